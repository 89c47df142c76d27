"""The standalone path on the CPU: simulator replicas behind HTTP, both routing policies, teardown."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import main
from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.manifest import read_manifest, validate_paths
from parity.standalone import replicas as replicas_module
from parity.standalone.client import parse_reply, request_body
from parity.standalone.replicas import ReplicaSet
from parity.procs import port_free as port_is_free


@pytest.fixture(scope="module")
def reuse_trace(small_reuse_trace):
    return small_reuse_trace


def test_sticky_beats_alternating_on_reuse_end_to_end(reuse_trace, tmp_path):
    result = CliRunner().invoke(main, ["standalone", "run", "--trace", str(reuse_trace), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    trials = {t: read_manifest(tmp_path / f"locality-vllm-{t}-reuse-r0.json") for t in ("alternating", "sticky")}
    share = {t: sum(r["cached_tokens"] for r in d["records"]) / sum(r["prompt_tokens"] for r in d["records"])
             for t, d in trials.items()}
    assert share["sticky"] == pytest.approx(3 / 4 * 1488 / trials["sticky"]["records"][0]["prompt_tokens"], abs=0.02)
    assert share["alternating"] < share["sticky"] - 0.1
    rps = {t: d["timing"]["requests_per_s"] for t, d in trials.items()}
    assert rps["sticky"] > rps["alternating"]
    for doc in trials.values():
        assert doc["simulated"] is True and doc["system"] == "standalone" and len(doc["records"]) == 64
        assert all(len(r["output_token_ids"]) == 16 for r in doc["records"])
        assert {r["gpu_uuid"] for r in doc["records"]} == {"sim-0", "sim-1"}
    sticky_docs = {}
    for r in trials["sticky"]["records"]:
        sticky_docs.setdefault(r["request_id"].split("-q")[0], set()).add(r["shard"])
    assert all(len(shards) == 1 for shards in sticky_docs.values())
    receipt = read_manifest(tmp_path / "cleanup-replicas.json")
    assert receipt["clean"] is True and all(port_is_free(p) for p in receipt["ports_released"])
    checked, problems = validate_paths([tmp_path])
    assert checked == 4 and problems == []  # two trials, the receipt, and the trace they link


def test_replica_that_cannot_start_fails_with_its_log(tmp_path):
    replica_set = ReplicaSet("sim", ["sim-0"], EngineArgs(), tmp_path, sim_params=tmp_path / "missing.yaml",
                             startup_timeout_s=60)
    with pytest.raises(ParityError, match=r"replica 0 \(GPU sim-0, pid \d+, port \d+\) exited before becoming "
                                          r"healthy: exit code 1 \(.*simulator parameters not found.*\); "
                                          r"log: .*replica-0.log$"):
        with replica_set:
            pass
    assert replica_set.receipt["processes"][0]["exit_code"] not in (None, 0)


def test_pinning_mismatch_fails_and_still_tears_down(tmp_path, monkeypatch):
    monkeypatch.setattr(replicas_module, "_identify", lambda kind, replica: "sim-9")
    replica_set = ReplicaSet("sim", ["sim-0"], EngineArgs(), tmp_path)
    with pytest.raises(ParityError, match="reports GPU sim-9, but was pinned to sim-0"):
        with replica_set:
            pass
    assert replica_set.receipt["clean"] is True


def test_bad_requests_are_refused_by_the_sim_server(reuse_trace, tmp_path):
    import httpx

    with ReplicaSet("sim", ["sim-0"], EngineArgs(), tmp_path) as replica_set:
        url = replica_set.replicas[0].url + "/v1/completions"
        assert httpx.post(url, json={"prompt": "text", "max_tokens": 16}).status_code == 400
        bad_sampling = request_body("m", [1, 2, 3]) | {"max_tokens": 8}
        assert httpx.post(url, json=bad_sampling).status_code == 400
        good = httpx.post(url, json=request_body("m", list(range(40)))).json()
        reply = parse_reply(good, "r", 0.0, 1.0)
        assert len(reply.output_token_ids) == 16 and reply.prompt_token_ids == list(range(40))


def test_wrong_output_length_and_missing_cached_count_fail_loudly():
    data = {"choices": [{"token_ids": [1] * 15}], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}
    with pytest.raises(ParityError, match="r7: 15 output tokens, expected 16"):
        parse_reply(data, "r7", 0, 1)
    data = {"choices": [{"token_ids": [1] * 16}], "usage": {"prompt_tokens": 3}}
    with pytest.raises(ParityError, match="enable-prompt-tokens-details"):
        parse_reply(data, "r8", 0, 1)
    with pytest.raises(ParityError, match="malformed"):
        parse_reply({"error": "x"}, "r9", 0, 1)


def test_unknown_replica_kind():
    with pytest.raises(ParityError, match="unknown replica kind"):
        ReplicaSet("tgi", ["x"], EngineArgs(), None)


def test_trial_fails_loudly_when_a_replica_dies(reuse_trace, tmp_path):
    import os
    import re
    import signal

    from parity import trial
    from parity.routing import RouterSettings
    from parity.paths.standalone import StandalonePath

    path = StandalonePath("sim", ["sim-0", "sim-1"], EngineArgs(), tmp_path / "logs")
    replica_set = path.replicas
    with pytest.raises(ParityError) as err:
        with path:
            dead = replica_set.replicas[1]
            os.killpg(dead.process.pid, signal.SIGKILL)
            dead.process.wait()
            trial.run(path, reuse_trace, tmp_path, trial_id="t", experiment="locality",
                      router=RouterSettings("alternating"), warmup_rounds=0)
    assert re.fullmatch(rf"replica 1 \(GPU sim-1, pid {dead.process.pid}, port {dead.port}\) died (before the trial|"
                        rf"during the run): killed by SIGKILL \(.*\); log: {tmp_path / 'logs' / 'replica-1.log'}",
                        str(err.value)), str(err.value)
    assert not (tmp_path / "t.json").exists()
    assert json.loads(json.dumps(replica_set.receipt))["processes"][1]["signal"] == "SIGKILL"


def test_a_replica_port_taken_between_pick_and_bind_is_one_line(tmp_path, monkeypatch):
    import os
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setattr(replicas_module.procs, "free_port", lambda host="127.0.0.1": port)
        replica_set = ReplicaSet("sim", ["sim-0"], EngineArgs(), tmp_path, startup_timeout_s=60)
        with pytest.raises(ParityError, match=rf"^replica 0 \(GPU sim-0, pid \d+, port {port}\) could not bind its "
                                              rf"port: pid {os.getpid()} \(.*\) on 127.0.0.1 took it after it was "
                                              rf"picked; log: .*replica-0.log$"):
            with replica_set:
                pass
    assert "cannot listen on 127.0.0.1" in (tmp_path / "replica-0.log").read_text()
    assert replica_set.receipt["processes"][0]["exit_code"] == 1


# Nothing the signal leaves may be swallowed: an exception in a gc callback or a coroutine never awaited fails.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning", "error::RuntimeWarning")
@pytest.mark.parametrize("name, lands", [("SIGTERM", "on a timer"), ("SIGINT", "on a timer"),
                                         ("SIGTERM", "inside a gc callback"), ("SIGINT", "inside a request")])
def test_a_signal_mid_burst_cancels_the_requests_in_flight(reuse_trace, tmp_path, caplog, monkeypatch, name, lands,
                                                           python_sigint):
    """A real SIGTERM (a scheduler's kill) or SIGINT (a reviewer's Ctrl-C) mid-burst, wherever the main thread
    is when its handler runs (here also inside a gc callback, which swallows what a handler raises: a CI run
    lost its signal so), cancels the burst's task: its requests are cancelled at their awaits, the signal's
    exception is raised once the loop is back, nothing is logged after the run says it stopped and the trial
    leaves no task pending on the closed pool."""
    import asyncio
    import gc
    import os
    import signal
    import threading

    from parity import procs
    from parity.routing import RouterSettings
    from parity.paths.standalone import StandalonePath
    from parity.schedule import Schedule
    from parity.standalone import client as client_module
    from parity.trace import load_trace

    signum = signal.Signals[name]
    monkeypatch.setattr(procs, "termination", procs.Termination())  # this test's signal is not the session's
    saved = {s: signal.getsignal(s) for s in procs.Termination.SIGNALS}
    sent = threading.Event()

    def send():
        sent.set()
        os.kill(os.getpid(), signum)

    def in_gc(phase, info):
        if phase == "start" and not sent.is_set():
            signal.raise_signal(signum)  # runs its handler here, inside gc's callback
            sent.set()

    answered, timers = [], []

    def parse_reply_then_signal(*args, **kwargs):
        answered.append(1)
        if len(answered) == 3 and lands == "inside a request":
            signal.raise_signal(signum)  # runs its handler here, in one request's own task
            sent.set()
        elif len(answered) == 3 and lands == "inside a gc callback":
            gc.callbacks.append(in_gc)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(in_gc)
        return parse_reply(*args, **kwargs)
    monkeypatch.setattr(client_module, "parse_reply", parse_reply_then_signal)

    def request_body_then_timer(*args, **kwargs):  # the timer starts with the burst: the replica takes a
        if lands == "on a timer" and not timers:  # second or more to answer, so the signal lands before that
            timers.append(threading.Timer(0.05, send))
            timers[0].start()
        return request_body(*args, **kwargs)
    monkeypatch.setattr(client_module, "request_body", request_body_then_timer)

    trace = load_trace(reuse_trace)
    path = StandalonePath("sim", ["sim-0"], EngineArgs(), tmp_path / "logs")
    gc.collect()  # what earlier tests left for the collector is theirs: only this test's records count below
    caplog.clear()
    prompts, ids = list(trace.prompts) * 4, [f"{r.id}-{k}" for k in range(4) for r in trace.requests]
    try:
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else procs.Terminated) as stopped, \
                path, path.trial("t", RouterSettings()):
            path.release(prompts, ids, RouterSettings().make(1), Schedule())
    finally:
        for timer in timers:  # sent, or never to be
            timer.cancel()
            timer.join()
        for s, handler in saved.items():  # a Termination that received a signal keeps its handler
            signal.signal(s, handler)
    gc.collect()
    assert sent.is_set() and len(answered) < len(prompts)  # mid-burst
    assert isinstance(stopped.value.__context__, asyncio.CancelledError)  # the burst's task was cancelled
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert path.receipt["clean"] and path.receipt["ended_by"] == name


def test_a_request_registered_nowhere_is_cancelled_before_the_pool_closes(reuse_trace, tmp_path, caplog):
    """What the signal above can leave, made on purpose: a request whose task asyncio does not list (the
    signal landed inside its creation) is still running when the trial ends. The client cancels it itself,
    so it never fails later on a closed session ("Task exception was never retrieved")."""
    import asyncio
    import gc

    from parity.routing import RouterSettings
    from parity.paths.standalone import StandalonePath
    from parity.trace import load_trace

    trace = load_trace(reuse_trace)
    path = StandalonePath("sim", ["sim-0"], EngineArgs(), tmp_path / "logs")
    gc.collect()
    caplog.clear()
    with path, path.trial("t", RouterSettings()):
        client, loop = path._client, path._loop

        async def orphan():
            task = loop.create_task(client.send(0, trace.prompts[0], "orphan"))
            asyncio.tasks._unregister_task(task)  # as a signal inside Task() leaves it
            await asyncio.sleep(0.01)  # sent, not yet answered
            return task

        task = loop.run_until_complete(orphan())
        assert task not in asyncio.all_tasks(loop) and not task.done()
    gc.collect()
    assert task.cancelled()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert path.receipt["clean"]


def test_a_request_that_starts_while_others_are_cancelled_is_cancelled_too(reuse_trace, tmp_path, caplog):
    """A request whose first step runs only while the client cancels the others (here: started by one of them
    as it is cancelled) registers after the client looked; the client looks again until none is left."""
    import asyncio
    import gc

    from parity.routing import RouterSettings
    from parity.paths.standalone import StandalonePath
    from parity.trace import load_trace

    trace = load_trace(reuse_trace)
    path = StandalonePath("sim", ["sim-0"], EngineArgs(), tmp_path / "logs")
    gc.collect()
    caplog.clear()
    late = []
    with path, path.trial("t", RouterSettings()):
        client, loop = path._client, path._loop

        async def first():
            try:
                await client.send(0, trace.prompts[0], "first")
            except asyncio.CancelledError:
                late.append(loop.create_task(client.send(0, trace.prompts[1], "late")))
                asyncio.tasks._unregister_task(late[0])  # only the client's own list can find it
                raise

        async def start():
            task = loop.create_task(first())
            asyncio.tasks._unregister_task(task)
            await asyncio.sleep(0.01)

        loop.run_until_complete(start())
    gc.collect()
    assert late and late[0].cancelled()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert path.receipt["clean"]


def test_the_kv_cache_a_vllm_replica_reports_is_read_from_its_log(tmp_path, monkeypatch):
    import subprocess

    from parity import gpus
    from parity.standalone.replicas import Replica

    monkeypatch.setattr(gpus, "on_this_machine", lambda: ["GPU-a"])  # the GPU the replica set is given is here
    replica_set = ReplicaSet("vllm", ["GPU-a"], EngineArgs(), tmp_path)
    log = tmp_path / "replica-0.log"
    replica_set.replicas = [Replica(0, "GPU-a", 1, log, subprocess.Popen(["true"]))]
    assert replica_set.kv_cache_tokens() is None  # no log yet: unknown, not a guess
    log.write_text("(EngineCore pid=1) INFO [kv_cache_utils.py:2177] GPU KV cache size: 898,784 tokens\n")
    assert replica_set.kv_cache_tokens() == 898_784


def test_a_replica_gone_after_its_health_check_is_one_line_not_a_traceback(tmp_path):
    """A replica that died after answering /health and before saying which GPU it runs on gave an httpx.ConnectError
    traceback (an outsider's, 2026-12-07): one line now, naming how it ended and its log."""
    import subprocess
    import sys

    from parity import procs
    from parity.errors import ParityError
    from parity.standalone.replicas import Replica, _identify

    log = tmp_path / "replica-0.log"
    log.write_text("serving\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    replica = Replica(0, "sim-0", procs.free_port(), log, process)
    with pytest.raises(ParityError) as err:
        _identify("sim", replica)
    assert str(err.value).startswith(f"replica 0 (GPU sim-0, pid {process.pid}, port {replica.port}) died before it "
                                     "said which GPU it runs on: ") and str(log) in str(err.value)
