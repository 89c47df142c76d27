"""The experiments: which cases run in which order, and a small run end to end on the simulator."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from parity.engine import engine_kind
from parity.errors import ParityError
from parity.experiments import offline_limit, plan
from parity.backend import Backend
from parity.flame.settings import FlameSettings
from parity.experiments.runner import run_experiment
from parity.manifest import read_manifest, validate_paths, write_manifest
from parity.routing import shard_positions
from parity.trace import TraceSpec, build_trace, load_trace

SIM = Path(__file__).resolve().parents[1] / "config" / "sim" / "h200-llama31-8b.yaml"
TRACES = [Path("t/no-reuse.json"), Path("t/reuse.json")]
FINAL = FlameSettings(batch_limit=128, window_ms=10, budget_mib=4, api="async", compress=True, gc_freeze=True)


def test_locality_rotates_the_four_configurations_each_repetition():
    cases = plan.locality(TRACES, repeats=3, flame=FlameSettings())
    assert len(cases) == 4 * 2 * 3 and len({c.trial_id for c in cases}) == len(cases)
    firsts = [(c.system, c.placement) for c in cases[::4]]
    assert firsts[0] == ("standalone", "alternating") and firsts[2] == ("flame", "global") and firsts[4] == ("standalone", "sticky")
    assert {(c.system, c.placement) for c in cases} == set(plan.LOCALITY_CONFIGS)


def test_pairs_alternate_which_system_goes_first_and_pin_only_the_candidate():
    cases = plan.confirmation(TRACES, 2, FINAL)
    assert [c.system for c in cases] == ["standalone", "flame", "standalone", "flame", "flame", "standalone", "flame", "standalone"]
    assert all(c.pinned == (c.system == "flame") for c in cases)
    assert all(c.flame == FINAL and c.placement == "sticky" for c in cases)


def test_pairs_per_trace_name_keep_each_pairs_ids_and_order():
    cases = plan.confirmation(TRACES, {"reuse": 3, "no-reuse": 1}, FINAL)
    assert [c.trial_id.removeprefix("confirmation-final-") for c in cases] == [
        "no-reuse-p0-vllm", "no-reuse-p0-flame", "reuse-p0-vllm", "reuse-p0-flame",
        "reuse-p1-flame", "reuse-p1-vllm", "reuse-p2-vllm", "reuse-p2-flame"]


def test_admission_screens_before_its_stages_and_never_pairs_a_pilot():
    settings = {"base": {"budget_mib": 4}, "batch_windows": [[32, 2], [128, 10]],
                "selected": {"batch_limit": 128, "window_ms": 10}, "stage_pairs": 1}
    cases = plan.admission(TRACES, plan.AdmissionSettings.from_dict(settings))
    pilots = [c for c in cases if c.stage.startswith("screen-")]
    assert len(pilots) == 2 + 4 + 2 and all(c.pair is None and c.trace.stem == "reuse" for c in pilots)
    orders = [c.flame for c in pilots if c.stage.startswith("screen-order-")]
    assert [o.order for o in orders] == ["arrival", "prefix"]
    assert all(o.api == "async" and o.compress and o.batch_limit == 128 for o in orders)
    assert cases[: len(pilots)] == pilots
    stages = {c.stage for c in cases if c.pair is not None}
    assert stages == {"batch-window", "async-zlib"}
    assert len({c.trial_id for c in cases}) == len(cases)  # 128/10 ms sync raw is in both screens, once each
    async_zlib = [c for c in cases if c.stage == "async-zlib"]
    assert all(c.flame.api == "async" and c.flame.compress and c.flame.batch_limit == 128 for c in async_zlib)


def test_unknown_experiment_and_backend_settings_are_refused():
    with pytest.raises(ParityError, match="unknown experiment"):
        plan.for_experiment("speed", TRACES, {})
    with pytest.raises(ParityError, match="unknown admission order 'random'"):
        plan.for_experiment("confirmation", TRACES, {"flame": {"order": "random"}})
    with pytest.raises(ParityError, match="unknown backend setting"):
        Backend.from_dict({"engine": "sim", "gpu": ["x"]})
    with pytest.raises(ParityError, match="backend engine"):
        Backend.from_dict({"engine": "tensorrt"})


def test_backend_maps_the_engine_api_and_needs_nvidia_smi_for_auto(monkeypatch):
    assert engine_kind("sim", "async") == ("sim", "async")
    assert engine_kind("vllm", "sync") == ("vllm-sync", "sync")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ParityError, match="nvidia-smi"):
        Backend.from_dict({"engine": "vllm", "gpus": ["auto"]}).gpu_uuids()


def fake_nvidia_smi(monkeypatch, folder: Path, uuids: list[str]) -> None:
    """An nvidia-smi first on PATH that lists these GPU UUIDs, one a line, in index order."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {uuid}\n" for uuid in uuids))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture(scope="module")
def tiny_traces(small_inputs, tmp_path_factory):
    corpus, tok = small_inputs
    out = tmp_path_factory.mktemp("tiny-traces")
    return [build_trace(TraceSpec("no-reuse", documents=4, questions_per_document=1, prefix_tokens=400, seed=0), corpus, tok, out),
            build_trace(TraceSpec("reuse", documents=4, questions_per_document=4, prefix_tokens=400, seed=1), corpus, tok, out)]


def test_confirmation_runs_checks_pairs_and_keeps_finished_trials(tiny_traces, tmp_path):
    backend = Backend.from_dict({"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1})
    cases = plan.confirmation(tiny_traces, 1, FINAL)
    out = run_experiment("confirmation", cases, backend, tmp_path, settings={"pairs": 1}, log=lambda m: None)
    doc = read_manifest(out)
    assert [c["status"] for c in doc["cases"]] == ["passed"] * 4 and doc["simulated"]
    assert {c["cluster"] for c in doc["cases"] if c["system"] == "flame"} == {"stand-in"}
    assert len(doc["pairs"]) == 2
    assert {(c["rate"], c["output_tokens"], c["arm"]) for c in doc["cases"]} == {(None, None, None)}  # the study's bursts
    pair = read_manifest(tmp_path / doc["pairs"][0]["path"])
    assert pair["stage"] == "final" and pair["ratio"] > 0
    candidate = read_manifest(tmp_path / "trials" / "confirmation-final-reuse-p0-flame.json")
    assert candidate["verdict"]["checks"]["placement"]["passed"]
    assert candidate["engine"]["version"] == candidate["workers"][0].get("engine_version")  # as the worker says
    checked, problems = validate_paths([tmp_path])
    assert not problems and checked >= 4 + 2 + 1
    # every cleanup receipt is linked by hash: each standalone case's replicas, and the shared Flame cluster
    assert sorted(r["path"] for r in doc["cleanup"]) == sorted(
        [f"cleanup/{c.trial_id}.json" for c in cases if c.system == "standalone"] + ["cleanup/flame-cluster.json"])
    receipt = tmp_path / "cleanup" / "flame-cluster.json"
    receipt.write_text(receipt.read_text().replace('"clean": true', '"clean": false'))
    assert any(p.rule == "sha256-mismatch" and "flame-cluster.json" in p.message for p in validate_paths([out])[1])

    # A rerun keeps every finished trial; a corrupted one is run again, and so are the Flame cases whose shared
    # cluster's receipt was edited above (its new receipt replaces the edited one)
    kept = tmp_path / "trials" / "confirmation-final-no-reuse-p0-vllm.json"
    broken = tmp_path / "trials" / "confirmation-final-reuse-p0-vllm.json"
    kept_bytes = kept.read_bytes()
    broken.write_text("{")
    lines = []
    run_experiment("confirmation", cases, backend, tmp_path, settings={"pairs": 1}, log=lines.append)
    assert kept.read_bytes() == kept_bytes
    assert sum("kept" in line for line in lines) == 1
    assert sum("run again: its cleanup receipt" in line and "flame-cluster.json changed" in line for line in lines) == 2
    assert validate_paths([tmp_path])[1] == []
    assert read_manifest(broken)["verdict"]["status"] == "passed"

    # A settings change never passes old trials off as new: the Flame trials are run again, vLLM's kept.
    lines = []
    changed = plan.confirmation(tiny_traces, 1, replace(FINAL, batch_limit=256))
    run_experiment("confirmation", changed, backend, tmp_path, settings={"pairs": 1}, log=lines.append)
    assert sum("stale" in line and "flame.batch_limit" in line for line in lines) == 2
    assert sum("kept" in line for line in lines) == 2
    assert read_manifest(tmp_path / "trials" / "confirmation-final-reuse-p0-flame.json")["config"]["flame"]["batch_limit"] == 256

    # A trial that does not record what it ran with (made before parity recorded it) is stale.
    legacy = tmp_path / "trials" / "confirmation-final-reuse-p0-flame.json"
    doc = read_manifest(legacy)
    del doc["ran_with"]
    write_manifest(legacy, doc)
    lines = []
    run_experiment("confirmation", changed, backend, tmp_path, settings={"pairs": 1}, log=lines.append)
    assert [line.split(":")[0] for line in lines if "run again" in line] == ["confirmation-final-reuse-p0-flame"]
    assert any("does not record what it ran with" in line for line in lines)
    assert read_manifest(legacy)["ran_with"]["flame"]["batch_limit"] == 256


def test_offline_limit_splits_the_trace_as_the_sticky_router_does(tiny_traces, tmp_path):
    backend = Backend.from_dict({"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1})
    out = offline_limit.run(tiny_traces[1:], backend, tmp_path, settings={}, log=lambda m: None)
    doc = read_manifest(out)
    (limit,) = doc["limits"]
    positions = shard_positions(load_trace(tiny_traces[1]).prompts, 2)
    assert [s["requests"] for s in limit["shards"]] == [len(p) for p in positions if p]
    assert limit["requests"] == 16 and limit["passed"] and limit["requests_per_s"] > 0 and limit["side_by_side"]
    shard = load_trace(tmp_path / "traces" / "reuse-shard0.json")
    parent = load_trace(tiny_traces[1])
    assert [r.sha256 for r in shard.requests] == [parent.requests[i].sha256 for i in positions[0]]
    assert not validate_paths([tmp_path])[1]
    # each shard's records name the simulated GPU it ran on (both said sim-0, outside pass J's nit)
    for k, gpu in enumerate(["sim-0", "sim-1"]):
        trial_doc = read_manifest(tmp_path / "trials" / f"sim-reuse-shard{k}.json")
        assert {r["gpu_uuid"] for r in trial_doc["records"]} == {gpu} and trial_doc["gpus"][0]["uuid"] == gpu


def test_offline_limit_runs_more_shards_than_gpus_in_waves_and_says_so(tiny_traces, tmp_path):
    backend = Backend.from_dict({"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1, "gpus": ["sim-0"]})
    lines = []
    out = offline_limit.run(tiny_traces[1:], backend, tmp_path, settings={"shards": 2}, log=lines.append)
    (limit,) = read_manifest(out)["limits"]
    positions = shard_positions(load_trace(tiny_traces[1]).prompts, 2)
    assert [s["requests"] for s in limit["shards"]] == [len(p) for p in positions if p]
    assert limit["side_by_side"] is False and limit["passed"]
    assert any("in waves on 1 GPU(s)" in line for line in lines)
    assert not validate_paths([tmp_path])[1]
    # a rerun keeps the checked shards and runs only the one whose trial is gone
    (tmp_path / "trials" / "sim-reuse-shard1.json").unlink()
    lines.clear()
    offline_limit.run(tiny_traces[1:], backend, tmp_path, settings={"shards": 2}, log=lines.append)
    assert "  reuse-shard0: kept (already run and checked)" in lines
    assert not any("shard1: kept" in line for line in lines)
    assert (tmp_path / "trials" / "sim-reuse-shard1.json").exists()
    # other GPUs make every shard stale; then one GPU per shard, but a shard kept from before: they did not
    # run at once, and the manifest says so
    two = Backend.from_dict({"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1, "gpus": ["sim-0", "sim-1"]})
    lines.clear()
    (limit,) = read_manifest(offline_limit.run(tiny_traces[1:], two, tmp_path, settings={}, log=lines.append))["limits"]
    assert limit["side_by_side"] is True and sum("stale: it ran with other gpus" in line for line in lines) == 2
    (tmp_path / "trials" / "sim-reuse-shard1.json").unlink()
    (limit,) = read_manifest(offline_limit.run(tiny_traces[1:], two, tmp_path, settings={}, log=lines.append))["limits"]
    assert limit["side_by_side"] is False
    for bad in (0, "2", True):
        with pytest.raises(ParityError, match="offline-limit shards"):  # the settings class's (and schema's) words
            offline_limit.run(tiny_traces[1:], backend, tmp_path / "bad", settings={"shards": bad}, log=lines.append)


def test_experiment_run_takes_the_offline_limit_through_the_registry_as_any_other(tiny_traces, tmp_path):
    """No experiment is a special case of the command: the registry says the offline limit runs no cases, and
    its settings are read through OfflineLimitSettings (recorded as given)."""
    from click.testing import CliRunner

    from parity.cli import main

    assert [name for name in plan.EXPERIMENTS if not plan.runs_cases(name)] == ["offline-limit"]
    backend = {"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1, "gpus": ["sim-0"]}
    result = CliRunner().invoke(main, ["experiment", "run", "offline-limit", "--trace", str(tiny_traces[1]),
                                       "--backend", json.dumps(backend), "--settings", '{"shards": 2}',
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = read_manifest(tmp_path / "experiment.json")
    assert doc["settings"] == {"shards": 2} and len(doc["limits"][0]["shards"]) == 2


def test_auto_gpus_are_the_nodes_first_two_and_one_gpu_runs_the_offline_limit_in_waves(tiny_traces, tmp_path,
                                                                                        monkeypatch):
    auto = {"engine": "sim", "sim_params": str(SIM), "warmup_rounds": 1, "gpus": ["auto"]}
    fake_nvidia_smi(monkeypatch, tmp_path / "three", ["GPU-a", "GPU-b", "GPU-c"])
    assert Backend.from_dict(auto).gpu_uuids() == ["GPU-a", "GPU-b"]  # the study's node: two, in index order
    fake_nvidia_smi(monkeypatch, tmp_path / "one", ["GPU-a"])
    backend = Backend.from_dict(auto)
    assert backend.gpu_uuids() == ["GPU-a"]
    lines = []
    out = offline_limit.run(tiny_traces[1:], backend, tmp_path / "limit", settings={"shards": 2}, log=lines.append)
    (limit,) = read_manifest(out)["limits"]
    assert len(limit["shards"]) == 2 and limit["side_by_side"] is False and limit["passed"]
    assert any("in waves on 1 GPU(s)" in line for line in lines)
    assert sum(line.startswith("  wave ") for line in lines) == 2


def test_a_paired_experiment_on_one_auto_gpu_is_refused_in_one_line(tiny_traces, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from parity.cli import main

    fake_nvidia_smi(monkeypatch, tmp_path / "bin", ["GPU-a"])
    backend = json.dumps({"engine": "sim", "sim_params": str(SIM), "gpus": ["auto"], "cluster": "standin"})
    args = [a for t in tiny_traces for a in ("--trace", str(t))]
    result = CliRunner().invoke(main, ["experiment", "run", "confirmation", *args, "--backend", backend,
                                       "--settings", '{"pairs": 1}', "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: the confirmation experiment (paired runs on two GPUs) needs 2 GPUs (gpus: auto); "
        "nvidia-smi lists 1 on this host"]
    assert not (tmp_path / "out").exists()  # nothing written
    fake_nvidia_smi(monkeypatch, tmp_path / "none", [])
    with pytest.raises(ParityError, match="needs 1 GPU \\(gpus: auto\\); nvidia-smi lists 0"):
        Backend.from_dict({"engine": "vllm", "gpus": ["auto"]}).gpu_uuids()


def test_a_one_shard_confirmation_takes_one_gpu_and_two_shards_refuse_one_named(monkeypatch, tmp_path):
    """`shards: 1` (a one-GPU host): exactly one GPU, the first, whatever the host has; `shards: 2` needs two."""
    from parity.experiments.runner import Runner

    fake_nvidia_smi(monkeypatch, tmp_path / "bin", ["GPU-a"])
    auto = Backend.from_dict({"engine": "sim", "sim_params": str(SIM), "gpus": ["auto"]})
    assert Runner("confirmation", auto, tmp_path, shards=1).gpus == ["GPU-a"]
    assert Runner("confirmation", Backend(gpus=("sim-0", "sim-1")), tmp_path, shards=1).gpus == ["sim-0"]
    assert Runner("confirmation", Backend(gpus=("sim-0", "sim-1")), tmp_path).gpus == ["sim-0", "sim-1"]
    with pytest.raises(ParityError, match="runs 2 shards, one GPU each; the backend names 1 \\(sim-1\\)"):
        Runner("confirmation", Backend(gpus=("sim-1",)), tmp_path, shards=2)


def test_bad_backend_or_settings_give_one_line_errors(tmp_path):
    from click.testing import CliRunner

    from parity.cli import main

    trace = tmp_path / "t.json"
    trace.write_text("{}")
    for backend, settings, message in [("{not json", "{}", "backend: neither JSON"),
                                       ('{"engine": "sim"}', "[1]", "must be a JSON object"),
                                       ('{"engine": "sim"}', "{x", "--settings is not JSON"),
                                       # an outside tester's: nesting past Python's parser was a traceback
                                       ('{"engine": "sim"}', "[" * 50_000, "--settings is not JSON: nested more deeply"),
                                       ("[" * 50_000, "{}", "backend: neither JSON nor a readable YAML file (nested")]:
        result = CliRunner().invoke(main, ["experiment", "run", "gc", "--trace", str(trace), "--backend", backend,
                                           "--settings", settings, "--out", str(tmp_path / "out")])
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
        assert not (tmp_path / "out").exists()  # nothing written


def test_bench_order_runs_each_shard_in_both_orders_and_counts_simulated_steps(tiny_traces, tmp_path):
    from parity.bench import order
    from parity.checks import check_file
    from parity.engine.sim import SimEngine, SimParams

    with SimEngine(params=SimParams.load(SIM), clock="virtual", mode="async") as engine:
        result = order.run(engine, tiny_traces[1], tmp_path, shards=2, repeats=1, warmup_rounds=0, log=lambda m: None)
    assert result["simulated"] and result["trace"] == "reuse"
    assert sum(row["requests"] for row in result["shards"]) == 16
    for row in result["shards"]:
        assert len(row["steps"]["arrival"]) == len(row["steps"]["prefix"]) == 1 and row["steps"]["prefix"][0] > 0
        assert row["speedup"] == row["arrival_median_s"] / row["prefix_median_s"]
    trials = sorted((tmp_path / "trials").glob("*.json"))
    assert len(trials) == 2 * len(result["shards"]) and all(check_file(t)["status"] == "passed" for t in trials)


def test_offline_limit_hands_each_shard_the_backend_whole(tmp_path):
    """The shard's `parity engine run` gets the backend itself (not flags rebuilt from it), strings kept strings."""
    from parity.experiments.offline_limit import _command

    for engine in ("sim", "vllm"):
        backend = Backend.from_dict({"engine": engine, "gpus": ["g0", "g1"], "cluster": "standin",
                                     "model": "m", "load_format": "dummy",
                                     "engine_args": {"revision": "1", "max_num_seqs": 32, "enforce_eager": False}})
        command = _command(backend, tmp_path / "t.json", tmp_path)
        assert "--engine-arg" not in command and "--model" not in command
        given = Backend.parse(command[command.index("--backend") + 1])
        assert given == backend and given.args() == backend.args()

def test_routing_runs_both_routers_on_both_paths_interleaved():
    traces = [Path("reuse.json"), Path("shared-head.json")]
    cases = plan.for_experiment("routing", traces, {"repeats": 2, "placements": ["sticky", "prefix"]})
    assert len(cases) == 2 * 2 * 4 and {c.experiment for c in cases} == {"routing"}
    assert {(c.system, c.placement) for c in cases} == {(s, p) for s in ("standalone", "flame") for p in ("sticky", "prefix")}
    assert cases[0].trial_id == "routing-vllm-sticky-reuse-r0" and cases[0].stage == "vllm-sticky"
    assert [c.placement for c in cases[8:12]] != [c.placement for c in cases[:4]]  # rotated each repetition
    assert all(c.pair is None for c in cases)


def test_a_trace_setting_naming_none_of_the_traces_given_is_refused():
    """`--settings '{"trace": "nope"}'` ran the gc experiment on the last trace given, and its manifest named "nope"
    (an outsider's, 2026-12-07)."""
    from pathlib import Path

    from parity.errors import ParityError
    from parity.experiments.plan import pick_trace

    traces = [Path("t/no-reuse.json"), Path("t/reuse.json")]
    assert pick_trace(traces, "no-reuse", "gc.trace") == traces[0]
    with pytest.raises(ParityError, match=r"^gc.trace 'reuze' is none of the traces given \(no-reuse, reuse\)$"):
        pick_trace(traces, "reuze", "gc.trace")
