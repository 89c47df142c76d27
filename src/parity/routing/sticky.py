"""Prefix-affinity routing, as the study describes it (placement `sticky`, the default of every study table).

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

import numpy as np

from parity.routing.base import Tokens

BLOCK_TOKENS = 256
DEPTH_TOKENS = 1024
_DOMAIN = b"parity-affinity-v1\0"


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

    follows_kv_events = released_on_completion = observes = models_cache = quotes = False  # parity.routing.base.Router

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
