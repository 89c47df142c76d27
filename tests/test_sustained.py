"""Sustained arrivals: seeded schedules and their statistics, one clock for both paths, streaming, goodput,
and the Flame client's held batch (inflight)."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from parity import latency
from parity.errors import ParityError
from parity.schedule import Schedule, lag


def gaps(schedule: Schedule, count: int = 20000) -> np.ndarray:
    return np.diff(schedule.offsets(count))


def test_poisson_arrivals_have_the_seeded_rate_and_exponential_gaps():
    g = gaps(Schedule(kind="poisson", rate=50.0, seed=3))
    assert 1 / g.mean() == pytest.approx(50.0, rel=0.03) and g.std() / g.mean() == pytest.approx(1.0, abs=0.03)
    assert Schedule(kind="poisson", rate=50.0, seed=3).offsets(100) == Schedule(kind="poisson", rate=50.0, seed=3).offsets(100)
    assert Schedule(kind="poisson", rate=50.0, seed=4).offsets(100) != Schedule(kind="poisson", rate=50.0, seed=3).offsets(100)
    assert Schedule(kind="poisson", rate=50.0).offsets(3)[0] == 0.0  # the first request at the release


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_scale_burstiness_as_vllm_bench_serve_does(burstiness):
    g = gaps(Schedule(kind="gamma", rate=20.0, burstiness=burstiness, seed=1))
    assert 1 / g.mean() == pytest.approx(20.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)  # 1: Poisson; below: burstier


def test_a_schedule_is_recorded_with_the_hash_of_its_offsets(tmp_path):
    a, b = Schedule(kind="poisson", rate=5.0, seed=0), Schedule(kind="poisson", rate=5.0, seed=1)
    assert a.describe(64)["offsets_sha256"] == a.describe(64)["offsets_sha256"] != b.describe(64)["offsets_sha256"]
    assert Schedule().describe(64) == {"kind": "burst"}  # the study's trials record what they always did
    recorded = tmp_path / "arrivals.json"
    recorded.write_text(json.dumps({"arrivals": [10.0, 10.5, 12.0, 12.0]}))
    replay = Schedule(kind="replay", replay=str(recorded))
    assert replay.offsets(3) == [0.0, 0.5, 2.0] and len(replay.describe(3)["replay_sha256"]) == 64


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"), ('{"arrivals": "soon"}', "a list of arrival times"),
    ("[1, 0.5, 2]", "never decrease"), ("[0, 1]", "2 arrival times for 3 requests")])
def test_a_bad_replay_file_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "arrivals.json"
    path.write_text(content)
    with pytest.raises(ParityError, match=message):
        Schedule(kind="replay", replay=str(path)).offsets(3)


def test_bad_schedule_settings_are_refused_by_name():
    with pytest.raises(ParityError, match="unknown arrival schedule 'uniform'"):
        Schedule(kind="uniform")
    with pytest.raises(ParityError, match="needs a rate above 0"):
        Schedule(kind="poisson")
    for burstiness in (0.0, 1e-300, 0.009):  # an outsider's 1e-300: gaps underflowed to 0, the generated rate inf
        with pytest.raises(ParityError, match="burstiness of at least 0.01"):
            Schedule(kind="gamma", rate=1.0, burstiness=burstiness)
    with pytest.raises(ParityError, match="schedule setting rate must be a number"):
        Schedule.from_dict({"kind": "poisson", "rate": "fast"})


def test_lag_is_actual_minus_scheduled_and_a_late_sender_is_flagged():
    assert lag([0.0, 1.0], [0.0001, 1.0002])["behind"] is False
    late = lag([0.0, 1.0, 2.0], [0.0, 1.0, 2.05])
    assert late["behind"] is True and late["max_s"] == pytest.approx(0.05)


def test_a_retried_requests_send_lag_is_measured_from_its_last_try_not_its_arrival():
    """Bounded admission's retry (or hold) sends a request late on purpose: its record's `due_s` says when its last try
    was due, and the trial's send lag is measured from that, so an honoured Retry-After is not a sender behind."""
    records = [record(t, [t + 0.5], t + 0.6) for t in range(10)]
    records[4] |= {"sent_s": 4.3001, "due_s": 4.3, "token_s": [4.8], "complete_s": 4.9}  # retried 0.3 s later
    s = latency.summarize({"records": records})
    assert s["lag"]["behind"] is False and s["lag"]["max_s"] == pytest.approx(0.0001)
    assert s["ttft_client"]["p99"] > 0.75  # its latency still from its arrival (0.8 s; the others 0.5 s)
    del records[4]["due_s"]
    assert latency.summarize({"records": records})["lag"]["max_s"] == pytest.approx(0.3001)


def record(arrival, tokens, complete, batch=None):
    return {"arrival_s": arrival, "sent_s": arrival, "token_s": tokens, "complete_s": complete,
            **({"batch_id": batch} if batch else {})}


def test_goodput_counts_requests_that_met_the_objective_and_a_batched_answer_reaches_the_client_whole():
    streamed = [record(t, [t + 0.5, t + 0.55], t + 0.6) for t in range(10)]
    streamed[5] = record(5, [5 + 2.5, 5 + 2.55], 5 + 2.6)  # first token too late
    streamed[6] = record(6, [6 + 0.5, 6 + 0.9], 6 + 1.0)  # a 400 ms gap between tokens
    s = latency.summarize({"records": streamed}, latency.Objective(ttft_s=2.0, itl_s=0.1))
    assert s["window_requests"] == 8 and s["good_share_client"] == pytest.approx(6 / 8)  # arrivals 1..8 in the window
    assert s["good_ttft_share_client"] == pytest.approx(7 / 8)  # the first-token part alone: the 400 ms gap meets it
    assert s["goodput_ttft_client_per_s"] == pytest.approx(7 / 6 * s["goodput_client_per_s"])
    assert s["ttft_engine"] == s["ttft_client"] and s["ttft_client"]["p50"] == pytest.approx(0.5)
    batched = [record(t, [t + 0.5, t + 0.55], t + 3.0, batch=f"b{t}") for t in range(10)]
    b = latency.summarize({"records": batched})
    assert b["ttft_engine"]["p50"] == pytest.approx(0.5) and b["ttft_client"]["p50"] == pytest.approx(3.0)
    assert b["good_share_engine"] == 1.0 and b["good_share_client"] == 0.0
    assert b["good_ttft_share_client"] == 0.0  # the client's first token is the batch's end, 3 s after arrival
    assert latency.summarize({"records": [{"complete_s": 1.0}]}) is None  # a study burst records no arrivals


def test_a_paired_first_token_difference_compares_request_by_request_where_p50s_compare_shapes():
    # two trials of one schedule: the candidate's every first token 2 ms later, but its distribution steep at the
    # median, so the p50s differ by far more than any request did
    times = [0.06] * 11 + [0.3] * 10  # the reference: half fast, half behind a prefill, its p50 on the step
    reference = [record(t, [t + x], t + x + 0.1) for t, x in enumerate(times)]
    for r, t in zip(reference, range(21)):
        r["request_id"] = f"q{t}"
    candidate = [dict(r, token_s=[r["token_s"][0] + 0.002]) for r in reference]
    candidate[10]["token_s"] = [10 + 0.3]  # one request moved behind the step: 240 ms later
    p50s = latency.summarize({"records": candidate})["ttft_client"]["p50"] - latency.summarize(
        {"records": reference})["ttft_client"]["p50"]
    paired = latency.paired_ttft_delta({"records": candidate}, {"records": reference})
    assert p50s == pytest.approx(0.24) and paired["p50"] == pytest.approx(0.002)
    assert latency.paired_ttft_delta({"records": []}, {"records": reference}) is None
    assert latency.paired_ttft_delta({"records": candidate}, {"records": []}) is None  # no request in common


def test_both_paths_record_every_latency_on_one_clock_from_the_scheduled_arrival(small_reuse_trace, sim_backend,
                                                                                tmp_path):
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    cases = plan.sustained([small_reuse_trace], [40.0], plan.FlameSettings(batch_limit=64, window_ms=5),
                           plan.Arrivals(kind="poisson", seed=7))
    before, lines = time.monotonic(), []
    run_experiment("sustained", cases, sim_backend, tmp_path, settings={"rates": [40.0]}, log=lines.append)
    after = time.monotonic()
    assert lines[0] == ("sustained: 2 cases; their arrival schedules take about 3.2 s in all (requests / rate, "
                        "case by case; engine starts and warmups come on top)")  # 64 requests at 40/s, each side
    docs = {c.system: read_manifest(tmp_path / "trials" / f"{c.trial_id}.json") for c in cases}
    assert docs["standalone"]["schedule"] == docs["flame"]["schedule"]  # the same arrivals, by hash
    assert docs["flame"]["schedule"]["kind"] == "poisson" and docs["flame"]["schedule"]["rate"] == 40.0
    for system, doc in docs.items():
        assert doc["verdict"]["status"] == "passed", system
        for r in doc["records"]:
            assert before <= r["arrival_s"] <= r["sent_s"] <= r["token_s"][0] <= r["complete_s"] <= after, system
            assert len(r["token_s"]) == 16 and r["token_s"] == sorted(r["token_s"]), system
        offsets = [r["arrival_s"] - doc["timing"]["release_s"] for r in doc["records"]]
        assert offsets == pytest.approx(Schedule(kind="poisson", rate=40.0, seed=7).offsets(len(offsets)))
    assert docs["flame"]["config"]["stream"] is True and docs["standalone"]["config"]["stream"] is True
    flame = latency.summarize(docs["flame"])
    assert flame["ttft_client"]["p50"] >= flame["ttft_engine"]["p50"]  # the worker's first token before its batch


def test_the_sim_server_streams_each_token_as_vllm_does(tmp_path):
    import asyncio

    import aiohttp

    from parity.engine import EngineArgs
    from parity.standalone.client import read_stream, request_body
    from parity.standalone.replicas import ReplicaSet

    async def ask(url):
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=request_body("m", list(range(300)), stream=True)) as response:
                return await read_stream(response, "r")

    with ReplicaSet("sim", ["sim-0"], EngineArgs(), tmp_path) as replicas:
        data, times = asyncio.run(ask(replicas.replicas[0].url + "/v1/completions"))
    choice = data["choices"][0]
    assert len(choice["token_ids"]) == 16 == len(times) and choice["prompt_token_ids"] == list(range(300))
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and times == sorted(times)
    assert times[-1] - times[0] > 0.01  # sixteen decode steps, each token sent as its step ended


def test_a_held_batch_gathers_what_arrives_while_a_task_runs():
    from concurrent.futures import Future

    from parity.flame import codec
    from parity.flame.batcher import Batcher
    from parity.flame.settings import FlameSettings
    from parity.flame.codec import encode_output

    sent: list[tuple[list[str], Future]] = []

    def send(data: bytes) -> Future:
        future: Future = Future()
        sent.append(([p.request_id for p in codec.decode(data, budget=1 << 22)], future))
        return future

    def answer(index: int) -> None:
        ids, future = sent[index]
        future.set_result(encode_output([{"request_id": i, "output_token_ids": [1] * 16, "prompt_tokens": 4,
                                          "cached_tokens": 0} for i in ids], {"executor_id": "e"}, {}))

    batcher = Batcher(send, FlameSettings(batch_limit=64, window_ms=1, inflight=1))
    first = batcher.submit("a", np.arange(4))
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.001)
    later = [batcher.submit(name, np.arange(4)) for name in ("b", "c", "d")]
    time.sleep(0.05)  # well past the window: still held, since a task is running
    assert [ids for ids, _ in sent] == [["a"]]
    answer(0)
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sent[1][0] == ["b", "c", "d"]  # one task: everything that arrived meanwhile
    answer(1)
    assert [f.result(timeout=5).request_id for f in [first, *later]] == ["a", "b", "c", "d"]
    batcher.close()


def test_inflight_is_ours_and_the_studys_settings_record_without_it():
    from parity.flame.settings import FlameSettings

    assert "inflight" not in FlameSettings().to_dict()
    assert FlameSettings(inflight=1).to_dict()["inflight"] == 1 and FlameSettings(inflight=1).label().endswith("-inflight1")
    assert FlameSettings.from_dict(FlameSettings(inflight=1).to_dict()) == FlameSettings(inflight=1)
    with pytest.raises(ParityError, match="inflight must be 0"):
        FlameSettings(inflight=-1)
    assert dataclasses.replace(FlameSettings(), inflight=2).inflight == 2


def test_the_ladder_pairs_each_rate_under_one_schedule_and_an_arm_gets_pairs_of_its_own(tiny_reuse_trace):
    from parity.experiments import plan

    cases = plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [2, 4], "arms": {"gathered": {"inflight": 1}}})
    assert [c.stage for c in cases] == ["rate-2"] * 2 + ["rate-2-gathered"] * 2 + ["rate-4"] * 2 + ["rate-4-gathered"] * 2
    for stage in ("rate-2", "rate-4-gathered"):
        ref, cand = sorted((c for c in cases if c.stage == stage), key=lambda c: c.side != "reference")
        assert ref.system == "standalone" and cand.system == "flame" and ref.schedule == cand.schedule
        assert ref.stream and cand.stream and ref.schedule.kind == "poisson"
    assert {c.flame.inflight for c in cases if c.stage.endswith("gathered")} == {1}
    assert [c.side for c in cases[:4]] == ["reference", "candidate", "candidate", "reference"]  # alternating order


def test_a_trial_that_ran_another_schedule_is_stale_and_a_study_trial_keeps_its_burst():
    from parity import trial

    study = {"ran_with": {}, "trace": {"sha256": "t"}, "engine": {"args": {}}, "versions": {}}
    wanted = {name: None for name in trial.RESULT_SETTINGS} | {"trace": "t", "engine_args": {}, "versions": {},
                                                                 "load": trial.recorded_load(None)}
    assert "load" not in (trial.stale(study, wanted) or "")  # recorded before `load` existed: the study's burst
    poisson = {"schedule": Schedule(kind="poisson", rate=4.0).to_dict(), "stream": True}
    assert "load.schedule" in trial.stale(study, wanted | {"load": trial.recorded_load(poisson)})


def test_startup_cost_is_measured_per_path_cold_then_warm(tmp_path):
    from click.testing import CliRunner

    from parity.cli import main

    result = CliRunner().invoke(main, ["bench", "startup", "--repeats", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "startup.json").read_text())
    alone, flame = doc["standalone"], doc["flame"]
    assert doc["simulated"] is True and [r["cold"] for r in alone["runs"]] == [True, False]
    assert all(0 < r["start_to_healthy_s"] < r["start_to_first_answer_s"] for r in alone["runs"])
    assert len(flame["runs"]) == 2 and all(r["session_to_first_answer_s"] > 0 for r in flame["runs"])
    assert flame["cluster_s"] > 0 and alone["start_to_first_answer"]["warm_median_s"] > 0
    assert json.loads((tmp_path / "cleanup-standalone-1.json").read_text())["clean"] is True
    assert "(simulated)" in result.output and doc["flame_over_standalone"]["warm"] > 0


def test_a_start_with_no_warm_run_says_so_not_zero_seconds():
    """`bench startup --repeats 1` printed "0.0 s warm" for a warm median it never measured (an outsider's,
    2026-12-07)."""
    from parity.bench.startup import summary, summary_line

    result = {"simulated": True, "repeats": 1, "standalone": {"start_to_first_answer": summary([1.2])},
              "flame": {"cluster_s": 3.0, "session_to_first_answer": summary([1.9])}}
    line = summary_line(result)
    assert line.count("no warm run") == 2 and "0.0 s warm" not in line and "warm 0" not in line, line
    assert "Flame / standalone: cold 4.08x" in line  # (3.0 + 1.9) / 1.2: outside pass Q found no ratio printed
    result["flame"]["session_to_first_answer"] = summary([1.9, 0.4, 0.6])
    result["standalone"]["start_to_first_answer"] = summary([1.2, 1.0, 1.0])
    line = summary_line(result)
    assert "0.5 s warm (median of 2, 0.4-0.6 s)" in line and "warm 0.50x" in line, line


def test_longer_answers_run_exactly_their_length_on_both_paths_and_are_checked_so(tiny_reuse_trace, sim_backend,
                                                                                   tmp_path):
    from parity.checks import check_trial, trace_of
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    cases = plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [20], "output_tokens": [128],
                                                                   "flame": {"window_ms": 5}})
    assert {c.stage for c in cases} == {"rate-20-out128"} and {c.max_tokens for c in cases} == {128}
    run_experiment("sustained", cases, sim_backend, tmp_path, settings={}, log=lambda m: None)
    for case in cases:
        path = tmp_path / "trials" / f"{case.trial_id}.json"
        doc = read_manifest(path)
        assert doc["verdict"]["status"] == "passed" and doc["engine"]["args"]["max_tokens"] == 128, case.system
        assert {len(r["output_token_ids"]) for r in doc["records"]} == {128} == {len(r["token_s"]) for r in doc["records"]}
        assert doc["ran_with"]["engine_args"]["max_tokens"] == 128
        doc["records"][0]["output_token_ids"] = doc["records"][0]["output_token_ids"][:16]  # the study's length here
        assert "without exactly 128 output tokens" in " ".join(check_trial(doc, trace_of(path, doc))["reasons"])


def test_the_eviction_case_runs_both_paths_on_a_cache_smaller_than_the_working_set(small_reuse_trace, sim_backend,
                                                                                    tmp_path):
    """Ours: the same pair on engines whose KV cache holds a fraction of the trace's documents; the trials
    record the cache they ran with (and the study's record no such key), and fewer prompt tokens hit."""
    from parity.engine import EngineArgs
    from parity.engine import vllm_compat
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest
    from parity.record import cached_share

    assert "num_gpu_blocks_override" not in EngineArgs().to_dict()
    small = EngineArgs(num_gpu_blocks_override=400)
    assert vllm_compat.serve_arguments(small, 8000)[-2:] == ["--num-gpu-blocks-override", "400"]
    settings = {"rates": [40], "evict": {"cache_blocks": 400}, "flame": {"batch_limit": 64, "window_ms": 5}}
    cases = plan.for_experiment("sustained", [small_reuse_trace], settings)
    evicting = [c for c in cases if c.cache_blocks]
    assert {c.stage for c in evicting} == {"evict-40"} and {c.system for c in evicting} == {"standalone", "flame"}
    run_experiment("sustained", cases, sim_backend, tmp_path, settings=settings, log=lambda m: None)
    docs = {c.trial_id: read_manifest(tmp_path / "trials" / f"{c.trial_id}.json") for c in cases}
    for case in cases:
        doc = docs[case.trial_id]
        assert doc["verdict"]["status"] == "passed", case.trial_id
        assert doc["engine"]["args"].get("num_gpu_blocks_override") == case.cache_blocks
    for system in ("standalone", "flame"):
        share = {bool(c.cache_blocks): cached_share(docs[c.trial_id]["records"]) for c in cases if c.system == system}
        assert share[True] < share[False], system


def test_a_rung_too_long_too_fast_or_on_a_trace_not_given_is_refused_before_anything_runs(tiny_reuse_trace, tmp_path):
    from click.testing import CliRunner

    from parity.cli import main

    out = tmp_path / "out"
    for settings, says in [
        ({"rates": [0.001]}, "sustained-rate-0.001-reuse-p0-vllm: 6 requests at 0.001 requests/s take about 1.7 h, "
                             "longer than the 1 h a rung may take; raise the rate"),
        ({"rates": [1e9]}, "sustained-rate-1e+09-reuse-p0-vllm: 1e+09 requests/s is more than a sender can hold "
                           "(at most 1000: faster, the gaps between sends are shorter than its own 1 ms lag)"),
        ({"rates": [4], "traces": ["reuse", "nonexistent"]},
         "sustained: the settings name trace 'nonexistent', which is not among the traces given (reuse)"),
    ]:
        result = CliRunner().invoke(main, ["experiment", "run", "sustained", "--trace", str(tiny_reuse_trace),
                                           "--backend", '{"engine": "sim"}', "--settings", json.dumps(settings),
                                           "--out", str(out)])
        assert result.exit_code == 1 and result.output.strip().splitlines() == [f"Error: {says}"], result.output
    assert not out.exists()


def test_paced_rungs_are_bounded_and_added_up_bursts_count_nothing(tiny_reuse_trace):
    from parity.experiments import plan

    edge = plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [6 / plan.MAX_RUNG_S, plan.MAX_RATE_PER_S]})
    assert plan.paced_span_s(edge, {tiny_reuse_trace: 6}) == pytest.approx(2 * (plan.MAX_RUNG_S + 6 / plan.MAX_RATE_PER_S))
    for rates in ([5 / plan.MAX_RUNG_S], [plan.MAX_RATE_PER_S * 1.01]):  # just beyond either bound
        with pytest.raises(ParityError):
            plan.paced_span_s(plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": rates}),
                              {tiny_reuse_trace: 6})
    assert plan.paced_span_s(plan.for_experiment("locality", [tiny_reuse_trace], {"repeats": 1}),
                             {tiny_reuse_trace: 6}) == 0.0


def test_an_arm_the_flame_settings_refuse_is_named(small_reuse_trace):
    """An arm's changes that the Flame settings refuse (express without harvest) name the arm they came from."""
    from parity.errors import ParityError
    from parity.experiments import plan

    with pytest.raises(ParityError, match="^Flame arm 'quick': Flame setting express applies only with mode harvest$"):
        plan.sustained([small_reuse_trace], [40.0], plan.FlameSettings(), arms={"quick": {"express": True}})
    with pytest.raises(ParityError, match="^Flame arm 'typo': unknown Flame setting\\(s\\) batch_limt: known are "):
        plan.with_arm(plan.FlameSettings(), "typo", {"batch_limt": 8})  # called directly, not through a config


def test_a_wait_with_no_answer_says_so_each_quiet_period(capsys):
    """A frozen Flame worker left `flame run` silent for up to an hour, a frozen replica `standalone run` for half
    of one (outsiders', 2026-12-07): each path's wait says how many requests are unanswered each QUIET_NOTE_S with
    none answered, and an answer restarts the count."""
    from parity.schedule import QUIET_NOTE_S, Quiet

    quiet = Quiet("flame", total=10, pending=10, deadline=3600.0, now=0.0)
    assert quiet.note(10, QUIET_NOTE_S - 1) is None
    line = (f"parity: flame: 10 of 10 requests unanswered, none answered for {QUIET_NOTE_S} s "
            f"(given up {3600 - QUIET_NOTE_S} s from now)")
    assert quiet.note(10, QUIET_NOTE_S) == line and capsys.readouterr().err == line + "\n"
    assert quiet.note(10, QUIET_NOTE_S + 1) is None  # once per quiet period, not at every poll
    assert quiet.note(9, 2 * QUIET_NOTE_S) is None  # an answer came: quiet from here
    assert quiet.note(9, 3 * QUIET_NOTE_S - 1) is None and quiet.note(9, 3 * QUIET_NOTE_S) is not None
    assert quiet.note(0, 10 * QUIET_NOTE_S) is None  # all answered
