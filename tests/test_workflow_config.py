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

