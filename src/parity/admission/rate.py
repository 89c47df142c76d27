"""Each shard's first-token wait, learned online from first tokens (parity.admission.controller): a request's wait
from admission to first token against the uncached prefill booked ahead of it then (its own included).

    line = latency + work / rate
    predicted wait = line + z x sd x sqrt(1 + 1 / n + (work - mean work)^2 / (n x variance of work))

- `latency` and `rate`: a least-squares line through the observed (work, wait) pairs, each new pair weighted
  `alpha` and older ones fading, so the line follows an engine that slows or speeds up. Both terms are real: an
  engine serves prefill in steps, so even a request with nothing ahead waits about a step for its first token,
  and a rate alone, fitted to such waits, reads far slower than the engine is on a backlog (the first probe on
  the simulator: predictions 1.4 x the waits observed, and refusals near saturation the engine could have
  served). A weak ridge prior (a hundredth of one pair spread over `span` tokens, the objective's budget at the
  seed rate) holds the rate at its seed until the observed work varies enough to say otherwise, so a shard that
  only ever sees one request at a time learns its latency, not a slower rate.
- The margin: the fitted line is a mean, the objective a p99. An engine makes first tokens only at the end of a
  step, and a step full of prefill is a large share of a short objective (about 0.1-0.25 s against 0.5 s on the
  simulator), so where in the running step a request arrives moves its wait by up to a step whatever the work
  ahead. The prediction is the wait the first token stays within at the `quantile` (z its standard normal
  score): the weighted fit's prediction interval, sd the waits' spread about the line (the fit's own, so a line
  that has caught up carries no stale error), n the fading weights' effective count, and the last term the line's
  own uncertainty where the work is far from what it has seen (a shard that has only seen short backlogs does
  not trust its slope on a long one: on the simulator at 2.2 x saturation, requests admitted in the first half
  second on a line fitted to a few light waits had waited 1.5-2 x their prediction). Infinite until the waits say
  anything of their spread (a line goes through any two): the shard then admits only when idle.

On the simulator (2 shards, reuse, objective 0.5 s, ARTIFACT.md has the table): the line times a bias fed back
from its errors (before) missed the p99 at 2.2 x saturation by 10%; judged at the 99th percentile it meets it.
"""

from __future__ import annotations

from math import inf, sqrt


class ServiceRate:
    """The learned wait model of `shards` shards; `observe` each first token's (work ahead at admission, wait)."""

    def __init__(self, shards: int, seed: float, alpha: float, span: float, z: float = 0.0):
        self.rates = [float(seed)] * shards  # prefill tokens per second, on a backlog
        self.latency_s = [0.0] * shards  # a first token's wait with nothing ahead
        self._margin = [(0.0, 0.0, 0.0, 0.0)] * shards  # what the predicted wait adds to the line: a bias (where
        # its latency is held at 0), and the margin's square at a work (the work's mean, a flat and a growing term)
        self.samples = [0] * shards  # how many (work, wait) pairs each fit has taken
        self.alpha, self._keep, self.z = alpha, 1.0 - alpha, z
        self._slope0 = 1.0 / seed
        self._prior = 0.01 * alpha * float(span) ** 2  # in tokens squared, as the spread is
        self._pull, self._floor = self._prior * self._slope0, self._slope0 / 100.0  # the prior's, the least slope
        self._sums = [(0.0,) * 7] * shards  # weighted n, n squared, x, y, xx, xy, yy (tuples: replaced, never changed)
        self._stale = [False] * shards  # observed since the line was last fitted

    def line(self, shard: int, work: float) -> float:
        """The fitted line's wait for `work` prefill tokens ahead (its error not applied)."""
        if self._stale[shard]:
            self._fit(shard)
        return self.latency_s[shard] + work / self.rates[shard]

    def predict(self, shard: int, work: float) -> float:
        """The wait the first token of a request with `work` prefill tokens ahead of it (its own included) stays
        within at the quantile: the line and the margin its waits' spread and its own uncertainty at `work` call
        for."""
        if self._stale[shard]:
            self._fit(shard)
        bias, centre, flat, tilt = self._margin[shard]
        off = work - centre
        return self.latency_s[shard] + work / self.rates[shard] + bias + sqrt(flat + tilt * off * off)

    def observe(self, shard: int, ahead: float, own: float, wait_s: float) -> None:
        """A request admitted with `ahead` prefill tokens before its `own` had its first token `wait_s` later. The
        line and margin are refitted when next read (several first tokens may come between two decisions: this
        runs inside the controller's cost)."""
        alpha, keep, work = self.alpha, self._keep, ahead + own
        n, n2, x, y, xx, xy, yy = self._sums[shard]
        self._sums[shard] = (n * keep + alpha, n2 * keep * keep + alpha * alpha, x * keep + alpha * work,
                             y * keep + alpha * wait_s, xx * keep + alpha * work * work,
                             xy * keep + alpha * work * wait_s, yy * keep + alpha * wait_s * wait_s)
        self.samples[shard] += 1
        self._stale[shard] = True

    def _fit(self, shard: int) -> None:
        n, n2, x, y, xx, xy, yy = self._sums[shard]
        sxx, sxy, syy = xx - x * x / n, xy - x * y / n, yy - y * y / n  # about the weighted means
        spread = sxx + self._prior  # the work's, with the ridge prior
        slope = (sxy + self._pull) / spread
        if self._floor > slope:  # more work never means less wait
            slope = self._floor
        self.rates[shard] = 1.0 / slope
        latency_s = (y - slope * x) / n
        self.latency_s[shard] = latency_s if latency_s > 0.0 else 0.0
        bias = (y - slope * x) / n - self.latency_s[shard]  # the waits over the line where it cannot go below 0
        effective = n * n / n2  # how many equal weights the fading ones are worth
        if not self.z:
            self._margin[shard] = (bias, 0.0, 0.0, 0.0)
        elif effective <= 2.0 + 1e-9:  # two points always fit a line: nothing said yet of the spread
            self._margin[shard] = (bias, 0.0, inf, 0.0)
        else:  # a weighted fit's prediction error at work X: var x (1 + n2 / n^2 + n2 / n (X - mean)^2 / spread)
            residual = max(0.0, syy - 2.0 * slope * sxy + slope * slope * sxx) / n * effective / (effective - 2.0)
            scale = self.z * self.z * residual
            self._margin[shard] = (bias, x / n, scale * (1.0 + n2 / (n * n)), scale * n2 / n / spread)
        self._stale[shard] = False

    def errors(self, shard: int) -> tuple[float, float]:
        """The shard's waits about its line, in seconds: their mean (a bias only where the line's latency is held
        at 0) and standard deviation (weighted, with the line's two fitted terms discounted)."""
        if self._stale[shard]:
            self._fit(shard)
        n, n2, x, y, xx, xy, yy = self._sums[shard]
        if not n:
            return 0.0, 0.0
        slope, effective = 1.0 / self.rates[shard], n * n / n2
        if effective <= 2.0 + 1e-9:
            return self._margin[shard][0], inf
        sxx, sxy, syy = xx - x * x / n, xy - x * y / n, yy - y * y / n
        return self._margin[shard][0], sqrt(max(0.0, syy - 2.0 * slope * sxy + slope * slope * sxx) / n * effective
                                            / (effective - 2.0))

    def fitted(self) -> "ServiceRate":
        """Itself, every shard's line refitted to what it has observed (for a record)."""
        for shard, stale in enumerate(self._stale):
            if stale:
                self._fit(shard)
        return self
