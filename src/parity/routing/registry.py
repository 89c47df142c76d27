"""The placement registry: each placement name with the router it makes and what it means to a serving path
(`PLACEMENTS`), and the settings a trial makes its router from (`RouterSettings`).

The one declaration of the placement vocabulary: the command line's choices, each serving path's `placements`,
the benches and the config schema's enums (held to it by tests/test_routing.py) read it here, and code outside
this room reads a placement's facts, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from parity.errors import ParityError
from parity.routing.alternating import AlternatingRouter
from parity.routing.base import Router
from parity.routing.prefix import PrefixRouter
from parity.routing.sticky import AffinityRouter
from parity.settings import Settings

# The revision the study pinned. Public code pairs it only with unsloth/Meta-Llama-3.1-8B-Instruct (an ungated
# copy), not with meta-llama's repository; the study's router salts its block identities with it, so ours does.
MODEL_REVISION = "a2856192dd7c25b842431f39c179a6c2c2f627d1"
STUDY = "sticky"  # the study's router: the default, the one every study table uses and ours is compared with


@dataclass(frozen=True)
class PlacementFacts:
    """What a placement name means: the router it makes, and where and how requests are placed by it."""

    router: type  # the Router class it makes: its declared capabilities (parity.routing.base.Router)
    make: Callable[["RouterSettings", int], Router]  # (settings, shards) -> a fresh router
    flame: bool = True  # the Flame path places requests by it
    shared_session: bool = False  # a Flame session layout, not a router: one session whose workers take tasks in
    # turn, so the path has one shard (not one per GPU) and its GPUs are shared, not one per shard

    @property
    def follows_kv_events(self) -> bool:
        """Its router follows the engines' KV cache events: a path opens a subscriber for them."""
        return self.router.follows_kv_events

    @property
    def models_cache(self) -> bool:
        """Its router is sized from one engine's KV cache, where the path knows it."""
        return self.router.models_cache


def _alternating(settings: "RouterSettings", shards: int) -> Router:
    return AlternatingRouter(shards)


PLACEMENTS: dict[str, PlacementFacts] = {
    # the base policy over a path's shards; the study's Flame base is its shared session instead (`global`)
    "alternating": PlacementFacts(AlternatingRouter, _alternating, flame=False),
    # Flame's one shared session: a session layout. Its path has one shard, so it falls through to the alternating
    # router, which has nothing to choose (every request to shard 0) and records its stats as for any placement
    "global": PlacementFacts(AlternatingRouter, _alternating, shared_session=True),
    "sticky": PlacementFacts(AffinityRouter, lambda s, shards: AffinityRouter(shards, s.revision, s.capacity)),
    "prefix": PlacementFacts(PrefixRouter, lambda s, shards: PrefixRouter(
        shards, s.revision, cache_tokens=s.cache_tokens, block_tokens=s.block_tokens)),
}
SHARDED = tuple(n for n, p in PLACEMENTS.items() if not p.shared_session)  # a path over shards of its own
FLAME = tuple(n for n, p in PLACEMENTS.items() if p.flame)  # the Flame path's
BOTH_PATHS = tuple(n for n in SHARDED if n in FLAME)  # the same router on standalone and Flame alike


def facts_of(name: str) -> PlacementFacts:
    """The facts of placement `name`; ParityError naming the known ones otherwise."""
    if name not in PLACEMENTS:
        raise ParityError(f"unknown placement {name!r}: use one of {', '.join(PLACEMENTS)}")
    return PLACEMENTS[name]


@dataclass(frozen=True)
class RouterSettings(Settings):
    """Where the requests of a burst go: the placement (`PLACEMENTS`), and its router's settings."""

    what = "router setting"
    placement: str = STUDY
    revision: str = MODEL_REVISION  # salts the block identities: a cache built by another revision is useless
    capacity: int = 4096  # sticky: entries of the identity map (the study's fixed size)
    cache_tokens: int = 880_000  # prefix: KV cache tokens per shard (an H200 replica of the 8B model)
    block_tokens: int = 256  # prefix: tokens per hashed block

    def check(self):
        facts_of(self.placement)

    @property
    def facts(self) -> PlacementFacts:
        return PLACEMENTS[self.placement]

    def make(self, shards: int) -> Router:
        """A fresh router over `shards` shards (each burst gets its own: no memory of an earlier one)."""
        return self.facts.make(self, shards)


def shard_positions(prompts, shards: int) -> list[list[int]]:
    """Burst positions per shard, as the study's sticky router assigns them (the shards of the offline
    limit and of `parity bench order` are the serving paths')."""
    router = RouterSettings().make(shards)
    out: list[list[int]] = [[] for _ in range(shards)]
    for position, prompt in enumerate(prompts):
        out[router.route(prompt)].append(position)
    return out
