"""vLLM's KV cache events read back into the prefix router's map: the same block hashes, kept in step."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import zmq

from parity import kv_events
from parity.engine import MODEL_REVISION
from parity.errors import ParityError
from parity.prefix_router import PrefixRouter, block_chain


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


def test_a_batch_that_is_not_vllms_is_refused_in_one_line():
    with pytest.raises(ParityError, match="not vLLM's EventBatch"):
        kv_events.decode(b"\x00garbage")
    with pytest.raises(ParityError, match="blocks of 16"):
        kv_events.EngineBlocks(1).stored([1], None, list(range(32)), 32)
    assert '"endpoint": "tcp://127.0.0.1:5557"' in kv_events.config_json("tcp://127.0.0.1:5557")


def test_events_encoded_as_maps_are_read_by_field_name():
    payload = msgspec.msgpack.encode({"ts": 1.0, "events": [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "lora_id": None}, {"type": "AllBlocksCleared"}]})
    assert kv_events.decode(payload) == [("BlockStored", [[1], None, list(range(16)), 16]), ("AllBlocksCleared", [])]
