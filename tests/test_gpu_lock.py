"""parity.gpu_lock: lock files made safely, holders named, stale locks of dead holders cleared."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parity import gpu_lock, procs
from parity.errors import ParityError

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def locks(tmp_path, monkeypatch):
    folder = tmp_path / "locks"
    monkeypatch.setenv(gpu_lock.LOCK_DIR_ENV, str(folder))
    return gpu_lock.lock_dir()


def holder_process(folder: Path, gpu: str) -> subprocess.Popen:
    """Another worker: leases `gpu` and waits; its pid is on its first line."""
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from parity import gpu_lock
        held = gpu_lock.lease([{gpu!r}], Path({str(folder)!r}), session_id="s-other", flame_endpoint="http://e:1")
        print(held.gpu, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == gpu
    return proc


def test_a_symlinked_lock_is_refused_and_its_target_left_alone(locks, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("do not truncate me")
    (locks / "sim-0.lock").symlink_to(target)
    with pytest.raises(ParityError, match=r"^GPU lock .*sim-0.lock is a symlink; refusing to use it$"):
        gpu_lock.lease(["sim-0"], locks)
    assert target.read_text() == "do not truncate me"


def test_a_fifo_or_a_folder_is_refused_without_blocking(locks):
    os.mkfifo(locks / "sim-0.lock")
    (locks / "sim-1.lock").mkdir()
    with pytest.raises(ParityError, match="sim-0.lock is not a regular file"):
        gpu_lock.lease(["sim-0"], locks)
    with pytest.raises(ParityError, match="sim-1.lock"):
        gpu_lock.lease(["sim-1"], locks)


def test_a_hard_linked_lock_is_refused(locks, tmp_path):
    other = tmp_path / "other"
    other.write_text("x")
    os.link(other, locks / "sim-0.lock")
    with pytest.raises(ParityError, match="has 2 hard links"):
        gpu_lock.lease(["sim-0"], locks)
    assert other.read_text() == "x"


def test_the_holder_is_recorded_named_when_busy_and_cleared_on_release(locks):
    held = gpu_lock.lease(["sim-0"], locks, session_id="s1", executor_id="e1")
    path = locks / "sim-0.lock"
    assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0
    record = json.loads(path.read_text())
    assert record["pid"] == os.getpid() and record["start_time"] == procs.start_time(os.getpid())
    assert record["session_id"] == "s1" and record["executor_id"] == "e1" and record["gpu"] == "sim-0"
    other = holder_process(locks, "sim-1")
    try:
        with pytest.raises(gpu_lock.GpuBusy, match=rf"^no free GPU among sim-0, sim-1: held sim-0 by pid "
                                                   rf"{os.getpid()} \(session s1\); sim-1 by pid {other.pid} "
                                                   rf"\(session s-other\) \(locks in {locks}\)$"):
            gpu_lock.lease(["sim-0", "sim-1"], locks)
    finally:
        other.kill()
        other.wait()
    held.release()
    assert path.read_text() == ""
    assert gpu_lock.lease(["sim-0"], locks).gpu == "sim-0"


def test_the_per_user_folder_is_private_and_ours(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_lock.LOCK_DIR_ENV, raising=False)
    monkeypatch.setattr(gpu_lock, "real_uid", lambda: f"{os.getuid()}-test-{os.getpid()}")
    folder = gpu_lock.lock_dir()
    try:
        assert folder == Path(f"/tmp/parity-gpu-locks-{os.getuid()}-test-{os.getpid()}")
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.geteuid()
        folder.chmod(0o777)
        with pytest.raises(ParityError, match=r"is open to other users \(mode 777\); it must be 0700"):
            gpu_lock.lock_dir()
        folder.rmdir()
        folder.symlink_to(tmp_path)
        with pytest.raises(ParityError, match="is not a directory"):
            gpu_lock.lock_dir()
    finally:
        if folder.is_symlink():
            folder.unlink()
        elif folder.exists():
            folder.rmdir()


def test_a_dead_holders_lock_is_taken_over_and_cleared_before_a_run(locks):
    dead = holder_process(locks, "sim-0")
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    assert json.loads((locks / "sim-0.lock").read_text())["pid"] == dead.pid  # its record stays
    assert [r["pid"] for r in gpu_lock.dead_holders(locks, "http://e:1")] == [dead.pid]  # it died holding it
    assert gpu_lock.dead_holders(locks, "http://other:1") == []  # not a worker of that cluster
    lines = []
    gpu_lock.clear_stale(locks, ["sim-0", "sim-1"], log=lines.append)
    assert lines == [f"cleared the stale lock of GPU sim-0: its holder, pid {dead.pid}, is gone"]
    assert (locks / "sim-0.lock").read_text() == ""
    assert gpu_lock.lease(["sim-0"], locks).gpu == "sim-0"


def test_a_holder_that_released_and_left_between_the_two_reads_is_not_reported_dead(locks, monkeypatch):
    """A worker whose session closed empties its record and exits; one that did so between `dead_holders` reading its
    record and seeing its process gone was reported dead (an outsider's, on a loaded machine)."""
    left = holder_process(locks, "sim-0")
    record = json.loads((locks / "sim-0.lock").read_text())
    seen = gpu_lock.holder_alive

    def released_meanwhile(r):  # the holder released and exited just as it was looked at
        (locks / "sim-0.lock").write_text("")
        return False

    monkeypatch.setattr(gpu_lock, "holder_alive", released_meanwhile)
    try:
        assert gpu_lock.dead_holders(locks, "http://e:1") == []
    finally:
        monkeypatch.setattr(gpu_lock, "holder_alive", seen)
        left.kill()
        left.wait()
    assert record["pid"] == left.pid


def test_a_gpu_held_by_a_live_run_is_refused_before_starting(locks):
    live = holder_process(locks, "sim-1")
    try:
        with pytest.raises(ParityError, match=rf"^GPU sim-1 is in use by pid {live.pid} \(.*\) of a run that is "
                                              rf"still going \(lock .*sim-1.lock\); stop that run or use other GPUs$"):
            gpu_lock.clear_stale(locks, ["sim-0", "sim-1"], timeout_s=1)
    finally:
        live.kill()
        live.wait()


def test_a_lock_left_to_a_dead_runs_leftover_is_waited_for_then_named(locks):
    leftover = holder_process(locks, "sim-0")
    try:
        path = locks / "sim-0.lock"
        record = json.loads(path.read_text()) | {"tree": "1.1"}  # its run (pid 1 as started at tick 1) is gone
        path.write_text(json.dumps(record))
        with pytest.raises(ParityError, match=rf"^GPU sim-0 is still held by pid {leftover.pid} \(session s-other\), "
                                              rf"left by a run that died; it did not let go within 1 s"):
            gpu_lock.clear_stale(locks, ["sim-0"], timeout_s=1)
    finally:
        leftover.kill()
        leftover.wait()
