"""The worker-restart fault (ours, beyond the study): one engine killed mid-run, a new one in its place,
no request lost.

A `Restart` names which shard's engine is killed (SIGKILL of the process and everything it started) and
when: `at`, a fraction of the arrival schedule's span after the release. The serving path brings a new
engine up in its place — standalone: a new replica process, started at once, as a supervisor would;
Flame: a new session for the shard, so a new worker and engine — and sends again each request the dead
engine had not answered. `Outage` keeps what happened on the host's monotonic clock: when the engine was
killed, which requests were sent again, and when the new engine answered first (the time to recover).
A request that still finds no engine, or a new engine slower to answer than `timeout_s`, fails the trial
in one line: none is dropped, none is counted twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

from parity import procs
from parity.errors import ParityError
from parity.settings import Settings


@dataclass(frozen=True)
class Restart(Settings):
    what = "restart setting"
    shard: int = 0  # whose engine is killed
    at: float = 0.4  # when, as a fraction of the schedule's span after the release
    timeout_s: float = 600.0  # the new engine must answer within this long after the kill, else the trial fails

    def check(self):
        if not 0 < self.at < 1:
            raise ParityError(f"restart at must be a fraction of the schedule's span, above 0 and below 1, "
                              f"got {self.at!r}")
        if self.shard < 0:
            raise ParityError(f"restart shard must be 0 or more, got {self.shard!r}")
        if not self.timeout_s > 0:
            raise ParityError(f"restart timeout_s must be above 0, got {self.timeout_s!r}")

    def delay_s(self, offsets: list[float], shards: int) -> float:
        """Seconds after the release at which the engine is killed; the schedule must spread its requests."""
        if self.shard >= shards:
            raise ParityError(f"restart shard {self.shard} does not exist: the path has {shards} shard(s)")
        span = offsets[-1] if offsets else 0.0
        if span <= 0:
            raise ParityError("the restart fault needs arrivals spread in time (a poisson, gamma or replay "
                              "schedule), not a burst")
        return self.at * span


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and every process it started (vLLM's engine core is a child of its server or worker)."""
    victims = [pid, *procs.descendants(pid)]
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


@dataclass
class Outage:
    """One restart fault as it happened: armed at the release, the kill done by a timer thread."""

    restart: Restart
    release_s: float
    delay_s: float
    killed_s: float | None = None
    pids: list[int] = field(default_factory=list)
    ready_s: float | None = None  # standalone: the new replica healthy (Flame starts its executor unseen)
    resent: list[str] = field(default_factory=list)
    first_answer_s: float | None = None  # the new engine's first answer
    executor_id: str | None = None  # Flame: the killed worker's executor
    replaced: bool = False  # Flame: the shard's session was replaced
    _lost: list[tuple] = field(default_factory=list)
    error: str | None = None  # why the kill did not happen
    _timer: threading.Timer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, find) -> None:
        """At the release plus the delay, on a timer thread: `find()` the pid of the engine's process (it may
        wait for one still starting), then kill it and what it started."""
        def fire():
            try:
                pid = find()
            except ParityError as exc:
                self.error = str(exc)
                return
            with self._lock:  # marked first: a request that fails from here on is one this kill lost
                self.killed_s = time.monotonic()
            pids = kill_tree(pid)
            with self._lock:
                self.pids = pids
        self._timer = threading.Timer(max(0.0, self.release_s + self.delay_s - time.monotonic()), fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        """Stop a kill that has not fired (the release failed early); wait for one under way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()

    @property
    def killed(self) -> bool:
        with self._lock:
            return self.killed_s is not None

    def resend(self, request_id: str) -> None:
        with self._lock:
            if request_id in self.resent:
                raise ParityError(f"request {request_id} was lost again after the restart of shard "
                                  f"{self.restart.shard}'s engine")
            self.resent.append(request_id)

    def watch(self, future, index: int) -> None:
        """Flame: request `index`'s task future; failing after the kill, it is lost (`take_lost`). One that
        failed before the kill is its own error, raised with its result."""
        def done(f):
            if f.cancelled() or f.exception() is None:
                return
            with self._lock:
                if self.killed_s is not None:
                    self._lost.append((index, f))
        future.add_done_callback(done)

    def take_lost(self) -> list[tuple]:
        """(index, future) of each request whose task failed after the kill, since the last call."""
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def overdue(self, now: float) -> bool:
        """The new engine has not answered within the restart's timeout after the kill."""
        with self._lock:
            return self.killed_s is not None and self.first_answer_s is None and now - self.killed_s > self.restart.timeout_s

    def answered(self, complete_s: float) -> None:
        """A request the new engine answered, at `complete_s`."""
        with self._lock:
            if self.first_answer_s is None or complete_s < self.first_answer_s:
                self.first_answer_s = complete_s

    def record(self, requests: int, answered: int) -> dict:
        """The trial manifest's `restart`: the fault, and what it cost, in seconds after the release."""
        if self.killed_s is None:
            raise ParityError(f"the restart fault never fired: {self.error or f'the burst ended before {self.delay_s:.2f} s'}")
        if self.first_answer_s is None:
            raise ParityError(f"shard {self.restart.shard}'s new engine answered no request after the restart")
        if self.first_answer_s - self.killed_s > self.restart.timeout_s:
            raise ParityError(f"shard {self.restart.shard}'s new engine answered first {self.first_answer_s - self.killed_s:.1f} s "
                              f"after the kill, beyond the restart's timeout_s ({self.restart.timeout_s:g} s)")
        after = lambda t: None if t is None else round(t - self.release_s, 6)  # noqa: E731
        return {**self.restart.to_dict(), "scheduled_s": round(self.delay_s, 6), "killed_s": after(self.killed_s),
                "killed_pids": self.pids,
                **({"killed_executor": self.executor_id} if self.executor_id else {}), "ready_s": after(self.ready_s),
                "first_answer_s": after(self.first_answer_s),
                "recovery_s": round(self.first_answer_s - self.killed_s, 6),
                "resent": sorted(self.resent), "requests": requests, "lost": requests - answered}
