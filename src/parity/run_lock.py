"""One run per output folder: a run (experiment, standalone, flame, mlperf; not `engine run`, whose shards share one
trials folder by design) holds OUT/.run.lock (flock) for as long as it writes there, so a second run
into the same folder is refused in one line naming the first, never interleaved with it (an outsider's two
`experiment run`s into one --out each rewrote the other's trials, and one's could be linked under the other's
settings). The kernel drops the lock when its holder dies, so a killed run leaves nothing to clear by hand; the
file stays, empty of meaning, and is not kept as evidence (`parity.seal.NOT_KEPT`: a `.lock`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from parity.errors import ParityError

LOCK = ".run.lock"


def _ours() -> set[int]:
    """This process and its ancestors (a run's own child may write inside the folder the run holds)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _holder(folder: Path) -> str | None:
    """The pid (as text) of a live run holding `folder`'s lock, or None: a lock file whose flock nobody holds is a
    finished or killed run's."""
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        return None
    finally:
        os.close(fd)


def _nested(out: Path) -> None:
    """Refuse `out` inside a folder another live run holds, or holding one inside it: the lock guarded its own folder
    alone, so `standalone run --out R/loc/trials` wrote its trial over a running experiment's in R/loc (an
    outsider's, 2026-12-07), and the experiment's manifest then linked it."""
    ours = _ours()
    resolved = out.resolve()
    for folder in resolved.parents:
        if (holder := _holder(folder)) is not None and not (holder.isdigit() and int(holder) in ours):
            raise ParityError(f"{out}: lies inside {folder}, which another parity run (pid {holder}) is writing into: "
                              "wait for it to end, or give another --out")
    if resolved.is_dir():
        for root, dirs, files in os.walk(resolved):
            if LOCK in files and Path(root) != resolved and (holder := _holder(Path(root))) is not None \
                    and not (holder.isdigit() and int(holder) in ours):
                raise ParityError(f"{out}: holds {root}, which another parity run (pid {holder}) is writing into: "
                                  "wait for it to end, or give another --out")


@contextlib.contextmanager
def holding(out: Path):
    """Hold `out` (made if missing) for this process while the block runs; ParityError if another holds it, or a
    folder around it or within it."""
    out = Path(out)
    _nested(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ParityError(f"{out}: another parity run (pid {holder}) is writing into this folder: wait for it "
                              "to end, or give another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: said with no file name (an outsider's), so it is named here
            raise OSError(exc.errno, exc.strerror, str(out / LOCK)) from None
        yield
    finally:
        os.close(fd)  # drops the flock
        if made and [p.name for p in out.iterdir()] == [LOCK]:  # a run refused before it wrote: no folder made
            with contextlib.suppress(OSError):
                (out / LOCK).unlink()
                out.rmdir()
