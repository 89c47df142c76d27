"""config/experiments.yaml writes the final Flame configuration once (a YAML anchor) and each experiment that
runs it merges it into a mapping of its own. Snakemake merges a profile's config over it in place
(`snakemake.utils.update_config`), so a shared mapping would carry one experiment's change into another's:
these tests load and merge the file exactly as the Snakefile does."""

from __future__ import annotations

import copy

import pytest
from snakemake.common.configfile import load_configfile
from snakemake.utils import update_config

STUDY = "config/experiments.yaml"
FINAL = {"batch_limit": 256, "window_ms": 10, "budget_mib": 4, "api": "async", "compress": True, "order": "prefix",
         "gc_freeze": True}
USERS = ("confirmation", "gc", "routing", "sustained")  # the experiments that run the final configuration


def flames(config: dict) -> dict:
    return {name: config["experiments"][name]["flame"] for name in USERS}


def test_the_final_configuration_is_written_once_and_each_user_gets_it():
    text = open(STUDY).read()
    assert text.count("budget_mib: 4, api: async") == 1
    got = flames(load_configfile(STUDY))
    unfrozen = {k: v for k, v in FINAL.items() if k != "gc_freeze"}  # gc's plan sets the freeze per case
    assert got == {"confirmation": FINAL, "gc": unfrozen, "routing": FINAL, "sustained": FINAL}


def test_each_user_holds_a_mapping_of_its_own():
    got = flames(load_configfile(STUDY))
    assert len({id(flame) for flame in got.values()}) == len(USERS)


@pytest.mark.parametrize("changed", USERS)
def test_a_profile_changing_one_experiments_flame_changes_no_other(changed):
    config = load_configfile(STUDY)
    before = copy.deepcopy(flames(config))
    update_config(config, {"experiments": {changed: {"flame": {"batch_limit": 8, "order": "arrival"}}}})
    after = flames(config)
    assert after[changed] == before[changed] | {"batch_limit": 8, "order": "arrival"}
    assert {k: v for k, v in after.items() if k != changed} == {k: v for k, v in before.items() if k != changed}


GENERATED = {"generate": True, "corpus": "results/smoke/inputs/corpus.jsonl", "tokenizer": "results/smoke/inputs/tokenizer",
             "corpus_origin": "synthetic-news", "tokenizer_origin": "smoke-bpe"}


@pytest.mark.parametrize("inputs", [
    {"tokenizer": "results/smoke/inputs/tok"},
    {"corpus": "results/smoke/inputs/news.jsonl"},
    {"corpus": "results/smoke/other/corpus.jsonl"},
    {"tokenizer": "results/smoke/tokenizer"},
    {"corpus": "corpus.jsonl", "tokenizer": "tokenizer"},
])
def test_generated_inputs_the_smoke_inputs_rule_cannot_make_are_refused_in_one_line(inputs):
    """Found by an outsider: with inputs.generate the workflow took any corpus and tokenizer names, but its
    smoke_inputs rule runs `parity smoke-inputs --out dirname(corpus)`, which writes DIR/corpus.jsonl and DIR/tokenizer:
    inputs={'tokenizer': 'results/smoke/inputs/tok'} ran the job and then failed with MissingOutputException."""
    from parity.errors import ParityError
    from parity.workflow_config import check_inputs

    with pytest.raises(ParityError, match=r"^inputs: generated inputs \(generate: true\) are DIR/corpus.jsonl and "
                                          r"DIR/tokenizer, one folder") as raised:
        check_inputs({**GENERATED, **inputs})
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("inputs", [
    {}, {"corpus": "results/host/inputs/corpus.jsonl", "tokenizer": "results/host/inputs/tokenizer/"},
    {"generate": False, "corpus": "resources/articles.jsonl", "tokenizer": "resources/Llama-3.1-8B-Instruct"},
])
def test_generated_inputs_in_one_folder_and_fetched_inputs_of_any_name_are_taken(inputs):
    from parity.workflow_config import check_inputs

    check_inputs({**GENERATED, **inputs})
    for profile in ("smoke", "host", "default"):
        config = load_configfile(STUDY)
        update_config(config, load_configfile(f"config/{profile}.yaml"))
        check_inputs(config["inputs"])
