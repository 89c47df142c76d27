"""The four per-request checks: a clean trial passes; each kind of damage fails with its reason."""

from __future__ import annotations

import copy

import pytest
from click.testing import CliRunner

from parity.checks import check_trial, pinning_of
from parity.cli import main
from parity.engine.sim import SimEngine
from parity.manifest import read_manifest
from parity.offline import run_offline
from parity.trace import load_trace


@pytest.fixture(scope="module")
def trial(small_reuse_trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("checks") / "trial.json"
    run_offline(SimEngine(), small_reuse_trace, out, warmup_rounds=0, log=lambda m: None)
    return out, read_manifest(out), load_trace(small_reuse_trace)


def test_a_clean_trial_passes_every_check(trial):
    _, doc, trace = trial
    verdict = check_trial(doc, trace)
    assert verdict == {"status": "passed", "checks": {name: {"passed": True} for name in
                                                        ("input", "coverage", "output_length", "placement")},
                       "reasons": []}


@pytest.mark.parametrize("damage,check", [
    (lambda d: d["records"][3].update(input_sha256="0" * 64), "input"),
    (lambda d: d["records"].pop(5), "coverage"),
    (lambda d: d["records"].append(copy.deepcopy(d["records"][0])), "coverage"),
    (lambda d: d["records"][7]["output_token_ids"].pop(), "output_length"),
    (lambda d: d["records"][2].update(gpu_uuid="sim-9"), "placement"),
])
def test_each_kind_of_damage_fails_its_check(trial, damage, check):
    _, doc, trace = trial
    broken = copy.deepcopy(doc)
    damage(broken)
    verdict = check_trial(broken, trace)
    assert verdict["status"] == "failed"
    assert verdict["checks"][check]["passed"] is False
    assert all(r.startswith(f"{check}: ") for r in verdict["reasons"])


def test_pinning_must_match_the_reference(trial):
    _, doc, trace = trial
    assert pinning_of(doc) == {0: doc["records"][0]["gpu_uuid"]}
    verdict = check_trial(doc, trace, pinning={0: "sim-1"})
    assert verdict["status"] == "failed" and "pinned to sim-1" in verdict["reasons"][0]


def test_check_command_writes_only_the_verdict(trial):
    path, doc, _ = trial
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 0 and f"{path}: passed" in result.output
    after = read_manifest(path)
    assert after["verdict"]["status"] == "passed"
    assert {k: v for k, v in after.items() if k != "verdict"} == {k: v for k, v in doc.items() if k != "verdict"}
