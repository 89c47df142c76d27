"""config/experiments.yaml writes the final Flame configuration once (a YAML anchor) and each experiment that
runs it merges it into a mapping of its own. Snakemake merges a profile's config over it in place
(`snakemake.utils.update_config`), so a shared mapping would carry one experiment's change into another's:
these tests load and merge the file exactly as the Snakefile does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from snakemake.common.configfile import load_configfile
from snakemake.utils import update_config

STUDY = "config/experiments.yaml"
FINAL = {"batch_limit": 128, "window_ms": 10, "budget_mib": 4, "api": "async", "compress": True, "order": "arrival",
         "gc_freeze": True}  # the study's
TUNED = {"batch_limit": 256, "order": "prefix"}  # ours, beside it: the confirmation's Flame arm `tuned`
USERS = ("confirmation", "gc", "routing", "sustained")  # the experiments that run the final configuration


def flames(config: dict) -> dict:
    return {name: config["experiments"][name]["flame"] for name in USERS}


def test_the_final_configuration_is_written_once_and_each_user_gets_it():
    text = open(STUDY).read()
    assert text.count("budget_mib: 4, api: async") == 1
    got = flames(load_configfile(STUDY))
    unfrozen = {k: v for k, v in FINAL.items() if k != "gc_freeze"}  # gc's plan sets the freeze per case
    # the study's tables run the study's settings; ours (routing, sustained: beyond the study) run it tuned, as the
    # confirmation's arm `tuned` runs beside the study's pairs (outside pass L: batch 256 and prefix order had
    # replaced the study's 128 and arrival order as the default of the study's tables)
    assert got == {"confirmation": FINAL, "gc": unfrozen, "routing": FINAL | TUNED, "sustained": FINAL | TUNED}
    assert load_configfile(STUDY)["experiments"]["confirmation"]["flame_arms"] == {"tuned": TUNED}
    assert load_configfile(STUDY)["experiments"]["admission"]["selected"] == {"batch_limit": 128, "window_ms": 10}


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



SMOKE = (STUDY, "config/smoke.yaml")


def smoke_sustained(change) -> tuple[dict, dict]:
    """The smoke profile's sustained settings and backend, as the workflow merges them, with `change` made."""
    from parity.workflow_config import load

    config = load(SMOKE)
    change(config["experiments"]["sustained"], config["backend"])
    return config["experiments"]["sustained"], config["backend"]


@pytest.mark.parametrize("change, said", [
    (lambda s, b: s["restart"].update(shard=7), "restart shard 7 does not exist: the path has 2 shard(s)"),
    (lambda s, b: b.update(gpus=["auto"]) or s["restart"].update(shard=2), "restart shard 2 does not exist"),
    (lambda s, b: s["bounded"].update(queue_s=1), "queue_s (the deadline-aware queue) runs on the standalone client"),
    (lambda s, b: s["bounded"].update(orphan_grace=3), "orphan_grace says how many orphans"),
    (lambda s, b: s["bounded"].update(orphan_demand=4), "orphan_demand says when a refused document's orphans"),
    (lambda s, b: s.update(rates=[1e9]), "1e+09 requests/s is more than a sender can hold"),
    (lambda s, b: s.update(rates=[0.0001]), "32 requests at 0.0001 requests/s take about 88.9 h"),
    (lambda s, b: s.update(rates={"nosuch": [30]}), "rates name trace 'nosuch', which is not among the traces given"),
    (lambda s, b: s["lengths"].update(low=100), "output lengths need 1 <= low <= median <= high, got low 100"),
    (lambda s, b: s.update(output_tokens=[99999999999]), "99999999999 output tokens leave no room for a prompt"),
    (lambda s, b: s["flame"].update(api="sync"), "bounded admission's Flame side runs the harvest mode"),
    (lambda s, b: s.update(run_first=["nosuch"]), "run_first names arm 'nosuch'"),
    (lambda s, b: s.update(arms={"bounded": {"inflight": 1}}), "an arm is named 'bounded'"),
    (lambda s, b: s["lengths"].update(arm="nosuch"), "an extra pair names arm 'nosuch'"),
    (lambda s, b: s["evict"].update(trace="nosuch"), "evict names trace 'nosuch', which is not among the ladder's"),
    (lambda s, b: s.update(replay={"trace": "nosuch"}), "replay names trace 'nosuch', which is not among the traces"),
])
def test_what_an_experiments_job_would_refuse_is_refused_from_the_config_alone(change, said):
    """An outside tester's, 2026-12-06: each of these passed `snakemake -n` and was refused by the sustained job
    only when it ran (a restart's shard after trials ran); the workflow checks each experiment this way at parse
    time (common.smk), on its traces' names and request counts alone."""
    from parity.backend import Backend
    from parity.errors import ParityError
    from parity.experiments.plan import check_experiment

    settings, backend = smoke_sustained(lambda s, b: None)
    check_experiment("sustained", settings, {"reuse-32": 32}, Backend.from_dict(backend))  # the profile's own
    settings, backend = smoke_sustained(change)
    with pytest.raises(ParityError) as refused:
        check_experiment("sustained", settings, {"reuse-32": 32}, Backend.from_dict(backend))
    assert said in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("value, said", [
    (1.0, "experiments.sustained.bounded.quantile: 1.0 is none of: 0, or a number >= 0.5 and < 1"),
    ("2e-1", "experiments.sustained.bounded.quantile: '2e-1' is none of: 0, or a number >= 0.5 and < 1"),
])
def test_a_setting_of_alternatives_says_them_and_yaml_text_for_a_number_says_how_to_write_it(value, said):
    """An outsider's (2026-12-07): `quantile: 1.0` read "1.0 is not valid under any of the given schemas", and a
    `headroom: 2e-1` (text to YAML 1.1) was "not of type 'number'" with no word of why; both now say what to write."""
    from parity.errors import ParityError
    from parity.workflow_config import check, load, schema

    config = load(SMOKE)
    config["experiments"]["sustained"]["bounded"]["quantile"] = value
    with pytest.raises(ParityError) as refused:
        check(schema(), config, "config")
    assert said in str(refused.value)
    config = load(SMOKE)
    config["experiments"]["sustained"]["bounded"]["headroom"] = "2e-1"
    with pytest.raises(ParityError) as refused:
        check(schema(), config, "config")
    assert "headroom: '2e-1' is not of type 'number' (YAML reads 2e-1 as text: write 2.0e-1)" in str(refused.value)


@pytest.mark.parametrize("extra, stage", [("bounded", "bounded"), ("restart", "restart"), ("evict", "evict"),
                                          ("lengths", "lengths")])
def test_a_profiles_extra_arm_or_pair_is_switched_off_with_null(extra, stage):
    """Nothing switched the smoke profile's bounded arm (or its restart, eviction or lengths pair) off from the
    command line (`--config`): null was "not of type 'object'". Null is now none, as leaving it out is."""
    from parity.experiments.plan import for_experiment
    from parity.workflow_config import check_experiment_settings

    def stages(settings):
        return {case.stage for case in for_experiment("sustained", [Path("reuse-32.json")], settings)}

    settings, _ = smoke_sustained(lambda s, b: None)
    assert any(stage in s for s in stages(settings))
    settings, _ = smoke_sustained(lambda s, b: s.update({extra: None}))
    check_experiment_settings("sustained", settings)  # as the workflow validates its config
    assert not any(stage in s for s in stages(settings))


def test_a_profiles_paced_warmups_are_switched_off_with_null():
    """`warmup_requests: null` (from the command line, over the smoke profile's 8) was "not of type 'integer'";
    null is now the default's whole-burst warm-ups, as leaving it out is, and zero is still refused."""
    from parity.errors import ParityError
    from parity.experiments.plan import for_experiment
    from parity.workflow_config import check_experiment_settings

    def warmups(settings):
        return {case.warmup_requests for case in for_experiment("sustained", [Path("reuse-32.json")], settings)}

    settings, _ = smoke_sustained(lambda s, b: None)
    assert warmups(settings) == {8}
    settings, _ = smoke_sustained(lambda s, b: s.update(warmup_requests=None))
    check_experiment_settings("sustained", settings)
    assert warmups(settings) == {None}
    settings, _ = smoke_sustained(lambda s, b: s.update(warmup_requests=0))
    with pytest.raises(ParityError, match="warmup_requests"):
        check_experiment_settings("sustained", settings)


def test_an_empty_flame_bin_dir_in_the_backend_is_refused_in_one_line():
    """`flame_bin_dir: ""` read as the current folder (`Path("")` is `.`), which the config did not name."""
    from parity.backend import Backend
    from parity.errors import ParityError

    for blank in ("", " "):  # " " was resolved to the current folder's " " (outside pass M)
        with pytest.raises(ParityError, match="flame_bin_dir") as refused:
            Backend.from_dict({"cluster": "flame", "flame_bin_dir": blank})
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("where", ["flame_arms", "arms"])
def test_a_key_yaml_reads_as_a_boolean_is_refused_in_one_line(where):
    """`flame_arms: {no: {...}}` unquoted is the boolean False to YAML, which the schema's name pattern let by: the
    dry run ended in a TypeError (outside pass M). Now one line that names the key and says to quote it."""
    from parity.errors import ParityError
    from parity.workflow_config import check, load, schema

    config = load(SMOKE)
    part = config["experiments"]["confirmation" if where == "flame_arms" else "sustained"]
    part.setdefault(where, {})[False] = {"batch_limit": 64}
    with pytest.raises(ParityError) as refused:
        check(schema(), config, "the workflow config:")
    said = str(refused.value)
    assert "\n" not in said and "key False is not text" in said and "quote it" in said and where in said, said
