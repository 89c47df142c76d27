"""The Flame service on its own: batch in, outputs in order with worker identity, GC freeze handled once."""

from __future__ import annotations

import gc
import json

import flamepy
import numpy as np
import pytest

from parity.engine.sim import output_tokens
from parity.errors import ParityError
from parity.flame import codec, service
from parity.flame.codec import decode_output
from parity.flame.service import ParityService
from parity.gpu_lock import lease
from parity.trace import token_sha256


def session(common: dict):
    return flamepy.SessionContext(_common_data=json.dumps(common).encode(), session_id="s0",
                                  application=flamepy.ApplicationContext(name="parity-gpu0"))


def batch(n=4, length=300, compress=False):
    rng = np.random.default_rng(0)
    prompts = [codec.Prompt(f"r{i}", rng.integers(0, 8000, length, dtype=np.uint32)) for i in range(n)]
    return prompts, codec.encode(prompts, compress=compress)


@pytest.mark.parametrize("order", ["arrival", "prefix"])
def test_task_outputs_in_input_order_with_identity(lock_dir, order):
    svc = ParityService()
    svc.on_session_enter(session({"engine": "sim", "flame": {"budget_mib": 1, "order": order}}))
    try:
        prompts, data = batch(compress=True)
        doc = decode_output(svc.on_task_invoke(flamepy.TaskContext(task_id="1", session_id="s0", input=data)))
        assert [o["request_id"] for o in doc["outputs"]] == [p.request_id for p in prompts]
        assert all(o["output_token_ids"] == output_tokens(p.tokens, 128_256) for o, p in zip(doc["outputs"], prompts))
        assert all(o["input_sha256"] == token_sha256(p.tokens) for o, p in zip(doc["outputs"], prompts))
        assert doc["worker"]["executor_id"] == "exec-7" and doc["worker"]["gpu_uuid"] == "sim-0"
        assert doc["timings"]["prompts"] == 4 and doc["timings"]["engine_s"] > 0
        assert doc["timings"]["order"] == order
    finally:
        svc.on_session_leave()


def test_an_unknown_admission_order_fails_the_bind(lock_dir):
    svc = ParityService()
    with pytest.raises(ParityError, match="unknown admission order 'random'"):
        svc.on_session_enter(session({"engine": "sim", "flame": {"order": "random"}}))
    svc.on_session_leave()


def test_over_budget_task_fails_with_a_clear_error(lock_dir):
    svc = ParityService()
    svc.on_session_enter(session({"engine": "sim", "flame": {"budget_mib": 1000 / 2**20}}))
    try:
        with pytest.raises(codec.PayloadError, match="over the payload budget of 1000"):
            svc.on_task_invoke(flamepy.TaskContext(task_id="1", session_id="s0", input=batch()[1]))
    finally:
        svc.on_session_leave()


def test_startup_heap_freeze_is_counted_once_and_undone(lock_dir, monkeypatch):
    calls = []
    real = gc.get_freeze_count
    monkeypatch.setattr(gc, "get_freeze_count", lambda: calls.append(1) or real())
    svc = ParityService()
    svc.on_session_enter(session({"engine": "sim", "flame": {"gc_freeze": True}}))
    try:
        assert real() > 0
        for task in range(3):
            doc = decode_output(svc.on_task_invoke(flamepy.TaskContext(task_id=str(task), session_id="s0", input=batch()[1])))
            assert doc["timings"]["gc_frozen"] is True and doc["timings"]["gc_freeze_count"] > 0
        assert len(calls) == 1  # never per batch: it walks the permanent heap
    finally:
        svc.on_session_leave()
    assert real() == 0


def test_two_workers_lease_different_gpus(lock_dir):
    lock_dir.mkdir()
    first = lease(["sim-0", "sim-1"], lock_dir)
    second = lease(["sim-0", "sim-1"], lock_dir)  # flock is per open file, as between processes
    assert (first.gpu, second.gpu) == ("sim-0", "sim-1")
    with pytest.raises(ParityError, match="no free GPU"):
        lease(["sim-0", "sim-1"], lock_dir)
    first.release()
    assert lease(["sim-0", "sim-1"], lock_dir).gpu == "sim-0"  # released with its holder


def test_no_gpu_list_is_an_error(lock_dir, monkeypatch):
    monkeypatch.delenv("PARITY_GPUS")
    with pytest.raises(ParityError, match="PARITY_GPUS"):
        ParityService().on_session_enter(session({"engine": "sim"}))


def test_a_failed_session_enter_is_left_for_the_client_but_a_surplus_worker_is_not(lock_dir, tmp_path, monkeypatch):
    failures = tmp_path / "failures"
    monkeypatch.setenv(service.FAILURE_DIR_ENV, str(failures))
    with pytest.raises(ParityError, match="simulator parameters not found"):
        ParityService().on_session_enter(session({"engine": "sim", "sim_params": str(tmp_path / "missing.yaml")}))
    assert "simulator parameters not found" in (failures / "s0.txt").read_text()
    (failures / "s0.txt").unlink()

    monkeypatch.setenv("PARITY_GPUS", "sim-0")
    holder = ParityService()
    holder.on_session_enter(session({"engine": "sim"}))
    try:
        with pytest.raises(service.GpuBusy):
            ParityService().on_session_enter(session({"engine": "sim"}))
        assert not failures.exists() or not any(failures.iterdir())  # Flame releases it; nothing to report
    finally:
        holder.on_session_leave()
    again = ParityService()
    again.on_session_enter(session({"engine": "sim"}))  # the lease was given back on leave
    again.on_session_leave()


def test_a_deep_temp_dir_is_replaced_by_tmp(monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", "/" + "deep/" * 20)
    monkeypatch.setattr(tempfile, "tempdir", "/" + "deep/" * 20)
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    service.short_temp_dir()
    assert tempfile.gettempdir() == "/tmp" and service.os.environ["VLLM_RPC_BASE_PATH"] == "/tmp"
