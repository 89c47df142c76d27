"""The prefix router's defining properties on each workload family, beside the study's router kept as it was."""

from __future__ import annotations

import numpy as np
import pytest

from parity.bench import routing
from parity.engine.sim import SimParams
from parity.routing import MODEL_REVISION, AffinityRouter, PrefixRouter, RouterSettings
from parity.routing.hashing import block_chain, fine_chain, token_words

PARAMS = SimParams.load()


def route(w: routing.Workload, **options) -> tuple[PrefixRouter, list[int]]:
    router = PrefixRouter(w.shards, MODEL_REVISION, cache_tokens=w.cache_tokens or PARAMS.kv_cache_tokens, **options)
    return router, [router.route(p) for p in w.prompts]


def test_the_chain_covers_full_blocks_of_the_whole_prompt_and_shares_exactly_the_shared_prefix():
    rng = np.random.default_rng(0)
    head, a, b = (rng.integers(0, 1000, n, dtype=np.uint32) for n in (600, 300, 300))
    x, y = block_chain(np.concatenate([head, a]), 1, 256), block_chain(np.concatenate([head, b]), 1, 256)
    assert len(x) == len(y) == 3 and x[:2] == y[:2] and x[2] != y[2]  # 512 shared tokens = 2 full blocks
    assert block_chain(head, 2, 256)[0] != block_chain(head, 1, 256)[0]  # salted
    with pytest.raises(ValueError, match="empty"):
        block_chain(np.array([], dtype=np.uint32), 1)


def test_engine_block_hashes_match_exactly_as_far_as_two_prompts_share_a_block_and_count_toward_the_hit():
    """Past the deepest shared block, what two prompts share of the next is counted in whole engine blocks (16
    tokens): its fine hashes are equal exactly that far. They are the block's own (the router keeps them under the
    prefix's chain hash), so the same block content after another prefix hashes alike but is never looked up there."""
    rng = np.random.default_rng(1)
    head, x, y = rng.integers(0, 1000, 256 + 40, dtype=np.uint32), *(rng.integers(1000, 2000, 300, dtype=np.uint32)
                                                                       for _ in range(2))
    a, b = np.concatenate([head, x]), np.concatenate([head, y])  # block 1 shares 40 tokens: 2 whole engine blocks
    fa, fb = fine_chain(token_words(a), 1, 256), fine_chain(token_words(b), 1, 256)
    assert len(fa) == len(fb) == 15 and fa[:2] == fb[:2] and all(p != q for p, q in zip(fa[2:], fb[2:]))
    other = np.concatenate([rng.integers(0, 1000, 256, dtype=np.uint32), a[256:]])  # block 1's tokens, another head
    assert fine_chain(token_words(other), 1, 256) == fa
    router = PrefixRouter(2, MODEL_REVISION, cache_tokens=PARAMS.kv_cache_tokens)
    assert router.route(a) == 0
    assert router.quote(b).held(0) == 256 + 32 and router.quote(other).held(0) == 0


@pytest.mark.parametrize("follow", [False, True])  # evicting as modelled; following engine events instead
def test_the_block_map_is_always_what_each_shard_holds(follow):
    """Each block's holders (a bit per shard, updated as chains are remembered, evicted, stored and removed) must
    be exactly the shards whose LRU map holds it, as if recomputed from those maps after every decision."""
    import queue

    w = routing.documents("t", "t", docs=30, questions=3, prefix_tokens=2000, shards=4, seed=2, head_tokens=512)
    router = PrefixRouter(4, MODEL_REVISION, cache_tokens=30 * 256)  # a small cache: evictions; a shared head
    changes: queue.SimpleQueue = queue.SimpleQueue()
    if follow:
        router.follow(changes)
    routed = []
    for i, prompt in enumerate(w.prompts):
        if follow and i % 3 == 2:  # the engine drops an earlier prompt's chain and stores another's elsewhere
            chain = block_chain(w.prompts[i // 2], router.salt, router.block_tokens)
            changes.put((routed[i // 2], "removed", chain))
            changes.put(((routed[i // 3] + 1) % 4, "stored", block_chain(w.prompts[i // 3], router.salt)))
        routed.append(router.route(prompt))
        recomputed: dict[int, int] = {}
        for shard, held in enumerate(router._held):
            for block in held:
                recomputed[block] = recomputed.get(block, 0) | 1 << shard
        assert router._holders == recomputed
        if not follow:  # as modelled, a shard's blocks of a chain are a prefix of it (evicted deepest first):
            # `_depths` then takes a held last block for the whole chain, and `_remember` adds past the deepest at
            # C speed
            for prompt in w.prompts[: i + 1]:
                chain = block_chain(prompt, router.salt, router.block_tokens)
                for held in router._held:
                    inside = [block in held for block in chain]
                    assert inside == sorted(inside, reverse=True)
    assert router.stats()["evicted_blocks"] > 0


def test_an_engine_event_removing_a_block_in_the_middle_of_a_chain_keeps_the_block_map_whole():
    """Found by a review of the router (2026-12-05): an engine may drop a block inside a held chain; routed there
    again, the router took the chain's leading blocks as held (its bisection does not see the gap), left the
    recomputed block out of the block map, and the engine's next removal of it raised KeyError in `_drop`."""
    import queue

    rng = np.random.default_rng(0)
    doc = rng.integers(0, 30000, 4000, dtype=np.uint32)
    router = PrefixRouter(2, MODEL_REVISION, cache_tokens=880_000)
    changes: queue.SimpleQueue = queue.SimpleQueue()
    router.follow(changes)
    chain = block_chain(doc, router.salt, router.block_tokens)
    shard = router.route(doc)
    changes.put((shard, "removed", [chain[3]]))
    assert router.route(doc) == shard  # the engine computes block 3 again
    assert router._holders[chain[3]] == 1 << shard
    changes.put((shard, "removed", [chain[3]]))
    router.route(doc)
    assert all(router._holders.get(block, 0) >> s & 1 for s, held in enumerate(router._held) for block in held)


def test_the_study_burst_splits_evenly_with_every_document_on_one_shard():
    w = routing.documents("study-reuse", "", docs=16, questions=4, prefix_tokens=2000, seed=1)
    _, shard_of = route(w)
    assert [shard_of.count(s) for s in (0, 1)] == [32, 32]
    per_doc = routing.shards_per_document(w, shard_of)
    assert all(len(s) == 1 for s in per_doc.values())
    assert sorted(len([d for d, s in per_doc.items() if shard in s]) for shard in (0, 1)) == [8, 8]


@pytest.mark.parametrize("head", [256, 1024, 4096])
def test_a_shared_system_prompt_does_not_pull_every_request_to_one_shard(head):
    w = routing.documents("shared-head", "", docs=16, questions=4, prefix_tokens=2000, head_tokens=head, seed=2)
    study = AffinityRouter(2, MODEL_REVISION)
    assert {study.route(p) for p in w.prompts} == {0}  # the study's router: any match decides
    router, shard_of = route(w)
    loads = router.loads
    assert max(loads) / min(loads) - 1 < 0.10  # work within 10%
    assert all(len(s) == 1 for s in routing.shards_per_document(w, shard_of).values())


def test_a_hot_document_is_replicated_to_the_second_of_two_shards_and_others_stay_put():
    counts = [600] + [2] * 10  # one document asked 600 times, ten asked twice
    w = routing.documents("zipf", "", docs=len(counts), questions=counts, prefix_tokens=2000, seed=3)
    router, shard_of = route(w)
    per_doc = routing.shards_per_document(w, shard_of)
    assert per_doc[0] == {0, 1} and router.stats()["replicated"] >= 1
    assert sum(len(s) > 1 for d, s in per_doc.items() if d) <= 1  # cold documents are not spread
    simulated = {p: routing.simulate(w, routing.place(w, p, PARAMS)[0], PARAMS)["requests_per_s"]
                 for p in ("alternating", "sticky", "prefix")}
    assert simulated["prefix"] > simulated["sticky"] and simulated["prefix"] >= simulated["alternating"]


def test_a_working_set_over_the_cache_is_forgotten_oldest_first_and_said():
    w = routing.documents("working-set", "", docs=12, questions=2, prefix_tokens=1024, seed=4, cache_tokens=4 * 1024)
    router, _ = route(w)
    stats = router.stats()
    assert stats["overflowed"] and stats["evicted_blocks"] > 0
    assert all(held <= stats["capacity_blocks"] for held in stats["held_blocks"])
    roomy, _ = route(routing.documents("working-set", "", docs=12, questions=2, prefix_tokens=1024, seed=4,
                                       cache_tokens=64 * 1024))
    assert not roomy.stats()["overflowed"]
    assert stats["expected_cached_tokens"] < roomy.stats()["expected_cached_tokens"]  # it stopped promising hits


def test_many_shards_are_all_used_and_documents_stay_whole():
    w = routing.documents("shards", "", docs=8 * 16, questions=4, prefix_tokens=2000, shards=16, seed=5)
    _, shard_of = route(w)
    assert set(shard_of) == set(range(16))
    assert all(len(s) == 1 for s in routing.shards_per_document(w, shard_of).values())


def test_load_is_released_when_a_request_completes_and_hits_are_observed():
    w = routing.documents("study-reuse", "", docs=2, questions=2, prefix_tokens=600, seed=6)
    router, _ = route(w)
    before = sum(router.loads)
    router.complete(0)
    router.complete(0)  # once only
    assert sum(router.loads) < before
    simulated = routing.simulate(w, routing.place(w, "prefix", PARAMS)[0], PARAMS)
    router.observe([592, 0, 0, 592])  # each document's second question hits its 600-token prefix, whole 16-token blocks
    stats = router.stats()
    assert stats["realized_cached_tokens"] == simulated["cached_tokens"] == stats["expected_cached_tokens"] == 1184
    assert sorted(router.expected) == [0, 0, 592, 592]
    with pytest.raises(ValueError, match="observed 1 requests, routed 4"):
        router.observe([0])


def test_the_study_router_is_still_the_default_and_prefix_is_its_own_placement():
    assert RouterSettings().placement == "sticky" and isinstance(RouterSettings().make(2), AffinityRouter)
    assert isinstance(RouterSettings("prefix").make(2), PrefixRouter)


def test_every_family_is_offered_and_each_row_compares_all_placements():
    from click.testing import CliRunner

    from parity.cli.bench_placing import bench_routing

    assert {w.family for w in routing.families(quick=True)} == set(routing.FAMILIES)
    option = next(p for p in bench_routing.params if p.name == "only")
    assert tuple(option.type.choices) == routing.FAMILIES
    result = CliRunner().invoke(bench_routing, ["--quick", "--family", "study-reuse"])
    assert result.exit_code == 0, result.output
    assert "study-reuse" in result.output and "p99" in result.output and "shards" not in result.output.split("\n")[1]


def test_a_prompt_shorter_than_a_block_goes_to_the_least_loaded_shard():
    router = PrefixRouter(2, MODEL_REVISION, cache_tokens=1 << 20)
    long = np.arange(1000, dtype=np.uint32)
    assert router.route(long) == 0
    assert router.route(np.arange(100, dtype=np.uint32)) == 1  # no full block: nothing to match, least loaded
    assert router.stats()["expected_cached_tokens"] == 0


def test_the_prefix_router_is_sized_from_the_engines_cache_and_says_when_it_outgrew_it(small_reuse_trace, tmp_path):
    from parity import trial
    from parity.engine.sim import SimEngine, SimParams
    from parity.paths.engine import EnginePath

    small = SimParams(kv_cache_tokens=4 * 1024)  # far less than the trace's prefixes
    lines = []
    doc = trial.run(EnginePath(SimEngine(params=small)), small_reuse_trace, tmp_path, trial_id="t", experiment="engine",
                    router=RouterSettings("prefix"), warmup_rounds=0, log=lines.append)
    assert doc["router"]["capacity_blocks"] == 4 * 1024 // 256 and doc["router"]["overflowed"]
    assert any("outgrew the engine's cache (4,096 tokens)" in line for line in lines)
    roomy = trial.run(EnginePath(SimEngine()), small_reuse_trace, tmp_path, trial_id="u", experiment="engine",
                      router=RouterSettings("prefix"), warmup_rounds=0, log=lines.append)
    assert roomy["router"]["capacity_blocks"] == SimParams.load().kv_cache_tokens // 256
    assert not roomy["router"]["overflowed"] and roomy["router"]["realized_cached_tokens"]


def test_a_completion_from_another_thread_is_released_before_the_next_decision():
    import threading

    router = PrefixRouter(2, MODEL_REVISION, cache_tokens=1 << 20)
    a, b = np.arange(3000, dtype=np.uint32), np.arange(3000, dtype=np.uint32) + 50_000
    assert (router.route(a), router.route(b)) == (0, 1)
    thread = threading.Thread(target=router.complete, args=(0,))  # a reply callback's thread
    thread.start()
    thread.join()
    assert router.loads[0] == 0 and router.loads[1] > 0
    assert router.route(np.arange(2000, dtype=np.uint32) + 90_000) == 0  # shard 0 is idle again


def test_explain_says_why_each_decision_went_where_it_did_and_changes_none():
    """One line per decision (issue 31's --explain): a new document goes to the least loaded shard, its next
    question is a hit on that shard (what it holds, each weighed shard's load and cost); asking changes nothing."""
    from parity.bench.routing import Workload, explain, place
    from parity.engine.sim import SimParams

    rng = np.random.default_rng(3)
    doc_a, doc_b = rng.integers(0, 30000, 1024), rng.integers(0, 30000, 1024)
    prompts = [np.concatenate([d, rng.integers(0, 30000, 24)]) for d in (doc_a, doc_b, doc_a, doc_b)]
    w = Workload("test", "two docs", prompts, [0, 1, 0, 1], 2)
    params = SimParams()
    lines = explain(w, params, 4)
    assert lines[0].startswith("test: two docs (4 requests, 2 shards)") and len(lines) == 5
    assert "-> shard 0 (new: the least loaded): s0 holds 0, load 0" in lines[1]
    assert "-> shard 1 (new: the least loaded)" in lines[2]
    assert "-> shard 0 (a hit): s0 holds 1,024" in lines[3] and "\n" not in "".join(lines)
    assert place(w, "prefix", params)[0] == [0, 1, 0, 1]


def test_a_decision_leaves_nothing_for_the_garbage_collector():
    """A quote kept its cost function as a closure over itself: a reference cycle per decision (~14 objects), freed
    only by the cyclic collector, whose pauses then set the router's p99 (or, paused, its memory grows). Now every
    decision's objects are freed as it ends, with replication and growth booking in play (a hot document)."""
    import gc

    w = routing.documents("hot-doc", "", docs=9, questions=[40] + [3] * 8, prefix_tokens=1000, shards=4, seed=8)
    router = PrefixRouter(w.shards, MODEL_REVISION, cache_tokens=PARAMS.kv_cache_tokens)
    gc.collect()
    gc.disable()
    try:
        for prompt in w.prompts:
            router.explain(router.quote(prompt))
            router.route(prompt)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert router.stats()["replicated"] > 0
