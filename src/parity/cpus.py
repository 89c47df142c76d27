"""CPUs of their own for the vLLM engine cores of a job (ours, issue 28: `backend.engine_cpus`; 0, the default, is
as the study ran: nothing reserved).

Why: with eager execution a vLLM engine core's main thread launches every kernel of every step from Python, so its
steps are bound by that one thread's CPU. On one H200 host (16 vCPUs) the standalone engine stepped 8-23% slower
with four processes beside it that look like the Flame path's own (each busy 2 ms of every 7), which is as much as
the Flame side's engine was slower than standalone's; with each engine core on a CPU of its own, the 512-token pair
went from 0.87 to 0.97 (benchmarks/measured/h200-diagnose-512-2026-12-03-session11.json).

How: the job's own process moves to the CPUs left after reserving `per_engine` CPUs per GPU at the top of its
allowed set, so everything it starts later (clients, `vllm serve`, Flame's managers and workers) inherits that;
a watcher moves each `VLLM::EngineCore` process that appears below the job, every thread of it, onto a reserved
slot of its own, and frees the slot when it exits. The same on both serving paths, so a pair stays fair. What was
reserved and which engine core went where is recorded in each trial (`cpus`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from pathlib import Path

from parity import procs
from parity.errors import ParityError

ENGINE_NAME = "VLLM::EngineCor"  # a vLLM engine core's process name (its title, cut to 15 characters)
POLL_S = 0.5

_active: "EngineCpus | None" = None


def ranges(cpus) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (as taskset and cgroups write CPU lists)."""
    runs = [[cpu for _, cpu in run] for _, run in itertools.groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0])]
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


class EngineCpus:
    """`per_engine` CPUs for each of `engines` engine cores, the rest for the job; see the module docstring."""

    def __init__(self, per_engine: int, engines: int, log=print):
        allowed = sorted(os.sched_getaffinity(0))
        reserved = per_engine * engines
        if len(allowed) - reserved < 1:
            raise ParityError(f"backend.engine_cpus: {per_engine} CPUs for each of {engines} engine cores leaves none "
                              f"of this job's {len(allowed)} CPUs for the rest")
        self.per_engine, self.log = per_engine, log
        self.others = allowed[: len(allowed) - reserved]
        self.slots = [allowed[len(self.others) + i * per_engine: len(self.others) + (i + 1) * per_engine]
                      for i in range(engines)]
        self._taken: dict[int, tuple[int, int, dict]] = {}  # engine core pid -> (its start time, its slot, its entry)
        self._threads: dict[int, set[int]] = {}  # engine core pid -> the threads moved so far
        self.placed: list[dict] = []  # every engine core placed: pid, cpus, when
        self.unplaced: list[int] = []  # engine cores that found no free slot
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-cpus", daemon=True)

    def start(self) -> None:
        os.sched_setaffinity(0, self.others)
        for tid in _threads(os.getpid()):  # threads already running in this process too
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, self.others)
        self.log(f"engine CPUs: {ranges(c for s in self.slots for c in s)} reserved, {self.per_engine} per engine "
                 f"core; this job on {ranges(self.others)}")
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            self.place()

    def place(self) -> None:
        """Move engine cores that appeared (and new threads of known ones) onto their slots; free the slots of
        engine cores that exited."""
        table = procs.proc_table()
        below = set(procs.descendants(os.getpid(), table))
        for pid, (started, _, entry) in list(self._taken.items()):
            if pid not in table or table[pid][1] != started:
                del self._taken[pid]
                self._threads.pop(pid, None)
                entry["ended_s"] = time.time()
        for pid in below:
            if not table[pid][2].startswith(ENGINE_NAME):
                continue
            if pid not in self._taken:
                free = sorted(set(range(len(self.slots))) - {slot for _, slot, _ in self._taken.values()})
                if not free:  # more engine cores than slots (two shards on one GPU): left where they are, said once
                    if pid not in self.unplaced:
                        self.unplaced.append(pid)
                        self.log(f"engine core {pid}: no reserved CPUs left ({len(self.slots)} slots); left on "
                                 f"{ranges(self.others)}")
                    continue
                entry = {"pid": pid, "cpus": ranges(self.slots[free[0]]), "at_s": time.time()}
                self._taken[pid] = (table[pid][1], free[0], entry)
                self.placed.append(entry)
                self.log(f"engine core {pid} on CPUs {ranges(self.slots[free[0]])}")
            cpus = self.slots[self._taken[pid][1]]
            moved = self._threads.setdefault(pid, set())
            for tid in _threads(pid) - moved:
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    os.sched_setaffinity(tid, cpus)
                    moved.add(tid)

    def describe(self, since: float | None = None) -> dict:
        """What a trial records: the reservation, and each engine core placed that was still running at `since`
        (the trial's start, wall clock; None: every one). A reservation spans a whole experiment run, so an
        engine core an earlier trial started and stopped is not this trial's (its exit is seen within POLL_S)."""
        cores = [dict(p) for p in self.placed if since is None or p.get("ended_s", since) >= since]
        return {"engine_cpus": self.per_engine, "reserved": [ranges(s) for s in self.slots],
                "others": ranges(self.others), "engine_cores": cores, "unplaced": list(self.unplaced)}


def _threads(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


@contextlib.contextmanager
def isolated(per_engine: int, engines: int, log=print):
    """Engine cores on CPUs of their own for the `with` block (nothing when `per_engine` is 0)."""
    global _active
    if not per_engine:
        yield None
        return
    if not Path("/proc/self/task").is_dir():
        raise ParityError("backend.engine_cpus needs Linux (/proc and sched_setaffinity)")
    reservation = EngineCpus(per_engine, engines, log)
    reservation.start()
    _active = reservation
    try:
        yield reservation
    finally:
        _active = None
        reservation.stop()


def record(since: float | None = None) -> dict | None:
    """The active reservation as a trial that began at `since` (wall clock) records it (None: none, as the
    study ran)."""
    return None if _active is None else _active.describe(since)
