"""The client batcher: limits, formation window, splitting at the cap, per-request futures, failures."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from parity.errors import ParityError
from parity.flame import codec
from parity.flame.batcher import Batcher
from parity.flame.codec import encode_output
from parity.flame.settings import FlameSettings

MiB = 1024 * 1024


class FakeWorker:
    """One serialized executor: decodes each task, answers in order, records what it received."""

    def __init__(self, budget=4 * MiB, fail_on=None, reorder=False):
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.received: list[list[codec.Prompt]] = []
        self.budget, self.fail_on, self.reorder = budget, fail_on, reorder

    def _run(self, data: bytes) -> bytes:
        prompts = codec.decode(data, budget=self.budget)
        self.received.append(prompts)
        if self.fail_on and any(p.request_id == self.fail_on for p in prompts):
            raise RuntimeError("worker exploded")
        outputs = [{"request_id": p.request_id, "output_token_ids": [int(p.tokens[0])] * 16,
                    "prompt_tokens": int(p.tokens.size), "cached_tokens": 0} for p in prompts]
        if self.reorder:
            outputs.reverse()
        return encode_output(outputs, {"executor_id": "e1", "pid": 1, "gpu_uuid": "sim-0"}, {})

    def send(self, data: bytes) -> Future:
        return self.pool.submit(self._run, data)


def prompt(i: int, length: int = 100) -> np.ndarray:
    return np.full(length, i, dtype=np.uint32)


def test_batches_never_exceed_the_limit_and_every_prompt_is_answered_once():
    worker = FakeWorker()
    batcher = Batcher(worker.send, FlameSettings(batch_limit=8, window_ms=50))
    futures = [batcher.submit(f"r{i}", prompt(i)) for i in range(30)]
    results = [f.result(timeout=10) for f in futures]
    batcher.close()
    assert [r.request_id for r in results] == [f"r{i}" for i in range(30)]
    assert all(r.output_token_ids == [i] * 16 for i, r in enumerate(results))
    assert max(batcher.batch_sizes) <= 8 and sum(batcher.batch_sizes) == 30
    assert sorted(p.request_id for batch in worker.received for p in batch) == sorted(f"r{i}" for i in range(30))
    assert all(r.complete_s >= r.submit_s and r.worker["executor_id"] == "e1" for r in results)


def test_a_lone_prompt_leaves_after_the_window():
    batcher = Batcher(FakeWorker().send, FlameSettings(batch_limit=128, window_ms=50))
    start = time.monotonic()
    result = batcher.submit("only", prompt(1)).result(timeout=5)
    waited = time.monotonic() - start
    batcher.close()
    assert 0.04 <= waited < 2.0 and batcher.batch_sizes == [1]
    assert result.complete_s - result.submit_s >= 0.04  # formation is inside the latency


def test_a_full_batch_does_not_wait_for_the_window():
    batcher = Batcher(FakeWorker().send, FlameSettings(batch_limit=4, window_ms=5000))
    futures = [batcher.submit(f"r{i}", prompt(i)) for i in range(4)]
    start = time.monotonic()
    [f.result(timeout=5) for f in futures]
    assert time.monotonic() - start < 2.0
    batcher.close()


def test_large_batches_are_split_at_the_payload_budget():
    worker = FakeWorker(budget=2 * MiB)
    batcher = Batcher(worker.send, FlameSettings(batch_limit=128, window_ms=50, budget_mib=2))
    rng = np.random.default_rng(0)
    futures = [batcher.submit(f"r{i}", rng.integers(0, 128_256, 8035, dtype=np.uint32)) for i in range(128)]
    assert len([f.result(timeout=20) for f in futures]) == 128
    batcher.close()
    assert len(batcher.batch_sizes) >= 2 and sum(batcher.batch_sizes) == 128
    assert all(size <= codec.FLAME_MESSAGE_CAP for size in batcher.task_bytes)


def test_compressed_batches_round_trip_token_ids():
    worker = FakeWorker()
    batcher = Batcher(worker.send, FlameSettings(batch_limit=16, window_ms=10, compress=True))
    sent = {f"r{i}": prompt(i, 3000) for i in range(16)}
    [batcher.submit(rid, tokens).result(timeout=5) for rid, tokens in sent.items()]
    batcher.close()
    got = {p.request_id: p.tokens for batch in worker.received for p in batch}
    assert all(np.array_equal(got[rid], tokens) for rid, tokens in sent.items())


def test_a_failed_task_fails_each_of_its_prompts_loudly():
    batcher = Batcher(FakeWorker(fail_on="r2").send, FlameSettings(batch_limit=4, window_ms=20))
    futures = [batcher.submit(f"r{i}", prompt(i)) for i in range(8)]
    outcomes = []
    for f in futures:
        try:
            f.result(timeout=5)
            outcomes.append("ok")
        except ParityError as exc:
            outcomes.append(str(exc))
    batcher.close()
    assert outcomes[4:] == ["ok"] * 4
    assert all("worker exploded" in o for o in outcomes[:4])


def test_answers_out_of_order_are_refused():
    batcher = Batcher(FakeWorker(reorder=True).send, FlameSettings(batch_limit=2, window_ms=10))
    futures = [batcher.submit(f"r{i}", prompt(i)) for i in range(2)]
    with pytest.raises(ParityError, match="in place of"):
        futures[0].result(timeout=5)
    batcher.close()


def test_bad_settings_and_closed_batcher():
    with pytest.raises(ParityError):
        Batcher(FakeWorker().send, FlameSettings(batch_limit=0))
    batcher = Batcher(FakeWorker().send, FlameSettings())
    batcher.close()
    with pytest.raises(ParityError, match="closed"):
        batcher.submit("x", prompt(1))
