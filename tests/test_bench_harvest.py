"""`parity bench harvest` (parity.bench.harvest) on the stand-in with tiny counts: every phase runs (the memory
phase before and after rotation), the JSON holds each phase's spread, and the output says it ran on the stand-in
with a simulated engine. Nothing timed is asserted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.bench.harvest import cpu_per_task, spread
from parity.cli import main
from parity.errors import ParityError


def test_bench_harvest_on_the_stand_in_runs_every_phase_and_says_where(tmp_path):
    out = tmp_path / "harvest.json"
    tiny = ["--tasks", 30, "--rotate-tasks", 20, "--round-trips", 5, "--warmup", 2, "--requests", 3, "--repeats", 1,
            "--rate", 20, "--samples", 3, "--hold-ms", 0, "--hold-ms", 5]
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", *map(str, tiny), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "on the Flame STAND-IN (in-process, not Flame)" in result.output and "(simulated)" in result.output
    doc = json.loads(out.read_text())
    assert doc["cluster_kind"] == "standin" and doc["simulated_engine"] and doc["cleanup_clean"] and doc["complete"]
    assert doc["round_trip"]["round_trip_s"]["n"] == 5
    assert [c["hold_ms"] for c in doc["cycles"]] == [0, 5]
    for c in doc["cycles"]:  # the worker shares this host: every prompt's and token's wait is measured
        assert c["arrival_to_admitted_s"]["n"] == 3 and c["event_to_client_s"]["n"] == 3 * 16
        assert c["runs"][0]["tasks"] >= 3 and c["tasks_per_s"]["min"] > 0
        # what the path's own processes spend: this process (stand-in and client) and the worker, per task
        assert set(c["cpu"]) == {"stand-in (this process, with the client)", "worker (service and simulated engine)"}
        assert all(u["ms_per_task"] >= 0 and u["cores"] >= 0 for u in c["cpu"].values())
    assert "CPU per task (share of a core over the window): stand-in" in result.output
    for key in ("memory", "memory_rotating"):  # before and after: one session, then a fresh one every 20 tasks
        points = doc[key]["points"]
        assert points[0]["tasks"] == 0 and points[-1]["tasks"] == doc[key]["tasks"] >= 30
        assert all(p["rss_kib"]["stand-in (this process, with the client)"] > 0 for p in points)
    assert doc["memory"]["rotations"] == 0 and doc["memory_rotating"]["rotations"] >= 1
    assert (tmp_path / "harvest-work" / "cleanup-flame.json").exists()
    for key in ("memory", "memory_rotating"):  # a line through fewer than 3 samples is not a growth (outside pass Q)
        fitted = [g["bytes_per_task"] is not None for g in doc[key]["growth"].values()]
        assert all(fitted) if len(doc[key]["points"]) >= 3 else not any(fitted)
        if len(doc[key]["points"]) < 3:
            assert f"not fitted to {len(doc[key]['points'])} samples (give more --tasks)" in result.output


def test_bench_harvest_express_runs_each_hold_both_ways_side_by_side(tmp_path):
    out = tmp_path / "harvest.json"
    tiny = ["--tasks", 5, "--round-trips", 2, "--warmup", 1, "--requests", 4, "--repeats", 1, "--rate", 20,
            "--samples", 2, "--hold-ms", 5, "--express"]
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", *map(str, tiny), "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [(c["hold_ms"], c["express"]) for c in doc["cycles"]] == [(5, False), (5, True)]
    assert all(c["arrival_to_seen_s"]["n"] == 4 for c in doc["cycles"])
    assert "hold 5 ms, EXPRESS:" in result.output
    assert "express / as the arm ran, side by side: admission wait p99 " in result.output


def test_spread_gives_the_percentiles_and_range():
    s = spread(range(101))
    assert (s["n"], s["p50"], s["p90"], s["p99"], s["min"], s["max"]) == (101, 50, 90, 99, 0, 100)
    assert spread([]) is None


def test_real_flame_without_binaries_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("FLAME_BIN_DIR", raising=False)
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "flame", "--work-dir", str(tmp_path)])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith(
        "Error: no Flame binaries: give --flame-bin-dir (backend.flame_bin_dir) or set FLAME_BIN_DIR"), result.output


def test_an_empty_flame_bin_dir_is_refused_not_read_as_the_current_folder(tmp_path):
    for empty in ("", "  "):
        result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "flame", "--flame-bin-dir", empty,
                                           "--work-dir", str(tmp_path)])
        assert result.exit_code == 2 and "Invalid value for '--flame-bin-dir': is empty: name a folder" in \
            result.output, result.output


def test_cpu_per_task_leaves_out_a_process_gone_in_any_run():
    runs = [{"tasks": 10, "window_s": 2.0, "cpu_s": {"client": 0.02, "worker": None}},
            {"tasks": 30, "window_s": 2.0, "cpu_s": {"client": 0.06, "worker": 0.1}}]
    assert cpu_per_task(runs) == {"client": {"ms_per_task": pytest.approx(2.0), "cores": pytest.approx(0.02)}}
    assert cpu_per_task([]) == {}


def test_a_rate_no_stream_can_keep_is_refused_before_the_cluster_starts(tmp_path):
    """An outside tester's --rate 1e-300: the cluster started, then an OverflowError traceback left a partial
    result at --out with no mark; now the experiments' own pace check refuses it at the door, nothing written."""
    out = tmp_path / "h.json"
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", "--rate", "1e-300", "--requests", "2",
                                       "--out", str(out)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "longer than the 1 h a rung may take; raise the rate" in result.output
    assert not out.exists() and not (tmp_path / "h-work").exists()


def test_a_run_stopped_midway_leaves_a_result_that_says_it_is_partial(tmp_path, monkeypatch):
    """Saved after each phase by design, so a run that stops keeps what it measured, marked `complete: false`."""
    from parity.bench import harvest

    def stop(*args, **kwargs):
        raise RuntimeError("stopped in the first harvest cycle")

    monkeypatch.setattr(harvest, "cycle", stop)
    out = tmp_path / "h.json"
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", "--round-trips", "3", "--warmup", "1",
                                       "--hold-ms", "0", "--out", str(out)])
    assert result.exit_code != 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["round_trip"]["round_trip_s"]["n"] == 3 and "cycles" not in doc


def test_a_result_that_never_comes_is_given_up_on_as_soon_as_the_watch_sees_a_death():
    """With Flame's executor manager killed, a task stays pending: the bench waited minutes in silence (an outsider's,
    2026-12-07); it now looks at the cluster every second while it waits."""
    import time
    from concurrent.futures import Future

    from parity.bench.harvest import _result

    looked = []

    def watch():
        looked.append(time.monotonic())
        if len(looked) == 2:
            raise ParityError("flame-executor-manager (pid 1) died during the run: killed by SIGTERM")

    start = time.monotonic()
    with pytest.raises(ParityError, match="died during the run"):
        _result(Future(), 120, watch)
    assert time.monotonic() - start < 10 and len(looked) == 2
    done = Future()
    done.set_result("answer")
    assert _result(done, 1, watch) == "answer"


def test_a_work_dir_that_cannot_be_made_is_one_line_before_anything_starts(tmp_path):
    result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", "--work-dir", "/proc/x",
                                       "--tasks", "5", "--requests", "2", "--repeats", "1"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith("Error: /proc"), result.output
    assert "Traceback" not in result.output


def test_task_counts_past_the_bound_are_refused_before_anything_starts(tmp_path):
    """Each task's record is kept, so an unbounded count ran until memory ran out (outside pass I's nit)."""
    for option in ("--tasks", "--round-trips", "--warmup"):
        result = CliRunner().invoke(main, ["bench", "harvest", "--cluster", "standin", option, "1000001",
                                           "--work-dir", str(tmp_path / "w")])
        assert result.exit_code == 2 and "1000001 is not in the range" in result.output, result.output
        assert not (tmp_path / "w").exists()
