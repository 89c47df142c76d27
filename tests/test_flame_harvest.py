"""The harvest mode (ours, parity.flame.harvest and .harvester): events in order, a request spanning many tasks,
a failed task failing its session's open requests, a hold of zero, an empty task, and a harvest trial that
passes the four per-request checks. The protocol is driven by hand where order matters (a scripted engine,
the service called in-process); the rest runs on the stand-in with the simulator, asserting nothing timed."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future

import flamepy
import numpy as np
import pytest

from parity.engine import Completion
from parity.engine.sim import output_tokens
from parity.errors import ParityError
from parity.flame import codec
from parity.flame.codec import decode_output
from parity.flame.harvest import Harvest
from parity.flame.harvester import Harvester
from parity.flame.service import ParityService
from parity.flame.settings import FlameSettings

HARVEST = {"api": "async", "mode": "harvest"}


class ScriptedEngine:
    """An engine whose tokens and completions the test emits by hand (the engine API SimEngine.submit has)."""

    def __init__(self):
        self.requests: list[list] = []  # [prompt, on_token, future, tokens so far]

    def submit(self, prompt, on_token=None, max_tokens=None) -> Future:
        if int(np.max(prompt)) >= 1000:
            raise ParityError("Token id 1000 is out of vocabulary")
        future: Future = Future()
        self.requests.append([prompt, on_token, future, 0])
        return future

    def token(self, index: int, count: int = 1) -> None:
        request = self.requests[index]
        for _ in range(count):
            request[1](request[3], 100.0 + request[3])
            request[3] += 1

    def complete(self, index: int) -> None:
        prompt, _, future, made = self.requests[index]
        future.set_result(Completion(list(range(made)), len(prompt), 3, 0.0, 1.0))


def prompt(rid: str, first: int = 1) -> codec.Prompt:
    return codec.Prompt(rid, np.arange(first, first + 20, dtype="<u4"))


def test_events_come_once_in_order_and_a_request_spans_many_tasks():
    engine = ScriptedEngine()
    harvest = Harvest(engine, hold_s=30.0)  # long: every task below returns on an event, or nothing is open
    engine_token = threading.Timer(0.05, engine.token, (0,))  # the first token comes while the first task holds
    engine_token.start()
    events, done, timings = harvest.task([prompt("a")])
    assert events == [{"request_id": "a", "from": 0, "token_s": [100.0]}] and done == [] and timings["open"] == 1
    engine.token(0, 2)
    events, done, _ = harvest.task([prompt("b", 5)])  # events already waiting: no hold
    assert events == [{"request_id": "a", "from": 1, "token_s": [101.0, 102.0]}] and done == []
    engine.token(1)
    engine.token(0)
    engine.complete(0)
    events, done, timings = harvest.task([])
    assert {e["request_id"]: e["from"] for e in events} == {"a": 3, "b": 0}
    assert [d["request_id"] for d in done] == ["a"] and done[0]["output_token_ids"] == [0, 1, 2, 3]
    assert done[0]["cached_tokens"] == 3 and timings == timings | {"prompts": 0, "completions": 1, "open": 1}


def test_a_hold_of_zero_returns_at_once_and_an_empty_task_with_nothing_open_never_holds():
    engine = ScriptedEngine()
    assert Harvest(engine, hold_s=3600.0).task([])[:2] == ([], [])  # nothing open: no event can come
    zero = Harvest(engine, hold_s=0.0)
    for _ in range(3):  # open, no event: back at once, empty, with the request still running
        events, done, timings = zero.task([prompt("a")] if not engine.requests else [])
        assert (events, done, timings["open"]) == ([], [], 1)
    held = Harvest(ScriptedEngine(), hold_s=0.05)
    timings = held.task([prompt("a")])[2]
    assert timings["admit_s"] + timings["wait_s"] >= 0.05  # the hold, as a floor, never a ceiling


def test_a_prompt_the_engine_refuses_fails_the_task_and_a_running_request_twice_is_refused():
    engine = ScriptedEngine()
    harvest = Harvest(engine, hold_s=0.0)
    harvest.task([prompt("a")])
    with pytest.raises(ParityError, match="out of vocabulary"):
        harvest.task([prompt("bad", 990)])
    with pytest.raises(ParityError, match="request a is already running on this session"):
        harvest.task([prompt("a")])


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("PARITY_GPUS", "sim-0")
    monkeypatch.setenv(flamepy.FLAME_INSTANCE_ENDPOINT, str(tmp_path / "exec-3.sock"))
    return tmp_path / "locks"


@pytest.fixture
def service(lock_dir):
    """The service in harvest mode on the paced simulator, called in-process as flamepy would."""
    svc = ParityService()
    svc.on_session_enter(flamepy.SessionContext(
        _common_data=json.dumps({"engine": "sim", "engine_args": {"max_tokens": 64},
                                 "flame": HARVEST | {"hold_ms": 50}}).encode(),
        session_id="s0", application=flamepy.ApplicationContext(name="parity-gpu0")))
    yield svc
    svc.on_session_leave()


def invoke(svc, prompts) -> dict:
    data = codec.encode(prompts, compress=False)
    return decode_output(svc.on_task_invoke(flamepy.TaskContext(task_id="t", session_id="s0", input=data)))


def test_the_service_returns_an_empty_task_empty_and_a_request_whole_across_tasks(service):
    doc = invoke(service, [])
    assert (doc["outputs"], doc["events"], doc["worker"]["executor_id"]) == ([], [], "exec-3")
    tokens = np.arange(1, 300, dtype="<u4")
    seen, outputs = [], []
    outputs += invoke(service, [codec.Prompt("a", tokens, 40)])["outputs"]
    while not outputs:
        doc = invoke(service, [])
        seen += [(e["from"], len(e["token_s"])) for e in doc["events"]]
        outputs += doc["outputs"]
    assert outputs[0]["output_token_ids"] == output_tokens(tokens, 128_256, 40)
    assert sum(n for _, n in seen) <= 40 and all(a + n == b for (a, n), (b, _) in zip(seen, seen[1:]))


def in_process(svc) -> callable:
    """flamepy's session.run, for one in-process service: a future of the task's output."""
    lock = threading.Lock()  # Flame's executor: one task at a time

    def send(data: bytes) -> Future:
        future: Future = Future()

        def run():
            with lock:
                try:
                    future.set_result(svc.on_task_invoke(flamepy.TaskContext(task_id="t", session_id="s0", input=data)))
                except Exception as exc:  # noqa: BLE001 - as flamepy fails the task
                    future.set_exception(RuntimeError(str(exc)))
        threading.Thread(target=run, daemon=True).start()
        return future
    return send


def test_the_client_resolves_each_request_from_its_events_and_a_failed_task_fails_all_open(service):
    harvester = Harvester(in_process(service), name="s0", output_tokens=64)
    try:
        long = harvester.submit("long", np.arange(1, 400), max_tokens=64)
        short = harvester.submit("short", np.arange(7, 300), max_tokens=2)
        result = short.result(timeout=60)
        assert result.output_token_ids == output_tokens(np.arange(7, 300), 128_256, 2) and len(result.token_s) == 2
        assert result.batch_id is None and result.worker["executor_id"] == "exec-3"
        bad = harvester.submit("bad", [1, 200_000], max_tokens=2)  # out of the simulator's vocabulary: its task fails
        for future in (bad, long):  # the long request was still open: it fails too, in one line
            with pytest.raises(ParityError, match=r"harvest task s0/h\d+ failed: .*out of vocabulary") as error:
                future.result(timeout=60)
            assert "\n" not in str(error.value)
        again = harvester.submit("again", np.arange(3, 100))  # the session serves on
        assert len(again.result(timeout=60).output_token_ids) == 64
    finally:
        harvester.close()
    assert harvester.tasks and all(t["executor_id"] == "exec-3" for t in harvester.tasks)


def test_closing_waits_for_the_outstanding_task_then_fails_what_is_left_by_name():
    from waiting import wait_until  # tests/ is on sys.path

    sent, outstanding = threading.Event(), Future()
    harvester = Harvester(lambda data: sent.set() or outstanding, name="s9")
    first = harvester.submit("a", [1, 2, 3])
    sent.wait(30)
    queued = harvester.submit("b", [4, 5])  # while the task is outstanding: for the next one
    closer = threading.Thread(target=harvester.close)
    closer.start()
    wait_until(lambda: harvester._closed, what="close to begin")
    outstanding.set_result(codec.encode_output([], {"executor_id": "e"}, {}, []))  # the task returns, nothing done
    closer.join(30)
    for future in (first, queued):
        with pytest.raises(ParityError, match="harvester s9 closed with the request unanswered"):
            future.result(timeout=5)
    with pytest.raises(ParityError, match="harvester s9 is closed"):
        harvester.submit("c", [1])


def test_the_mode_is_ours_and_the_studys_settings_record_without_it():
    study = FlameSettings(batch_limit=256, window_ms=10, api="async", order="prefix")
    assert "mode" not in study.to_dict() and "hold_ms" not in study.to_dict() and "harvest" not in study.label()
    ours = FlameSettings.from_dict(HARVEST | {"hold_ms": 2})
    assert ours.label() == "b32-w2ms-async-raw-harvest-h2ms" and FlameSettings.from_dict(ours.to_dict()) == ours
    assert FlameSettings.from_dict(HARVEST | {"hold_ms": 0}).hold_s == 0


@pytest.mark.parametrize("values, message", [
    ({"mode": "stream"}, "mode 'stream': use one of burst, harvest"),
    ({"mode": "harvest"}, "mode harvest needs api async"),
    (HARVEST | {"inflight": 1}, "leave inflight unset, got 1"),
    (HARVEST | {"hold_ms": -1}, "hold_ms must be 0 or more"),
    ({"hold_ms": 3}, "hold_ms \\(3\\) applies only with mode harvest"),
])
def test_a_bad_harvest_setting_is_refused_in_one_line(values, message):
    with pytest.raises(ParityError, match=message):
        FlameSettings.from_dict(values)


def test_a_harvest_trial_on_the_stand_in_passes_the_four_checks(tiny_reuse_trace, sim_backend, tmp_path):
    from parity import latency
    from parity.checks import CHECKS
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    cases = plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [20], "arms": {"harvest": HARVEST},
                                                                   "flame": {"window_ms": 5, "api": "async"}})
    cases = [c for c in cases if c.stage.endswith("-harvest")]  # the arm's pair: standalone beside it
    (flame,) = [c for c in cases if c.system == "flame"]
    assert flame.flame.mode == "harvest"
    run_experiment("sustained", cases, sim_backend, tmp_path, settings={}, log=lambda m: None)
    doc = read_manifest(tmp_path / "trials" / f"{flame.trial_id}.json")
    assert doc["verdict"]["status"] == "passed", doc["verdict"]
    assert {name: c["passed"] for name, c in doc["verdict"]["checks"].items()} == {name: True for name in CHECKS}
    assert doc["config"]["flame"]["mode"] == "harvest" and doc["config"]["cluster"] == "stand-in"
    assert doc["harvest"]["tasks"] >= 1 and doc["harvest"]["completions"] == len(doc["records"])
    for r in doc["records"]:
        assert "batch_id" not in r and len(r["token_s"]) == 16 and r["token_s"][-1] <= r["complete_s"]
    summary = latency.summarize(doc)
    assert summary["ttft_client"]["p50"] <= summary["e2e"]["p50"]


def test_on_the_stand_in_a_request_spans_many_tasks_and_a_failed_task_fails_the_sessions_open_requests(tmp_path):
    from parity.flame.client import FlameSessions
    from parity.flame.settings import session_data
    from parity.paths.flame import cluster

    settings = FlameSettings.from_dict(HARVEST)
    data = session_data(settings, "sim", {"max_tokens": 512}, None)
    with cluster("standin", ["sim-0"], tmp_path, simulated=True) as running, \
            FlameSessions(running, 1, settings, data, placement="sticky", name="hv", output_tokens=512) as sessions:
        harvester = sessions.batchers[0]
        assert isinstance(harvester, Harvester)
        answer = harvester.submit("many", np.arange(1, 200), max_tokens=128).result(timeout=120)
        assert answer.output_token_ids == output_tokens(np.arange(1, 200), 128_256, 128)
        assert len(set(answer.token_s)) > 1 and answer.token_s == sorted(answer.token_s)  # tokens from many tasks
        assert len(harvester.tasks) > 1 and answer.worker["executor_id"] in {e["executor_id"] for e in sessions.executors()}
        long = harvester.submit("long", np.arange(5, 300), max_tokens=512)  # hundreds of engine steps
        bad = harvester.submit("bad", [1, 200_000], max_tokens=2)  # out of the simulator's vocabulary: its task fails
        for future in (bad, long):
            with pytest.raises(ParityError, match="harvest task hv-0/h\\d+ failed: .*out of vocabulary") as error:
                future.result(timeout=120)
            assert "\n" not in str(error.value)
    assert running.receipt["clean"], running.receipt["errors"]
