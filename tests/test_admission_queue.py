"""Bounded admission's deadline-aware queue (`BoundedSettings.queue_s`, off by default): a request that would be
refused is held, judged again as first tokens release booked prefill, admitted when its predicted wait fits the
budget less its hold, refused at its bound with its reason. Nothing is timed: every `now` is given."""

import numpy as np
import pytest

from parity.admission import BoundedSettings, Controller
from parity.errors import ParityError
from parity.latency import Objective
from parity.routing import PrefixRouter

RNG = np.random.default_rng(8)


def _prompt(tokens: int) -> np.ndarray:
    return RNG.integers(0, 32_000, tokens, dtype=np.uint32)


def _controller(shards=1, queue_s=1.0) -> Controller:
    """1,000 prefill tokens/s seeded, judged by the line alone, a 2 s objective."""
    router = PrefixRouter(shards, "rev", cache_tokens=1_000_000)
    settings = BoundedSettings(seed_tokens_per_s=1000.0, quantile=0.0, queue_s=queue_s)
    return Controller(router, settings, Objective(ttft_s=2.0))


def test_a_held_request_is_admitted_when_work_drains():
    c, fates = _controller(), []
    first = c.decide(_prompt(1200), now=0.0, wake=fates.append)
    assert first.admitted
    held = c.decide(_prompt(1200), now=0.1, wake=fates.append)  # (1,200 ahead + 1,200 own) / 1,000 = 2.4 s > 2 s
    assert held.held and not held.admitted and held.reason is None and held.until == pytest.approx(1.1)
    assert fates == [] and (c.admitted, c.refused, c.held) == (1, 0, 1)
    assert c.decide(_prompt(10), now=0.2, wake=fates.append).admitted  # a small one fits beside it
    c.first_token(first.index, now=0.6)  # the first's prefill done: 1,200 own, held 0.5 s, fits 1.5 s
    assert len(fates) == 1 and fates[0].admitted and fates[0].shard == 0 and fates[0].index == 2
    assert (c.admitted, c.refused, c.held, c.held_admitted) == (3, 0, 1, 1)
    assert c.stats()["held"] == 1 and c.stats()["held_admitted"] == 1
    c.first_token(first.index, now=0.7)  # again: nothing more to release, no one woken twice
    assert len(fates) == 1


def test_a_request_held_past_its_bound_is_refused_with_its_reason():
    c, fates = _controller(queue_s=0.3), []
    first = c.decide(_prompt(1500), now=0.0, wake=fates.append)
    held = c.decide(_prompt(1500), now=0.1, wake=fates.append)
    assert held.held and held.until == pytest.approx(0.4)
    c.expire(now=0.3)  # before its bound: still held
    assert fates == [] and c.refused == 0
    c.expire(now=0.4)
    (refusal,) = fates
    assert not refusal.admitted and not refusal.held and refusal.shard is None
    assert refusal.reason.startswith("waited 0.300 s since its arrival, then predicted first token in 3.00 s > 1.70 s")
    assert "objective less that wait" in refusal.reason and "\n" not in refusal.reason
    assert (c.admitted, c.refused, c.held, c.held_admitted) == (1, 1, 1, 0)
    c.first_token(first.index, now=1.0)  # refused for good: never woken again
    assert len(fates) == 1


def test_a_held_request_whose_shard_has_nothing_ahead_and_still_cannot_fit_is_refused_at_once():
    """An idle shard's wait does not fall by waiting: refused when its prefill is released, not at the bound."""
    c, fates = _controller(queue_s=2.0), []
    first = c.decide(_prompt(1900), now=0.0, wake=fates.append)
    c.decide(_prompt(1900), now=0.0, wake=fates.append)
    c.first_token(first.index, now=1.0)  # nothing ahead now, but 1.9 s > 2 s less 1 s held
    (refusal,) = fates
    assert not refusal.admitted and refusal.reason.startswith("waited 1.000 s since its arrival, then predicted")


def test_a_burst_of_holds_leaks_no_slot_or_booking():
    """60 arrivals 10 ms apart on 2 shards, each answered in turn: every request gets exactly one fate (admitted
    at once, or held and then admitted or refused), the router's indices are the admitted ones', and once every
    answer is back nothing is booked and nothing is held."""
    c, fates, admitted = _controller(shards=2, queue_s=0.5), {}, []

    def wake(i):
        return lambda decision: fates.setdefault(i, []).append(decision)

    for i in range(60):
        decision = c.decide(_prompt(1200), now=0.01 * i, wake=wake(i))
        if not decision.held:
            fates.setdefault(i, []).append(decision)
    assert c.held > 0 and c._held
    now, answered = 0.6, 0
    while answered < len([d for f in fates.values() for d in f if d.admitted]) or c._held:
        ready = [d for f in fates.values() for d in f if d.admitted]
        if answered < len(ready):
            d = ready[answered]
            c.first_token(d.index, now)
            c.complete(d.index, now + 0.05)
            answered += 1
        else:
            c.expire(now)
        now += 0.1
    assert sorted(fates) == list(range(60)) and all(len(f) == 1 for f in fates.values())
    admitted = [f[0] for f in fates.values() if f[0].admitted]
    assert c.held_admitted > 0 and c.refused > 0 and c.admitted + c.refused == 60
    assert sorted(d.index for d in admitted) == list(range(len(admitted))) == list(range(c.router.requests))
    c.stats()
    assert c.router.loads == [0, 0] and c.ahead == [0, 0] and c._held == [] and c._open == {}
    assert c.decide(_prompt(1200), now=now + 1.0, wake=wake(60)).admitted  # and the next one finds room again


def test_off_by_default_and_never_holding_then():
    c = Controller(PrefixRouter(1, "rev", cache_tokens=1_000_000), BoundedSettings(seed_tokens_per_s=1000.0),
                   Objective(ttft_s=2.0))
    assert BoundedSettings().queue_s == 0.0
    c.decide(_prompt(1500), now=0.0)
    refused = c.decide(_prompt(1500), now=0.1)
    assert not refused.admitted and not refused.held and refused.reason.startswith("predicted first token")
    assert (c.held, c.refused) == (0, 1)


@pytest.mark.parametrize("values, message", [
    ({"queue_s": -0.1}, "admission setting queue_s must be 0 or more seconds, got -0.1"),
    ({"queue_s": float("nan")}, "admission setting queue_s must be a number, got nan"),
    ({"queue_s": float("inf")}, "admission setting queue_s must be a number, got inf"),
    ({"queue_s": "soon"}, "admission setting queue_s must be a number, got 'soon'"),
    ({"queue_s": 0.2, "retries": 2}, "admission settings queue_s and retries are two ways to try a refused request "
                                     "again: set one"),
])
def test_bad_queue_settings_are_refused_in_one_line(values, message):
    with pytest.raises(ParityError) as error:
        BoundedSettings.from_dict(values)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_caller_that_cannot_hold_is_refused_in_one_line():
    """A path whose client does not hold requests yet (the Flame client) passes no `wake`: refused, not dropped."""
    c = _controller()
    c.decide(_prompt(1500), now=0.0)
    with pytest.raises(ParityError, match="queue_s holds a request: decide needs its wake") as error:
        c.decide(_prompt(1500), now=0.1)
    assert "\n" not in str(error.value) and c._held == []


def test_the_sustained_plan_refuses_the_queue_where_the_flame_client_cannot_hold(small_reuse_trace):
    from parity.experiments import plan
    from parity.experiments.settings import SustainedSettings

    settings = SustainedSettings.from_dict({"rates": [4], "bounded": {"queue_s": 0.2}, "flame": {"api": "async"}})
    with pytest.raises(ParityError, match="queue_s .* runs on the standalone client only") as error:
        plan._sustained([small_reuse_trace], settings)
    assert "\n" not in str(error.value)


def test_the_standalone_client_sends_a_held_request_once_admitted(small_reuse_trace, tmp_path):
    """Simulated replicas on the CPU, the whole burst at once under a 40 ms objective held up to its bound: every
    request is a completion or a refusal with its reason, the held ones among them, and nothing is left booked."""
    from parity.engine import EngineArgs
    from parity.paths.standalone import StandalonePath
    from parity.routing import RouterSettings
    from parity.schedule import Schedule
    from parity.trace import load_trace

    trace = load_trace(small_reuse_trace)
    ids = [r.id for r in trace.requests]
    settings = RouterSettings("prefix")
    with StandalonePath("sim", ["sim-0", "sim-1"], EngineArgs(), tmp_path / "logs", stream=True) as path:
        with path.trial("t", settings):
            router = settings.make(path.shards)
            controller = Controller(router, BoundedSettings(queue_s=1.0), Objective(ttft_s=0.05))
            burst = path.release(list(trace.prompts), ids, router, Schedule(), admission=controller)
    stats = burst.extra["admission"]
    assert stats["held"] == len(ids) - 2  # each shard's first admitted at once, every later one held
    assert len(burst.completions) + len(burst.refused) == len(ids) == stats["admitted"] + stats["refused"]
    assert len(burst.completions) == 2 + stats["held_admitted"]
    # a held request says when its hold let it leave (its send lag is measured from then), the two sent at once do not
    assert sum(c.due_s is not None for c in burst.completions) == stats["held_admitted"]
    assert all(c.due_s is None or c.sent_s >= c.due_s for c in burst.completions)
    assert all(r.startswith("waited ") and "\n" not in r for r in burst.refused.values())
    assert router.loads == [0, 0] and controller.ahead == [0, 0] and controller._held == []
