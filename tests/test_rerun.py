"""Reruns never bless bad evidence: an edited, stale or unsupported trial is run again, never counted.

The outsider's reproduction: run a small experiment on the simulator, edit finished trials (a 10x
rate, deleted records, cut outputs, a flipped verdict), rerun, and the edited trials are run again,
`parity validate` passes on the new tree and the report never shows an edited number.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity.checks import check_file
from parity.cli import main
from parity.errors import ParityError
from parity.experiments import offline_limit, plan
from parity.backend import Backend
from parity.experiments.runner import run_experiment
from parity.flame.settings import FlameSettings
from parity.trial import RESULT_SETTINGS, ran_with, stale
from parity.manifest import read_manifest, sha256_file, validate_paths
from parity.record import timing
from parity.report import write_report
from parity.trace import TraceSpec, build_trace

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "config" / "sim" / "h200-llama31-8b.yaml"
REFERENCE = ROOT / "config" / "study-reference.yaml"


def _backend(root: Path, **changes) -> Backend:
    return Backend.from_dict({"engine": "sim", "sim_params": str(root / "sim.yaml"), "warmup_rounds": 0} | changes)


def _cases(root: Path) -> list[plan.Case]:
    """Four standalone trials (alternating and sticky, twice) on one small trace: quick on the simulator."""
    cases = plan.locality([root / "traces" / "reuse.json"], 2, FlameSettings())
    return [c for c in cases if c.system == "standalone"]


@pytest.fixture(scope="module")
def finished_run(small_inputs, tmp_path_factory) -> Path:
    """ROOT/{inputs, traces, sim.yaml, run}: a finished four-trial experiment, copied by each test before editing
    (its inputs inside it, as the smoke profile's are, so the copy's links to them still resolve)."""
    root = tmp_path_factory.mktemp("finished")
    shutil.copy(small_inputs[0], root / "corpus.jsonl")
    shutil.copytree(small_inputs[1], root / "tok")
    build_trace(TraceSpec("reuse", documents=4, questions_per_document=4, prefix_tokens=400, seed=1),
                root / "corpus.jsonl", root / "tok", root / "traces")
    shutil.copy(SIM, root / "sim.yaml")
    run_experiment("locality", _cases(root), _backend(root), root / "run", settings={}, log=lambda m: None)
    return root


@pytest.fixture()
def run(finished_run, tmp_path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(finished_run, root)
    return root


def _trial(root: Path, case: plan.Case) -> Path:
    return root / "run" / "trials" / f"{case.trial_id}.json"


def _edit(path: Path, change) -> float:
    """Edit a trial as an outsider would (plain JSON, schema-valid); returns the rate it now states."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return doc["timing"]["requests_per_s"]


def ten_x(doc):  # the rate alone: its records no longer give it
    doc["timing"]["requests_per_s"] *= 10


def cut(doc):  # 10 records deleted, 5 outputs cut to 3 tokens, timing redone to match, verdict left passed
    del doc["records"][:10]
    for record in doc["records"][:5]:
        record["output_token_ids"] = record["output_token_ids"][:3]
    doc["timing"] = timing(doc["records"], doc["timing"]["release_s"])


def faster(doc):  # every time 10x shorter, timing redone: consistent, only a recorded hash tells
    release = doc["timing"]["release_s"]
    for record in doc["records"]:
        for key in ("submit_s", "complete_s"):
            record[key] = release + (record[key] - release) / 10
    doc["timing"] = timing(doc["records"], release)


def flipped(doc):  # a good trial marked failed, so it would be left out of the statistics
    doc["verdict"] = {"status": "failed", "checks": dict(doc["verdict"]["checks"], coverage={"passed": False}),
                      "reasons": ["coverage: 1 request(s) missing, e.g. x"]}


def _rerun(root: Path, cases=None, **changes) -> tuple[dict, list[str]]:
    lines: list[str] = []
    out = run_experiment("locality", cases or _cases(root), _backend(root, **changes), root / "run", settings={},
                         log=lines.append)
    return read_manifest(out), lines


def _said(lines: list[str], case: plan.Case) -> str:
    return next(line for line in lines if line.startswith(f"{case.trial_id}: "))


@pytest.mark.parametrize("how", ["forged", "deleted"])
def test_a_changed_or_deleted_cleanup_receipt_runs_its_case_again(run, how):
    """An outsider's, 2026-12-07: a rerun re-hashed the cleanup receipts on disk, so a forged receipt (a replica said
    killed) or a deleted one passed `parity validate` once experiment.json was written again. The receipts the last
    experiment manifest recorded are held to it: the case whose teardown a changed one speaks for runs again, and its
    new receipt replaces it."""
    cases = _cases(run)
    receipt = run / "run" / "cleanup" / f"{cases[0].trial_id}.json"
    if how == "forged":
        doc = json.loads(receipt.read_text())
        doc["processes"][0] |= {"exit_code": None, "signal": "SIGKILL"}
        doc["what"] += " (forged)"
        receipt.write_text(json.dumps(doc))
    else:
        receipt.unlink()
    doc, lines = _rerun(run)
    assert f"run again: its cleanup receipt {receipt} " in _said(lines, cases[0])
    assert all(_said(lines, c).endswith("kept (already run and checked)") for c in cases[1:])
    assert "(forged)" not in receipt.read_text()
    assert [r["path"] for r in doc["cleanup"]].count(f"cleanup/{cases[0].trial_id}.json") == 1
    assert validate_paths([run / "run"])[1] == []


def test_edited_trials_are_run_again_and_never_shown(run):
    cases = _cases(run)
    edits = {cases[0].trial_id: ten_x, cases[1].trial_id: cut, cases[2].trial_id: faster, cases[3].trial_id: flipped}
    stated = {c.trial_id: _edit(_trial(run, c), edits[c.trial_id]) for c in cases}
    doc, lines = _rerun(run)
    assert "its timing is not what its records give" in _said(lines, cases[0])
    for case in cases[1:]:  # the rerun reads experiment.json's hashes before it writes anything
        assert "run again: the trial on disk changed after" in _said(lines, case)
        assert "experiment.json recorded it" in _said(lines, case)
    for case, entry in zip(cases, doc["cases"]):
        fresh = read_manifest(_trial(run, case))
        assert fresh["verdict"]["status"] == entry["status"] == "passed" and len(fresh["records"]) == 16
        assert entry["requests_per_s"] == fresh["timing"]["requests_per_s"] != stated[case.trial_id]
    assert validate_paths([run / "run"])[1] == []
    report = write_report([run / "run"], None, REFERENCE, run / "report")
    shown = json.dumps(report["manifest"]) + report["markdown"]
    for value in (stated[cases[0].trial_id], stated[cases[2].trial_id]):
        assert f"{value:.2f}" not in shown and repr(value) not in shown


def test_without_an_earlier_record_each_trial_is_checked_again_from_its_records(run):
    """An interrupted run leaves trials no experiment.json names yet: then the records are the guard."""
    (run / "run" / "experiment.json").unlink()
    cases = _cases(run)
    stated = {c.trial_id: _edit(_trial(run, c), edit) for c, edit in zip(cases, (ten_x, cut, flipped))}
    doc, lines = _rerun(run)
    assert "its timing is not what its records give" in _said(lines, cases[0])
    assert ("the trial on disk is not what its records give: its verdict says passed, its records say failed "
            "(coverage: 10 request(s) missing") in _said(lines, cases[1])
    assert "its verdict says failed, its records say passed" in _said(lines, cases[2])
    assert _said(lines, cases[3]).endswith("kept (already run and checked)")
    assert [e["status"] for e in doc["cases"]] == ["passed"] * 4
    assert all(e["requests_per_s"] != stated.get(e["trial_id"]) for e in doc["cases"])
    assert validate_paths([run / "run"])[1] == []


def test_a_failed_trial_is_kept_as_failed_until_its_manifest_is_deleted(run):
    """A rerun never runs a failed case until it passes: the failure stays, with its reasons, excluded."""
    (run / "run" / "experiment.json").unlink()
    case = _cases(run)[0]
    path = _trial(run, case)
    _edit(path, lambda d: d["records"][0].update(output_token_ids=d["records"][0]["output_token_ids"][:3]))
    assert check_file(path)["status"] == "failed"  # a consistent failure: what its records give
    failed_bytes = path.read_bytes()
    doc, lines = _rerun(run)
    kept = f"kept as failed, excluded from statistics (delete {path} to run it again): output_length"
    assert kept in _said(lines, case)
    assert doc["cases"][0]["status"] == "failed" and path.read_bytes() == failed_bytes
    assert any("failed (excluded from statistics): " + case.trial_id in line for line in lines)
    path.unlink()
    doc, _ = _rerun(run)
    assert doc["cases"][0]["status"] == "passed"


def test_every_setting_that_can_change_a_result_makes_a_trial_stale(run):
    cases = _cases(run)
    doc = read_manifest(_trial(run, cases[0]))
    gpus = ["sim-0", "sim-1"]
    now = ran_with(_backend(run), gpus, cases[0].trace, placement=cases[0].placement, flame=None)
    assert set(doc["ran_with"]) == set(RESULT_SETTINGS) and stale(doc, now) is None
    for changes, named in [({"engine": "vllm"}, "it ran with other engine, sim_params"),
                           ({"warmup_rounds": 1}, "warmup_rounds"),
                           ({"load_format": "dummy"}, "engine_args.load_format"),
                           ({"engine_args": {"max_num_seqs": 8}}, "engine_args.max_num_seqs"),
                           ({"model": "other/model"}, "engine_args.model")]:
        wanted = ran_with(_backend(run, **changes), gpus, cases[0].trace, placement=cases[0].placement, flame=None)
        assert stale(doc, wanted).endswith(named), changes
    wanted = ran_with(_backend(run), ["sim-0", "sim-2"], cases[0].trace, placement="sticky", flame=None)
    assert stale(doc, wanted) == "it ran with other gpus, placement"
    assert stale(doc, now | {"versions": now["versions"] | {"vllm": "0.99.0"}}) == "it ran with other versions.vllm"
    # the Flame cluster and its configuration count for Flame trials (a standalone one uses neither)
    assert stale(doc, ran_with(_backend(run, cluster="flame"), gpus, cases[0].trace, placement=cases[0].placement,
                               flame=None)) is None
    flame = copy.deepcopy(doc)
    flame["ran_with"] = ran_with(_backend(run), gpus, cases[0].trace, placement="sticky", flame=FlameSettings())
    other = ran_with(_backend(run, cluster="flame"), gpus, cases[0].trace, placement="sticky",
                     flame=replace(FlameSettings(), order="prefix"),
                     flame_binaries={"flame-session-manager": "0" * 64})
    assert stale(flame, other) == "it ran with other cluster, flame_binaries, flame.order"
    del flame["ran_with"]
    assert stale(flame, now) == "it does not record what it ran with (made before parity recorded it)"


def test_a_changed_simulator_file_or_warmup_runs_every_trial_again(run):
    cases = _cases(run)[:2]
    sim = run / "sim.yaml"  # the same path, other content (20x faster: the simulator paces in wall time)
    sim.write_text(sim.read_text().replace("fixed_s: 0.02", "fixed_s: 0.001"))
    doc, lines = _rerun(run, cases)
    assert all("stale: it ran with other sim_params" in _said(lines, c) for c in cases)
    assert doc["backend"]["sim_params_sha256"] == sha256_file(sim)
    assert all(read_manifest(_trial(run, c))["ran_with"]["sim_params"] == sha256_file(sim) for c in cases)
    doc, lines = _rerun(run, cases, warmup_rounds=1)
    assert all("stale: it ran with other warmup_rounds" in _said(lines, c) for c in cases)
    assert doc["backend"]["warmup_rounds"] == 1
    assert all(read_manifest(_trial(run, c))["config"]["warmup_rounds"] == 1 for c in cases)


def test_a_trace_longer_than_the_engine_context_is_refused_before_anything_is_written(run, tmp_path):
    too_short = {"engine_args": {"max_model_len": 400}}
    with pytest.raises(ParityError, match=r"request reuse-d\d+-q\d has 4\d\d prompt tokens; with 16 new tokens it "
                                          r"does not fit the engine's max_model_len 400"):
        run_experiment("locality", _cases(run), _backend(run, **too_short), tmp_path / "out", settings={},
                       log=lambda m: None)
    with pytest.raises(ParityError, match="does not fit the engine's max_model_len 400"):
        offline_limit.run([run / "traces" / "reuse.json"], _backend(run, **too_short), tmp_path / "out", settings={},
                          log=lambda m: None)
    result = CliRunner().invoke(main, ["experiment", "run", "locality", "--trace", str(run / "traces" / "reuse.json"),
                                       "--backend", json.dumps(too_short | {"engine": "sim"}),
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and "max_model_len 400" in result.output
    assert not (tmp_path / "out").exists()


def test_offline_limit_runs_an_edited_shard_again(run, tmp_path):
    out = tmp_path / "offline"
    backend = _backend(run)
    offline_limit.run([run / "traces" / "reuse.json"], backend, out, settings={}, log=lambda m: None)
    shard = out / "trials" / "sim-reuse-shard0.json"
    stated = _edit(shard, ten_x)
    lines: list[str] = []
    doc = read_manifest(offline_limit.run([run / "traces" / "reuse.json"], backend, out, settings={}, log=lines.append))
    assert any(line.startswith("  reuse-shard0: run again: ") and "timing" in line for line in lines)
    assert "  reuse-shard1: kept (already run and checked)" in lines
    assert doc["limits"][0]["shards"][0]["requests_per_s"] != stated
    _edit(shard, faster)  # consistent in itself: the hash experiment.json recorded tells
    lines.clear()
    offline_limit.run([run / "traces" / "reuse.json"], backend, out, settings={}, log=lines.append)
    assert any(line.startswith("  reuse-shard0: run again: the trial on disk changed after") for line in lines)
    lines.clear()
    offline_limit.run([run / "traces" / "reuse.json"], _backend(run, warmup_rounds=1), out, settings={},
                      log=lines.append)
    assert sum("stale: it ran with other warmup_rounds" in line for line in lines) == 2
    assert validate_paths([out])[1] == []


def test_a_missing_warmup_token_file_is_refused_before_anything_runs(run):
    """A deleted warm-up token file was found only once an engine had started and its first warm-up had run (an
    outsider's, 2026-12-07): each warm-up variant the backend replays is loaded, by hash, before any case runs."""
    (run / "traces" / "reuse.warmup1.tokens").unlink()
    before = {p: p.stat().st_mtime_ns for p in (run / "run").rglob("*") if p.is_file()}
    with pytest.raises(ParityError, match=r"trace file missing: .*reuse\.warmup1\.tokens"):
        _rerun(run, warmup_rounds=1)
    assert {p: p.stat().st_mtime_ns for p in (run / "run").rglob("*") if p.is_file()} == before
