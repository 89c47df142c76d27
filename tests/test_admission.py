"""Bounded admission (parity.admission): refusals with reasons, no leaked work, a learned rate that follows the
engine, one-line errors. Nothing is timed: every `now` is given."""

import heapq
import json
import queue
import threading
from pathlib import Path

import numpy as np
import pytest

from parity.admission import BoundedSettings, Controller, ServiceRate
from parity.errors import ParityError
from parity.latency import Objective
from parity.routing import AffinityRouter, PrefixRouter

RNG = np.random.default_rng(7)


def _prompt(tokens: int, head: np.ndarray | None = None) -> np.ndarray:
    tail = RNG.integers(0, 32_000, tokens - (0 if head is None else head.size), dtype=np.uint32)
    return tail if head is None else np.concatenate([head, tail])


def _controller(shards=1, rate=1000.0, reroute=False, headroom=1.0, quantile=0.0) -> Controller:
    """Judged by the line alone unless a `quantile` is given (tests/test_admission_quantile.py has the margin)."""
    router = PrefixRouter(shards, "rev", cache_tokens=1_000_000)
    settings = BoundedSettings(headroom=headroom, seed_tokens_per_s=rate, reroute=reroute, quantile=quantile)
    return Controller(router, settings, Objective(ttft_s=2.0))


def test_a_request_that_cannot_meet_the_objective_is_refused_with_its_reason():
    c = _controller(rate=1000.0)
    first = c.decide(_prompt(1500), now=0.0)
    assert first.admitted and first.index == 0 and first.reason is None
    second = c.decide(_prompt(1500), now=0.1)  # (1,500 prefill ahead + 1,500 own) / 1,000 tokens/s = 3 s > 2 s
    assert not second.admitted and second.shard is None and second.index is None
    assert second.predicted_s == pytest.approx(3.0)
    assert "3.00 s > 2.00 s" in second.reason
    assert "1500 prefill tokens ahead + 1500 uncached at 1000 prefill tokens/s" in second.reason
    assert "\n" not in second.reason
    assert (c.admitted, c.refused) == (1, 1)
    assert second.retry_after_s == pytest.approx(1.0)  # when 1,000 of the tokens ahead will have drained
    assert first.retry_after_s is None


def test_the_clients_retry_policy_tries_a_refused_request_again_in_its_turn():
    """Each request's first try at its offset, a retry at the time `again` gives it, in time order with the rest;
    no more tries than the policy allows, and the final reason says how many it had."""
    from parity.admission.retry import Attempts

    attempts, seen = Attempts([0.0, 0.1, 0.2], retries=1), []
    for offset, index, attempt in attempts:
        seen.append((offset, index, attempt))
        if index == 0:
            assert attempts.again(index, attempt, offset + 0.15) == (attempt == 0)
    assert seen == [(0.0, 0, 0), (0.1, 1, 0), (0.15, 0, 1), (0.2, 2, 0)]
    assert attempts.final("why", 1) == "why; refused on all 2 tries"
    assert Attempts([0.0], retries=0).final("why", 0) == "why"


def test_a_retry_is_judged_against_what_is_left_of_its_budget_and_never_tried_past_it():
    """An outsider's (2026-12-07): each retry was judged afresh with the whole budget, and an idle shard admitted it
    whatever its wait, so retried requests were admitted at about the wait they were refused for, past the objective.
    A retry now has its wait since its first arrival counted against the budget, and no retry comes past it."""
    from parity.admission.retry import Attempts

    c = _controller(rate=1000.0)
    assert c.decide(_prompt(1500), now=0.0).admitted
    refused = c.decide(_prompt(1500), now=0.1)  # 3 s predicted > 2 s
    assert not refused.admitted and refused.retry_after_s == pytest.approx(1.0)
    c.first_token(0, 1.5)  # the work ahead drained: idle again
    fresh = _controller(rate=1000.0)  # the same prompt, a first try on an idle shard: admitted (1.5 s)
    assert fresh.decide(_prompt(1500), now=1.1).admitted
    late = c.decide(_prompt(1500), now=1.1, attempt=1, arrived=0.1)  # 1.5 s more after 1.0 s waited: 2.5 s > 2 s
    assert not late.admitted and "waited 1.000 s since its arrival, then predicted first token in 1.50 s > 1.00 s" in late.reason
    ok = c.decide(_prompt(500), now=1.2, attempt=1, arrived=0.9)  # 0.5 s more after 0.3 s: within the budget
    assert ok.admitted
    attempts = Attempts([0.0, 0.5], retries=3, budget_s=2.0)
    assert attempts.again(0, 0, 1.9) and not attempts.again(1, 0, 2.6)  # 2.6 s is past request 1's 0.5 + 2.0 s
    assert attempts.final("why", 0) == "why; refused on 1 try: a retry would come past its budget"
    assert attempts.final("why", 1) == "why; refused on 2 tries: a retry would come past its budget"
    assert attempts.final("why", 3) == "why; refused on all 4 tries"


def test_the_first_token_frees_the_prefill_before_the_answer_is_back():
    """A first token waits only for the prefill ahead of it: once the request ahead has its first token, the next is
    admitted while the router still books the first's decode (placement); an answer that is not streamed releases
    its prefill when it completes. Each is applied once, in either order."""
    c = _controller(rate=1000.0)
    first = c.decide(_prompt(1500), now=0.0)
    assert not c.decide(_prompt(1500), now=0.1).admitted
    c.first_token(first.index, now=1.5)
    second = c.decide(_prompt(1500), now=1.6)
    assert second.admitted and c.ahead == [1500] and c.router.loads[0] > 1500  # the router still books the first
    c.complete(second.index, now=3.5)  # not streamed: its prefill goes when it completes
    c.first_token(second.index, now=3.6)  # late, or again: nothing more to release
    c.complete(first.index, now=3.7)
    c.stats()
    assert c.ahead == [0] and c.router.loads == [0]


def test_an_answer_is_learned_when_it_is_reported_even_from_other_threads():
    """A first token releases its prefill and teaches its shard when it is reported, not at the next decision (so
    its cost is its own request's, issue 30); reports from the answers' threads while the client decides leave
    nothing booked and each wait learned once. The budget is so wide that no decision refuses, whatever the threads'
    order taught the rate (a loaded machine reports late)."""
    c = _controller(shards=2, rate=1000.0, headroom=1000.0)  # the widest the settings allow
    first = c.decide(_prompt(1500), now=0.0)
    c.first_token(first.index, now=1.5)
    assert c.ahead == [0, 0] and sum(c.rate.samples) == 1  # no decision since
    reports: queue.SimpleQueue = queue.SimpleQueue()

    def answer() -> None:  # an answers' thread: each admitted request's first token, then its completion
        while (index := reports.get()) is not None:
            c.first_token(index, now=2.0 + index)
            c.complete(index, now=2.5 + index)

    threads = [threading.Thread(target=answer) for _ in range(2)]
    for thread in threads:
        thread.start()
    admitted = 0
    for i in range(300):
        d = c.decide(_prompt(200), now=1.6 + i * 0.001)
        if d.admitted:
            admitted += 1
            reports.put(d.index)
    for thread in threads:
        reports.put(None)
    for thread in threads:
        thread.join()
    c.complete(first.index, now=3.0)
    assert admitted == 300 and sum(c.rate.samples) == admitted + 1
    assert c.ahead == [0, 0] and c.router.loads == [0, 0]


def test_the_prefill_rate_is_learned_from_first_tokens():
    """A shard that reaches each first token at 4,000 prefill tokens/s (however long its answers take after) is
    learned at that rate, up from a seed of 1,000."""
    c = _controller(rate=1000.0, headroom=10.0)
    free, events = 0.0, []  # (time, kind, index), reported in time order as a client sees them
    for i in range(200):
        now = i * 0.3  # 5,000 prefill tokens/s offered: always a backlog
        while events and events[0][0] <= now:
            at, kind, index = heapq.heappop(events)
            (c.first_token if kind == "first" else c.complete)(index, at)
        d = c.decide(_prompt(1500), now=now)
        assert d.admitted
        free = max(free, now) + 1500 / 4000.0
        heapq.heappush(events, (free, "first", d.index))
        heapq.heappush(events, (free + 2.0, "z-complete", d.index))  # a long answer after: not prefill
    c.stats()
    assert c.rate.rates[0] == pytest.approx(4000.0, rel=0.1)


def test_the_expected_hit_is_not_counted_as_work():
    """The same document's next question needs only its own tokens: admitted where a new document is refused."""
    c = _controller(rate=1000.0)
    document = _prompt(1024)
    assert c.decide(_prompt(1040, document), now=0.0).admitted
    assert not c.decide(_prompt(1040), now=0.0).admitted
    question = c.decide(_prompt(1040, document), now=0.0)
    assert question.admitted and question.predicted_s < 1.2


def test_an_idle_shard_always_admits():
    """Refusing on a shard with nothing booked helps no one, and would leave its rate unlearned."""
    c = _controller(rate=10.0)
    assert c.decide(_prompt(5000), now=0.0).admitted


def test_a_burst_of_refusals_leaks_no_booked_work():
    c = _controller(shards=2, rate=1000.0)
    decisions = [c.decide(_prompt(1200), now=0.01 * i) for i in range(60)]
    admitted = [d for d in decisions if d.admitted]
    assert 2 <= len(admitted) < 60 and c.refused == 60 - len(admitted)
    assert [d.index for d in admitted] == list(range(len(admitted)))  # the router's indices: refusals took none
    assert c.router.requests == len(admitted)
    for d in admitted:
        c.complete(d.index, now=5.0)
        c.complete(d.index, now=5.0)  # once only
    c.stats()
    assert c.router.loads == [0, 0] and c.ahead == [0, 0]
    assert c.decide(_prompt(1200), now=6.0).admitted  # and the next one finds room again


def test_reroute_places_a_request_the_sticky_shard_cannot_serve_in_time():
    """A miss that meets the deadline beats a hit that misses it, when `reroute` is on; refused when it is off."""
    document = _prompt(1024)
    for reroute in (False, True):
        c = _controller(shards=2, rate=500.0, reroute=reroute)
        assert c.decide(_prompt(1040, document), now=0.0).shard == 0
        assert c.router.quote(_prompt(1040, document)).shard == 0  # the router would keep it with its document
        d = c.decide(_prompt(1040, document), now=0.0)  # (1,040 ahead + 16) / 500 tokens/s = 2.11 s there
        if reroute:
            assert d.admitted and d.shard == 1 and d.moved and c.moved == 1
        else:
            assert not d.admitted and "on shard 0" in d.reason


def _serve(learner: ServiceRate, rate: float, latency_s: float, works, gaps, start_s=0.0, admit=lambda work: True):
    """A first-come engine that serves `rate` prefill tokens per second and gives each first token `latency_s` after
    its prefill, sent `works` `gaps` apart: the learner is told each first token in time order, as a client is.
    Returns the time the last arrival came."""
    firsts, free, now = [], start_s, start_s  # (first token at, ahead at admission, own, (central wait, admitted at,
    # the bias in that central))
    for work, gap in zip(works, gaps):
        now += gap
        while firsts and firsts[0][0] <= now:
            at, ahead, own, admitted = heapq.heappop(firsts)
            learner.observe(0, ahead, own, at - admitted[1], admitted[0], admitted[2])
        ahead = sum(own for _, _, own, _ in firsts)
        if ahead and not admit(ahead + work):  # an idle shard admits, as the controller's does
            continue
        free = max(free, now) + work / rate
        heapq.heappush(firsts, (free + latency_s, ahead, work, (learner.central(0, ahead + work), now,
                                                                learner.bias[0])))
    return now


def test_the_wait_model_follows_a_slowed_engine():
    """Seeded low, it learns the engine's rate on a varying backlog, and the waits it predicts; when the engine
    slows to half, it follows it down."""
    rng = np.random.default_rng(3)
    learner = ServiceRate(1, seed=2_000.0, alpha=0.05, span=4_000.0)
    works = rng.choice([100, 2_000], size=600)
    end = _serve(learner, 10_000.0, 0.03, works, rng.exponential(0.12, 600))  # offered 88% of it
    assert learner.fitted().rates[0] == pytest.approx(10_000.0, rel=0.15)
    assert learner.predict(0, 8_000) == pytest.approx(0.03 + 0.8, rel=0.2)  # a head half served counts whole
    _serve(learner, 5_000.0, 0.03, works, rng.exponential(0.24, 600), start_s=end + 5.0)
    assert learner.fitted().rates[0] == pytest.approx(5_000.0, rel=0.15)
    assert learner.predict(0, 8_000) == pytest.approx(0.03 + 1.6, rel=0.2)


def test_the_wait_model_follows_an_engine_slower_than_its_seed_when_admission_caps_its_backlog():
    """Under admission a shard holds no more work than its predicted objective allows: the waits it sees still
    teach it the engine is slower than seeded, so the backlog it admits shrinks to what the engine serves in time.
    Capped, the work it sees spans little, so its line is loosely fitted: judged at the 99th percentile, the
    margin covers that, and the admitted waits meet the budget."""
    rng = np.random.default_rng(4)
    learner = ServiceRate(1, seed=20_000.0, alpha=0.05, span=8_000.0, z=2.3263478740408408)
    waits, observe = [], learner.observe
    learner.observe = lambda shard, ahead, own, wait_s, central_s, bias: (
        waits.append(wait_s), observe(shard, ahead, own, wait_s, central_s, bias))
    _serve(learner, 5_000.0, 0.02, rng.choice([100, 1_000], size=800), rng.exponential(0.04, 800),
           admit=lambda work: learner.predict(0, work) <= 0.4)
    assert 300 < len(waits) < 700  # capped: some refused, most admitted
    assert np.quantile(waits[100:], 0.99) <= 0.4  # once it has learned: the budget met at p99
    assert learner.predict(0, 2_000) == pytest.approx(0.02 + 0.4, rel=0.2)


def test_one_first_token_behind_a_full_step_does_not_multiply_the_bias():
    """The bias is the waits over the line's predictions as a ratio of their fading sums: a request with almost
    nothing ahead (a line of 3 ms) whose first token waited a step of someone else's prefill (0.45 s) is an error
    of 0.45 s, not a factor of 150 on every prediction after it (a mean of ratios set the bias to 8.6 so on the
    simulator: benchmarks/simulated/admission-bias-2026-12-04.txt)."""
    learner = ServiceRate(1, seed=16_000.0, alpha=0.05, span=32_000.0)
    for _ in range(100):  # a backlog the line predicts well: 16,000 tokens ahead, a second's wait
        learner.observe(0, 16_000, 32, 1.0, learner.central(0, 16_032), learner.bias[0])
    assert learner.bias[0] == pytest.approx(1.0, abs=0.01)
    learner.observe(0, 35, 32, 0.45, learner.central(0, 67), learner.bias[0])
    assert learner.bias[0] == pytest.approx(1.0, abs=0.03)
    for _ in range(60):  # the engine now takes half as long again as the line says: the bias follows
        learner.observe(0, 16_000, 32, 1.5 * learner.central(0, 16_032) / learner.bias[0],
                        learner.central(0, 16_032), learner.bias[0])
    assert learner.bias[0] == pytest.approx(1.5, rel=0.05)


def test_a_lightly_loaded_shard_learns_its_latency_not_a_slower_rate():
    """One request at a time, each 100 tokens in 0.1 s: the wait is latency, not a slower rate."""
    learner = ServiceRate(1, seed=10_000.0, alpha=0.05, span=8_000.0)
    for _ in range(200):
        learner.observe(0, 0, 100, 0.1, learner.central(0, 100))
    learner.fitted()
    assert learner.rates[0] == pytest.approx(10_000.0)
    assert learner.latency_s[0] == pytest.approx(0.09, rel=0.01) and learner.bias == [1.0]
    assert learner.predict(0, 5_000) == pytest.approx(0.59, rel=0.01)


@pytest.mark.parametrize("values, message", [
    ({"headroom": 0}, "admission setting headroom must be in [0.001, 1000], got 0"),
    ({"seed_tokens_per_s": -1}, "admission setting seed_tokens_per_s must be 1 to 1e9 tokens a second, got -1"),
    ({"seed_tokens_per_s": 1e-300},  # an outsider's: the fit's ridge prior underflowed to 0 after the trials ran
     "admission setting seed_tokens_per_s must be 1 to 1e9 tokens a second, got 1e-300"),
    ({"sample_s": 0.5}, "unknown admission setting(s) sample_s: known are"),
    ({"alpha": 1.5}, "admission setting alpha must be in [1e-6, 1], got 1.5"),
    ({"retries": -1}, "admission setting retries must be 0 or more, got -1"),
    ({"retries": 1.5}, "admission setting retries must be an integer, got 1.5"),
    ({"headrom": 0.9}, "unknown admission setting(s) headrom: known are"),
    ({"reroute": "yes"}, "admission setting reroute must be true or false, got 'yes'"),
])
def test_bad_settings_are_refused_in_one_line(values, message):
    with pytest.raises(ParityError) as error:
        BoundedSettings.from_dict(values)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_router_that_books_nothing_is_refused_in_one_line():
    with pytest.raises(ParityError, match="needs the prefix router") as error:
        Controller(AffinityRouter(2, "rev", capacity=16))
    assert "\n" not in str(error.value)


def test_settings_round_trip():
    settings = BoundedSettings(headroom=0.7, reroute=True)
    assert BoundedSettings.from_dict(settings.to_dict()) == settings


def test_the_standalone_path_never_sends_a_refused_request(small_reuse_trace, tmp_path):
    """Simulated replicas on the CPU, the whole burst at once: before any answer, each shard's first request is
    admitted (nothing booked there) and every later one is refused with its reason; nothing is left booked."""
    from parity.routing import RouterSettings
    from parity.engine import EngineArgs
    from parity.paths.standalone import StandalonePath
    from parity.schedule import Schedule
    from parity.trace import load_trace

    trace = load_trace(small_reuse_trace)
    ids = [r.id for r in trace.requests]
    settings = RouterSettings("prefix")
    with StandalonePath("sim", ["sim-0", "sim-1"], EngineArgs(), tmp_path / "logs") as path:
        with path.trial("t", settings):
            router = settings.make(path.shards)
            controller = Controller(router, BoundedSettings(), Objective(ttft_s=0.05))  # 40 ms: one request each
            burst = path.release(list(trace.prompts), ids, router, Schedule(), admission=controller)
    assert len(burst.completions) == len(burst.placements) == len(burst.input_hashes) == 2
    assert sorted(p.shard for p in burst.placements) == [0, 1]
    assert len(burst.refused) == len(ids) - 2 and set(burst.refused) <= set(ids)
    assert all(r.startswith("predicted first token in ") and "\n" not in r for r in burst.refused.values())
    stats = burst.extra["admission"]
    assert (stats["admitted"], stats["refused"]) == (2, len(ids) - 2)
    assert router.loads == [0, 0] and controller.ahead == [0, 0]  # both answers released their work
    assert all(len(c.output_token_ids) == 16 for c in burst.completions)


def test_a_trial_records_refusals_apart_and_goodput_counts_them_as_misses(small_reuse_trace, tmp_path):
    """A paced trial under bounded admission on simulated replicas: every request is a record or a refusal with its
    reason (coverage passes), the manifest validates, and a refusal is never a completion nor good."""
    from parity import trial
    from parity.routing import RouterSettings
    from parity.engine import EngineArgs
    from parity.latency import summarize
    from parity.paths.standalone import StandalonePath
    from parity.schedule import Schedule

    objective = Objective(ttft_s=0.05)
    with StandalonePath("sim", ["sim-0", "sim-1"], EngineArgs(), tmp_path / "logs", stream=True) as path:
        doc = trial.run(path, small_reuse_trace, tmp_path, trial_id="bounded", experiment="sustained",
                        router=RouterSettings("prefix"), schedule=Schedule(kind="poisson", rate=200.0, seed=0),
                        warmup_rounds=1, admission=BoundedSettings(), objective=objective, log=lambda _: None)
    assert doc["verdict"]["status"] == "passed", doc["verdict"]["reasons"]
    refused, records = doc["refused"], doc["records"]
    assert len(records) + len(refused) == 64 and refused and records
    assert {r["request_id"] for r in refused}.isdisjoint(r["request_id"] for r in records)
    assert all(r["reason"].startswith("predicted first token in ") and "arrival_s" in r for r in refused)
    assert (doc["admission"]["admitted"], doc["admission"]["refused"]) == (len(records), len(refused))
    assert doc["timing"]["requests_per_s"] == pytest.approx(len(records) / doc["timing"]["duration_s"])
    summary = summarize(doc, objective)
    assert summary["requests"] == 64 and summary["window_requests"] == summary["admitted"] + summary["refused"]
    for view in ("engine", "client"):
        assert summary[f"good_share_{view}"] <= summary["admitted"] / summary["window_requests"]
        assert summary[f"good_share_{view}"] <= summary[f"good_ttft_share_{view}"] <= (summary["admitted"]
                                                                                      / summary["window_requests"])
    without = summarize({"records": records}, objective)  # the same completions, refusals forgotten
    assert "refused" not in without and without["good_share_client"] >= summary["good_share_client"]


def test_a_window_whose_requests_were_all_refused_counts_no_completion_from_outside_it():
    """An outsider's (2026-12-07): where every request in the steady-state window was refused, the window fell back
    to every completion, so completions from before and after it were counted as its goodput."""
    from parity.latency import summarize

    def record(k):
        return {"request_id": f"r{k}", "arrival_s": float(k), "token_s": [k + 0.1, k + 0.2], "complete_s": k + 0.2}

    doc = {"records": [record(0), record(9)],
           "refused": [{"request_id": f"r{k}", "arrival_s": float(k), "reason": "full"} for k in range(1, 9)]}
    summary = summarize(doc, Objective(ttft_s=2.0))
    assert (summary["admitted"], summary["refused"]) == (0, summary["window_requests"]) and summary["refused"] > 0
    assert summary["achieved_per_s"] == 0.0 and summary["saturated"] is True
    for view in ("engine", "client"):
        assert summary[f"goodput_{view}_per_s"] == summary[f"goodput_ttft_{view}_per_s"] == 0.0
        assert summary[f"good_share_{view}"] == 0.0 and summary[f"ttft_{view}"] is None


def test_the_sustained_plan_adds_a_bounded_case_per_rung_only_when_asked(small_reuse_trace):
    from parity.experiments import plan
    from parity.experiments.settings import SustainedSettings

    flame = plan.FlameSettings(api="async")
    unbounded = plan.sustained([small_reuse_trace], [4.0, 8.0], flame)
    default = SustainedSettings.from_dict({"rates": [4, 8], "flame": {"api": "async"}})
    assert default.bounded is None and plan._sustained([small_reuse_trace], default) == unbounded  # off by default
    assert all(c.admission is None and "admission" not in c.load for c in unbounded)
    settings = SustainedSettings.from_dict({"rates": [4, 8], "bounded": {"reroute": True}, "flame": {"api": "async"}})
    cases = plan._sustained([small_reuse_trace], settings)
    lone = [c for c in cases if c.arm == "bounded"]
    assert [c for c in cases if c.arm != "bounded"] == unbounded  # the study's pairs, untouched
    assert [c.stage for c in lone] == ["rate-4-bounded"] * 2 + ["rate-8-bounded"] * 2
    assert [c.system for c in lone] == ["standalone", "flame"] * 2
    assert all(c.flame.mode == "harvest" for c in lone if c.system == "flame")  # streamed: first tokens come back
    for case in lone:
        assert (case.placement, case.pair, case.side, case.stream) == ("prefix", None, None, True)
        assert case.admission == BoundedSettings(reroute=True) and case.objective == settings.objective
        assert case.load["admission"] == BoundedSettings(reroute=True).to_dict() | {"objective": {"ttft_s": 2.0,
                                                                                                  "itl_s": 0.1}}
    with pytest.raises(ParityError, match="admission setting alpha must be in"):
        SustainedSettings.from_dict({"rates": [4], "bounded": {"alpha": 2}})
    with pytest.raises(ParityError, match="needs the async engine API; the experiment's Flame settings say api 'sync'"):
        plan.sustained([small_reuse_trace], [4.0], plan.FlameSettings(), bounded=BoundedSettings())
    with pytest.raises(ParityError, match="an arm is named 'bounded'"):
        plan.sustained([small_reuse_trace], [4.0], flame, arms={"bounded": {"inflight": 1}}, bounded=BoundedSettings())


@pytest.mark.parametrize("retries", [0, 1])
def test_the_bounded_arm_runs_on_the_cpu_on_both_paths_and_each_trial_says_what_it_refused(small_reuse_trace, retries,
                                                                                            sim_backend, tmp_path):
    """One overloaded rung (a 50 ms objective) through the experiment runner, simulated, on both paths (Flame: the
    stand-in, harvest mode, its first tokens releasing their prefill): each bounded case's trial passes its checks,
    records what it admitted and refused (never a refused request among its records), and the experiment names
    its arm. With the client's retry policy, a refused request is tried again after its Retry-After: the trial
    counts tries, and what was admitted on a retry, and a request refused for good says it was tried twice."""
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    flame = plan.FlameSettings(api="async", window_ms=5)
    cases = [c for c in plan.sustained([small_reuse_trace], [200.0], flame, bounded=BoundedSettings(retries=retries),
                                       objective=Objective(ttft_s=0.05)) if c.arm == "bounded"]
    assert [c.system for c in cases] == ["standalone", "flame"]
    run_experiment("sustained", cases, sim_backend, tmp_path, settings={"rates": [200.0]}, log=lambda _: None)
    for case in cases:
        doc = read_manifest(tmp_path / "trials" / f"{case.trial_id}.json")
        assert doc["verdict"]["status"] == "passed", (case.system, doc["verdict"]["reasons"])
        assert doc["config"]["placement"] == "prefix"
        assert doc["refused"] and len(doc["records"]) + len(doc["refused"]) == 64
        assert {r["request_id"] for r in doc["refused"]}.isdisjoint(r["request_id"] for r in doc["records"])
        stats, refused = doc["admission"], doc["refused"]
        assert stats["admitted"] == len(doc["records"]) and stats["settings"]["retries"] == retries
        # a request refused for good had two tries, or one where a retry would have come past its budget
        tries = [2 if r["reason"].endswith("; refused on all 2 tries") else 1 for r in refused]
        assert stats["refused"] == (len(refused) if not retries else sum(tries) + stats["retried"])
        assert all(r["reason"].endswith(("; refused on all 2 tries", "; refused on 1 try: a retry would come past its "
                                         "budget")) == bool(retries) for r in refused)
        # the policy ran: a retry admitted, or tried and refused again (most retries at 200/s come past their budget)
        assert not retries or stats["retried"] or 2 in tries or case.system == "flame", (stats, tries)
        # a request admitted on a retry says when that try was due (its Retry-After), the others say nothing
        due = [r for r in doc["records"] if "due_s" in r]
        assert len(due) == stats["retried"] and all(r["due_s"] > r["arrival_s"] for r in due)
        from parity.checks import admission_mismatch, records_contradict

        assert admission_mismatch(doc) is None and records_contradict(doc) is None  # what validate derives again
        assert doc["ran_with"]["load"]["admission"]["objective"]["ttft_s"] == 0.05
    assert read_manifest(tmp_path / "trials" / f"{cases[1].trial_id}.json")["harvest"]["completions"] > 0
    entries = json.loads((tmp_path / "experiment.json").read_text())["cases"]
    assert [(e["arm"], e["stage"], e["pair"]) for e in entries] == [("bounded", "rate-200-bounded", None)] * 2
    from parity.report import tables
    from parity.report.inputs import load_experiment

    table, _ = tables.sustained(load_experiment(tmp_path))  # the report reads them, and names each for what it is
    assert sorted(row[3] for row in table.rows) == [
        "Flame (tokens timed at the client), prefix router, bounded admission",
        "standalone vLLM (streamed), prefix router, bounded admission"]


def test_with_a_shared_start_each_paths_bounded_rungs_share_one_start_of_their_own(small_reuse_trace, sim_backend,
                                                                                      tmp_path):
    """The host ladder's device time: a shared-start ladder runs each path's bounded rungs on one engine start of
    their own, after every arm's blocks (not a fresh start per rung and path); each rung's trial still has its own
    controller, passes its checks and says which start it shared (simulated)."""
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    flame = plan.FlameSettings(api="async", window_ms=5)
    cases = plan.sustained([small_reuse_trace], [100.0, 200.0], flame, arms={"harvest": {"mode": "harvest"}},
                           shared_start=True, warmup_requests=4, bounded=BoundedSettings(),
                           objective=Objective(ttft_s=0.05))
    starts = list(dict.fromkeys(c.start for c in cases))
    assert starts[-2:] == ["sustained-start-bounded-p0-vllm", "sustained-start-bounded-p0-flame"]
    lone = [c for c in cases if c.arm == "bounded"]
    assert cases[-4:] == lone and [c.stage for c in lone] == ["rate-100-bounded", "rate-200-bounded"] * 2
    assert [c.load["start"] for c in lone] == ["sustained-start-bounded-p0-vllm"] * 2 + [
        "sustained-start-bounded-p0-flame"] * 2  # a block is its start's rungs, in order
    assert all(c.start is None for c in plan.sustained([small_reuse_trace], [100.0], flame, bounded=BoundedSettings()))
    lines: list[str] = []
    run_experiment("sustained", lone, sim_backend, tmp_path, settings={"rates": [100.0, 200.0]}, log=lines.append)
    assert sum("started sustained-start-bounded-p0-vllm" in line for line in lines) == 1
    assert sum("started sustained-start-bounded-p0-flame" in line for line in lines) == 1
    for case in lone:
        doc = read_manifest(tmp_path / "trials" / f"{case.trial_id}.json")
        assert doc["verdict"]["status"] == "passed", (case.trial_id, doc["verdict"]["reasons"])
        assert doc["ran_with"]["load"]["start"] == case.start and doc["config"]["placement"] == "prefix"
        assert doc["admission"]["admitted"] == len(doc["records"])


def test_the_report_names_each_paths_first_saturated_rung_and_draws_the_bounded_arm(tmp_path, monkeypatch):
    """Measured, not configured: the first rung whose row says saturated, per path and trace; the bounded arm's
    curve is drawn as its own path (an arm's standalone reference is not)."""
    from parity.report import plots, tables

    def row(trace, offered, label, saturated):
        return [trace, offered, 16, label, "ours", "1", "-", "-", "-", "-", "1", "90%", saturated, "0.01"]

    rows = [row("reuse", "4", "standalone vLLM", "No"), row("reuse", "4", "bounded", "No"),
            row("reuse", "8", "standalone vLLM", "Yes"), row("reuse", "8", "bounded", "No"),
            row("reuse", "12", "standalone vLLM", "Yes"), row("reuse", "12", "bounded", "Yes")]
    assert tables._first_saturated(rows) == ("First over-saturated rung (measured: achieved below 90% of offered): "
                                             "standalone vLLM on reuse: 8 req/s; bounded on reuse: 12 req/s.")
    assert tables._first_saturated(rows[:2]) is None
    seeds = [{"offered": o, "achieved": a, "goodput": g} for o, a, g in ((4.0, 3.8, 3.0), (4.0, 4.0, 3.4), (8.0, 7.0, 5.0))]
    assert plots._medians(seeds) == [{"offered": 4.0, "achieved": 3.9, "goodput": 3.2}, seeds[2]]  # a rung's seeds
    point = {"offered": 4.0, "achieved": 3.9, "ttft_p50": 0.1, "ttft_p99": 0.5, "e2e_p50": 0.2, "e2e_p99": 0.6,
             "goodput": 3.8}
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append([line.get_label() for ax in fig.axes
                                                                       for line in ax.get_lines()]))
    plots.sustained({"reuse": {"standalone": [point], "standalone-bounded": [point], "standalone-harvest": [point]}},
                    None, tmp_path / "s.png")
    assert "standalone vLLM, bounded admission (ours)" in drawn[0]
    assert not any("harvest" in label for label in drawn[0])
    legends = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: legends.append(
        [(len(ax.get_legend_handles_labels()[0]), ax.get_legend()) for ax in fig.axes] + [fig.legends]))
    plots.sustained({"reuse": {"standalone": [point], "standalone-bounded": [point]}}, None, tmp_path / "s.png")
    *panels, below = legends[0]
    assert all(legend is None for _, legend in panels) and len(below) == 1  # one legend, under the panels
    assert [t.get_text() for t in below[0].get_texts()][:2] == ["standalone vLLM",
                                                                "standalone vLLM, bounded admission (ours)"]


def test_a_flame_shared_start_whose_sessions_fail_to_open_closes_its_kv_event_subscriber(monkeypatch):
    """The prefix router's subscriber is made before a shared start's sessions; if they fail to open, nothing is
    left to close it later, so it is closed at once and the failure goes on (no socket outlives the start)."""
    from parity.engine import EngineArgs
    from parity.experiments import plan
    from parity.kv_events import Subscriber
    from parity.paths import flame as flame_path
    from parity.routing import RouterSettings

    class Broken:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            raise ParityError("no executor came")

    closed, close = [], Subscriber.close
    monkeypatch.setattr(Subscriber, "close", lambda self: (closed.append(self), close(self)))
    monkeypatch.setattr(flame_path, "FlameSessions", Broken)
    path = flame_path.FlamePath(None, ["sim-0"], plan.FlameSettings(api="async", mode="harvest"), engine="sim",
                                engine_args=EngineArgs(), shared_start="sustained-start-bounded-p0-flame")
    with pytest.raises(ParityError, match="no executor came"):
        with path.trial("t", RouterSettings("prefix", cache_tokens=100_000)):
            pass
    assert len(closed) == 1 and path.events is None and path.sessions is None


def test_the_bounded_arms_own_ladder_runs_with_an_unbounded_comparator_on_one_gpu(small_reuse_trace, sim_backend,
                                                                                    tmp_path):
    """`bounded_rates` (the host profile's bounded ladder, past saturation): the bounded arm runs at its own rates and
    nowhere else, each rung after an unbounded sticky standalone case of its own on a start of its own (a start's
    engines are opened for its first case's router), so the arms compare on one GPU; the arms' pairs are untouched;
    bad settings are one line each; the report names the comparator for what it is (simulated)."""
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.experiments.settings import SustainedSettings
    from parity.manifest import read_manifest
    from parity.report import tables
    from parity.report.inputs import load_experiment

    flame = plan.FlameSettings(api="async", window_ms=5)
    ladder = plan.sustained([small_reuse_trace], [100.0], flame, shared_start=True, warmup_requests=4)
    own = {small_reuse_trace.stem: (150.0, 250.0)}
    cases = plan.sustained([small_reuse_trace], [100.0], flame, shared_start=True, warmup_requests=4,
                           bounded=BoundedSettings(), objective=Objective(ttft_s=0.05), bounded_rates=own)
    assert cases[:len(ladder)] == ladder  # the ladder's pairs, untouched; no bounded case at their rung
    extra = cases[len(ladder):]
    assert [(c.stage, c.system, c.placement, c.start) for c in extra] == [
        ("rate-150-unbounded", "standalone", "sticky", "sustained-start-unbounded-p0-vllm"),
        ("rate-250-unbounded", "standalone", "sticky", "sustained-start-unbounded-p0-vllm"),
        ("rate-150-bounded", "standalone", "prefix", "sustained-start-bounded-p0-vllm"),
        ("rate-250-bounded", "standalone", "prefix", "sustained-start-bounded-p0-vllm"),
        ("rate-150-bounded", "flame", "prefix", "sustained-start-bounded-p0-flame"),
        ("rate-250-bounded", "flame", "prefix", "sustained-start-bounded-p0-flame")]
    free = [c for c in extra if c.arm == "unbounded"]
    assert all(c.admission is None and c.pair is None and c.stream and "admission" not in c.load for c in free)
    settings = SustainedSettings.from_dict({"rates": [100], "flame": {"api": "async"}, "bounded": {},
                                            "bounded_rates": {small_reuse_trace.stem: [150, 250]}})
    assert settings.bounded_rates == own and settings.highest_rate == 250
    with pytest.raises(ParityError, match="bounded_rates is the bounded arm's ladder: set bounded too"):
        plan.sustained([small_reuse_trace], [100.0], flame, bounded_rates=own)
    with pytest.raises(ParityError, match="bounded_rates name trace 'elsewhere', which is not among the ladder's"):
        plan.sustained([small_reuse_trace], [100.0], flame, bounded=BoundedSettings(),
                       bounded_rates={"elsewhere": (5.0,)})
    with pytest.raises(ParityError, match="an arm is named 'unbounded'"):
        plan.sustained([small_reuse_trace], [100.0], flame, arms={"unbounded": {"inflight": 1}},
                       bounded=BoundedSettings())
    with pytest.raises(ParityError, match="bounded_rates"):  # the config schema's bound: a rate above 0
        SustainedSettings.from_dict({"rates": [100], "bounded": {}, "bounded_rates": {small_reuse_trace.stem: [-1]}})
    first = [c for c in extra if c.stage.startswith("rate-250")]
    run_experiment("sustained", first, sim_backend, tmp_path, settings={"rates": [100.0]}, log=lambda _: None)
    docs = {c.arm: read_manifest(tmp_path / "trials" / f"{c.trial_id}.json") for c in first if c.system != "flame"}
    assert all(d["verdict"]["status"] == "passed" for d in docs.values())
    assert "refused" not in docs["unbounded"] and docs["unbounded"]["config"]["placement"] == "sticky"
    assert docs["bounded"]["refused"] and docs["unbounded"]["ran_with"]["gpus"] == docs["bounded"]["ran_with"]["gpus"]
    table, _ = tables.sustained(load_experiment(tmp_path))
    assert "standalone vLLM (streamed), sticky router, unbounded (the bounded arm's comparator)" in [r[3] for r in
                                                                                                  table.rows]


def test_a_bounded_rung_finished_whole_on_an_earlier_gpu_is_kept_and_a_split_one_runs_again_whole(tiny_reuse_trace,
                                                                                                   tmp_path):
    """A bounded ladder spread over device sessions meets another GPU each session: a rung whose three arms (its
    unbounded comparator, each path bounded) all ran on one earlier GPU is kept there; a rung with an arm missing runs
    again whole here, so a rung's arms never compare across two GPUs (simulated)."""
    from pathlib import Path as P

    from parity.backend import Backend
    from parity.experiments import plan
    from parity.experiments.runner import groups, run_experiment
    from parity.manifest import read_manifest

    params = str(P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml")
    on = lambda gpu: Backend.from_dict({"engine": "sim", "sim_params": params, "gpus": [gpu],  # noqa: E731
                                        "warmup_rounds": 0})
    flame = plan.FlameSettings(api="async", window_ms=5)
    cases = [c for c in plan.sustained([tiny_reuse_trace], [20.0], flame, shared_start=True, warmup_requests=2,
                                       bounded=BoundedSettings(), objective=Objective(ttft_s=0.05),
                                       bounded_rates={tiny_reuse_trace.stem: (30.0, 40.0)}) if c.rung]
    assert {tuple(sorted(c.trial_id for c in (case, *groups(cases)[case.trial_id]))) for case in cases} == {
        tuple(sorted(f"sustained-rate-{r}-{arm}-{tiny_reuse_trace.stem}-p0-{side}" for arm, side in
                     [("unbounded", "vllm"), ("bounded", "vllm"), ("bounded", "flame")])) for r in (30, 40)}
    settings = {"rates": [20.0]}
    run_experiment("sustained", cases, on("sim-0"), tmp_path, settings=settings, log=lambda _: None)
    (tmp_path / "trials" / f"sustained-rate-40-bounded-{tiny_reuse_trace.stem}-p0-flame.json").unlink()
    lines: list[str] = []
    run_experiment("sustained", cases, on("sim-1"), tmp_path, settings=settings, log=lines.append)
    gpus = {c.trial_id: read_manifest(tmp_path / "trials" / f"{c.trial_id}.json")["ran_with"]["gpus"] for c in cases}
    assert gpus == {c.trial_id: ["sim-1" if c.stage.startswith("rate-40") else "sim-0"] for c in cases}
    assert any("its group ran whole on sim-0 (an earlier machine)" in line for line in lines)
    assert f"sustained-rate-40-unbounded-{tiny_reuse_trace.stem}-p0-vllm: its group runs again whole here: " \
           f"sustained-rate-40-bounded-{tiny_reuse_trace.stem}-p0-flame is not on disk (or not readable)" in lines
    assert sum(": kept (already run and checked)" in line for line in lines) == 3


@pytest.fixture(scope="module")
def bounded_trial(small_reuse_trace, tmp_path_factory) -> Path:
    """A paced trial under bounded admission on simulated replicas, some of it refused."""
    from parity import trial
    from parity.engine import EngineArgs
    from parity.paths.standalone import StandalonePath
    from parity.routing import RouterSettings
    from parity.schedule import Schedule

    out = tmp_path_factory.mktemp("bounded")
    with StandalonePath("sim", ["sim-0", "sim-1"], EngineArgs(), out / "logs", stream=True) as path:
        doc = trial.run(path, small_reuse_trace, out, trial_id="bounded", experiment="sustained",
                        router=RouterSettings("prefix"), schedule=Schedule(kind="poisson", rate=200.0, seed=0),
                        warmup_rounds=1, admission=BoundedSettings(), objective=Objective(ttft_s=0.05),
                        log=lambda _: None)
    assert doc["refused"] and doc["verdict"]["status"] == "passed"
    return out / "bounded.json"


def _shift_refusals(doc):
    for r in doc["refused"]:
        r["arrival_s"] += 100.0


def _drop_refusal_arrivals(doc):
    for r in doc["refused"]:
        del r["arrival_s"]


def _shift_records(doc):
    for r in doc["records"]:
        r["arrival_s"] += 0.05


def _other_seed(doc):  # in what it ran with too, so the offsets' hash is what names it
    doc["schedule"]["seed"] += 1
    doc["ran_with"]["load"]["schedule"]["seed"] += 1


def _delete_a_refusal(doc):
    doc["refused"].pop(len(doc["refused"]) // 2)
    doc["admission"]["refused"] -= 1


def _token_times(change):
    def forge(doc):
        change(doc["records"][len(doc["records"]) // 2])
    return forge


FORGED_ADMISSION = {  # an outsider's (2026-12-07): each passed `validate` with its hashes rewritten
    "refusals' arrivals deleted": (_drop_refusal_arrivals, "/refused/0", "has no arrival_s, yet the trial ran on a "
                                                                         "poisson schedule"),
    "refusals moved out of the window": (_shift_refusals, "/refused/0/arrival_s", "is not the schedule's arrival"),
    "records moved": (_shift_records, "/records/0/arrival_s", "is not the schedule's arrival"),
    "another schedule seed": (_other_seed, "/schedule/offsets_sha256", "is not the SHA-256 of the offsets"),
    "another seed in the trial alone": (lambda d: d["schedule"].update(seed=7), "/schedule/seed",
                                        "states 7, the trial ran with 0 (ran_with.load.schedule)"),
    "a refusal deleted, its count lowered": (_delete_a_refusal, "/records", "of the schedule's 64 requests are neither"),
    "a first token before its arrival": (_token_times(lambda r: r["token_s"].__setitem__(0, r["arrival_s"] - 100)),
                                         None, "first token came 100 s before its arrival"),
    "token times reversed": (_token_times(lambda r: r.update(token_s=[r["token_s"][-1]] + r["token_s"][:-1])),
                             None, "token times go back in time"),
    "a token after its completion": (_token_times(lambda r: r["token_s"].__setitem__(-1, r["complete_s"] + 50)),
                                     None, "last token came 50 s after its completion"),
    # outside pass K's (2026-12-07): each passed `validate` with its hashes rewritten
    "a paced trial relabelled a replay, its arrivals moved": (
        lambda d: d["schedule"].update(kind="replay") or _shift_records(d), "/schedule/kind",
        "states 'replay', the trial ran with a 'poisson' schedule"),
    "its offsets' hash deleted, its arrivals moved": (
        lambda d: d["schedule"].pop("offsets_sha256") and _shift_records(d), "/schedule/offsets_sha256",
        "absent, yet the trial ran on a paced schedule"),
    "sent before its arrival": (_token_times(lambda r: r.update(sent_s=r["arrival_s"] - 0.5)), "sent_s",
                                "was sent 0.5 s before its arrival"),
    "sent after its completion": (_token_times(lambda r: r.update(sent_s=r["complete_s"] + 1)), "sent_s",
                                  "was sent 1 s after its completion"),
    "a first token before its send": (_token_times(lambda r: r.update(sent_s=r["token_s"][0] + 0.001)), None,
                                      "first token came 0.001 s before it was sent"),
    "due before its arrival": (_token_times(lambda r: r.update(due_s=r["arrival_s"] - 100)), "due_s",
                               "a retry's or a hold's last try is due after its arrival"),
    "due after its send": (_token_times(lambda r: r.update(due_s=r["sent_s"] + 5)), "due_s",
                           "a retry's or a hold's last try is due after its arrival"),
    "due on a request neither retried nor held": (_token_times(lambda r: r.update(due_s=r["sent_s"])),
                                                  "/admission/retried", "yet 1 record(s) say when a retry or a hold"),
    # outside pass M's (2026-12-07): the most lagged sends deleted, or every one, moved the report's send lag
    "the latest sends deleted": (lambda d: [r.pop("sent_s") for r in sorted(d["records"], key=lambda r: r["arrival_s"]
                                                                             - r["sent_s"])[:3]],
                                 "sent_s", "a path records every request's send or none"),
    "every send deleted": (lambda d: [r.pop("sent_s") for r in d["records"]], "/records/0/sent_s",
                           "absent on every record of a trial on a schedule"),
    "admitted inflated": (lambda d: d["admission"].update(admitted=999), "/admission/admitted", "states 999"),
    "refusals not counted": (lambda d: d["admission"].update(refused=0), "/admission/refused", "states 0"),
    "retries under settings of none": (lambda d: d["admission"].update(retried=5), "/admission/retried", "states 5"),
    "settings edited": (lambda d: d["admission"]["settings"].update(headroom=5.0), "/admission/settings",
                        "are not the settings and objective the trial ran with"),
    "admission block deleted": (lambda d: d.pop("admission"), "/admission", "absent, yet"),
    "what it ran with deleted": (lambda d: d["ran_with"]["load"].pop("admission"), "/ran_with/load/admission",
                                 "absent, yet the trial states its admission"),
}


def test_a_send_held_back_on_a_trial_without_bounded_admission_is_named():
    """Only bounded admission retries or holds a request, so only its trials say when one was let go (`due_s`): an
    unbounded trial's send lag read 0 with every record's due_s set to its send (outside pass K)."""
    from parity.checks import admission_mismatch

    doc = {"records": [{"arrival_s": 1.0, "sent_s": 1.001, "due_s": 1.001, "complete_s": 2.0}], "refused": [],
           "ran_with": {"load": {}}}
    assert admission_mismatch(doc) == ("/records/0/due_s", "states when a retry or a hold let it leave, yet the "
                                       "trial ran without bounded admission, which alone retries or holds")
    del doc["records"][0]["due_s"]
    assert admission_mismatch(doc) is None


@pytest.mark.parametrize("refused, says", [(4, None), (5, None), (3, "states 3 refused tries"),
                                           (6, "states 6 refused tries")])
def test_refused_tries_are_those_of_its_refusals_and_its_admitted_retries(refused, says):
    """With retries, each refused try is counted once: a request refused for good says how many it had, and a
    request admitted on a retry had one to `retries` before; a completed request moved into the refusals, the counts
    edited to match, passed `validate` (outside pass K)."""
    from parity.checks import admission_mismatch

    settings, objective = {"retries": 2}, {"ttft_s": 2.0, "itl_s": 0.1}
    doc = {"records": [{"arrival_s": 1.0, "due_s": 1.2, "sent_s": 1.2, "complete_s": 2.0},
                       {"arrival_s": 1.5, "sent_s": 1.5, "complete_s": 2.5}],
           "refused": [{"reason": "predicted first token in 3 s > 2 s; refused on all 3 tries"}],
           "admission": {"admitted": 2, "refused": refused, "retried": 1, "held_admitted": 0, "settings": settings,
                         "objective": objective},
           "ran_with": {"load": {"admission": settings | {"objective": objective}}}}
    found = admission_mismatch(doc)  # its refusal's 3 tries, and its one admitted retry's 1 or 2
    assert found is None if says is None else found[0] == "/admission/refused" and says in found[1], found


@pytest.mark.parametrize("retries, reason, says", [
    (2, "refused on all 3 tries", None), (2, "refused on 2 tries: a retry would come past its budget", None),
    (2, "refused on all 9 tries", "all 9 tries"), (2, "refused on all 2 tries", "all 2 tries"),
    (2, "refused on 4 tries", "4 tries"), (2, "refused on 3 tries", "3 tries"), (0, "refused on 1 try", "1 try")])
def test_a_refusal_had_no_more_tries_than_its_retries_allow(retries, reason, says):
    """"refused on all 9 tries" under 2 retries, its counts raised to match, passed (outside pass M): a refusal's tries
    are as retry.Attempts.final words them, all retries + 1, or 1 to retries where a retry would have come past its
    budget, and none said without retries (outside pass N)."""
    from parity.checks import admission_mismatch

    settings, objective = {"retries": retries}, {"ttft_s": 2.0, "itl_s": 0.1}
    tries = int(reason.split(" tr")[0].split()[-1])
    doc = {"records": [{"arrival_s": 1.5, "sent_s": 1.5, "complete_s": 2.5}],
           "refused": [{"reason": f"predicted first token in 3 s > 2 s; {reason}"}],
           "admission": {"admitted": 1, "refused": tries, "retried": 0, "held_admitted": 0, "settings": settings,
                         "objective": objective},
           "ran_with": {"load": {"admission": settings | {"objective": objective}}}}
    found = admission_mismatch(doc)
    assert found is None if says is None else found[0] == "/refused/0/reason" and says in found[1], found


@pytest.mark.parametrize("name", FORGED_ADMISSION)
def test_what_a_bounded_trial_states_of_its_arrivals_and_admission_is_derived_again(bounded_trial, name):
    """A paced trial's arrivals are its schedule's (the release plus each offset), and what it states of its
    admission is what it recorded and ran with; each forgery is named by the trial's own derivation."""
    import copy
    import json

    from parity.checks import derived_problems

    pristine = json.loads(bounded_trial.read_text())
    stats = pristine["admission"]  # what the experiment runner records it ran with (trial.run alone records none)
    pristine.setdefault("ran_with", {"load": {"admission": stats["settings"] | {"objective": stats["objective"]}}})
    pristine["ran_with"]["load"].setdefault("schedule", {key: pristine["schedule"][key] for key in
                                                         ("burstiness", "kind", "rate", "replay", "seed")})
    assert not [p for p in derived_problems(bounded_trial, pristine) if p[0].startswith(("/admission", "/refused",
                                                                                         "/records", "/schedule"))]
    forge_it, pointer, says = FORGED_ADMISSION[name]
    doc = copy.deepcopy(pristine)
    forge_it(doc)
    found = [why for where, why in derived_problems(bounded_trial, doc)  # a field's name alone: of a record's
             if where == pointer or (pointer or "token_s") in ("token_s", "sent_s", "due_s")
             and where.startswith("/records/") and where.endswith("/" + (pointer or "token_s"))]
    assert found and says in found[0], derived_problems(bounded_trial, doc)


@pytest.mark.parametrize("kind, says", [("replay", "absent on every record of a trial on a schedule"), ("burst", None)])
def test_a_replayed_trial_records_its_sends_as_a_paced_one_does(kind, says):
    """Both paths record each request's send on any schedule but a burst: a replayed trial's sends all deleted passed,
    where a paced one's were named (outside pass N)."""
    from parity.checks import records_contradict

    records = [{"request_id": f"r{i}", "position": i, "prompt_tokens": 10, "cached_tokens": 0, "arrival_s": 1.0 + i,
                "complete_s": 3.0 + i} for i in range(3)]
    found = records_contradict({"records": records, "schedule": {"kind": kind}})
    assert found is None if says is None else found[0] == "/records/0/sent_s" and says in found[1], found
