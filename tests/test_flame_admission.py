"""The adapter's admission order: a permutation that puts prompts sharing a prefix side by side."""

from __future__ import annotations

import numpy as np
import pytest

from parity.engine import EngineArgs
from parity.engine.sim import SimEngine, SimParams
from parity.errors import ParityError
from parity.flame.admission import admission_order


def burst(documents=12, questions=4, prefix=1200, seed=0):
    """A reuse burst in which each document's later questions arrive long after its first."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 8000, prefix, dtype=np.uint32) for _ in range(documents)]
    prompts = [np.concatenate([docs[d], rng.integers(0, 8000, 40, dtype=np.uint32)])
               for q in range(questions) for d in range(documents)]
    return prompts, [d for q in range(questions) for d in range(documents)]


def test_arrival_keeps_the_order_and_prefix_groups_siblings():
    prompts, doc_of = burst()
    assert admission_order(prompts, "arrival") == list(range(len(prompts)))
    order = admission_order(prompts, "prefix")
    assert sorted(order) == list(range(len(prompts)))
    grouped = [doc_of[i] for i in order]
    assert all(grouped[k] == grouped[k - k % 4] for k in range(len(grouped)))  # runs of one document


def test_equal_prompts_keep_arrival_order_and_an_unknown_order_is_an_error():
    same = [np.array([5, 6, 7], dtype=np.uint32)] * 3
    assert admission_order(same + [np.array([1], dtype=np.uint32)], "prefix") == [3, 0, 1, 2]
    assert admission_order([], "prefix") == []
    with pytest.raises(ParityError, match="unknown admission order"):
        admission_order(same, "shortest")


def test_prefix_order_fills_engine_steps_that_arrival_order_leaves_nearly_empty():
    """In the simulator (vLLM's scheduler, simplified) with max_num_seqs capping the running set:
    same cache hits, fewer steps, a shorter burst."""
    prompts, _ = burst()
    args = EngineArgs(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=4096)

    def run(order):
        engine = SimEngine(args, SimParams.load(), clock="virtual", mode="async")
        start = engine.now()
        done = engine.generate([prompts[i] for i in admission_order(prompts, order)])
        return (max(c.complete_s for c in done) - start, engine.scheduler.work_totals["steps"],
                sum(c.cached_tokens for c in done))

    arrival, prefix = run("arrival"), run("prefix")
    assert prefix[2] == arrival[2] > 0
    assert prefix[1] < arrival[1] and prefix[0] < arrival[0]
