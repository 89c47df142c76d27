"""The placement names and the settings that make a router from one (`RouterSettings`)."""

from __future__ import annotations

from dataclasses import dataclass

from parity.errors import ParityError
from parity.routing.alternating import AlternatingRouter
from parity.routing.prefix import PrefixRouter
from parity.routing.sticky import AffinityRouter
from parity.settings import Settings

# The revision the study pinned. Public code pairs it only with unsloth/Meta-Llama-3.1-8B-Instruct (an ungated
# copy), not with meta-llama's repository; the study's router salts its block identities with it, so ours does.
MODEL_REVISION = "a2856192dd7c25b842431f39c179a6c2c2f627d1"
POLICIES = ("alternating", "sticky", "prefix")  # the routers: the base policy, the study's, ours
PLACEMENTS = (*POLICIES, "global")


@dataclass(frozen=True)
class RouterSettings(Settings):
    """Where the requests of a burst go: the placement, and its router's settings.

    `alternating`, `sticky` (the study's router, `parity.routing.sticky`) and `prefix` (`parity.routing.prefix`,
    ours) name the router; `global` is Flame's one shared queue (a single session whose workers take tasks
    in turn), so its path has one shard and nothing to choose.
    """

    what = "router setting"
    placement: str = "sticky"
    revision: str = MODEL_REVISION  # salts the block identities: a cache built by another revision is useless
    capacity: int = 4096  # sticky: entries of the identity map (the study's fixed size)
    cache_tokens: int = 880_000  # prefix: KV cache tokens per shard (an H200 replica of the 8B model)
    block_tokens: int = 256  # prefix: tokens per hashed block

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ParityError(f"unknown placement {self.placement!r}: use one of {', '.join(PLACEMENTS)}")

    def make(self, shards: int):
        """A fresh router over `shards` shards (each burst gets its own: no memory of an earlier one)."""
        if self.placement == "sticky":
            return AffinityRouter(shards, self.revision, self.capacity)
        if self.placement == "prefix":
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
