"""Bounded admission (ours): admit a request only if it can still meet the latency objective's first token.

Not `parity.flame.admission` (the order a Flame batch's prompts enter the engine) nor the `admission`
experiment (the Flame batch-limit screening): this decides whether a request is served at all.

- From what it knows: each shard's booked work (the prefix router books each request's uncached prefill plus
  decode, and releases it on `complete`), the shard's service rate learned online from completions
  (`rate.ServiceRate`: tokens of work per second, seeded low, never a constant), and the request's own
  uncached prefill after the hit the router expects on that shard.
- Decision (`controller.Controller`): predicted first token = (booked work + own uncached prefill) / rate; admit
  when it is within `headroom` x the objective's TTFT, or when the shard has nothing booked (refusing there helps
  no one and would leave the rate unlearned). Otherwise refuse at once with a one-line reason; with `reroute`, a
  shard that meets it takes the request first (a miss that meets the deadline beats a hit that misses it).
- No queue in front of the engine (yet): under a first-come engine, a request whose first token is predicted past
  the objective is no earlier for waiting in front of the engine than inside it; a bounded queue helps only where
  the prediction is wrong, so it waits for measurements of how often that is.

A refused request is never booked, so a burst of refusals leaves no work behind.
"""

from parity.admission.controller import Controller, Decision
from parity.admission.rate import ServiceRate
from parity.admission.settings import BoundedSettings

__all__ = ["BoundedSettings", "Controller", "Decision", "ServiceRate"]
