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
block hashes, with the same fingerprints as `parity.routing.hashing.block_chain`, accumulated 16
tokens at a time, so the router's map follows what the engine holds: stored, evicted, cleared.
`Subscriber` reads one stream per shard on a thread and queues what it derives; the router applies
the queue at its next decision (`PrefixRouter.follow`), so the map is only ever changed from the
routing thread. A subscriber that expected events and received none says so (`check`): a publisher
that is configured but sends nothing is a known upstream failure. A message that cannot be read (not
msgpack, wrong field types, nested past the decoder's depth, oversized) is counted and its first few
named (`stats`), never the end of the thread; an event of a tag the router does not know is counted
apart, not as an event, so a shard that sent only such things fails `check` as well, in its own words,
instead of passing or being blamed on a silent publisher. `Publisher` is an engine's side, as
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
from parity.routing.hashing import BLOCK_TOKENS, DEPTHS, salt_of, weights

ENGINE_BLOCK_TOKENS = 16
TOPIC = "kv"
_MASK = 2**64 - 1


def config_json(endpoint: str) -> str:
    """vLLM's `--kv-events-config` for a publisher that connects to `endpoint` (a subscriber's loopback port)."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC})


FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
          "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}
MAX_PAYLOAD = 64 << 20  # bytes: a step's batch is kilobytes (a 128k-token prefill, under 1 MiB); more is refused unread
_KEPT_ERRORS, _KEPT_TAGS, _CHARS = 3, 8, 300  # what a stream of garbage can make the subscriber hold: bounded


def decode(payload: bytes) -> list[tuple[str, list]]:
    """(tag, fields) of each event in one EventBatch payload, the fields in `FIELDS` order. An event is a
    tagged array (`[tag, field, ...]`) or, where a version encodes it so, a map with a `type` key.

    Depth: msgspec counts its nesting against the interpreter's recursion limit and stops a recursion bomb
    at the first level past it (a million levels deep: refused in under a millisecond, nothing below read);
    a scan of our own before it would cost a Python step per token ID of every batch. Size: checked first."""
    import msgspec

    if len(payload) > MAX_PAYLOAD:
        raise ParityError(f"a KV event batch of {len(payload):,} bytes, over the {MAX_PAYLOAD:,} read: refused unread")
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
    except RecursionError:
        raise ParityError(f"a KV event batch nested deeper than the decoder follows (a recursion bomb, "
                          f"not vLLM's EventBatch): {payload[:40]!r}") from None
    except (msgspec.DecodeError, IndexError, KeyError, TypeError) as exc:
        sample = repr(payload[:120])
        raise ParityError(f"a KV event batch that is not vLLM's EventBatch ({type(exc).__name__}: {exc}): {sample}") from None


def stored_event(hashes: list, parent, token_ids: list[int]) -> list:
    """A BlockStored event as vLLM 0.26-0.28 encodes it (a tagged array; lora_id none, medium GPU)."""
    return ["BlockStored", list(hashes), parent, [int(t) for t in token_ids], ENGINE_BLOCK_TOKENS, None, "GPU"]


def removed_event(hashes: list) -> list:
    return ["BlockRemoved", list(hashes), "GPU"]


def _check_hashes(hashes) -> None:
    """Engine block hashes as vLLM sends them: a list of integers or (newer versions) bytes; one step per block."""
    if not isinstance(hashes, list) or not all(type(h) in (int, bytes) for h in hashes):
        raise ParityError(f"KV event: block hashes that are not a list of integers or bytes: {str(hashes)[:80]}")


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
        self.words = weights(block_tokens // 2)  # block_chain's weights: two token IDs per 64-bit word
        self.depth_weights = weights(DEPTHS)
        self._state: dict = {}  # engine hash -> (engine depth, completed sum, partial fingerprint)
        self.orphans = 0  # blocks whose parent was never announced (stored before we listened)

    def _router_hash(self, depth: int, done: int, partial: int) -> int | None:
        if depth % self.per_router_block != self.per_router_block - 1:
            return None
        r = depth // self.per_router_block
        return (self.salt + done + partial * int(self.depth_weights[r % DEPTHS])) & _MASK

    def stored(self, hashes: list, parent, token_ids: list[int], block_size: int) -> list[int]:
        """The router blocks these engine blocks complete."""
        _check_hashes(hashes)
        _check_hashes([] if parent is None else [parent])
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= 2**32):
            raise ParityError(f"KV event: token IDs that are not a list of 32-bit unsigned integers ({ids.dtype})")
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
        words = ids.astype(np.uint32).view(np.uint64).reshape(len(hashes), ENGINE_BLOCK_TOKENS // 2)
        half, per = ENGINE_BLOCK_TOKENS // 2, self.per_router_block
        offsets = (depth + 1 + np.arange(len(hashes))) % per  # each engine block's place in its router block
        rows = self.words.reshape(per, half)[offsets]
        pieces = (words * rows).sum(axis=1, dtype=np.uint64).tolist()  # all the fingerprints' parts at once (mod 2**64)
        completed = []
        for engine_hash, piece in zip(hashes, pieces):
            if depth >= 0 and depth % per == per - 1:  # the last ended one
                done = (done + partial * int(self.depth_weights[(depth // per) % DEPTHS])) & _MASK
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
        _check_hashes(hashes)
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
        self.counts = [Counter() for _ in range(shards)]  # events of the tags in FIELDS, applied
        self.unknown = [Counter() for _ in range(shards)]  # events of any other tag: ignored, not events
        self.error_counts = [0] * shards  # messages or events that could not be read
        self.received = [0] * shards  # messages, whatever they held (for `settle`)
        self.gaps = [0] * shards
        self._last_seq: list[int | None] = [None] * shards
        self.errors: list[str] = []  # the first few, named
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @classmethod
    def for_revision(cls, shards: int, revision: str, block_tokens: int = BLOCK_TOKENS) -> "Subscriber":
        """A subscriber whose block hashes are those of a prefix router for the model at `revision`."""
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
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    continue
                try:
                    self._take(shard, frames)
                except Exception as exc:  # whatever a malformed message raises: counted, and the thread goes on
                    self._error(shard, exc)

    def _error(self, shard: int, exc: Exception, tag: str | None = None) -> None:
        self.error_counts[shard] += 1
        if len(self.errors) < _KEPT_ERRORS:
            what = str(exc) if isinstance(exc, ParityError) else f"{type(exc).__name__}: {exc}"
            where = f"shard {shard}: " + (f"a {tag} event whose fields are not vLLM's ({what})" if tag else what)
            self.errors.append(where[:_CHARS])

    def _take(self, shard: int, frames: list[bytes]) -> None:
        self.received[shard] += 1
        if len(frames) != 3:
            raise ParityError(f"a KV event message of {len(frames)} frames, not topic, sequence, payload")
        seq = int.from_bytes(frames[1], "big")
        if self._last_seq[shard] is not None and seq != self._last_seq[shard] + 1:
            self.gaps[shard] += 1
        self._last_seq[shard] = seq
        for tag, fields in decode(frames[2]):
            if tag not in FIELDS:
                unknown, name = self.unknown[shard], tag[:40]
                unknown[name if name in unknown or len(unknown) < _KEPT_TAGS else "(other tags)"] += 1
                continue
            try:
                self._apply(shard, tag, fields)
            except Exception as exc:  # one event's wrong fields: the batch's other events still count
                self._error(shard, exc, tag)
            else:
                self.counts[shard][tag] += 1

    def _apply(self, shard: int, tag: str, fields: list) -> None:
        blocks = self.blocks[shard]
        if tag == "BlockStored":
            self.changes.put((shard, "stored", blocks.stored(fields[0], fields[1], fields[2], fields[3])))
        elif tag == "BlockRemoved":
            self.changes.put((shard, "removed", blocks.removed(fields[0])))
        else:
            blocks.cleared()
            self.changes.put((shard, "cleared", []))

    def settle(self, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
        """Wait until no message has arrived for `quiet_s` (what the engines published after the last
        request is in the queue), at most `limit_s`."""
        deadline = time.monotonic() + limit_s
        seen = -1
        while time.monotonic() < deadline:
            now = sum(self.received)
            if now == seen:
                return
            seen = now
            time.sleep(quiet_s)

    def held(self) -> list[int]:
        """Router blocks each shard's engine reported holding (stored and not since removed)."""
        return [b.router_blocks() for b in self.blocks]

    def unreadable(self) -> str:
        """What could not be followed, in one line ("" when nothing): malformed messages, the first named,
        and events of tags the router does not know."""
        errors, unknown = sum(self.error_counts), sum((c for c in self.unknown), Counter())
        parts = [f"{errors} malformed KV event message(s) or event(s), first: {self.errors[0]}"] if errors else []
        if unknown:
            parts.append(f"{sum(unknown.values())} event(s) of a tag the router does not know "
                         f"({', '.join(sorted(unknown))})")
        return "; ".join(parts)

    def check(self) -> None:
        """ParityError if any shard sent no event the router could follow: nothing at all (its publisher sent
        nothing), or only what could not be read."""
        none = [k for k, c in enumerate(self.counts) if not c]
        garbage = [str(k) for k in none if self.error_counts[k] or self.unknown[k]]
        if garbage:
            raise ParityError(f"no readable KV cache events arrived from shard(s) {', '.join(garbage)}, only "
                              f"{self.unreadable()}: its publisher is not sending vLLM's events")
        if none:
            raise ParityError(f"no KV cache events arrived from shard(s) {', '.join(map(str, none))}: the engine was "
                              "started with events on, so its publisher sent nothing (a known upstream failure)")

    def mark(self) -> list[Counter]:
        """The counts so far, for `stats(since=...)`."""
        return [Counter(c) for c in self.counts]

    def stats(self, since: list[Counter] | None = None) -> dict:
        """Events per shard (since `mark`'s counts, when given), sequence gaps, the router blocks each engine
        reports holding, blocks whose parent was never announced; since the subscriber started, what could not
        be read per shard and the first of it named, and the events of unknown tags per shard."""
        counts = self.counts if since is None else [c - s for c, s in zip(self.counts, since)]
        return {"events": [dict(c) for c in counts], "gaps": self.gaps, "engine_held_blocks": self.held(),
                "orphan_blocks": [b.orphans for b in self.blocks], "errors": list(self.errors),
                "error_count": list(self.error_counts), "unknown_events": [dict(c) for c in self.unknown]}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self.sockets:
            sock.close(0)
        self.context.term()
