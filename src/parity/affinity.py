"""Prefix-affinity routing, as the study describes it, and the alternating base policy.

Requests that share a document prefix should land on the shard whose prefix cache already holds it.
A request's identity is a chain of SHA-256 hashes over 256-token blocks of its first 1,024 tokens,
salted with the model revision (a cache built by another revision is useless). A bounded LRU map
from identity to shard sends a request to the shard holding its longest known chained prefix; an
unseen prefix goes to the shard with the least cumulative estimated prefill work (uncached prompt
tokens sent so far), and that assignment is kept. The router sees token IDs only: no document
labels, no future requests, no cache events, so an assignment is not proof of a cache hit (the
engines' returned cached-token counts are).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from parity.engine import MODEL_REVISION
from parity.settings import Settings

BLOCK_TOKENS = 256
DEPTH_TOKENS = 1024
POLICIES = ("alternating", "sticky", "prefix")  # the routers: the base policy, the study's, ours
PLACEMENTS = (*POLICIES, "global")
_DOMAIN = b"parity-affinity-v1\0"

Tokens = Sequence[int] | np.ndarray


def prefix_identities(tokens: Tokens, salt: str | bytes, *,
                      block_tokens: int = BLOCK_TOKENS, depth_tokens: int = DEPTH_TOKENS) -> list[bytes]:
    """Chained identities of the blocks in the first `depth_tokens` tokens (the last may be partial).

    Identity k covers tokens [0, k * block_tokens), so two prompts share identity k exactly when they
    share that prefix. Only the head is converted: prompts are ~8K tokens and the rest is never read.
    """
    head = np.asarray(tokens[:depth_tokens])
    if head.size == 0:
        raise ValueError("cannot route an empty prompt")
    # Refuse what "<u4" would silently wrap (negative or huge IDs) instead of aliasing identities.
    if head.dtype != np.uint32 and (head.dtype.kind not in "iu" or head.min() < 0 or head.max() >= 2**32):
        raise ValueError(f"token IDs must be integers in [0, 2**32), got dtype {head.dtype}")
    data = head.astype("<u4", copy=False).tobytes()
    salt = salt.encode("utf-8") if isinstance(salt, str) else bytes(salt)
    parent = hashlib.sha256(_DOMAIN + salt).digest()
    step = 4 * block_tokens
    identities = []
    for start in range(0, len(data), step):
        parent = hashlib.sha256(parent + data[start:start + step]).digest()
        identities.append(parent)
    return identities


class AffinityRouter:
    """Sticky-prefix routing over `num_shards` shards with a bounded (LRU) client map."""

    def __init__(self, num_shards: int, revision: str, capacity: int = 4096):
        if num_shards < 1:
            raise ValueError(f"need at least one shard, got num_shards={num_shards}")
        if capacity < 1:
            raise ValueError(f"the identity map needs room for at least one entry, got capacity={capacity}")
        self.num_shards = num_shards
        self.capacity = capacity
        self._salt = revision.encode("utf-8") if isinstance(revision, str) else bytes(revision)
        self._map: OrderedDict[bytes, int] = OrderedDict()
        self._loads = [0] * num_shards
        self._requests = self._hits = 0

    def route(self, tokens: Tokens) -> int:
        """The shard for this prompt: its deepest known prefix's shard, else the least-loaded one."""
        identities = prefix_identities(tokens, self._salt)
        depth = next((d for d in range(len(identities), 0, -1) if identities[d - 1] in self._map), 0)
        if depth:
            shard = self._map[identities[depth - 1]]
            self._hits += 1
        else:
            shard = self._loads.index(min(self._loads))  # ties go to the lowest index
        for index, identity in enumerate(identities):
            if index >= depth or identity not in self._map:  # shallower links may have aged out first
                self._map[identity] = shard
            self._map.move_to_end(identity)
        while len(self._map) > self.capacity:
            self._map.popitem(last=False)
        cached = min(depth * BLOCK_TOKENS, len(tokens))  # only what the matched identities cover
        self._loads[shard] += len(tokens) - cached
        self._requests += 1
        return shard

    @property
    def loads(self) -> list[int]:
        """Estimated uncached prompt tokens sent to each shard so far."""
        return list(self._loads)

    @property
    def map_size(self) -> int:
        return len(self._map)

    def stats(self) -> dict:
        return {"policy": "sticky", "requests": self._requests, "hits": self._hits,
                "misses": self._requests - self._hits, "loads": self.loads, "map_size": self.map_size,
                "capacity": self.capacity}


class AlternatingRouter:
    """The base policy: round-robin over shards, blind to content."""

    def __init__(self, num_shards: int):
        if num_shards < 1:
            raise ValueError(f"need at least one shard, got num_shards={num_shards}")
        self.num_shards = num_shards
        self._requests = 0
        self._loads = [0] * num_shards

    def route(self, tokens: Tokens) -> int:
        shard = self._requests % self.num_shards
        self._requests += 1
        self._loads[shard] += len(tokens)
        return shard

    @property
    def loads(self) -> list[int]:
        """Full prompt tokens sent to each shard so far (this policy estimates no cache)."""
        return list(self._loads)

    def stats(self) -> dict:
        return {"policy": "alternating", "requests": self._requests, "loads": self.loads}


@dataclass(frozen=True)
class RouterSettings(Settings):
    """Where the requests of a burst go: the placement, and its router's settings.

    `alternating`, `sticky` (the study's router, above) and `prefix` (`parity.prefix_router`, ours)
    name the router; `global` is Flame's one shared queue (a single session whose workers take tasks
    in turn), so its path has one shard and nothing to choose.
    """

    what = "router setting"
    placement: str = "sticky"
    revision: str = MODEL_REVISION  # salts the block identities: a cache built by another revision is useless
    capacity: int = 4096  # sticky: entries of the identity map (the study's fixed size)
    cache_tokens: int = 880_000  # prefix: KV cache tokens per shard (an H200 replica of the 8B model)
    block_tokens: int = 256  # prefix: tokens per hashed block

    def __post_init__(self):
        from parity.errors import ParityError

        if self.placement not in PLACEMENTS:
            raise ParityError(f"unknown placement {self.placement!r}: use one of {', '.join(PLACEMENTS)}")

    def make(self, shards: int):
        """A fresh router over `shards` shards (each burst gets its own: no memory of an earlier one)."""
        if self.placement == "sticky":
            return AffinityRouter(shards, self.revision, self.capacity)
        if self.placement == "prefix":
            from parity.prefix_router import PrefixRouter

            return PrefixRouter(shards, self.revision, cache_tokens=self.cache_tokens, block_tokens=self.block_tokens)
        return AlternatingRouter(shards)


def shard_positions(prompts, shards: int) -> list[list[int]]:
    """Burst positions per shard, as the study's sticky router assigns them (the shards of the offline
    limit and of `parity bench order` are the serving paths')."""
    router = RouterSettings().make(shards)
    out: list[list[int]] = [[] for _ in range(shards)]
    for position, prompt in enumerate(prompts):
        out[router.route(prompt)].append(position)
    return out
