"""vLLM's KV cache events, read back into the prefix router's map (placement `prefix`).

Started with `--kv-events-config` (`config_json`), vLLM 0.26-0.28 publishes on a ZMQ PUB socket,
which *binds* only a wildcard endpoint (its default `tcp://*:5557`, every interface) and *connects*
to any other: so the subscriber binds a loopback port and each engine connects to it (checked on an
H200: with both sides connecting, nothing arrives). Three frames per message: topic, sequence
number, msgpack `EventBatch(ts, events[, data_parallel_rank])`; each event a tagged array:
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, ...]`,
`["BlockRemoved", block_hashes, ...]`, `["AllBlocksCleared"]`. Fields grew across versions, so they
are read by position and the rest ignored; only full blocks are announced.

`EngineBlocks` turns one shard's stored engine blocks (16 tokens each) back into the router's own
block hashes, with the same fingerprints as `parity.prefix_router.block_chain`, accumulated 16
tokens at a time, so the router's map follows what the engine holds: stored, evicted, cleared.
`Subscriber` reads one stream per shard on a thread and queues what it derives; the router applies
the queue at its next decision (`PrefixRouter.follow`), so the map is only ever changed from the
routing thread. A subscriber that expected events and received none says so (`check`): a publisher
that is configured but sends nothing is a known upstream failure. `Publisher` is an engine's side, as
vLLM's: the simulator publishes the same events through it, so the CPU chain exercises the same feed.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import Counter

import numpy as np

from parity.errors import ParityError
from parity.prefix_router import BLOCK_TOKENS, _DEPTHS, _weights

ENGINE_BLOCK_TOKENS = 16
TOPIC = "kv"
_MASK = 2**64 - 1


def config_json(endpoint: str) -> str:
    """vLLM's `--kv-events-config` for a publisher that connects to `endpoint` (a subscriber's loopback port)."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC})


FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
          "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}


def decode(payload: bytes) -> list[tuple[str, list]]:
    """(tag, fields) of each event in one EventBatch payload, the fields in `FIELDS` order. An event is a
    tagged array (`[tag, field, ...]`) or, where a version encodes it so, a map with a `type` key."""
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload)
        events = batch["events"] if isinstance(batch, dict) else batch[1]
        out = []
        for event in events:
            if isinstance(event, dict):
                tag = str(event.get("type") or event.get("tag"))
                out.append((tag, [event.get(name) for name in FIELDS.get(tag, ())]))
            else:
                out.append((str(event[0]), list(event[1:])))
        return out
    except (msgspec.DecodeError, IndexError, KeyError, TypeError) as exc:
        sample = repr(payload[:120])
        raise ParityError(f"a KV event batch that is not vLLM's EventBatch ({type(exc).__name__}: {exc}): {sample}") from None


def stored_event(hashes: list, parent, token_ids: list[int]) -> list:
    """A BlockStored event as vLLM 0.26-0.28 encodes it (a tagged array; lora_id none, medium GPU)."""
    return ["BlockStored", list(hashes), parent, [int(t) for t in token_ids], ENGINE_BLOCK_TOKENS, None, "GPU"]


def removed_event(hashes: list) -> list:
    return ["BlockRemoved", list(hashes), "GPU"]


class Publisher:
    """An engine's side of the feed, as vLLM's ZmqEventPublisher: one EventBatch per engine step, on a socket
    connected to the subscriber's endpoint. It waits (up to `join_s`) for the subscription to arrive, since
    a PUB socket drops what it sends before then (vLLM's does not wait; its engine takes longer to start)."""

    def __init__(self, endpoint: str, join_s: float = 5.0):
        import zmq

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.XPUB)  # a PUB that also hears the subscription
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.connect(endpoint)
        self.joined = bool(self.socket.poll(int(join_s * 1000)))
        if self.joined:
            self.socket.recv()
        self.sequence = 0

    def send(self, events: list) -> None:
        """Publish `events` (tagged arrays, in the order they happened) as one batch; nothing when empty."""
        if not events:
            return
        import msgspec

        payload = msgspec.msgpack.encode([time.time(), events, None])
        self.socket.send_multipart([TOPIC.encode(), self.sequence.to_bytes(8, "big"), payload])
        self.sequence += 1

    def close(self) -> None:
        self.socket.close()  # lingers: what was sent still goes
        self.context.term()


class EngineBlocks:
    """One shard's engine blocks, each with the router block it ends (when it ends one)."""

    def __init__(self, salt: int, block_tokens: int = BLOCK_TOKENS):
        if block_tokens % ENGINE_BLOCK_TOKENS:
            raise ValueError(f"the router's blocks ({block_tokens}) must be whole engine blocks of {ENGINE_BLOCK_TOKENS}")
        self.salt, self.per_router_block = salt, block_tokens // ENGINE_BLOCK_TOKENS
        self.words = _weights(block_tokens // 2)  # block_chain's weights: two token IDs per 64-bit word
        self.depth_weights = _weights(_DEPTHS)
        self._state: dict = {}  # engine hash -> (engine depth, completed sum, partial fingerprint)
        self.orphans = 0  # blocks whose parent was never announced (stored before we listened)

    def _router_hash(self, depth: int, done: int, partial: int) -> int | None:
        if depth % self.per_router_block != self.per_router_block - 1:
            return None
        r = depth // self.per_router_block
        return (self.salt + done + partial * int(self.depth_weights[r % _DEPTHS])) & _MASK

    def stored(self, hashes: list, parent, token_ids: list[int], block_size: int) -> list[int]:
        """The router blocks these engine blocks complete."""
        if block_size != ENGINE_BLOCK_TOKENS or len(token_ids) != block_size * len(hashes):
            raise ParityError(f"KV event: {len(hashes)} blocks of {block_size} tokens with {len(token_ids)} token IDs; "
                              f"the router reads blocks of {ENGINE_BLOCK_TOKENS}")
        if parent is None:
            depth, done, partial = -1, 0, 0
        elif parent in self._state:
            depth, done, partial = self._state[parent]
        else:
            self.orphans += len(hashes)
            return []
        words = np.asarray(token_ids, dtype=np.uint32).view(np.uint64).reshape(len(hashes), ENGINE_BLOCK_TOKENS // 2)
        half, per = ENGINE_BLOCK_TOKENS // 2, self.per_router_block
        offsets = (depth + 1 + np.arange(len(hashes))) % per  # each engine block's place in its router block
        rows = self.words.reshape(per, half)[offsets]
        pieces = (words * rows).sum(axis=1, dtype=np.uint64).tolist()  # all the fingerprints' parts at once (mod 2**64)
        completed = []
        for engine_hash, piece in zip(hashes, pieces):
            if depth >= 0 and depth % per == per - 1:  # the last ended one
                done = (done + partial * int(self.depth_weights[(depth // per) % _DEPTHS])) & _MASK
                partial = 0
            depth += 1
            partial = (partial + piece) & _MASK
            self._state[engine_hash] = (depth, done, partial)
            ended = self._router_hash(depth, done, partial)
            if ended is not None:
                completed.append(ended)
        return completed

    def removed(self, hashes: list) -> list[int]:
        """The router blocks these evicted engine blocks had completed."""
        out = []
        for engine_hash in hashes:
            state = self._state.pop(engine_hash, None)
            if state is not None and (ended := self._router_hash(*state)) is not None:
                out.append(ended)
        return out

    def cleared(self) -> None:
        self._state.clear()

    def router_blocks(self) -> int:
        """How many router blocks the engine blocks held now complete."""
        per = self.per_router_block
        return sum(1 for depth, _, _ in self._state.values() if depth % per == per - 1)


class Subscriber:
    """One SUB socket per shard, bound to a loopback port of its own (`endpoints`: give shard k's engine
    `config_json(endpoints[k])`); derived router-block changes queued for the router."""

    def __init__(self, shards: int, salt: int, block_tokens: int = BLOCK_TOKENS):
        import zmq

        self.context = zmq.Context()
        self.sockets, self.endpoints = [], []
        for _ in range(shards):
            sock = self.context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
            sock.setsockopt(zmq.LINGER, 0)
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            self.sockets.append(sock)
            self.endpoints.append(f"tcp://127.0.0.1:{port}")
        self.blocks = [EngineBlocks(salt, block_tokens) for _ in range(shards)]
        self.changes: queue.SimpleQueue = queue.SimpleQueue()  # (shard, "stored" | "removed" | "cleared", hashes)
        self.counts = [Counter() for _ in range(shards)]
        self.gaps = [0] * shards
        self._last_seq: list[int | None] = [None] * shards
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @classmethod
    def for_revision(cls, shards: int, revision: str, block_tokens: int = BLOCK_TOKENS) -> "Subscriber":
        """A subscriber whose block hashes are those of a prefix router for the model at `revision`."""
        from parity.prefix_router import salt_of

        return cls(shards, salt_of(revision), block_tokens)

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        for sock in self.sockets:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                shard = self.sockets.index(sock)
                try:
                    self._take(shard, sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    continue
                except ParityError as exc:
                    self.errors.append(f"shard {shard}: {exc}")

    def _take(self, shard: int, frames: list[bytes]) -> None:
        if len(frames) != 3:
            raise ParityError(f"a KV event message of {len(frames)} frames, not topic, sequence, payload")
        seq = int.from_bytes(frames[1], "big")
        if self._last_seq[shard] is not None and seq != self._last_seq[shard] + 1:
            self.gaps[shard] += 1
        self._last_seq[shard] = seq
        blocks = self.blocks[shard]
        for tag, fields in decode(frames[2]):
            self.counts[shard][tag] += 1
            if tag == "BlockStored":
                self.changes.put((shard, "stored", blocks.stored(fields[0], fields[1], fields[2], fields[3])))
            elif tag == "BlockRemoved":
                self.changes.put((shard, "removed", blocks.removed(fields[0])))
            elif tag == "AllBlocksCleared":
                blocks.cleared()
                self.changes.put((shard, "cleared", []))

    def settle(self, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
        """Wait until no event has arrived for `quiet_s` (what the engines published after the last
        request is in the queue), at most `limit_s`."""
        deadline = time.monotonic() + limit_s
        seen = -1
        while time.monotonic() < deadline:
            now = sum(sum(c.values()) for c in self.counts)
            if now == seen:
                return
            seen = now
            time.sleep(quiet_s)

    def held(self) -> list[int]:
        """Router blocks each shard's engine reported holding (stored and not since removed)."""
        return [b.router_blocks() for b in self.blocks]

    def check(self) -> None:
        """ParityError if any shard's publisher sent nothing (or a message could not be read)."""
        silent = [str(k) for k, c in enumerate(self.counts) if not c]
        if silent:
            raise ParityError(f"no KV cache events arrived from shard(s) {', '.join(silent)}: the engine was started "
                              "with events on, so its publisher sent nothing (a known upstream failure)")
        if self.errors:
            raise ParityError(self.errors[0])

    def mark(self) -> list[Counter]:
        """The counts so far, for `stats(since=...)`."""
        return [Counter(c) for c in self.counts]

    def stats(self, since: list[Counter] | None = None) -> dict:
        """Events per shard (since `mark`'s counts, when given), sequence gaps, the router blocks each engine
        reports holding, blocks whose parent was never announced, and the first errors."""
        counts = self.counts if since is None else [c - s for c, s in zip(self.counts, since)]
        return {"events": [dict(c) for c in counts], "gaps": self.gaps, "engine_held_blocks": self.held(),
                "orphan_blocks": [b.orphans for b in self.blocks], "errors": self.errors[:3]}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self.sockets:
            sock.close(0)
        self.context.term()
