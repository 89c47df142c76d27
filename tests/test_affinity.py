"""Prefix-affinity routing: identity properties, bounded map, balance, and the alternating policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.affinity import (
    BLOCK_TOKENS,
    DEPTH_TOKENS,
    AffinityRouter,
    AlternatingRouter,
    make_router,
    prefix_identities,
)
from parity.bench import router as router_bench

REV = "a2856192dd7c25b842431f39c179a6c2c2f627d1"
fast = settings(max_examples=40, deadline=None)
token = st.integers(min_value=0, max_value=2**32 - 1)


def prompt(seed: int, length: int = 1300) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 128_000, length, dtype=np.uint32)


@fast
@given(seed=st.integers(0, 10_000), suffix_a=st.lists(token, max_size=50), suffix_b=st.lists(token, max_size=50))
def test_same_prefix_same_identity_and_shard(seed, suffix_a, suffix_b):
    head = prompt(seed, DEPTH_TOKENS)
    a = np.concatenate([head, np.array(suffix_a, dtype=np.uint32)])
    b = np.concatenate([head, np.array(suffix_b, dtype=np.uint32)])
    assert prefix_identities(a, REV) == prefix_identities(b, REV)
    router = AffinityRouter(2, REV)
    router.route(prompt(seed + 1))  # make shard 1 the least loaded for the next unseen prefix
    assert router.route(a) == router.route(b)


@fast
@given(seed=st.integers(0, 10_000), position=st.integers(0, DEPTH_TOKENS - 1), delta=st.integers(1, 1000))
def test_change_inside_first_1024_tokens_changes_identity(seed, position, delta):
    base = prompt(seed)
    changed = base.copy()
    changed[position] = (int(changed[position]) + delta) % 2**32
    ids_a, ids_b = prefix_identities(base, REV), prefix_identities(changed, REV)
    block = position // BLOCK_TOKENS
    assert ids_a[:block] == ids_b[:block]
    assert all(x != y for x, y in zip(ids_a[block:], ids_b[block:]))


@fast
@given(seed=st.integers(0, 10_000), position=st.integers(DEPTH_TOKENS, 1299))
def test_change_after_1024_tokens_changes_nothing(seed, position):
    base = prompt(seed)
    changed = base.copy()
    changed[position] += 1
    assert prefix_identities(base, REV) == prefix_identities(changed, REV)


@fast
@given(seed=st.integers(0, 10_000), other=st.text(min_size=1, max_size=40))
def test_revision_salt_changes_every_hash(seed, other):
    if other == REV:
        return
    a, b = prefix_identities(prompt(seed), REV), prefix_identities(prompt(seed), other)
    assert len(a) == 4 and all(x != y for x, y in zip(a, b))


def test_list_and_array_inputs_agree():
    p = prompt(3)
    assert prefix_identities(p, REV) == prefix_identities(p.tolist(), REV)
    assert len(prefix_identities(p[:300], REV)) == 2
    with pytest.raises(ValueError):
        prefix_identities([], REV)


@fast
@given(stream=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 1200)), min_size=1, max_size=120),
       capacity=st.integers(1, 12))
def test_map_never_exceeds_its_bound(stream, capacity):
    router = AffinityRouter(3, REV, capacity=capacity)
    for doc, length in stream:
        router.route(prompt(doc, length))
        assert router.map_size <= capacity


@fast
@given(lengths=st.lists(st.integers(7900, 8100), min_size=2, max_size=64), shards=st.integers(2, 4))
def test_no_reuse_work_is_balanced(lengths, shards):
    router = AffinityRouter(shards, REV)
    for i, length in enumerate(lengths):
        router.route(prompt(10_000 + i, length))
    assert max(router.loads) - min(router.loads) <= max(lengths)


def test_reuse_burst_keeps_documents_on_one_shard():
    rng = np.random.default_rng(0)
    docs = [prompt(d, 8000) for d in range(64)]
    requests = [(d, np.concatenate([docs[d], rng.integers(0, 128_000, 12, dtype=np.uint32)]))
                for d in range(64) for _ in range(4)]
    router = AffinityRouter(2, REV)
    shard_of: dict[int, set[int]] = {}
    for i in rng.permutation(len(requests)):
        d, p = requests[i]
        shard_of.setdefault(d, set()).add(router.route(p))
    assert all(len(s) == 1 for s in shard_of.values())
    per_shard = [sum(1 for s in shard_of.values() if s == {k}) for k in (0, 1)]
    assert min(per_shard) >= 26  # unseen documents go to the less-loaded shard
    stats = router.stats()
    assert stats["hits"] == 192 and stats["misses"] == 64


def test_lru_eviction_forgets_the_oldest_prefix():
    router = AffinityRouter(2, REV, capacity=4)  # one 1,024-token prompt fills the map
    a, b = prompt(1, 2000), prompt(2, 2000)
    assert router.route(a) == 0
    assert router.route(b) == 1
    assert router.map_size == 4
    assert router.stats()["hits"] == 0
    router.route(a)  # a was evicted by b: treated as unseen again, goes to the least-loaded shard
    assert router.stats()["hits"] == 0


def test_alternating_is_round_robin():
    router = AlternatingRouter(2)
    assert [router.route(prompt(0, 10)) for _ in range(5)] == [0, 1, 0, 1, 0]
    assert router.stats()["requests"] == 5


def test_make_router():
    assert isinstance(make_router("sticky", 2, REV), AffinityRouter)
    assert isinstance(make_router("alternating", 2), AlternatingRouter)
    with pytest.raises(ValueError, match="alternating, sticky"):
        make_router("random", 2)
    with pytest.raises(ValueError):
        AffinityRouter(0, REV)


def test_router_benchmark_reports_a_ratio():
    result = router_bench.run(num_requests=16, repeats=1)
    assert result["route_us_per_request"] > 0 and result["hash_us_per_request"] > 0
    assert result["ratio_route_to_hash"] == result["route_us_per_request"] / result["hash_us_per_request"]
