"""Each shard's first-token wait, learned online from first tokens (parity.admission.controller): a request's wait
from admission to first token against the uncached prefill booked ahead of it then (its own included).

    predicted wait = bias x (latency + work / rate)

- `latency` and `rate`: a least-squares line through the observed (work, wait) pairs, each new pair weighted
  `alpha` and older ones fading, so the line follows an engine that slows or speeds up. Both terms are real: an
  engine serves prefill in steps, so even a request with nothing ahead waits about a step for its first token,
  and a rate alone, fitted to such waits, reads far slower than the engine is on a backlog (the first probe on
  the simulator: predictions 1.4 x the waits observed, and refusals near saturation the engine could have
  served). A weak ridge prior (a hundredth of one pair spread over `span` tokens, the objective's budget at the
  seed rate) holds the rate at its seed until the observed work varies enough to say otherwise, so a shard that
  only ever sees one request at a time learns its latency, not a slower rate.
- `bias`: the recent waits of requests that had work ahead, over the waits predicted for them when they were
  admitted (the same weights). A line fitted over the recent past lags a backlog that is growing: under overload
  the controller admits by a line learned at lighter load and the waits overshoot. The bias feeds the predictions'
  own error back (not an unbiased estimate: it settles where that error and the admission it causes balance).
  On the simulator (2 shards, reuse, objective 0.5 s, 3 runs a variant, ARTIFACT.md has the table), at 2.2 x
  saturation: p99 first token of the admitted 0.55 s and goodput 53-55/s, against 0.72-0.86 s and 44-49/s for
  the line alone and 0.53-0.56 s but 39-43/s for a multiplicative bias that drives the error to zero.
"""

from __future__ import annotations


class ServiceRate:
    """The learned wait model of `shards` shards; `observe` each first token's (work ahead at admission, wait)."""

    def __init__(self, shards: int, seed: float, alpha: float, span: float):
        self.rates = [float(seed)] * shards  # prefill tokens per second, on a backlog
        self.latency_s = [0.0] * shards  # a first token's wait with nothing ahead
        self.bias = [1.0] * shards  # recent waits over the line's (requests with work ahead)
        self.samples = [0] * shards  # how many (work, wait) pairs each fit has taken
        self.alpha, self._keep = alpha, 1.0 - alpha
        self._slope0 = 1.0 / seed
        self._prior = 0.01 * alpha * float(span) ** 2  # in tokens squared, as the spread is
        self._pull, self._floor = self._prior * self._slope0, self._slope0 / 100.0  # the prior's, the least slope
        self._sums = [(0.0,) * 5] * shards  # weighted n, x, y, xx, xy (tuples: replaced, never changed)
        self._stale = [False] * shards  # observed since the line was last fitted

    def line(self, shard: int, work: float) -> float:
        """The fitted line's wait for `work` prefill tokens ahead (the bias not applied)."""
        if self._stale[shard]:
            self._fit(shard)
        return self.latency_s[shard] + work / self.rates[shard]

    def predict(self, shard: int, work: float) -> float:
        """The predicted first-token wait of a request with `work` prefill tokens ahead of it (its own included)."""
        if self._stale[shard]:
            self._fit(shard)
        return self.bias[shard] * (self.latency_s[shard] + work / self.rates[shard])

    def observe(self, shard: int, ahead: float, own: float, wait_s: float, predicted_s: float) -> None:
        """A request admitted with `ahead` prefill tokens before its `own` had its first token `wait_s` later,
        against `predicted_s` then. The line is refitted when next read (several first tokens may come between
        two decisions: this runs inside the controller's cost)."""
        alpha, keep, work = self.alpha, self._keep, ahead + own
        if ahead and predicted_s > 0:
            bias = self.bias
            bias[shard] += alpha * (wait_s / predicted_s - bias[shard])
        n, x, y, xx, xy = self._sums[shard]
        self._sums[shard] = (n * keep + alpha, x * keep + alpha * work, y * keep + alpha * wait_s,
                             xx * keep + alpha * work * work, xy * keep + alpha * work * wait_s)
        self.samples[shard] += 1
        self._stale[shard] = True

    def _fit(self, shard: int) -> None:
        n, x, y, xx, xy = self._sums[shard]
        slope = (xy - x * y / n + self._pull) / (xx - x * x / n + self._prior)  # about the weighted means
        if self._floor > slope:  # more work never means less wait
            slope = self._floor
        self.rates[shard] = 1.0 / slope
        latency_s = (y - slope * x) / n
        self.latency_s[shard] = latency_s if latency_s > 0.0 else 0.0
        self._stale[shard] = False

    def fitted(self) -> "ServiceRate":
        """Itself, every shard's line refitted to what it has observed (for a record)."""
        for shard, stale in enumerate(self._stale):
            if stale:
                self._fit(shard)
        return self
