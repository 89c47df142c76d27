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


@contextlib.contextmanager
def holding(out: Path):
    """Hold `out` (made if missing) for this process while the block runs; ParityError if another holds it."""
    out = Path(out)
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the flock
        if made and [p.name for p in out.iterdir()] == [LOCK]:  # a run refused before it wrote: no folder made
            with contextlib.suppress(OSError):
                (out / LOCK).unlink()
                out.rmdir()
