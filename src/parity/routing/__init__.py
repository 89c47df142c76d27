"""Routing: which shard each request of a burst goes to, the one home of every router and placement name.

- `registry`: the placement names, each with its router and the facts the serving paths read, and
  `RouterSettings`, which makes the router a name stands for;
- `sticky`: the study's prefix-affinity router (`sticky`); `alternating`: the base policy;
- `prefix`: ours, the prefix-aware router; `hashing`: its block hashes, which `parity.kv_events` reads the
  engines' KV cache events back into;
- `base`: the `Router` interface, whose capabilities the callers read instead of probing for methods.

Routers see token IDs only: an assignment is not proof of a cache hit (the engines' counts are).
"""

from parity.routing.alternating import AlternatingRouter
from parity.routing.base import Router, Tokens
from parity.routing.prefix import PrefixRouter
from parity.routing.registry import (BOTH_PATHS, FLAME, MODEL_REVISION, PLACEMENTS, SHARDED, STUDY, PlacementFacts,
                                     RouterSettings, facts_of, shard_positions)
from parity.routing.sticky import AffinityRouter

__all__ = ["AffinityRouter", "AlternatingRouter", "BOTH_PATHS", "FLAME", "MODEL_REVISION", "PLACEMENTS", "PlacementFacts",
           "PrefixRouter", "Router", "RouterSettings", "SHARDED", "STUDY", "Tokens", "facts_of", "shard_positions"]
