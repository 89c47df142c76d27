"""Each shard's service rate, learned online: tokens of work per second, as an EWMA. The controller's work is
a request's uncached prefill, finished at its first token (parity.admission.controller).

A sample is the work a shard finished over a stretch of time it was busy (from when it became busy, or the
last sample, to a completion at least `sample_s` later, or to when it fell idle). Work finished over busy time
never exceeds what the shard could do, so a sample above the estimate always counts; one below it counts only
when the shard was offered at least the estimate's worth of work over the stretch (what it held when the stretch
began plus what came: it had the work and still did less, so it is slower), since a lightly loaded shard is slow
for want of work, not of speed. (Not what it held at the start alone: under admission a shard holds at most the
objective's worth of work, which can be less than a stretch's.)
"""

from __future__ import annotations


class ServiceRate:
    """The learned rate of `shards` shards; `start`/`finish` each request's work with the time it happened."""

    def __init__(self, shards: int, seed: float, alpha: float, sample_s: float):
        self.rates = [float(seed)] * shards  # tokens of work per second
        self.samples = [0] * shards  # how many samples each estimate has taken
        self.alpha, self.sample_s = alpha, sample_s
        self._outstanding = [0] * shards  # work started and not yet finished
        self._since: list[float | None] = [None] * shards  # when the current stretch began (None: idle)
        self._from_idle = [False] * shards  # the stretch began on an idle shard (all its work is its own)
        self._offered = [0] * shards  # work outstanding when it began, plus work started since
        self._done = [0] * shards  # work finished since

    def start(self, shard: int, work: int, now: float) -> None:
        if self._since[shard] is None:
            self._since[shard], self._from_idle[shard], self._offered[shard], self._done[shard] = now, True, 0, 0
        self._outstanding[shard] += work
        self._offered[shard] += work

    def finish(self, shard: int, work: int, now: float) -> None:
        self._outstanding[shard] -= work
        self._done[shard] += work
        since = self._since[shard]
        idle = self._outstanding[shard] <= 0
        span = now - since
        if span < self.sample_s and not idle:
            return
        if span > 0 and (span >= self.sample_s or self._from_idle[shard]):
            self._learn(shard, self._done[shard] / span, span)
        self._since[shard] = None if idle else now
        self._from_idle[shard], self._offered[shard], self._done[shard] = False, self._outstanding[shard], 0

    def _learn(self, shard: int, sample: float, span: float) -> None:
        rate = self.rates[shard]
        if sample < rate and self._offered[shard] < rate * span:
            return  # slow for want of work: no news of its speed
        self.rates[shard] = rate + self.alpha * (sample - rate)
        self.samples[shard] += 1

    @property
    def outstanding(self) -> list[int]:
        """Work started and not finished, per shard (zero on every shard once all have finished)."""
        return list(self._outstanding)
