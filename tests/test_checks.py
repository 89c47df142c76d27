"""The four per-request checks: a clean trial passes; each kind of damage fails with its reason."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from parity.checks import check_trial, pinning_of, timing_mismatch, unsupported
from parity.cli import main
from parity.engine.sim import SimEngine
from parity.manifest import dumps, read_manifest, write_manifest
from parity import trial as trials
from parity.paths.engine import EnginePath
from parity.trace import load_trace


@pytest.fixture(scope="module")
def trial(small_reuse_trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("checks") / "trial.json"
    trials.run(EnginePath(SimEngine()), small_reuse_trace, out.parent, trial_id="trial", experiment="engine",
               warmup_rounds=0, log=lambda m: None)
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
    (lambda d: d["records"][1].update(prompt_tokens=7), "input"),  # the trace has its count: the prompt was not it
    (lambda d: d["records"][0].update(position=1) or d["records"][1].update(position=0), "coverage"),  # swapped
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


def _one_line_error(result) -> str:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: ")
    return line


def test_check_command_exits_1_on_a_failed_trial_and_prints_every_verdict(trial, tmp_path):
    path, doc, _ = trial
    broken = tmp_path / "broken.json"
    bad = copy.deepcopy(doc)
    bad["records"][7]["output_token_ids"] = bad["records"][7]["output_token_ids"][:3]  # verdict left "passed"
    write_manifest(broken, bad)
    result = CliRunner().invoke(main, ["check", str(path), str(broken)])
    assert result.exit_code == 1
    assert f"{path}: passed" in result.output and f"{broken}: failed\n  output_length: 1 request(s)" in result.output
    assert read_manifest(broken)["verdict"]["status"] == "failed"


def test_check_command_refuses_what_is_not_a_trial_in_one_line(trial, small_reuse_trace, tmp_path):
    path, doc, _ = trial
    before = path.read_bytes()
    text = tmp_path / "notes.json"
    text.write_text("not json")
    experiment = tmp_path / "experiment.json"
    experiment.write_text(json.dumps({"kind": "experiment", "schema_version": 1}))
    edited = tmp_path / "edited.json"
    write_manifest(edited, doc | {"timing": doc["timing"] | {"requests_per_s": doc["timing"]["requests_per_s"] * 10}})
    for target, message in [(experiment, "is not a trial manifest (kind 'experiment')"),
                            (small_reuse_trace, "is not a trial manifest (kind 'trace')"),
                            (text, "not valid JSON"),
                            (edited, "its timing is not what its records give: it states")]:
        assert message in _one_line_error(CliRunner().invoke(main, ["check", str(path), str(target)]))
    assert message in _one_line_error(CliRunner().invoke(main, ["check", str(path), "--pinning-from", str(edited)]))
    assert path.read_bytes() == before  # no verdict written when any file is not a trial


@pytest.mark.parametrize("damage, says", [
    (lambda d: d["records"][0].update(cached_tokens=d["records"][0]["prompt_tokens"] + 1),
     "/records/0/cached_tokens: its records contradict one another: "),
    (lambda d: d["records"][1].update(position=d["records"][0]["position"]),
     "/records/1/position: its records contradict one another: "),
    (lambda d: d["records"][0].update(prompt_tokens=2**70), "/records/0/prompt_tokens: maximum: "),
    (lambda d: d["records"][3].update(position=2**70), "/records/3/position: maximum: "),
])
def test_records_that_contradict_themselves_are_refused_in_one_line(trial, tmp_path, damage, says):
    """An outside tester's forgeries passed `check` (and `validate` and `seal`): more of a prompt cached than it
    holds, two requests at one position, a count no token file can hold."""
    from parity.checks import derived_problems

    path, doc, _ = trial
    forged = tmp_path / "forged.json"
    bad = copy.deepcopy(doc)
    damage(bad)
    forged.write_text(dumps(bad))  # as a forger writes it (parity's own writer refuses the schema's problems)
    before = forged.read_bytes()
    assert f"{forged}: {says}" in _one_line_error(CliRunner().invoke(main, ["check", str(forged)]))
    assert forged.read_bytes() == before  # no verdict written
    if "contradict" in says:  # (a schema problem is validate's before anything is derived)
        pointer = says.split(":")[0]
        assert any(p == pointer for p, _ in derived_problems(path, bad))


def test_a_verdict_is_what_its_records_give_and_names_its_pinning(trial):
    _, doc, trace = trial
    doc = doc | {"verdict": check_trial(doc, trace)}
    assert unsupported(doc, trace) is None
    pinned = doc | {"verdict": check_trial(doc, trace, pinning={0: "sim-1"})}
    assert pinned["verdict"]["pinning"] == {"0": "sim-1"} and unsupported(pinned, trace) is None
    left = copy.deepcopy(doc)
    del left["records"][0]
    assert unsupported(left, trace).startswith("its verdict says passed, its records say failed (coverage: ")
    assert timing_mismatch(doc) is None
    assert "its 64 records give" in timing_mismatch(doc | {"timing": doc["timing"] | {"requests_per_s": 1.0}})


def test_two_exclusive_shards_on_one_gpu_fail_placement_but_a_global_session_shares_one_queue(trial):
    _, doc, trace = trial
    shared = copy.deepcopy(doc)
    gpu = doc["records"][0]["gpu_uuid"]
    for record in shared["records"][::2]:  # half of the requests as a second shard, on the same GPU
        record["shard"] = 1
    verdict = check_trial(shared, trace)
    assert verdict["status"] == "failed" and verdict["reasons"] == [f"placement: shards 0, 1 ran on the same GPU {gpu}"]
    shared["config"]["placement"] = "global"  # Flame's global session: its workers take from one queue
    assert check_trial(shared, trace)["status"] == "passed"
