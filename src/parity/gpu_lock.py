"""GPU leases between Flame workers: one lock file per GPU, held (flock) for as long as the worker holds it.

Flame counts GPUs but never assigns them, so each worker takes the first free GPU of its list. The
lock folder is the run's for simulated GPUs ($PARITY_GPU_LOCK_DIR, set to the run's out dir) and
this user's for real ones, which belong to the node: /tmp/parity-gpu-locks-<uid>, mode 0700, ours.
Lock files are opened without following a symlink, created without truncating anything, and only
a regular file of ours with one link is used. The holder writes its pid, start time, session and
executor into the file and empties it on release, so a busy GPU names who holds it, a worker that
died holding one is found (`dead_holders`), and a lock left by a dead holder is taken over: the
kernel dropped its flock when the holder died, the next lease rewrites the record.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from parity import procs
from parity.errors import ParityError

LOCK_DIR_ENV = "PARITY_GPU_LOCK_DIR"
WAIT_FOR_LEFTOVERS_S = 30.0


class GpuBusy(ParityError):
    """Every GPU this worker may use is held: Flame started more executors than the session uses."""


def real_uid() -> int:
    """Our uid outside any user namespace (`unshare --map-root-user` makes it 0 inside)."""
    uid = os.getuid()
    try:
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, outside, count = (int(x) for x in line.split())
            if inside <= uid < inside + count:
                return outside + uid - inside
    except (OSError, ValueError):
        pass
    return uid


def _check_dir(path: Path, *, private: bool) -> Path:
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ParityError(f"GPU lock folder {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ParityError(f"GPU lock folder {path} is not a directory (a symlink or a file); remove it")
    if info.st_uid != os.geteuid():
        raise ParityError(f"GPU lock folder {path} belongs to uid {info.st_uid}, not to us; remove it")
    if private and info.st_mode & 0o077:
        raise ParityError(f"GPU lock folder {path} is open to other users (mode {info.st_mode & 0o777:o}); "
                          f"it must be 0700")
    return path


def lock_dir() -> Path:
    """$PARITY_GPU_LOCK_DIR (the run's), else this user's folder for the node's GPUs; created and checked."""
    given = os.environ.get(LOCK_DIR_ENV)
    path = Path(given) if given else Path(f"/tmp/parity-gpu-locks-{real_uid()}")
    if given:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ParityError(f"GPU lock folder {path}: {exc.strerror}") from None
    return _check_dir(path, private=not given)


def run_dir(out_dir: Path | str) -> Path:
    """The lock folder of one run's simulated GPUs (what its $PARITY_GPU_LOCK_DIR names): OUT/logs/gpu-locks."""
    return (Path(out_dir) / "logs" / "gpu-locks").resolve()


def _open(path: Path, flags: int) -> int:
    """A lock file's descriptor: never through a symlink, never a FIFO or device, never another's file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        why = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise ParityError(f"GPU lock {path} {why}; refusing to use it") from None
    info = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(info.st_mode) else
               f"belongs to uid {info.st_uid}" if info.st_uid != os.geteuid() else
               f"has {info.st_nlink} hard links" if info.st_nlink != 1 else None)
    if problem:
        os.close(fd)
        raise ParityError(f"GPU lock {path} {problem}; refusing to use it")
    return fd


def read_record(path: Path) -> dict | None:
    """The holder a lock file names (None if empty, unreadable or absent)."""
    try:
        fd = _open(path, os.O_RDONLY)
    except ParityError:
        return None
    try:
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if data.strip() else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def holder_alive(record: dict) -> bool:
    return procs.alive(int(record.get("pid", 0)), record.get("start_time"))


def describe_holder(record: dict | None) -> str:
    if not record:
        return "a process that left no record"
    what = f"pid {record.get('pid')}" + (f" (session {record['session_id']})" if record.get("session_id") else "")
    return what if holder_alive(record) else f"{what}, which is gone"


@dataclass
class Lease:
    """A held GPU; `release` empties the record and drops the flock (dying does the latter too)."""

    gpu: str
    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None


def _lock_path(directory: Path, gpu: str) -> Path:
    if not gpu or "/" in gpu or gpu.startswith("."):
        raise ParityError(f"GPU name {gpu!r} cannot name a lock file")
    return directory / f"{gpu}.lock"


def lease(gpus: list[str], directory: Path | None = None, **holder) -> Lease:
    """Hold the lock of the first free GPU and record who holds it; GpuBusy names the holders."""
    directory = directory or lock_dir()
    busy = []
    for gpu in gpus:
        path = _lock_path(directory, gpu)
        fd = _open(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            busy.append(f"{gpu} by {describe_holder(read_record(path))}")
            continue
        record = {"gpu": gpu, "pid": os.getpid(), "start_time": procs.start_time(os.getpid()),
                  "host": socket.gethostname(), "since": time.time(),
                  "tree": os.environ.get(procs.TREE_ENV, ""), **holder}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record, sort_keys=True).encode(), 0)
        return Lease(gpu, path, fd)
    raise GpuBusy(f"no free GPU among {', '.join(gpus)}: held {'; '.join(busy)} (locks in {directory})")


def _held(path: Path) -> bool:
    try:
        fd = _open(path, os.O_RDONLY)
    except ParityError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def clear_stale(directory: Path, gpus: list[str], *, timeout_s: float = WAIT_FOR_LEFTOVERS_S,
                log=None) -> None:
    """Before a run: take over locks whose holder is gone, wait for a dead run's leftovers to let go,
    and refuse (one line, naming the holder) a GPU that a live run holds."""
    deadline = time.monotonic() + timeout_s
    for gpu in gpus:
        path = _lock_path(directory, gpu)
        if not path.exists():
            continue
        while _held(path):
            record = read_record(path)
            if record and holder_alive(record) and procs.tree_alive(record.get("tree", "")):
                raise ParityError(f"GPU {gpu} is in use by {procs.describe(record['pid'])} of a run that is "
                                  f"still going (lock {path}); stop that run or use other GPUs")
            if time.monotonic() > deadline:  # leftovers of a dead run, being stopped by its watchdog
                raise ParityError(f"GPU {gpu} is still held by {describe_holder(record)}, left by a run that "
                                  f"died; it did not let go within {timeout_s:.0f} s (lock {path})")
            time.sleep(0.2)
        record = read_record(path)
        if record:  # the kernel dropped the dead holder's flock; take the file over and empty it
            stale = Lease(gpu, path, _open(path, os.O_RDWR))
            try:
                fcntl.flock(stale.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a worker took it in the meantime: it is its record now
                os.close(stale.fd)
                continue
            stale.release()
            if log:
                log(f"cleared the stale lock of GPU {gpu}: its holder, pid {record.get('pid')}, is gone")


def _records(directory: Path):
    """(lock path, holder record) of every lock file in `directory` that names a holder."""
    for path in sorted(directory.glob("*.lock")):
        if record := read_record(path):
            yield path, record


def dead_holders(directory: Path, endpoint: str, since: float = 0.0) -> list[dict]:
    """Records of workers of the cluster at `endpoint` (started at `since`) that died holding a GPU."""
    return [record | {"lock": str(path)} for path, record in _records(directory)
            if record.get("flame_endpoint") == endpoint and record.get("since", 0) >= since
            and _died_holding(path, record)]


def _died_holding(path: Path, record: dict) -> bool:
    """Whether the holder `record` names is gone and its record still there: read again after the death is seen, so
    a worker that released its GPU and left between the two reads (a session closed) is not reported dead (an
    outsider saw it, twice, on a loaded machine)."""
    return not holder_alive(record) and read_record(path) == record


def live_holder(directory: Path, session_id: str) -> dict | None:
    """The record of the live worker of session `session_id` that holds a GPU (the restart fault's target)."""
    return next((record for _, record in _records(directory)
                 if record.get("session_id") == session_id and holder_alive(record)), None)
