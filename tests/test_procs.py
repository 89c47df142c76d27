"""parity.procs: children in their own session that die with the run, grandchildren too; SIGTERM as an
orderly exit; busy ports named. Every test bounds its waits and stops what it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from parity import procs
from parity.errors import ParityError
from waiting import wait_until  # tests/ is on sys.path (pytest's rootdir-relative import)

SRC = str(Path(__file__).resolve().parents[1] / "src")


def python(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A spawner like `parity flame run`: a child through procs.spawn that itself starts a grandchild in a
# session of its own (as Flame's executor manager starts services), and a scratch folder.
SPAWNER = """
    import subprocess, sys, time
    from parity import procs
    child = procs.spawn([sys.executable, "-c",
                         "import subprocess, sys, time\\n"
                         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
                         " start_new_session=True)\\n"
                         "print(g.pid, flush=True)\\n"
                         "time.sleep(120)"], stdout=subprocess.PIPE, stderr=None)
    grandchild = int(child.stdout.readline())
    print(child.pid, grandchild, procs.scratch_dir("pf-"), flush=True)
    time.sleep(120)
"""


def test_a_spawned_child_leads_its_own_session_and_carries_the_run():
    proc = procs.spawn(["sleep", "60"], stdout=subprocess.DEVNULL)
    try:
        assert os.getsid(proc.pid) == proc.pid and os.getpgid(proc.pid) == proc.pid
        # the launcher that arms the death signal carries the mark too: wait for its exec of the command itself,
        # since /proc/<pid>/environ reads empty while an exec is under way (a loaded CI run saw {} so)
        wait_until(lambda: procs.proc_table().get(proc.pid, (0, 0, ""))[2] == "sleep"
                   and procs.environ(proc.pid).get(procs.TREE_ENV), 10, "the child's exec")
        assert procs.mark() in procs.environ(proc.pid)[procs.TREE_ENV].split()
        assert proc.pid in procs.marked(procs.mark())
    finally:
        entry = procs.stop(proc, "sleeper", timeout_s=5)
    assert entry == {"pid": proc.pid, "name": "sleeper", "exit_code": None, "signal": "SIGTERM"}


def test_a_command_that_cannot_start_says_so_in_its_log(tmp_path):
    log = tmp_path / "log"
    with log.open("wb") as out:
        proc = procs.spawn(["no-such-command-here"], stdout=out)
    assert proc.wait(timeout=30) == 1
    assert procs.last_line(log) == "cannot start no-such-command-here: No such file or directory"


def test_children_grandchildren_and_scratch_dirs_go_when_the_spawner_is_killed():
    spawner = python(SPAWNER)
    child, grandchild, scratch = spawner.stdout.readline().split()
    child, grandchild = int(child), int(grandchild)
    try:
        assert os.getsid(grandchild) == grandchild  # escaped the child's session, as Flame's services do
        assert Path(scratch).is_dir()
        spawner.kill()
        spawner.wait(timeout=10)
        wait_until(lambda: not procs.alive(child) and not procs.alive(grandchild), 30, "the tree to go")
        wait_until(lambda: not Path(scratch).exists(), 10, "the watchdog to remove the scratch dir")
    finally:
        kill_all([spawner.pid, child, grandchild])


def test_the_death_signal_alone_stops_the_child_even_without_the_watchdog():
    spawner = python(SPAWNER)
    child, grandchild, scratch = spawner.stdout.readline().split()
    child, grandchild = int(child), int(grandchild)
    try:
        watchdog_args = ["-m", "parity.procs", str(spawner.pid), str(procs.start_time(spawner.pid))]
        watchdogs = [pid for pid in procs.proc_table() if cmdline(pid)[1:] == watchdog_args]
        assert len(watchdogs) == 1, "one watchdog per spawning process"
        os.kill(watchdogs[0], signal.SIGKILL)
        wait_until(lambda: not procs.alive(watchdogs[0]), 10, "the watchdog to die")
        spawner.kill()
        spawner.wait(timeout=10)
        wait_until(lambda: not procs.alive(child), 10, "the kernel's death signal")
        assert procs.alive(grandchild)  # only the watchdog reaches a grandchild in its own session
    finally:
        kill_all([spawner.pid, child, grandchild])
        Path(scratch).rmdir()  # the watchdog we killed would have removed it


ORDERLY = """
    import signal, sys, time
    from parity import procs
    if "masked" in sys.argv:  # as if inherited blocked from the parent: entering unblocks it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    procs.termination.enter()
    try:
        with procs.termination.shielded() if "shielded" in sys.argv else open("/dev/null"):
            print("ready", flush=True)
            time.sleep(3 if "shielded" in sys.argv else 60)
            print("block done", flush=True)
    finally:
        print("cleaned up", procs.termination.ended_by(sys.exc_info()[1]), flush=True)
"""


def signal_state(pid: int) -> str:
    """What a process that did not stop was doing with its signals (for the failure's message)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"unreadable: {exc}"
    return "; ".join([line for line in status if line.startswith(("State", "Sig", "Shd"))] + [f"wchan {wchan}"])


@pytest.mark.parametrize("shielded,masked", [(False, False), (True, False), (False, True)],
                         ids=["plain", "shielded", "inherited-mask"])
def test_sigterm_becomes_an_orderly_exit_and_waits_for_a_shielded_teardown(shielded, masked):
    env = {**os.environ, "PYTHONPATH": SRC}
    args = [*(["shielded"] if shielded else []), *(["masked"] if masked else [])]
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(ORDERLY), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after SIGTERM: {signal_state(proc.pid)}")
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out.splitlines() == (["block done", "cleaned up SIGTERM"] if shielded else ["cleaned up SIGTERM"])


def test_a_second_sigterm_exits_at_once():
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(ORDERLY), "shielded"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        # the first one handled before the second is sent: two pending SIGTERMs would be delivered as one
        assert proc.stderr.readline().startswith("parity: SIGTERM: leaving in order")  # it spawned nothing
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and out == ""  # neither the block nor the cleanup ran


def test_a_busy_port_is_one_line_naming_its_holder():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert (("127.0.0.1", os.getpid()) in procs.listeners(port))
        with pytest.raises(ParityError, match=rf"^port {port} on 127.0.0.1 is in use by pid {os.getpid()} "
                                              rf"\(.*\) on 127.0.0.1; the test server needs it$"):
            procs.check_ports_free([port], "127.0.0.1", "the test server")
    assert procs.port_free(port)
    procs.check_ports_free([port], "127.0.0.1", "the test server")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_while_a_loop_runs_cancels_its_task_and_is_raised_once_the_loop_is_back(name, python_sigint):
    """Its handler runs wherever the main thread is, here inside a gc callback, which swallows what a
    handler raises (a CI run lost its signal so): while `run` runs a loop, the handler only cancels the
    task, which unwinds through its own awaits, and `run` raises the signal's exception."""
    import asyncio
    import gc

    termination, signum = procs.Termination(), signal.Signals[name]
    saved = {s: signal.getsignal(s) for s in (*procs.Termination.SIGNALS, signal.SIGINT)}
    steps = []

    def in_gc(phase, info):
        if phase == "start" and not steps:
            signal.raise_signal(signum)  # its handler runs here, inside the callback
            steps.append("callback done")

    async def work():
        gc.callbacks.append(in_gc)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(in_gc)
        steps.append("went on")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    loop = asyncio.new_event_loop()
    termination.enter()
    try:
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else procs.Terminated):
            termination.run(loop, work())
        assert signal.getsignal(signal.SIGINT) is saved[signal.SIGINT]  # Ctrl-C's own handler is back
    finally:
        loop.close()
        for s, handler in saved.items():  # a Termination that received a signal keeps its handler
            signal.signal(s, handler)
    assert steps == ["callback done", "went on", "cancelled"]


def test_receipt_says_how_the_step_ended():
    doc = procs.receipt("x", processes=[procs.entry(5, "a", -9), procs.entry(6, "b", 3)], ports_released=[1],
                        gpus_released=["sim-0"], errors=[], simulated=True, ended_by="SIGTERM")
    from parity.manifest import validate_document

    assert validate_document(json.loads(json.dumps(doc))) == []
    assert doc["processes"] == [{"pid": 5, "name": "a", "exit_code": None, "signal": "SIGKILL"},
                                {"pid": 6, "name": "b", "exit_code": 3, "signal": None}]
    assert validate_document(doc | {"ended_by": "lunch"}) != []


def test_a_port_is_released_when_nothing_listens_on_it_though_a_connection_uses_its_number():
    """A receipt asks whether a server of ours still listens; another process's connection may take the number
    as its local port once we let it go (two suites on one machine did), which `port_free`'s bind refuses."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not procs.released(port)
        with socket.socket() as client:  # a connection whose local port is the number we are about to let go
            client.bind(("127.0.0.1", 0))
            client.connect(("127.0.0.1", port))
            local = client.getsockname()[1]
            assert procs.released(local) and not procs.port_free(local)


def test_cpu_s_counts_this_process_work_and_says_none_for_a_gone_one():
    before = procs.cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert procs.cpu_s(os.getpid()) >= before + 0.03  # clock ticks of 10 ms
    child = subprocess.Popen(["true"])
    child.wait()
    assert procs.cpu_s(child.pid) is None


def test_free_port_never_hands_one_process_the_same_port_twice_while_the_first_may_be_unbound(monkeypatch):
    """Two replicas of one set each asked for a free port before either bound its own; under load the kernel named
    the same port twice and the second replica could not bind it (2026-12-05, a suite beside two others)."""
    given = iter([5000, 5000, 5001, 5000, 5002])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(given)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(procs, "_issued", {})
    monkeypatch.setattr(procs.socket, "socket", Socket)
    assert [procs.free_port(), procs.free_port(), procs.free_port()] == [5000, 5001, 5002]
    monkeypatch.setattr(procs, "_issued", {5000: time.monotonic() - procs.ISSUED_FOR_S - 1})
    given = iter([5000])
    assert procs.free_port() == 5000  # handed out long ago: free again
    given = iter([7000] * 3)
    monkeypatch.setattr(procs, "_issued", {7000: time.monotonic()})
    with pytest.raises(ParityError, match="no free TCP port found in 3 attempts"):
        procs.free_port(attempts=3)


def test_free_port_pair_takes_neither_port_this_process_handed_out_and_keeps_both(monkeypatch):
    """Flame's two ports, p and p + 1: p + 1 may be a replica's port not yet bound (free to the kernel), and once
    given, neither goes to a replica after."""
    monkeypatch.setattr(procs, "_issued", {6001: time.monotonic()})
    monkeypatch.setattr(procs, "port_free", lambda port, host="127.0.0.1": True)
    given = iter([6000, 6010, 6011, 6012])
    monkeypatch.setattr(procs, "free_port", lambda host="127.0.0.1": next(given))
    assert procs.free_port_pair() == 6010  # 6000's neighbour was handed out
    assert 6011 in procs._issued



def test_a_stopped_child_is_continued_to_take_its_sigterm_not_waited_for_to_the_kill():
    """A SIGSTOPped replica (frozen) ignored SIGTERM until continued, so its teardown waited the whole STOP_TIMEOUT_S
    (60 s), then killed it (an outsider's, 2026-12-07): SIGCONT follows the SIGTERM, and it ends by the SIGTERM."""
    import time

    child = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        began = time.monotonic()
        ended = procs.stop(child, "frozen", timeout_s=30)
        assert ended["signal"] == "SIGTERM" and time.monotonic() - began < 20, ended
    finally:
        child.kill()
        child.wait(timeout=30)
