"""vLLM's KV cache events read back into the prefix router's map: the same block hashes, kept in step."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import zmq

from parity import kv_events
from parity.errors import ParityError
from parity.routing import MODEL_REVISION, PrefixRouter
from parity.routing.hashing import block_chain


def stored(hashes, parent, tokens) -> list:
    """A BlockStored event as vLLM encodes it: a tagged array, then fields by position (0.28 adds more)."""
    return ["BlockStored", list(hashes), parent, [int(t) for t in tokens], 16, None, "GPU"]


def batch(*events) -> bytes:
    return msgspec.msgpack.encode([time.time(), list(events)])


def engine_blocks_of(tokens: np.ndarray, first_hash: int = 1000) -> tuple[list[int], list[np.ndarray]]:
    count = len(tokens) // 16
    return [first_hash + k for k in range(count)], [tokens[16 * k: 16 * (k + 1)] for k in range(count)]


def test_the_engines_blocks_give_back_exactly_the_routers_block_hashes():
    tokens = np.random.default_rng(0).integers(0, 128_000, 1000, dtype=np.uint32)
    hashes, pieces = engine_blocks_of(tokens)
    blocks = kv_events.EngineBlocks(salt=12345)
    first = blocks.stored(hashes[:20], None, np.concatenate(pieces[:20]), 16)  # two events, linked by parent
    rest = blocks.stored(hashes[20:], hashes[19], np.concatenate(pieces[20:]), 16)
    assert first + rest == block_chain(tokens, 12345)[: len(tokens) // 256]
    assert blocks.removed([hashes[15], hashes[16]]) == [first[0]]  # the engine block that ended router block 0
    assert blocks.stored([9999], 424242, pieces[0], 16) == [] and blocks.orphans == 1  # parent never announced


def test_the_router_follows_what_the_engine_stored_and_evicted():
    router = PrefixRouter(2, MODEL_REVISION, cache_tokens=1 << 20)
    tokens = np.random.default_rng(1).integers(0, 128_000, 2048, dtype=np.uint32)
    hashes, pieces = engine_blocks_of(tokens)
    blocks, changes = kv_events.EngineBlocks(router.salt), kv_events.queue.SimpleQueue()
    router.follow(changes)
    router.route(np.arange(5000, dtype=np.uint32))  # shard 0 busier than shard 1
    changes.put((1, "stored", blocks.stored(hashes, None, tokens, 16)))  # shard 1's engine holds the document
    assert router.route(np.concatenate([tokens, np.arange(40, dtype=np.uint32)])) == 1
    assert router.stats()["expected_cached_tokens"] == 2048 and router.stats()["engine_changes"] == {"stored": 1}
    changes.put((1, "removed", blocks.removed(hashes)))  # evicted: the map forgets it
    changes.put((0, "cleared", []))
    router.route(np.arange(300, dtype=np.uint32) + 7)
    assert router.stats()["held_blocks"] == [0, 1]  # shard 0 cleared; shard 1 only what it routed since


def test_a_subscriber_reads_each_shards_stream_and_says_when_one_is_silent():
    sub = kv_events.Subscriber(2, salt=7)  # binds; each engine's PUB connects, as vLLM's does to a non-* endpoint
    context = zmq.Context()
    publishers = []
    for endpoint in sub.endpoints:
        assert endpoint.startswith("tcp://127.0.0.1:")
        pub = context.socket(zmq.PUB)
        pub.connect(endpoint)
        publishers.append(pub)
    try:
        tokens = np.random.default_rng(2).integers(0, 128_000, 512, dtype=np.uint32)
        hashes, _ = engine_blocks_of(tokens)
        deadline = time.monotonic() + 10
        while not sub.counts[0] and time.monotonic() < deadline:  # a SUB socket misses what precedes its join
            publishers[0].send_multipart([b"kv", (0).to_bytes(8, "big"), batch(stored(hashes, None, tokens))])
            time.sleep(0.05)
        assert sub.counts[0]["BlockStored"] >= 1
        with pytest.raises(ParityError, match=r"no KV cache events arrived from shard\(s\) 1"):
            sub.check()
        shard, kind, changed = sub.changes.get(timeout=5)
        assert (shard, kind, changed) == (0, "stored", block_chain(tokens, 7))
        assert sub.stats()["events"][0]["BlockStored"] >= 1 and sub.stats()["events"][1] == {}
    finally:
        sub.close()
        for pub in publishers:
            pub.close(0)
        context.term()


BOMB = b"\x92\xcb" + bytes(8) + b"\x91" * 1_000_000 + b"\xc0"  # [ts, [[[[...a million arrays deep...]]]]]


def test_a_batch_that_is_not_vllms_is_refused_in_one_line(monkeypatch):
    with pytest.raises(ParityError, match="not vLLM's EventBatch"):
        kv_events.decode(b"\x00garbage")
    with pytest.raises(ParityError, match="recursion bomb"):
        kv_events.decode(BOMB)
    monkeypatch.setattr(kv_events, "MAX_PAYLOAD", 10)
    with pytest.raises(ParityError, match="refused unread"):
        kv_events.decode(batch(stored([1], None, range(16))))
    with pytest.raises(ParityError, match="token IDs that are not"):
        kv_events.EngineBlocks(1).stored([1], None, ["a"] * 16, 16)
    with pytest.raises(ParityError, match="block hashes that are not"):
        kv_events.EngineBlocks(1).removed(5)
    with pytest.raises(ParityError, match="blocks of 16"):
        kv_events.EngineBlocks(1).stored([1], None, list(range(32)), 32)
    assert '"endpoint": "tcp://127.0.0.1:5557"' in kv_events.config_json("tcp://127.0.0.1:5557")


def test_events_encoded_as_maps_are_read_by_field_name():
    payload = msgspec.msgpack.encode({"ts": 1.0, "events": [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "lora_id": None}, {"type": "AllBlocksCleared"}]})
    assert kv_events.decode(payload) == [("BlockStored", [[1], None, list(range(16)), 16]), ("AllBlocksCleared", [])]


def drained(sub: kv_events.Subscriber) -> list[tuple]:
    out = []
    while not sub.changes.empty():
        out.append(sub.changes.get())
    return out


def test_the_simulator_publishes_what_it_caches_and_evicts_as_vllm_does(small_reuse_trace):
    from parity.engine.sim import SimEngine, SimParams
    from parity.trace import load_trace

    prompts = list(load_trace(small_reuse_trace).prompts)[:8]  # two documents, four questions each
    sub = kv_events.Subscriber(1, salt=99)
    engine = SimEngine(kv_events=sub.endpoints[0])
    try:
        engine.generate(prompts)
        sub.settle(quiet_s=1.0)  # a loaded CI core can hold the subscriber thread back
        stored = {h for _, kind, hashes in drained(sub) if kind == "stored" for h in hashes}
        assert stored == {h for p in prompts for h in block_chain(p, 99)}  # every full router block, as routed
        assert sub.held() == [len(stored)] and sub.stats()["gaps"] == [0] and sub.stats()["orphan_blocks"] == [0]
        engine.reset_prefix_cache()
        sub.settle(quiet_s=1.0)  # a loaded CI core can hold the subscriber thread back
        assert drained(sub) == [(0, "cleared", [])] and sub.counts[0]["AllBlocksCleared"] == 1
    finally:
        engine.close()
        sub.close()
    small = SimParams(kv_cache_tokens=4096)  # a pool of 256 blocks: a second document evicts the first
    sub = kv_events.Subscriber(1, salt=99)
    engine = SimEngine(params=small, kv_events=sub.endpoints[0])
    try:
        for prompt in prompts:
            engine.generate([prompt])
        sub.settle(quiet_s=1.0)  # a loaded CI core can hold the subscriber thread back
        assert sub.counts[0]["BlockRemoved"] > 0 and 0 < sub.held()[0] <= 4096 // 256
    finally:
        engine.close()
        sub.close()


class _Followed:
    """The engine path with a subscriber, as a path whose engines publish would have."""

    def __init__(self, publish: bool):
        from parity.engine.sim import SimEngine
        from parity.paths.engine import EnginePath
        from parity.routing.hashing import salt_of

        self.events = kv_events.Subscriber(1, salt_of(MODEL_REVISION))
        self.path = EnginePath(SimEngine(kv_events=self.events.endpoints[0] if publish else None))
        self.path.events = self.events

    def close(self):
        self.path.engine.close()
        self.events.close()


def test_a_prefix_trial_follows_the_engines_events_and_records_them(small_reuse_trace, tmp_path):
    from parity import trial
    from parity.routing import RouterSettings

    followed = _Followed(publish=True)
    try:
        doc = trial.run(followed.path, small_reuse_trace, tmp_path, trial_id="t", experiment="routing",
                        router=RouterSettings("prefix"), warmup_rounds=1, log=lambda m: None)
    finally:
        followed.close()
    kv = doc["kv_events"]
    assert kv["events"][0]["BlockStored"] > 0 and kv["gaps"] == [0] and kv["errors"] == []
    assert kv["engine_held_blocks"] == kv["router_held_blocks"]  # the map in step with the engine
    assert doc["router"]["engine_changes"]["stored"] > 0
    router = doc["router"]  # the working set fits: every hit the engine made, the router expected, token for token
    assert router["expected_cached_tokens"] == router["realized_cached_tokens"] and router["expected_vs_realized"] == 1



def test_a_prefix_trial_on_engines_that_log_their_compilations_records_both(small_reuse_trace, tmp_path):
    """Found on an H200 (issue 30's bounded ladder, 2026-12-05): a router that follows KV events and engines that log
    their kernel compilations (real vLLM) in one trial; the events' mark took the name of the JIT window's start, and
    the trial failed after its timed window. Here the simulator's path is given a JIT log, stamped during warm-up."""
    import time as clock

    from parity import trial
    from parity.routing import RouterSettings

    followed, log = _Followed(publish=True), tmp_path / "replica-0.jit"

    def jit_logs():  # asked for just before the timed window: a compilation stamped now is the warm-up's
        log.write_text(f"{clock.time()} Triton kernel JIT compilation during inference: reduce_segments\n")
        return [log]

    followed.path.jit_logs = jit_logs
    try:
        doc = trial.run(followed.path, small_reuse_trace, tmp_path, trial_id="t", experiment="routing",
                        router=RouterSettings("prefix"), warmup_rounds=1, log=lambda m: None)
    finally:
        followed.close()
    assert doc["jit"] == {"monitored": True, "warmup": 1, "measured": []}
    assert doc["kv_events"]["events"][0]["BlockStored"] > 0

def test_engines_that_were_to_publish_and_sent_nothing_fail_the_trial(small_reuse_trace, tmp_path):
    _refused(_Followed(publish=False), small_reuse_trace, tmp_path, "t", r"no KV cache events arrived from shard\(s\) 0")


def _refused(followed, trace, folder, trial_id: str, message: str) -> None:
    """The trial stops with `message` and leaves no partial trial manifest."""
    from parity import trial
    from parity.routing import RouterSettings

    try:
        with pytest.raises(ParityError, match=message):
            trial.run(followed.path, trace, folder, trial_id=trial_id, experiment="routing",
                      router=RouterSettings("prefix"), warmup_rounds=0, log=lambda m: None)
    finally:
        followed.close()
    assert not (folder / f"{trial_id}.json").exists()  # no partial trial written


def test_both_paths_engines_publish_from_their_own_processes_to_the_trials_router(small_reuse_trace, sim_backend,
                                                                                 tmp_path):
    """Simulator replicas (standalone) and stand-in Flame workers each publish to a subscriber of the trial's."""
    import dataclasses

    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    cases = plan.for_experiment("routing", [small_reuse_trace], {"repeats": 1, "placements": ["prefix"]})
    run_experiment("routing", cases, dataclasses.replace(sim_backend, warmup_rounds=1), tmp_path, settings={},
                   log=lambda m: None)
    for case in cases:
        doc = read_manifest(tmp_path / "trials" / f"{case.trial_id}.json")
        kv = doc["kv_events"]
        assert doc["verdict"]["status"] == "passed" and all(e["BlockStored"] > 0 for e in kv["events"]), case.system
        assert kv["engine_held_blocks"] == kv["router_held_blocks"] and kv["gaps"] == [0, 0]
        assert doc["router"]["expected_vs_realized"] == 1


def until(done, what: str, limit_s: float = 30.0) -> None:
    """Poll `done` until it holds (a generous deadline: CI's cores are loaded), else fail naming `what`."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class _Feed:
    """A subscriber and one PUB socket per shard, joined (a SUB socket misses what precedes its join)."""

    def __init__(self, shards: int, join: bytes):
        self.sub = kv_events.Subscriber(shards, salt=7)
        self.context = zmq.Context()
        self.pubs = []
        for k, endpoint in enumerate(self.sub.endpoints):
            pub = self.context.socket(zmq.PUB)
            pub.connect(endpoint)
            self.pubs.append(pub)
            until(lambda: self.sub.received[k] or self.send(k, join), f"shard {k}'s subscription")

    def send(self, shard: int, payload: bytes, frames=None) -> None:
        self.pubs[shard].send_multipart(frames or [b"kv", bytes(8), payload])

    def close(self):
        self.sub.close()
        for pub in self.pubs:
            pub.close(0)
        self.context.term()


def test_a_malformed_message_of_any_kind_is_counted_and_the_subscriber_goes_on():
    tokens = np.random.default_rng(3).integers(0, 128_000, 512, dtype=np.uint32)
    hashes, _ = engine_blocks_of(tokens)
    feed = _Feed(1, join=batch(kv_events.removed_event([1])))  # evicts nothing: only joins
    sub = feed.sub
    try:
        malformed = [batch(["BlockStored", "not a list", None, list(range(16)), 16]),  # wrong field types
                     batch(["BlockStored", [1], None, ["x"] * 16, 16]), batch(["BlockRemoved", 5]),
                     batch(stored([[1]], None, range(16)), stored(hashes, None, tokens)),  # a bad event beside a good one
                     b"\x00garbage", BOMB]  # not msgpack; nested a million deep
        for payload in malformed:
            feed.send(0, payload)
        feed.send(0, b"", frames=[b"kv", b"two frames"])
        feed.send(0, batch(["BlockAllocated", [1]], ["BlockAllocated", [2]]))  # a tag the router does not know
        feed.send(0, batch(kv_events.removed_event(hashes)))  # a good event after all of it
        changes = []
        until(lambda: changes.append(sub.changes.get(timeout=30)) or changes[-1][1:] == ("removed", block_chain(tokens, 7)),
              "the good event after the malformed ones")
        assert (0, "stored", block_chain(tokens, 7)) in changes  # the good event beside a bad one counted too
        assert sub.error_counts == [7] and sub.unknown == [{"BlockAllocated": 2}] and sub.counts[0]["BlockStored"] == 1
        assert "BlockAllocated" not in sub.counts[0]  # an unknown tag is not an event
        assert sub.errors[0] == "shard 0: a BlockStored event whose fields are not vLLM's (KV event: block hashes " \
                                "that are not a list of integers or bytes: not a list)"
        assert sub._thread.is_alive() and len(sub.errors) == 3  # the first few named, the rest counted
        stats = sub.stats()
        assert stats["error_count"] == [7] and stats["unknown_events"] == [{"BlockAllocated": 2}]
        sub.check()  # good events arrived: what could not be read is recorded, not fatal
        assert sub.unreadable().startswith("7 malformed KV event message(s) or event(s), first: shard 0: a BlockStored")
    finally:
        feed.close()


def test_a_shard_that_sent_only_garbage_or_unknown_events_fails_the_events_check():
    feed = _Feed(2, join=b"\x00garbage")
    try:
        feed.send(1, batch(["BlockAllocated", [1]]))
        until(lambda: feed.sub.unknown[1], "shard 1's unknown event")
        assert feed.sub.counts == [{}, {}]
        with pytest.raises(ParityError, match=r"^no readable KV cache events arrived from shard\(s\) 0, 1, only \d+ "
                                              r"malformed .* event\(s\) of a tag the router does not know "
                                              r"\(BlockAllocated\): its publisher is not sending vLLM's events$"):
            feed.sub.check()
    finally:
        feed.close()


def test_a_trial_records_what_it_could_not_read_and_fails_when_that_was_all(small_reuse_trace, tmp_path, monkeypatch):
    from parity import trial
    from parity.routing import RouterSettings

    real = kv_events.Publisher.send

    def garbage_first(self, events):  # one unreadable batch, in sequence, before the engine's first
        if events and self.sequence == 0:
            self.socket.send_multipart([b"kv", self.sequence.to_bytes(8, "big"), b"\xc1"])
            self.sequence += 1
        real(self, events)

    monkeypatch.setattr(kv_events.Publisher, "send", garbage_first)
    logs, followed = [], _Followed(publish=True)
    try:
        doc = trial.run(followed.path, small_reuse_trace, tmp_path, trial_id="t", experiment="routing",
                        router=RouterSettings("prefix"), warmup_rounds=1, log=logs.append)
    finally:
        followed.close()
    kv = doc["kv_events"]  # written, so schema-valid
    assert kv["error_count"] == [1] and kv["errors"][0].startswith("shard 0: a KV event batch that is not vLLM's")
    assert kv["gaps"] == [0] and kv["engine_held_blocks"] == kv["router_held_blocks"]
    assert doc["verdict"]["status"] == "passed" and any(m.startswith("  KV events: 1 malformed") for m in logs)

    def only_garbage(self, events):
        self.socket.send_multipart([b"kv", bytes(8), b"\xc1"])

    monkeypatch.setattr(kv_events.Publisher, "send", only_garbage)
    _refused(_Followed(publish=True), small_reuse_trace, tmp_path, "u",
             r"no readable KV cache events arrived from shard\(s\) 0, only \d+ malformed")
