"""The admission controller: quote, judge against the objective, book or refuse (see parity.admission)."""

from __future__ import annotations

import queue
from typing import NamedTuple

from parity.admission.rate import ServiceRate
from parity.admission.settings import BoundedSettings
from parity.errors import ParityError
from parity.latency import Objective


class Decision(NamedTuple):
    """One request's fate: admitted on `shard` as the router's `index`-th booking, or refused (`reason` says why).
    A tuple, and its reason written only when read: the controller's whole cost is a few microseconds."""

    shard: int | None
    index: int | None  # the router's routing index: what `Controller.complete` takes
    predicted_s: float  # the first token's predicted wait on the shard judged last
    moved: bool = False  # placed on another shard than the router chose (`reroute`)
    why: tuple | None = None  # a refusal's facts: (shard, booked, uncached, rate, budget_s, ttft_s, headroom, reroute)

    @property
    def admitted(self) -> bool:
        return self.shard is not None

    @property
    def reason(self) -> str | None:
        """One line: the predicted wait against the objective, and what it was predicted from."""
        if self.why is None:
            return None
        shard, booked, uncached, rate, budget_s, ttft_s, headroom, reroute = self.why
        where = "no shard meets it" if reroute else f"on shard {shard}"
        return (f"predicted first token in {self.predicted_s:.2f} s > {budget_s:.2f} s ({headroom:g} x the "
                f"{ttft_s:g} s objective) {where}: {booked} tokens booked + {uncached} uncached at {rate:.0f} tokens/s")


class Controller:
    """Bounded admission in front of a router that quotes before it books (parity.prefix_router.PrefixRouter).

    `decide(tokens, now)` per request; `complete(index, now)` when an admitted one finished (from any thread:
    queued, applied before the next decision, as the router does). `now` is the caller's monotonic clock."""

    def __init__(self, router, settings: BoundedSettings = BoundedSettings(), objective: Objective = Objective()):
        if not hasattr(router, "quote"):
            raise ParityError(f"bounded admission needs the prefix router (placement prefix), which books each "
                              f"shard's work; got {type(router).__name__}")
        self.router, self.settings, self.objective = router, settings, objective
        self.budget_s = objective.ttft_s * settings.headroom
        shards = router.num_shards
        self.rate = ServiceRate(shards, settings.seed_tokens_per_s, settings.alpha, settings.sample_s)
        self._works: dict[int, tuple[int, int]] = {}  # routing index -> (shard, work) until it completes
        self._completed: queue.SimpleQueue = queue.SimpleQueue()
        self.admitted = self.refused = self.moved = 0

    def decide(self, tokens, now: float) -> Decision:
        """Admit (booked on its shard) or refuse (nothing booked) this prompt, arriving `now`."""
        self._apply()
        quote = self.router.quote(tokens)
        loads, rates = quote.loads, self.rate.rates
        shard = quote.shard
        booked = loads[shard]
        wait = (booked + quote.length - quote.held(shard)) / rates[shard]
        moved = False
        if booked and wait > self.budget_s and self.settings.reroute:
            best = min(range(len(loads)), key=lambda s: ((loads[s] + quote.length - quote.held(s)) / rates[s], s))
            best_wait = (loads[best] + quote.length - quote.held(best)) / rates[best]
            if not loads[best] or best_wait <= self.budget_s:
                shard, booked, wait, moved = best, loads[best], best_wait, True
        if booked and wait > self.budget_s:
            self.refused += 1
            return Decision(None, None, wait, False, (shard, booked, quote.length - quote.held(shard), rates[shard],
                                                      self.budget_s, self.objective.ttft_s, self.settings.headroom,
                                                      self.settings.reroute))
        work = quote.work(shard)
        index = self.router.requests  # the routing index this booking gets
        self.router.commit(quote, shard)
        self._works[index] = (shard, work)
        self.rate.start(shard, work, now)
        self.admitted += 1
        self.moved += moved
        return Decision(shard, index, wait, moved)

    def complete(self, index: int, now: float) -> None:
        """The `index`-th admitted request finished at `now`: its work is released and teaches the shard's rate."""
        self._completed.put((index, now))

    def _apply(self) -> None:
        completed = self._completed
        while not completed.empty():  # one consumer: what it saw stays there
            index, now = completed.get_nowait()
            entry = self._works.pop(index, None)
            if entry is not None:  # once only
                self.rate.finish(entry[0], entry[1], now)
                self.router.complete(index)

    def stats(self) -> dict:
        """Counts, each shard's learned rate and the settings, for a trial's record."""
        self._apply()
        return {"admitted": self.admitted, "refused": self.refused, "moved": self.moved,
                "rates_tokens_per_s": [round(r, 1) for r in self.rate.rates], "rate_samples": list(self.rate.samples),
                "settings": self.settings.to_dict(), "objective": self.objective.to_dict()}
