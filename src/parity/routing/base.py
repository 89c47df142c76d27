"""The router interface: what every router is given, what it does, and what it declares it can do (`Router`)."""

from __future__ import annotations

from typing import ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

Tokens = Sequence[int] | np.ndarray


@runtime_checkable
class Router(Protocol):
    """Chooses a shard per request of one burst (each burst gets a fresh router: no memory of an earlier one).

    What a router can do beyond `route` and `stats` is declared on its class, so a caller reads a fact instead of
    probing for a method:
    - `follows_kv_events`: `follow(changes)` and `sync()` keep its map in step with the engines' own KV cache
      events (the queue of a `parity.kv_events.Subscriber`), so a path whose engines can publish them opens one;
    - `released_on_completion`: `complete(index)` releases the work booked for the `index`-th routed request once
      its answer is back (safe from any thread);
    - `observes`: `observe(cached_tokens)` takes the engines' cached prompt tokens per request in routing order,
      so its stats hold the hits it expected beside those that happened;
    - `models_cache`: it models each shard's KV cache (`cache_tokens`, sized from the engine's where the path
      knows it) and says when what it holds outgrew it (`overflowed`);
    - `quotes`: `quote(tokens)` decides without booking and `commit(quote)` books (what bounded admission needs).
    """

    follows_kv_events: ClassVar[bool]
    released_on_completion: ClassVar[bool]
    observes: ClassVar[bool]
    models_cache: ClassVar[bool]
    quotes: ClassVar[bool]
    num_shards: int

    def route(self, tokens: Tokens) -> int:
        """The shard for this prompt (booked there: the router remembers it)."""

    def stats(self) -> dict:
        """What the router did, for the trial manifest (`policy` names it)."""
