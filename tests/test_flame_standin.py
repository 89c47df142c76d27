"""The Flame stand-in, driven by unmodified flamepy 0.6.0 and a real service process (tests/flame_echo_service.py)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

import flamepy
import pytest
from flamepy.core.client import ConnectionInstance

from parity.flame.standin import StandInCluster
from parity.manifest import validate_document
from waiting import wait_until  # tests/ is on sys.path (pytest's rootdir-relative import)

SERVICE = str(Path(__file__).with_name("flame_echo_service.py"))
MIB = 1024 * 1024
BOUND = 4  # types_pb2.ExecutorBound


def app(**kw) -> flamepy.ApplicationAttributes:
    return flamepy.ApplicationAttributes(command=sys.executable, arguments=[SERVICE], **kw)


def parse(reply: bytes) -> tuple[int, str, bytes]:
    """(pid, executor id, rest) of an echo reply."""
    pid, executor_id, rest = reply.split(b":", 2)
    return int(pid), executor_id.decode(), rest


def executors_of(conn, session_id: str) -> list:
    return [ex for ex in conn.list_executors() if ex.status.session_id == session_id]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="psi-", dir="/tmp"))  # Unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(short_dir):
    with StandInCluster(socket_dir=short_dir / "s", log_dir=short_dir / "logs") as flame:
        yield flame
    assert flame.receipt["clean"], flame.receipt["errors"]


@pytest.fixture(scope="module")
def conn(cluster):
    connection = flamepy.connect(cluster.endpoint)
    connection.register_application("echo", app(environments={"CUDA_VISIBLE_DEVICES": "GPU-test"}))
    connection.register_application("echo-quick", app(delay_release=1))
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def session(conn):
    """One shared single-executor session: every test on it pays for one process start only."""
    s = conn.create_session(flamepy.SessionAttributes(application="echo", common_data=b"shared-data",
                                                      min_instances=1, max_instances=1))
    yield s
    conn.close_session(s.id)


def test_round_trip_environment_and_common_data(session):
    pid, executor_id, rest = parse(session.run(b"hello").result(timeout=60))
    assert rest == b"hello" and pid != os.getpid() and len(executor_id) == 36
    assert parse(session.run(b"env:CUDA_VISIBLE_DEVICES").result(timeout=30))[2] == b"GPU-test"
    assert parse(session.run(b"common").result(timeout=30))[2] == b"shared-data"
    task = session.create_task(b"sleep:0.3")
    assert task.id.isdigit() and task.state == flamepy.TaskState.PENDING
    states = [t.state for t in session.watch_task(task.id)]  # no Pending message, then the stream ends
    assert states == [flamepy.TaskState.RUNNING, flamepy.TaskState.SUCCEED]


def test_one_task_at_a_time_per_executor(session):
    futures = [session.run(b"sleep:0.3") for _ in range(3)]
    replies = sorted((parse(f.result(timeout=30)) for f in futures), key=lambda r: r[2])
    assert len({(pid, ex) for pid, ex, _ in replies}) == 1
    spans = [tuple(map(float, rest.split(b":"))) for _, _, rest in replies]
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end


def test_failing_task_raises_with_message_and_session_goes_on(session):
    with pytest.raises(flamepy.FlameError, match="asked to fail"):
        session.run(b"fail").result(timeout=30)
    assert parse(session.run(b"ok").result(timeout=30))[2] == b"ok"


def test_payload_limit_is_4_mib(session):
    with pytest.raises(flamepy.FlameError, match="larger than max"):
        session.run(b"size:" + b"x" * (5 * MIB))  # refused by CreateTask
    assert parse(session.run(b"size:" + b"x" * (3 * MIB)).result(timeout=60))[2] == str(3 * MIB + 5).encode()
    assert len(session.run(f"out:{3 * MIB}".encode()).result(timeout=60)) == 3 * MIB
    with pytest.raises(flamepy.FlameError, match="larger than max"):
        session.run(f"out:{5 * MIB}".encode()).result(timeout=60)  # the service's reply is refused


def test_two_executors_pull_from_one_queue(conn):
    s = conn.create_session(flamepy.SessionAttributes(application="echo", min_instances=2, max_instances=2))
    wait_until(lambda: [e.status.state for e in executors_of(conn, s.id)] == [BOUND, BOUND], 60, "two executors")
    futures = [s.run(b"sleep:0.1") for _ in range(8)]
    wait(futures, timeout=60)
    workers = {parse(f.result())[:2] for f in futures}
    assert len(workers) == 2 and len({pid for pid, _ in workers}) == 2
    assert {ex for _, ex in workers} == {e.metadata.id for e in executors_of(conn, s.id)}
    conn.close_session(s.id)


def test_delay_release_unbinds_an_idle_executor(conn):
    s = conn.create_session(flamepy.SessionAttributes(application="echo-quick", min_instances=1, max_instances=1))
    first_pid, first_executor, _ = parse(s.run(b"a").result(timeout=60))
    wait_until(lambda: not executors_of(conn, s.id) and gone(first_pid), 15, "the idle executor to unbind")
    pid, executor_id, _ = parse(s.run(b"b").result(timeout=60))
    assert pid != first_pid and executor_id != first_executor
    conn.close_session(s.id)


def test_bind_failure_fails_the_task(conn):
    s = conn.create_session(flamepy.SessionAttributes(application="echo", common_data=b"fail-enter",
                                                      min_instances=1, max_instances=1))
    with pytest.raises(flamepy.FlameError, match="refusing to enter the session"):
        s.run(b"x").result(timeout=60)
    conn.close_session(s.id)


def test_module_level_api_through_flame_endpoint(cluster, conn, monkeypatch):
    monkeypatch.setenv("FLAME_ENDPOINT", cluster.endpoint)
    monkeypatch.setattr(ConnectionInstance, "_connection", None)  # no connection cached by another test
    flamepy.register_application("echo-module", app())
    s = flamepy.create_session("echo-module", min_instances=1, max_instances=1)
    executor_id = parse(s.run(b"hi").result(timeout=60))[1]
    [executor] = [e for e in flamepy.list_executors() if e.status.session_id == s.id]
    assert executor.metadata.id == executor_id and executor.spec.node == socket.gethostname()
    flamepy.close_session(s.id)
    ConnectionInstance._connection.close()


def test_close_refused_while_running_then_clean_receipt(tmp_path):
    sockets = Path(tempfile.mkdtemp(prefix="psi-", dir="/tmp"))
    try:
        with StandInCluster(socket_dir=sockets, log_dir=tmp_path / "logs") as flame:
            c = flamepy.connect(flame.endpoint)
            c.register_application("echo", app(environments={"CUDA_VISIBLE_DEVICES": "GPU-test"}))
            s = c.create_session(flamepy.SessionAttributes(application="echo", min_instances=1, max_instances=1))
            future = s.run(b"sleep:1")
            wait_until(lambda: s.get_task("1").state == flamepy.TaskState.RUNNING, 60, "the task to run")
            with pytest.raises(flamepy.FlameError, match="running tasks"):
                c.close_session(s.id)
            pid = parse(future.result(timeout=30))[0]
            c.close_session(s.id)
            wait_until(lambda: gone(pid), 15, "the service process to be killed")
            c.close()
        receipt = flame.receipt
        assert validate_document(receipt) == []
        assert receipt["clean"] and receipt["simulated"] and receipt["errors"] == []
        assert [p["pid"] for p in receipt["processes"]] == [pid]
        assert receipt["ports_released"] == [flame.port] and receipt["gpus_released"] == ["GPU-test"]
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def test_its_own_socket_dir_goes_on_exit_also_on_failure(tmp_path):
    with StandInCluster(log_dir=tmp_path / "logs") as flame:
        sockets = flame.socket_dir
        assert sockets.is_dir() and sockets.name.startswith(f"pf-{os.getpid()}.")
    assert not sockets.exists() and flame.receipt["ended_by"] == "normal"
    with pytest.raises(RuntimeError, match="boom"):
        with StandInCluster(log_dir=tmp_path / "logs") as flame:
            sockets = flame.socket_dir
            raise RuntimeError("boom")
    assert not sockets.exists() and flame.receipt["ended_by"] == "error"


def test_it_listens_on_loopback_only_and_a_busy_port_is_one_line(tmp_path):
    from parity import procs
    from parity.errors import ParityError

    with StandInCluster(log_dir=tmp_path / "logs") as flame:
        assert [address for address, _ in procs.listeners(flame.port)] == ["127.0.0.1"]
        with pytest.raises(ParityError, match=rf"^port {flame.port} on 127.0.0.1 is in use by pid {os.getpid()} "
                                              rf"\(.*\) on 127.0.0.1; the Flame stand-in's frontend needs it$"):
            with StandInCluster(log_dir=tmp_path / "logs2", port=flame.port):
                pass
    assert flame.describe()["network"]["binds"] == [f"127.0.0.1:{flame.port}"]


def test_a_worker_killed_mid_task_fails_the_task_naming_it(tmp_path):
    with StandInCluster(log_dir=tmp_path / "logs") as flame:
        c = flamepy.connect(flame.endpoint)
        c.register_application("echo", app(environments={"PARITY_GPUS": "GPU-x"}))
        s = c.create_session(flamepy.SessionAttributes(application="echo", min_instances=1, max_instances=1))
        pid, executor_id, _ = parse(s.run(b"warm").result(timeout=60))
        future = s.run(b"sleep:30")
        wait_until(lambda: s.get_task("2").state == flamepy.TaskState.RUNNING, 60, "the task to run")
        os.kill(pid, 9)
        with pytest.raises(flamepy.FlameError) as err:
            future.result(timeout=30)
        assert f"Flame worker pid {pid} (session {s.id}, executor {executor_id}, GPU GPU-x) died: killed by " \
               f"SIGKILL" in str(err.value) and f"log: {tmp_path / 'logs' / executor_id}.err" in str(err.value)
        assert flame.deaths() == [str(err.value).split(" (code:")[0]]
        c.close_session(s.id)
        c.close()


MUTE = ("import os, socket, time\n"  # a service whose socket exists but never answers (a slow start, or hung)
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.bind(os.environ['FLAME_INSTANCE_ENDPOINT'])\n"
        "time.sleep(600)\n")


def test_a_service_that_never_answers_its_socket_is_not_waited_for_on_exit(tmp_path):
    """Torn down while an executor waits for its service's socket to answer: the service is stopped and the
    executor's thread ends at once, not after the bind timeout (it once waited there for all of it, under load:
    'executor ... did not stop' in the receipt)."""
    sockets = Path(tempfile.mkdtemp(prefix="psi-", dir="/tmp"))
    try:
        with StandInCluster(socket_dir=sockets, log_dir=tmp_path / "logs", bind_timeout_s=600) as flame:
            c = flamepy.connect(flame.endpoint)
            c.register_application("mute", flamepy.ApplicationAttributes(command=sys.executable,
                                                                         arguments=["-c", MUTE]))
            c.create_session(flamepy.SessionAttributes(application="mute", min_instances=1, max_instances=1))
            wait_until(lambda: any(sockets.glob("*.sock")), 60, "the service to bind its socket")
            c.close()
            started = time.monotonic()
        assert time.monotonic() - started < 25  # the stop's own grace (10 s) and kill, not the 600 s bind timeout
        assert flame.receipt["clean"], flame.receipt["errors"]
        assert len(flame.receipt["processes"]) == 1
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
