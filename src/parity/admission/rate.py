"""Each shard's first-token wait, learned online from first tokens (parity.admission.controller): a request's wait
from admission to first token against the uncached prefill booked ahead of it then (its own included).

    line = latency + work / rate
    central = bias x line
    predicted wait = central + mean + z x sd x sqrt(1 + 1 / n + (work - mean work)^2 / (n x variance of work))

- `latency` and `rate`: a least-squares line through the observed (work, wait) pairs, each new pair weighted
  `alpha` and older ones fading, so the line follows an engine that slows or speeds up. Both terms are real: an
  engine serves prefill in steps, so even a request with nothing ahead waits about a step for its first token,
  and a rate alone, fitted to such waits, reads far slower than the engine is on a backlog (the first probe on
  the simulator: predictions 1.4 x the waits observed, and refusals near saturation the engine could have
  served). A weak ridge prior (a hundredth of one pair spread over `span` tokens, the objective's budget at the
  seed rate) holds the rate at its seed until the observed work varies enough to say otherwise, so a shard that
  only ever sees one request at a time learns its latency, not a slower rate.
- `bias`: the recent waits of requests that had work ahead, over the line's waits predicted for them when they
  were admitted (the central without the bias it carried then): the ratio of the two fading sums (the same
  weights), starting from one budget-long wait predicted exactly. A line fitted over the recent past lags a
  backlog that is growing: under overload the controller admits by a line learned at lighter load and the waits
  overshoot; the bias scales the line by how far it has recently fallen short (or over). Taken over the biased
  central instead, it settled at the square root of that ratio and fell back to 1 whenever it was right. A mean
  of the ratios instead let one request with almost nothing ahead decide it: a line of 3 ms against a wait of a
  step someone else's prefill filled (0.45 s) is a ratio of 150, and one such first token set the bias from 0.92
  to 8.6, so the shard refused nearly everything for the next fifty (the simulator at 14/s,
  benchmarks/simulated/admission-bias-2026-12-04.txt); a step's wait is an error in seconds, not a factor.
- The margin: the central prediction is a mean, the objective a p99. An engine makes first tokens only at the
  end of a step, and a step full of prefill is a large share of a short objective (about 0.1-0.25 s against
  0.5 s on the simulator), so where in the running step a request arrives moves its wait by up to a step
  whatever the work ahead. The prediction is the wait the first token stays within at the `quantile` (z its
  standard normal score): a weighted fit's prediction interval, sd the spread of the central prediction's errors
  in seconds (wait - central, as admitted), n the fading weights' effective count, and the last term the line's
  own uncertainty where the work is far from what it has seen (a shard that has only seen short backlogs does
  not trust its slope on a long one: on the simulator at 2.2 x saturation, requests admitted in the first
  seconds on a line fitted to a few light waits had waited 1.5-2 x their prediction). Infinite until two errors
  have been seen (one says nothing of a spread): the shard then admits only when idle. With a cold-start prior
  (`cold_sd_s`, off by default), the spread is that prior until the shard has seen 1 / alpha first tokens (its
  fit's window), not the spread of a handful of errors: at 1.6 x saturation on the simulator, a fifth of the
  refusals came in the first 0.6 s, before the margin had more than a few waits to go on (with the calibrated
  seed it halved them there but cut goodput at 2.2 x: benchmarks/simulated/admission-2026-12-03c.txt).
- Two kinds of request, their errors apart (`mean` and `sd` above are those of the request's kind): one that brings
  its own prefill (`fresh`: most of its prompt uncached, a document's first question) and one that does not. On one
  line their errors differ in sign: on the simulator at the GPU's shape the fresh ones waited 0.05-0.12 s longer
  than their central wait on average, the others 0.01-0.05 s less (15 runs, 4-18 requests/s), so a margin pooled
  over both under-covered the fresh ones, and they were the admitted requests past the objective
  (benchmarks/simulated/admission-bias-2026-12-04.txt). Each kind's mean error is added to the central wait and its
  spread makes the margin; a kind with fewer than two errors seen (or under the cold-start prior) takes the pooled
  spread and no mean.

On the simulator (2 shards, reuse, objective 0.5 s, ARTIFACT.md has the table): the central wait against
0.8 x the objective (before) missed the p99 at 2.2 x saturation; judged at the 99th percentile against the
whole objective, the margin taken from the shard's own errors, it meets it in most runs and serves more.
"""

from __future__ import annotations

from math import inf, sqrt


class ServiceRate:
    """The learned wait model of `shards` shards; `observe` each first token's (work ahead at admission, wait)."""

    def __init__(self, shards: int, seed: float, alpha: float, span: float, z: float = 0.0, cold_sd_s: float = 0.0):
        self.rates = [float(seed)] * shards  # prefill tokens per second, on a backlog
        self.latency_s = [0.0] * shards  # a first token's wait with nothing ahead
        self._margin = [((0.0, 0.0, 0.0, 0.0),) * 2] * shards  # per kind (not fresh, fresh): the work's mean, the
        # margin's square as a flat and a growing term, and the kind's mean error
        self._kinds = [((0.0,) * 4,) * 2] * shards  # per kind: its errors' weighted n, n squared, sum, sum of squares
        self.bias = [1.0] * shards  # recent waits over the line's predictions (requests with work ahead)
        self._ratio = [(span / seed,) * 2] * shards  # the fading sums of those waits and of those predictions,
        # from one budget-long wait predicted exactly (the objective's budget: the span at the seed rate)
        self.centrals = [0.0] * shards  # each shard's central wait at its latest `predict`
        self.samples = [0] * shards  # how many (work, wait) pairs each fit has taken
        self.alpha, self._keep, self.z = alpha, 1.0 - alpha, z
        self._slope0 = 1.0 / seed
        self._prior = 0.01 * alpha * float(span) ** 2  # in tokens squared, as the spread is
        self._pull, self._floor = self._prior * self._slope0, self._slope0 / 100.0  # the prior's, the least slope
        self._sums = [(0.0,) * 8] * shards  # weighted n, n squared, x, y, xx, xy, and the sum and sum of squares
        # of the errors wait - central (one tuple a shard: replaced, never changed)
        self._stale = [False] * shards  # observed since the line was last fitted
        self._cold_sd_s, self._cold_pairs = cold_sd_s, round(1.0 / alpha)  # the margin's spread until a shard has
        # seen its fit's window of first tokens (0: its own errors', infinite until two)

    def central(self, shard: int, work: float) -> float:
        """The mean wait of a request with `work` prefill tokens ahead of it: the line times its recent bias."""
        if self._stale[shard]:
            self._fit(shard)
        return self.bias[shard] * (self.latency_s[shard] + work / self.rates[shard])

    def predict(self, shard: int, work: float, fresh: bool = False) -> float:
        """The wait the first token of a request with `work` prefill tokens ahead of it (its own included) stays
        within at the quantile: the central wait (kept in `centrals`, for the controller to book with a request it
        admits), its kind's mean error (`fresh`: it brings its own prefill) and the margin that kind's errors' spread
        and the line's uncertainty at `work` call for."""
        if self._stale[shard]:
            self._fit(shard)
        centre, flat, tilt, mean = self._margin[shard][fresh]
        off = work - centre
        central = self.centrals[shard] = self.bias[shard] * (self.latency_s[shard] + work / self.rates[shard])
        return central + mean + sqrt(flat + tilt * off * off)

    def observe(self, shard: int, ahead: float, own: float, wait_s: float, central_s: float,
                bias: float = 1.0, fresh: bool = False) -> None:
        """A request admitted with `ahead` prefill tokens before its `own` had its first token `wait_s` later,
        against the central wait `central_s` predicted then under the bias `bias` of then (its line: the central
        over that bias); `fresh`: of the kind that brings its own prefill. Runs inside the controller's cost, once per
        first token; the line and margin are refitted when next read."""
        alpha, keep = self.alpha, self._keep
        work, error = ahead + own, wait_s - central_s
        if ahead and central_s > 0:  # the waits over the line's (the central without the bias it had then)
            waits, lines = self._ratio[shard]
            waits, lines = waits * keep + alpha * wait_s, lines * keep + alpha * central_s / bias
            self._ratio[shard] = (waits, lines)
            self.bias[shard] = waits / lines
        n, n2, x, y, xx, xy, e, ee = self._sums[shard]
        self._sums[shard] = (n * keep + alpha, n2 * keep * keep + alpha * alpha, x * keep + alpha * work,
                             y * keep + alpha * wait_s, xx * keep + alpha * work * work,
                             xy * keep + alpha * work * wait_s, e * keep + alpha * error,
                             ee * keep + alpha * error * error)
        kinds = self._kinds[shard]
        w, w2, e, ee = kinds[fresh]
        kind = (w * keep + alpha, w2 * keep * keep + alpha * alpha, e * keep + alpha * error,
                ee * keep + alpha * error * error)
        self._kinds[shard] = (kinds[0], kind) if fresh else (kind, kinds[1])
        self.samples[shard] += 1
        self._stale[shard] = True

    def _fit(self, shard: int) -> None:
        n, n2, x, y, xx, xy, e, ee = self._sums[shard]
        spread = xx - x * x / n + self._prior  # the work's about its weighted mean, with the ridge prior
        slope = (xy - x * y / n + self._pull) / spread
        if self._floor > slope:  # more work never means less wait
            slope = self._floor
        self.rates[shard] = 1.0 / slope
        latency_s = (y - slope * x) / n
        self.latency_s[shard] = latency_s if latency_s > 0.0 else 0.0
        if self.z:  # a weighted fit's prediction error at work X: var x (1 + n2 / n^2 + n2 / n (X - mean)^2 / spread)
            cold = self._cold_sd_s and self.samples[shard] < self._cold_pairs  # a prior, not a handful of errors
            pooled = self._cold_sd_s if cold else _error_sd(n, n2, e, ee)  # the errors' weights are the pairs'
            centre, lift = x / n, 1.0 + n2 / (n * n)  # the line's, the same for both kinds
            margins = []
            for w, w2, e_kind, ee_kind in self._kinds[shard]:  # each kind's errors, the pooled ones until two
                own_sd = inf if cold else _error_sd(w, w2, e_kind, ee_kind)
                sd, mean = (own_sd, e_kind / w) if own_sd < inf else (pooled, 0.0)
                if sd == inf:
                    margins.append((0.0, inf, 0.0, 0.0))
                else:
                    scale = self.z * self.z * sd ** 2
                    margins.append((centre, scale * lift, scale * n2 / n / spread, mean))
            self._margin[shard] = tuple(margins)
        self._stale[shard] = False

    def errors(self, shard: int) -> tuple[float, float]:
        """The central prediction's recent errors (wait - central, in seconds): their mean and standard deviation
        (weighted, unbiased: infinite until two have been seen)."""
        w, w2, *_, e, ee = self._sums[shard]
        if not w:
            return 0.0, 0.0
        return e / w, _error_sd(w, w2, e, ee)

    def fitted(self) -> "ServiceRate":
        """Itself, every shard's line refitted to what it has observed (for a record)."""
        for shard, stale in enumerate(self._stale):
            if stale:
                self._fit(shard)
        return self


def _error_sd(w: float, w2: float, e: float, ee: float) -> float:
    """The weighted, unbiased standard deviation of errors summed as `e` and `ee` under weights summing to `w` (their
    squares to `w2`): infinite until two have been seen (one says nothing of a spread)."""
    unbiased = w * w - w2
    if unbiased <= 1e-9 * w * w:
        return inf
    mean = e / w
    square = ee / w - mean * mean
    return sqrt((square if square > 0.0 else 0.0) * w * w / unbiased)
