"""Bounded admission's decisions on a fixed seeded sequence, pinned: a change made for speed must leave every
decision (shard, index, predicted wait to the last bit, move, booked prefill, a refusal's one-line reason) as it was.
A stub router (not parity.routing.prefix) so that only the controller's own arithmetic is pinned."""

import hashlib
import heapq

import numpy as np
import pytest

from parity.admission import BoundedSettings, Controller
from parity.latency import Objective


class _Quote:
    __slots__ = ("length", "shard", "_held")

    def __init__(self, length, shard, held):
        self.length, self.shard, self._held = length, shard, held

    def held(self, shard):
        return self._held[shard]


class _Router:
    """Quotes drawn from a seeded stream: a prompt of `length` tokens, the shard its document lives on and what
    each shard holds of it (the document's 2,000 tokens there, a little elsewhere)."""

    quotes = True

    def __init__(self, shards):
        self.num_shards, self.requests = shards, 0

    def quote(self, spec):
        length, home, held = spec
        return _Quote(length, home, held)

    def commit(self, quote, shard=None):
        self.requests += 1
        return shard

    def complete(self, index):
        pass


def decisions(reroute: bool, count: int = 3000, shards: int = 2, seed: int = 11) -> tuple[list, Controller]:
    """Every decision over a seeded arrival stream at about 1.6 x what first-come engines of 40,000 prefill tokens
    a second serve (each first token a step of 20-60 ms after its prefill, each answer 0.32 s after that)."""
    rng = np.random.default_rng(seed)
    controller = Controller(_Router(shards), BoundedSettings(reroute=reroute), Objective(ttft_s=0.5))
    free, events, out, now = [0.0] * shards, [], [], 0.0
    for _ in range(count):
        now += float(rng.exponential(0.012))
        while events and events[0][0] <= now:
            at, index, done = heapq.heappop(events)
            (controller.complete if done else controller.first_token)(index, at)
        home = int(rng.integers(shards))
        own = int(rng.choice([40, 2040], p=[0.75, 0.25]))
        held = [2000 if s == home and own == 40 else int(rng.integers(0, 64)) for s in range(shards)]
        decision = controller.decide((2040, home, held), now)
        out.append((*decision[:5], decision.reason))  # a refusal's facts as the one line that says them
        if decision.admitted:
            shard = decision.shard
            free[shard] = max(free[shard], now) + decision.prefill / 40_000.0 + float(rng.uniform(0.02, 0.06))
            heapq.heappush(events, (free[shard], decision.index, False))
            heapq.heappush(events, (free[shard] + 0.32, decision.index, True))
    return out, controller


def digest(rows: list) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()


# the model judged at the 99th percentile (issue 30); re-pinned only when a decision is meant to change.
# Re-pinned (adm16-bias) because the bias now learns the waits over the line, not over the biased central it
# already scaled (whose fixed point was the square root of the line's error, and which decayed to 1 when right):
# on this sequence it refuses more (1828 / 1871 of 3000 against 1719 / 1789) and the admitted waits' p99 falls
# from 0.73 to 0.60 s (objective 0.5 s)
# Re-pinned (adm18-ratio) because the bias is now the ratio of the fading sums of waits and of the line's
# predictions, not the fading mean of their ratios (one first token with almost nothing ahead moved that mean by
# several times): on this sequence it refuses a little less (1777 / 1855 against 1828 / 1871) and the admitted
# waits' p99 is 0.58 / 0.55 s against 0.60 / 0.49 s
# Re-pinned (adm18-kinds) because a request that brings its own prefill is judged by its own kind's errors (their mean
# and spread), the others by theirs: on this sequence, whose line is far off (one shard's rate at its floor, biases
# 1-2.6), it refuses 1741 / 1875 against 1777 / 1855 and the admitted waits' p99 rises to 0.67 / 0.75 s from
# 0.58 / 0.55 s (objective 0.5 s; benchmarks/simulated/admission-bias-2026-12-04.txt says so beside the simulator's)
GOLDEN = {False: "9bed2166cb701609a716d1ce65432948a57a17f456d7885552d40738c7c52b4a",
          True: "28521c2be865df5033cb00c5cf9cb2d81b9073a6d803235d8245cbac969ca168"}


@pytest.mark.parametrize("reroute", [False, True])
def test_decisions_on_a_fixed_seeded_sequence_are_pinned(reroute):
    rows, controller = decisions(reroute)
    assert controller.refused > 100 and controller.admitted > 100  # the sequence exercises both outcomes
    if reroute:
        assert controller.moved > 10
    assert digest(rows) == GOLDEN[reroute]
