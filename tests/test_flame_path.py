"""The Flame path end to end on the CPU: stand-in cluster, real flamepy client, simulator engine in workers."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from parity.cli import main
from parity.manifest import read_manifest, validate_paths
from parity.trace import load_trace
from real_flame import real_flame  # tests/ is on sys.path


@pytest.fixture(scope="module")
def reuse_trace(small_reuse_trace):
    return small_reuse_trace


def cached(doc) -> float:
    return sum(r["cached_tokens"] for r in doc["records"]) / sum(r["prompt_tokens"] for r in doc["records"])


@pytest.fixture(scope="module")
def placements(reuse_trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("flame-run")
    result = CliRunner().invoke(main, ["flame", "run", "--placement", "global", "--placement", "sticky",
                                       "--trace", str(reuse_trace), "--batch-limit", "8", "--window-ms", "5",
                                       "--compress", "--gc-freeze", "--warmup-rounds", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, {p: read_manifest(out / f"locality-flame-{p}-reuse-r0.json") for p in ("global", "sticky")}


def test_both_placements_answer_every_request_with_the_right_tokens(placements, reuse_trace):
    _, docs = placements
    trace = load_trace(reuse_trace)
    for doc in docs.values():
        assert doc["simulated"] is True and doc["system"] == "flame" and doc["config"]["cluster"] == "stand-in"
        assert [r["input_sha256"] for r in doc["records"]] == [r.sha256 for r in trace.requests]
        assert all(len(r["output_token_ids"]) == 16 for r in doc["records"])
        assert max(doc["batch_sizes"]) <= 8 and sum(doc["batch_sizes"]) == len(trace.requests)


def test_sticky_sessions_keep_each_document_on_one_worker(placements):
    _, docs = placements
    workers = {}
    for r in docs["sticky"]["records"]:
        workers.setdefault(r["request_id"].split("-q")[0], set()).add(r["worker_id"])
    assert all(len(w) == 1 for w in workers.values())
    shard_gpu = {(r["shard"], r["gpu_uuid"]) for r in docs["sticky"]["records"]}
    assert len(shard_gpu) == 2 and len({g for _, g in shard_gpu}) == 2  # one GPU per shard
    assert cached(docs["sticky"]) > cached(docs["global"]) + 0.05


def test_global_session_spreads_work_over_two_workers(placements):
    _, docs = placements
    assert len({r["worker_id"] for r in docs["global"]["records"]}) == 2
    assert {r["shard"] for r in docs["global"]["records"]} == {0}


def test_workers_report_gc_freeze_and_pauses(placements):
    _, docs = placements
    batches = docs["sticky"]["batches"]
    assert batches and all(b["gc_frozen"] and b["gc_freeze_count"] > 0 and b["gc_pause_s"] >= 0 for b in batches)


def test_manifests_and_cleanup_receipt_are_valid(placements):
    out, _ = placements
    receipt = read_manifest(out / "cleanup-flame.json")
    assert receipt["clean"] is True
    checked, problems = validate_paths([out])
    assert problems == [] and checked >= 3


def test_placement_is_verified_from_executor_records(placements):
    _, docs = placements
    for doc in docs.values():
        assert doc["placement_verified"] is True
        listed = {e["executor_id"] for e in doc["executors"]}
        assert {r["worker_id"] for r in doc["records"]} <= listed


def test_a_record_from_an_unlisted_executor_fails_verification():
    from types import SimpleNamespace

    from parity.errors import ParityError
    from parity.flame.client import verify_placement

    result = SimpleNamespace(request_id="r0", worker={"executor_id": "e9"})
    with pytest.raises(ParityError, match="executor e9"):
        verify_placement([result], ["s0"], [{"executor_id": "e1", "session_id": "s0", "node": "n"}])


@real_flame
def test_the_same_client_and_service_against_real_flame(reuse_trace, tmp_path):
    result = CliRunner().invoke(main, ["flame", "run", "--cluster", "flame", "--placement", "sticky",
                                       "--trace", str(reuse_trace), "--batch-limit", "16", "--warmup-rounds", "1",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = read_manifest(tmp_path / "locality-flame-sticky-reuse-r0.json")
    assert doc["config"]["cluster"] == "flame-v0.6.0" and doc["placement_verified"] is True
    assert cached(doc) > 0.6
    assert read_manifest(tmp_path / "cleanup-flame.json")["clean"] is True


def test_a_relative_search_path_reaches_the_workers_absolute(tmp_path, monkeypatch):
    """Flame v0.6.0 starts a worker in its executor's own folder: `PYTHONPATH=src` must not change meaning there."""
    import os

    from parity.flame.client import absolute_search_paths

    monkeypatch.chdir(tmp_path)
    env = absolute_search_paths({"PYTHONPATH": f"src{os.pathsep}/opt/lib", "PATH": "/usr/bin", "OTHER": "x"})
    assert env == {"PYTHONPATH": f"{tmp_path / 'src'}{os.pathsep}/opt/lib", "PATH": "/usr/bin", "OTHER": "x"}


def test_an_empty_failure_report_is_named_not_shown_as_nothing(tmp_path, monkeypatch):
    """On a full disk a worker's failure report was created but left empty, and the run said only "a worker of session
    S failed: " (an outsider's, 2026-12-07): an empty report is named, with the likely cause."""
    from types import SimpleNamespace

    from parity.errors import ParityError
    from parity.flame.client import FlameSessions
    from parity.flame.service import FAILURE_DIR_ENV

    monkeypatch.setenv(FAILURE_DIR_ENV, str(tmp_path))
    (tmp_path / "s1.txt").write_text("")
    sessions = FlameSessions.__new__(FlameSessions)
    sessions.sessions = [SimpleNamespace(id="s1")]
    sessions.cluster = SimpleNamespace(unexpected_deaths=lambda: [])
    with pytest.raises(ParityError) as error:
        sessions.check_failures()
    assert str(error.value) == (f"a worker of session s1 failed: its failure report {tmp_path / 's1.txt'} is empty: "
                                "the worker could not write it (is the disk full?)")
