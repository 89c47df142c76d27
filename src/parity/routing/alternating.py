"""The base policy (placement `alternating`, and Flame's `global` session, which has one shard): round-robin
over shards, blind to content."""

from __future__ import annotations

from parity.routing.base import Tokens


class AlternatingRouter:
    """Round-robin over `num_shards` shards."""

    follows_kv_events = released_on_completion = observes = models_cache = quotes = False  # parity.routing.base.Router

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
