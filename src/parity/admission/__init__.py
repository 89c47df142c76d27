"""Bounded admission (ours): admit a request only if it can still meet the latency objective's first token.

Not `parity.flame.admission` (the order a Flame batch's prompts enter the engine) nor the `admission`
experiment (the Flame batch-limit screening): this decides whether a request is served at all.

- From what it knows: the uncached prefill of the requests admitted on each shard that have no first token yet
  (booked by the controller, apart from the prefix router's placement booking of prefill plus decode), the
  shard's first-token wait learned online from those first tokens (`rate.ServiceRate`: a line, latency + prefill
  ahead / rate, under the decode load the engine runs; seeded low, never a constant), and the request's own
  uncached prefill after the hit the router expects on that shard. A first token waits only for the prefill ahead
  of it: continuous batching decodes the earlier answers beside it.
- Decision (`controller.Controller`): predicted first token = the wait that model says the first token stays
  within at `quantile` (0.99: the line plus the mean and margin of its waits' errors about it, a document's first
  question's apart from the others', and its own uncertainty at that much work, call for) at (prefill ahead + own
  uncached prefill); admit when it is within `headroom` (1) x the objective's TTFT, or when the shard has no
  prefill ahead (refusing there helps no one and would leave the rate unlearned). Otherwise refuse at once with a
  one-line reason; with `reroute`, a shard that meets it takes the request first (a miss that meets the deadline
  beats a hit that misses it).
- No queue in front of the engine by default: under a first-come engine, a request whose first token is predicted
  past the objective is no earlier for waiting in front of the engine than inside it; a bounded queue helps only
  where the prediction is wrong. `queue_s` (off by default; the standalone client only) is that queue, deadline-
  aware: a request that would be refused is held up to `queue_s`, judged again in arrival order whenever a first
  token releases booked prefill (and at its bound), admitted when its predicted wait fits the objective less its
  hold, refused at its bound with its reason (benchmarks/simulated/admission-2026-12-03d.txt measures it).

- Orphans: `orphan_s` (off by default) refuses, for that long after a document's uncached question was refused, a
  later question of it that would also come uncached, even where it would fit: refusals otherwise leave the admitted
  stream more uncached prefill per request than an unrefused one (a refused first question's document is not
  cached for the next), so under overload its capacity is better spent on a new document's first question, which
  seeds the ones after it (benchmarks/simulated/admission-2026-12-03e.txt). `orphan_grace` N judges a refused
  document's next N uncached questions as any request first (one of them, if it fits, seeds the rest): a first-come
  rule refuses a burst's late first questions, and its second question, arriving after the burst, is then the
  better seed (benchmarks/admission_bound.py's online rule: 0.80 -> 0.85 of capacity at 14/s, simulated).

A refused request is never booked, so a burst of refusals leaves no work behind; a held one is booked only
once admitted.
"""

from parity.admission.controller import Controller, Decision
from parity.admission.rate import ServiceRate
from parity.admission.settings import BoundedSettings

__all__ = ["BoundedSettings", "Controller", "Decision", "ServiceRate"]
