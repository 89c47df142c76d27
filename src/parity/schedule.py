"""Arrival schedules: when each request of a trial is released, as offsets from the trial's release.

The study released every request at once (`burst`), and that stays the default. Beyond it:
`poisson` (exponential gaps at `rate` requests/s), `gamma` (gamma gaps at `rate`, with vLLM's
`burstiness` factor: 1 is Poisson, below 1 burstier, above 1 more even; the gaps' coefficient of
variation is 1/sqrt(burstiness)), and `replay` (the arrival times of a recorded run, a JSON list of
seconds, or `{"arrivals": [...]}`, taken relative to the first). Each kind is one branch of
`offsets`; the serving paths release request k at `release + offsets[k]`. Seeded: the same schedule
gives the same offsets in every process, and `describe` records their SHA-256 (and the replayed
file's) in the trial manifest, so both sides of a pair can be shown to have had the same arrivals.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.errors import ParityError
from parity.settings import Settings

KINDS = ("burst", "poisson", "gamma", "replay")
PACED = ("poisson", "gamma")  # the kinds that send at a rate


MIN_BURSTINESS = 0.01  # gamma's shape: below it (an outsider's 1e-300) its gaps underflowed to 0 and the generated
# rate was infinite


@dataclass(frozen=True)
class Schedule(Settings):
    what = "schedule setting"
    kind: str = "burst"
    rate: float = 0.0  # poisson, gamma: requests per second
    burstiness: float = 1.0  # gamma: the shape of its gaps (vLLM bench serve's --burstiness)
    seed: int = 0  # poisson, gamma
    replay: str = ""  # replay: the file of recorded arrival times

    def check(self):
        if self.kind not in KINDS:
            raise ParityError(f"unknown arrival schedule {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.paced and not self.rate > 0:
            raise ParityError(f"a {self.kind} schedule needs a rate above 0 requests/s, got {self.rate!r}")
        if self.kind == "gamma" and not self.burstiness >= MIN_BURSTINESS:
            raise ParityError(f"a gamma schedule needs a burstiness of at least {MIN_BURSTINESS} (its gaps' CV at most "
                              f"10; below, most gaps round to 0 and the rest are hours), got {self.burstiness!r}")
        if self.kind == "replay" and not self.replay:
            raise ParityError("a replay schedule needs the file of arrival times it replays (replay: PATH)")

    @property
    def paced(self) -> bool:
        """Sent at a rate (poisson, gamma), not all at once nor replayed."""
        return self.kind in PACED

    def offsets(self, count: int) -> list[float]:
        """Seconds after the release at which each of `count` requests is sent, in burst order."""
        if self.kind == "burst":
            return [0.0] * count
        if self.kind == "replay":
            return self._replayed(count)
        rng = np.random.default_rng(self.seed)
        if self.kind == "poisson":
            gaps = rng.exponential(1.0 / self.rate, max(count - 1, 0))
        else:
            gaps = rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), max(count - 1, 0))
        return [0.0, *np.cumsum(gaps).tolist()][:count]

    def _replayed(self, count: int) -> list[float]:
        path = Path(self.replay)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ParityError(f"replay schedule {path}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParityError(f"replay schedule {path}: not JSON ({exc})") from None
        times = data.get("arrivals") if isinstance(data, dict) else data
        if not isinstance(times, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
            raise ParityError(f"replay schedule {path}: expected a list of arrival times in seconds "
                              "(or {\"arrivals\": [...]})")
        if len(times) < count:
            raise ParityError(f"replay schedule {path}: {len(times)} arrival times for {count} requests")
        times = [float(t) for t in times[:count]]
        if any(b < a for a, b in zip(times, times[1:])) or not all(np.isfinite(times)):
            raise ParityError(f"replay schedule {path}: arrival times must be finite and never decrease")
        return [t - times[0] for t in times] if times else []

    def describe(self, count: int) -> dict:
        """The schedule as a trial records it: its settings, and the SHA-256 of its offsets (in µs) for
        `count` requests (and of the replayed file)."""
        offsets = self.offsets(count)
        doc = {k: v for k, v in self.to_dict().items() if self.kind != "burst" or k == "kind"}
        if self.kind != "burst":
            doc |= {"requests": count, "offsets_sha256": offsets_sha256(offsets),
                    "span_s": offsets[-1] if offsets else 0.0}
        if self.kind == "replay":
            doc["replay_sha256"] = hashlib.sha256(Path(self.replay).read_bytes()).hexdigest()
        return doc


def offsets_sha256(offsets: list[float]) -> str:
    """The SHA-256 a trial records of its offsets: of their JSON list in whole microseconds."""
    return hashlib.sha256(json.dumps([round(t * 1e6) for t in offsets]).encode()).hexdigest()


def lag(scheduled: list[float], sent: list[float]) -> dict:
    """How far sending fell behind the schedule (actual minus scheduled send, seconds): p50, p99, max, and
    whether the generator fell behind (`behind`: p99 above 1 ms, the load generator's own target)."""
    late = np.maximum(np.asarray(sent, dtype=float) - np.asarray(scheduled, dtype=float), 0.0)
    if not late.size:
        return {"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0, "behind": False}
    p99 = float(np.percentile(late, 99))
    return {"p50_s": float(np.percentile(late, 50)), "p99_s": p99, "max_s": float(late.max()), "behind": p99 > 1e-3}


SPIN_S = 0.002  # the last stretch before a send is spun, not slept: a sleep wakes up to a millisecond late


def wait_until(t: float) -> None:
    """Return at `t` on the monotonic clock (a thread's pacing: the Flame path's release)."""
    while (left := t - time.monotonic()) > SPIN_S:
        time.sleep(left - SPIN_S)
    while time.monotonic() < t:
        pass


async def wait_until_async(t: float) -> None:
    """`wait_until` on an event loop: other tasks run while it sleeps and while it spins."""
    while (left := t - time.monotonic()) > SPIN_S:
        await asyncio.sleep(left - SPIN_S)
    while time.monotonic() < t:
        await asyncio.sleep(0)


QUIET_NOTE_S = 60  # a line on stderr each time this long passes with no answer (a frozen worker or replica)


class Quiet:
    """What a client says while it waits for answers: a line on stderr each time `QUIET_NOTE_S` pass with none
    answered (a frozen Flame worker or replica was otherwise silent until the path gave up: an hour on Flame,
    30 minutes on standalone). `note` returns the line it wrote, for tests."""

    def __init__(self, path: str, total: int, pending: int, deadline: float, now: float):
        self.path, self.total, self.left, self.deadline, self.since = path, total, pending, deadline, now

    def note(self, pending: int, now: float) -> str | None:
        if pending < self.left:
            self.left, self.since = pending, now
        elif pending and now - self.since >= QUIET_NOTE_S:
            self.since = now
            line = (f"parity: {self.path}: {pending} of {self.total} requests unanswered, none answered for "
                    f"{QUIET_NOTE_S} s (given up {max(0.0, self.deadline - now):.0f} s from now)")
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            return line
        return None
