"""The admission controller: quote, judge against the objective, book or refuse (see parity.admission)."""

from __future__ import annotations

import threading
from math import inf
from typing import NamedTuple

from parity.admission.rate import ServiceRate
from parity.admission.retry import Attempts
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
    prefill: int = 0  # an admitted request's uncached prefill, booked on its shard until its first token
    why: tuple | None = None  # a refusal's facts: (shard, ahead, uncached, rate, latency_s, budget_s, ttft_s,
    # headroom, reroute, quantile, bias, held_s, orphan_s); budget_s: what is left of it after held_s; orphan_s: an
    # orphan's (settings.orphan_s), how long ago its document's uncached question was refused, else None
    until: float | None = None  # held (`queue_s`): no fate yet; by this time (the caller's clock) its `wake` gets it

    @property
    def held(self) -> bool:
        return self.until is not None

    @property
    def admitted(self) -> bool:
        return self.shard is not None

    @property
    def retry_after_s(self) -> float | None:
        """A refusal's Retry-After: how much later the predicted wait would fit the budget (the work ahead
        drains meanwhile at the predicted pace), at least 10 ms; by the central wait where the margin is not yet
        known (infinite: a shard that has seen too few first tokens), so that a retry is never put off for ever."""
        if self.why is None:
            return None
        predicted_s = self.predicted_s if self.predicted_s < inf else self._central_s
        return max(0.01, predicted_s - self.why[5])  # over the budget

    @property
    def _central_s(self) -> float:
        """A refusal's central wait (the line times its bias) at the work it was judged with: the prediction
        without the quantile's margin."""
        _shard, ahead, uncached, rate, latency_s, *_, bias, _held_s, _orphan_s = self.why
        return bias * (latency_s + (ahead + uncached) / rate)

    @property
    def reason(self) -> str | None:
        """One line: the predicted wait against the objective, and what it was predicted from."""
        if self.why is None:
            return None
        (shard, ahead, uncached, rate, latency_s, budget_s, ttft_s, headroom, reroute, quantile, bias, held_s,
         orphan_s) = self.why
        if orphan_s is not None:
            return (f"an orphan on shard {shard}: its document's uncached question was refused {orphan_s:.3f} s ago, "
                    f"and alone it would prefill {uncached} tokens for one question (predicted first token in "
                    f"{self.predicted_s:.2f} s, {ahead} prefill tokens ahead)")
        # held_s: held by the controller (queue_s) or, for a retry, the time since its first arrival
        held, less = (f"waited {held_s:.3f} s since its arrival, then ", " less that wait") if held_s else ("", "")
        where = "no shard meets it" if reroute else f"on shard {shard}"
        margin_s = self.predicted_s - self._central_s
        margin = (f", plus a margin of {margin_s:.3f} s for the {quantile * 100:g}th percentile of its errors"
                  if quantile else "")
        return (f"{held}predicted first token in {_s(self.predicted_s)} s > {_s(budget_s)} s ({headroom:g} x the "
                f"{ttft_s:g} s objective{less}) {where}: {ahead} prefill tokens ahead + {uncached} uncached at "
                f"{rate:.0f} prefill tokens/s after {latency_s:.3f} s, x {bias:.2f} (its recent bias){margin}")


def _s(seconds: float) -> str:
    """Seconds in a reason: two decimals, or three significant digits under 0.1 s (a 1 ms objective's budget read
    0.00, an outsider's)."""
    return f"{seconds:.2f}" if not 0 < abs(seconds) < 0.1 else f"{seconds:.3g}"


_DONE = object()  # a request no longer open (completed, or never admitted)
_decision = tuple.__new__  # a Decision of all seven fields, without NamedTuple's __new__ (a Python call, 0.3 us)


class Controller:
    """Bounded admission in front of a router that quotes before it books (parity.routing.prefix.PrefixRouter).

    `decide(tokens, now)` per request; `first_token(index, now)` when an admitted one's first token came (a
    streamed answer), `complete(index, now)` when it finished (from any thread, under the controller's lock: each
    is learned when it is reported, so its cost is its own request's, not queued for whichever decision comes
    next, where several reported at once made that decision the p99 of the cost, issue 30; the router still
    queues the release of its booking). `now` is the caller's monotonic clock.

    The first token waits only for the prefill ahead of it (continuous batching runs the answers already
    decoding beside it), so the controller books each admitted request's uncached prefill on its shard until its
    first token, apart from the router's booking (prefill plus decode until the whole answer, which places
    requests), and learns each shard's first-token wait from those first tokens (`rate.ServiceRate`: a latency
    plus the prefill ahead over a rate, under the decode load the engine runs, as it actually delivers it). An
    answer not streamed releases its prefill when it completes (a later, so cautious, first token)."""

    def __init__(self, router, settings: BoundedSettings = BoundedSettings(), objective: Objective = Objective()):
        if not router.quotes:  # declared by its class (parity.routing.base.Router)
            raise ParityError(f"bounded admission needs the prefix router (placement prefix), which books each "
                              f"shard's work; got {type(router).__name__}")
        self.router, self.settings, self.objective = router, settings, objective
        self.budget_s = objective.ttft_s * settings.headroom
        shards = router.num_shards
        self.rate = ServiceRate(shards, settings.seed_tokens_per_s, settings.alpha,
                                span=settings.seed_tokens_per_s * self.budget_s, z=settings.z,
                                cold_sd_s=settings.cold_sd_s)
        self.ahead = [0] * shards  # per shard: uncached prefill of admitted requests before their first token
        self._open: dict[int, tuple | None] = {}  # routing index of each admitted request not yet complete -> its
        # booking until its first token (shard, prefill, work ahead, admitted at, the central wait, bias and kind it
        # was judged by), then None
        self._lock = threading.Lock()  # decisions, and first tokens and completions from the answers' threads
        self.queue_s = min(settings.queue_s, self.budget_s)  # no hold past the budget: nothing would fit after it
        self._held: list[tuple] = []  # held requests in arrival order: (arrived, until, tokens, attempt, wake)
        self.admitted = self.refused = self.moved = self.retried = 0  # tries; retried: admitted on a retry
        self.held = self.held_admitted = 0  # requests held (`queue_s`), and of those admitted later
        self.orphan_s = settings.orphan_s
        self._refused_docs: dict[int, tuple[float, int, int]] = {}  # `orphan_s`: a document's first block -> when
        # its uncached question was last refused, how many of them were, and how often it was asked since the first
        self.orphans = 0  # refused as orphans

    def decide(self, tokens, now: float, attempt: int = 0, wake=None, arrived: float | None = None) -> Decision:
        """Admit (booked on its shard) or refuse (nothing booked) this prompt, arriving `now`; `attempt` counts
        the client's earlier tries of it (parity.admission.retry), and a retry is judged against what is left of
        the budget since its first arrival `arrived` (its wait so far counts, and an idle shard is no exception: a
        retry judged afresh was admitted at about the wait it was refused for, past the objective, an outsider's,
        2026-12-07). With `queue_s`, one that would be refused is
        held instead (a Decision with `until`): `wake(decision)` gets its fate later, from whichever call re-judged
        it (`first_token`, `complete`, or the caller's `expire` at `until`), under the controller's lock. Written
        for its cost (a few microseconds, issue 30): the wait model read inline, the other shards weighed only
        when the router's cannot meet the budget."""
        waited_s = now - arrived if attempt and arrived is not None and now > arrived else 0.0
        with self._lock:  # the answers' threads report first tokens and completions meanwhile
            decision = self._judge(tokens, now, waited_s, attempt)
            if decision[0] is None:
                if self.queue_s:
                    if wake is None:
                        raise ParityError("admission setting queue_s holds a request: decide needs its wake")
                    until = now + self.queue_s
                    self._held.append((now, until, tokens, attempt, wake))
                    self.held += 1
                    return _decision(Decision, (None, None, decision[2], False, 0, None, until))
                self.refused += 1
            return decision

    def _judge(self, tokens, now: float, held_s: float, attempt: int) -> Decision:
        """`decide`'s judgement, the lock held: a request held `held_s` already has that much less budget, and
        the idle-shard exception (admit when nothing is ahead) is for a first try only (a held one has already
        waited: admitted past what is left of its budget, it would miss)."""
        quote = self.router.quote(tokens)
        shard, ahead, budget_s, predict = quote.shard, self.ahead, self.budget_s - held_s, self.rate.predict
        own = quote.length - quote.held(shard)
        fresh = 2 * own > quote.length  # it brings its own prefill (a document's first question): its own errors
        wait = predict(shard, ahead[shard] + own, fresh)
        moved = False
        # `orphan_s`: the document (its first block) of a question that would come uncached, else None
        document = quote.chain[0] if self.orphan_s and fresh and quote.chain else None
        if document is not None and (ahead[shard] or held_s):
            refused_at, refusals, asked = self._refused_docs.get(document, (None, 0, 0))
            if refused_at is not None and now - refused_at <= self.orphan_s:
                demand = self.settings.orphan_demand
                self._refused_docs[document] = (refused_at, refusals, asked + 1)
                if refusals > self.settings.orphan_grace and not (demand and asked + 1 >= demand):
                    self.orphans += 1
                    return self._refusal(shard, own, wait, budget_s, held_s, now - refused_at)
        if wait > budget_s and (ahead[shard] or held_s):
            if self.settings.reroute:  # the least predicted wait, the lowest shard on a tie
                best, best_own, best_wait, best_fresh = shard, own, wait, fresh
                for other in range(len(ahead)):
                    if other != shard:
                        other_own = quote.length - quote.held(other)
                        other_fresh = 2 * other_own > quote.length
                        other_wait = predict(other, ahead[other] + other_own, other_fresh)
                        if other_wait < best_wait or (other_wait == best_wait and other < best):
                            best, best_own, best_wait, best_fresh = other, other_own, other_wait, other_fresh
                if best != shard and ((not ahead[best] and not held_s) or best_wait <= budget_s):
                    shard, own, wait, fresh, moved = best, best_own, best_wait, best_fresh, True
            if (ahead[shard] or held_s) and wait > budget_s:
                if document is not None:  # a document's uncached question refused: its next ones are orphans
                    self._remember_refused(document, now)
                return self._refusal(shard, own, wait, budget_s, held_s, None)
        router, rate = self.router, self.rate
        index = router.requests  # the routing index this booking gets
        router.commit(quote, shard)
        self._open[index] = (shard, own, ahead[shard], now, rate.centrals[shard], rate.bias[shard], fresh)
        # its latest predict, the bias in it, and its kind
        ahead[shard] += own
        self.admitted += 1
        if moved:
            self.moved += 1
        if attempt:
            self.retried += 1
        return _decision(Decision, (shard, index, wait, moved, own, None, None))

    def _refusal(self, shard: int, own: int, wait: float, budget_s: float, held_s: float,
                 orphan_s: float | None) -> Decision:
        """A refusal on `shard` and the facts its reason is written from (Decision.why)."""
        settings, rate = self.settings, self.rate
        return _decision(Decision, (None, None, wait, False, 0, (
            shard, self.ahead[shard], own, rate.rates[shard], rate.latency_s[shard], budget_s, self.objective.ttft_s,
            settings.headroom, settings.reroute, settings.quantile, rate.bias[shard], held_s, orphan_s), None))

    def _remember_refused(self, document: int, now: float) -> None:
        """`orphan_s`: note that `document`'s uncached question was refused `now` (and count the refusals within
        `orphan_s` of each other, for `orphan_grace`, and the times it was asked since the first, for
        `orphan_demand`); forget those older than `orphan_s` once many are kept (the lock held)."""
        docs = self._refused_docs
        at, refusals, asked = docs.get(document, (None, 0, 0))
        recent = at is not None and now - at <= self.orphan_s
        docs[document] = (now, refusals + 1, asked) if recent else (now, 1, 1)
        if len(docs) > 4096:
            self._refused_docs = {d: seen for d, seen in docs.items() if now - seen[0] <= self.orphan_s}

    def expire(self, now: float) -> None:
        """Re-judge the held requests at `now`: the caller calls it at each held request's `until` (the controller
        keeps no clock of its own)."""
        with self._lock:
            self._rejudge(now)

    def _rejudge(self, now: float) -> None:
        """Judge each held request again, in arrival order (the lock held): admitted when its predicted wait fits
        what is left of the budget after its hold; refused at its bound, or at once where no work is ahead of it
        on the shard judged (an idle shard's wait does not fall by waiting)."""
        still = []
        for hold in self._held:
            arrived, until, tokens, attempt, wake = hold
            decision = self._judge(tokens, now, now - arrived, attempt)
            if decision[0] is not None:
                self.held_admitted += 1
            elif now >= until or not decision.why[1]:
                self.refused += 1
            else:
                still.append(hold)
                continue
            wake(decision)
        self._held = still

    def attempts(self, offsets: list[float]) -> Attempts:
        """A burst's tries under the client's retry policy (`settings.retries`), each request's first at its offset."""
        return Attempts(offsets, self.settings.retries, self.budget_s)

    def first_token(self, index: int, now: float) -> None:
        """The `index`-th admitted request's first token came at `now`: its prefill is done (teaches the rate)."""
        with self._lock:
            booking = self._open.get(index)
            if booking is not None:  # once only
                self._open[index] = None
                self._learn(booking, now)
                if self._held:
                    self._rejudge(now)

    def complete(self, index: int, now: float) -> None:
        """The `index`-th admitted request finished at `now`: the router releases its work (and the controller its
        prefill, if no first token was reported)."""
        with self._lock:
            booking = self._open.pop(index, _DONE)
            if booking is _DONE:  # once only
                return
            if booking is not None:  # no first token reported
                self._learn(booking, now)
            self.router.complete(index)
            if booking is not None and self._held:
                self._rejudge(now)

    def _learn(self, booking: tuple, now: float) -> None:
        """A booking's first token came at `now`: release its prefill and learn from its wait (the lock held)."""
        shard, own, before, admitted_at, central_s, bias, fresh = booking
        self.ahead[shard] -= own
        self.rate.observe(shard, before, own, now - admitted_at, central_s, bias, fresh)

    def stats(self) -> dict:
        """Counts, each shard's learned wait model (rate, latency, bias, its errors' mean and spread) and the
        settings, for a trial's record."""
        with self._lock:
            rate = self.rate.fitted()
            errors = [rate.errors(shard) for shard in range(len(self.ahead))]
            return {"admitted": self.admitted, "refused": self.refused, "moved": self.moved, "retried": self.retried,
                    **({"orphans": self.orphans} if self.orphan_s else {}),
                    "held": self.held, "held_admitted": self.held_admitted,
                    "rates_tokens_per_s": [round(r, 1) for r in rate.rates], "rate_samples": list(rate.samples),
                    "latency_s": [round(s, 4) for s in rate.latency_s], "bias": [round(b, 3) for b in rate.bias],
                    "error_mean_s": [round(m, 4) for m, _ in errors],
                    "error_sd_s": [round(sd, 4) if sd < inf else None for _, sd in errors],  # None: one error seen
                    "settings": self.settings.to_dict(), "objective": self.objective.to_dict()}
