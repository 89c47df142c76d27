"""A run's deadline (ours; `parity experiment run --deadline`, or PARITY_DEADLINE): the runner begins no case that
would not finish before it, so a device call that its time limit will end stops between cases, its finished trials
kept for the rerun, instead of inside one (whose work is then lost).

A case's need is predicted before it begins: its paced warm-ups and arrivals (requests / rate) with a margin, plus an
engine start where it opens one (START_S until this process has opened one on the case's path, then the longest it
has seen there, its decode sweep included, plus START_SPREAD_S: on 2026-12-05 a bounded case was not begun for a
START_S of 90 s where the standalone start just measured had taken about 45); once a case of the same rate, request
count and answer length has run in this process, from the longest such instead (a saturated rung takes longer than its arrivals, and a measured one says by
how much): a case on fresh engines by its whole time, a rung on a shared start by those that did not open it, plus a
start where it opens one; one not yet measured by its schedule times the most a measured case overran its own. A
burst not yet measured has no schedule to go by: on fresh engines it needs at least their start and its drain
(START_S + SLACK_S; on 2026-12-04 a device call whose process had measured only a standalone burst began a Flame
burst 57 s before its deadline, and the call's limit killed it); one on engines already open is begun.
Cases are told apart by path too (on 2026-12-06 a no-reuse burst took 180 s on the Flame side and 121 s standalone,
on one H100). With a memory (`remember`: the runner's, where a deadline is set, in OUT/logs/deadline.json) what a
run measured is kept for the next run on the same GPUs: a device call's process ends with its limit, and the next
call's first case was predicted from START_S alone (2026-12-06: a Flame burst of about 200 s at 120 s, another case
at 202 s where its path had taken 121).
Measured on one H200 (2026-12-04): 640-request rungs took 195 s at 4 requests/s, 100 s at 8 and 82 s at 12, past
saturation; an engine start 20-40 s standalone and about 66 s on Flame (about 130 s with a cold Triton cache).
"""

from __future__ import annotations

import contextlib
import json
import time
from math import inf
from pathlib import Path
from typing import NamedTuple

from parity.errors import ParityError
from parity.experiments.plan import Case
from parity.manifest import atomic_write_text

MARGIN = 1.1  # a rung's warm-ups and arrivals take this much longer than their schedule, at most, while it keeps up
SLACK_S = 30.0  # and this much more: its drain, the cold reset, writing its manifest
START_S = 90.0  # an engine start with its decode sweep, where the case opens one
AGAIN = 1.1  # a case measured before takes at most this much longer again
START_SPREAD_S = 20.0  # one path's engine starts on one machine differ by up to this much (20-40 s standalone)


MEMORY_BYTES = 1 << 20  # a memory is a few hundred cases at most; a larger file is not one of ours


def _seconds(value) -> float:
    """A remembered time (or rate, or factor): a JSON number, finite and not negative, else ValueError (float() would
    read false as 0 s and "5" as 5 s)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < inf:
        raise ValueError(f"not a time: {value!r}")
    return float(value)


def _text(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not a text: {value!r}")
    return value


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"not true or false: {value!r}")
    return value


def _count(value) -> int:
    """A remembered request count: a whole JSON number above 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"not a count: {value!r}")
    return value


class _Kind(NamedTuple):
    """What a case is predicted by: cases alike in all of it take alike times."""
    rate: float | None  # None: a burst
    requests: int
    answers: str
    fresh: bool  # on engines of its own (not a shared start)
    system: str  # its path


class Deadline:
    """`at`: epoch seconds (None: no deadline). `check` before a case runs, `ran` after."""

    def __init__(self, at: float | None, clock=time.time):
        self.at, self.clock = at, clock
        self._took: dict[_Kind, float] = {}  # the longest wall time seen of each kind of case
        self._slower = 1.0  # the most a measured case took over its schedule's prediction (at least 1)
        self._starts: dict[str, float] = {}  # per path (system), the longest engine start seen, its sweep included
        self._memory: tuple[Path, list[str]] | None = None  # where what was measured is kept, and on which GPUs

    def remember(self, path: Path, gpus: list[str]) -> None:
        """Predict also from what earlier runs on these GPUs measured (kept at `path`), and keep what this one
        measures there. A memory of other GPUs, or one that cannot be read, is not used (it only predicts)."""
        memory = Path(path)
        self._memory = (memory, list(gpus))
        try:
            if not memory.is_file() or memory.stat().st_size > MEMORY_BYTES:  # not a FIFO that blocks a read
                return
            doc = json.loads(memory.read_text())
            if doc["gpus"] != list(gpus):
                return
            took = {_Kind(None if rate is None else _seconds(rate), _count(requests), _text(answers), _flag(fresh),
                          _text(system)): _seconds(wall)
                    for rate, requests, answers, fresh, system, wall in doc["took"]}
            starts = {_text(system): _seconds(s) for system, s in doc["starts"].items()}
            slower = _seconds(doc["slower"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return  # a memory with any value that is not a time (negative, NaN: a trial would look as if it fits)
        for key, wall in took.items():
            self._took[key] = max(wall, self._took.get(key, 0.0))
        for system, start in starts.items():
            self._starts[system] = max(start, self._starts.get(system, 0.0))
        self._slower = max(self._slower, slower)

    def _keep(self) -> None:
        if self._memory is None:
            return
        path, gpus = self._memory
        doc = {"gpus": gpus, "took": [[*key, wall] for key, wall in sorted(self._took.items(), key=repr)],
               "starts": self._starts, "slower": self._slower}
        # whole or not at all (a call killed while writing leaves the last one); only a prediction for a later run,
        # so one that cannot be written (a full disk) is left out and the run goes on
        with contextlib.suppress(OSError):
            atomic_write_text(path, json.dumps(doc, indent=1) + "\n")

    def start_s(self, case: Case) -> float:
        """What opening `case`'s engines is predicted to take: the longest start measured on its path plus
        START_SPREAD_S, or START_S before one was."""
        seen = self._starts.get(case.system)
        return START_S if seen is None else seen + START_SPREAD_S

    @staticmethod
    def _key(case: Case, requests: int) -> _Kind:
        answers = case.lengths.to_dict() if case.lengths is not None else case.max_tokens
        return _Kind(case.schedule.rate if case.schedule.paced else None, requests, repr(answers), case.start is None,
                     case.system)

    def _scheduled_s(self, case: Case, requests: int, warmup_rounds: int, opens: bool,
                     start_s: float | None = None) -> float | None:
        """What `case`'s schedule predicts: its paced warm-ups and arrivals with the margin, and a start where it
        opens one (`start_s`, else the start predicted); None for a case not paced (a burst)."""
        if not case.schedule.paced:
            return None
        warmups = warmup_rounds * (case.warmup_requests if case.warmup_requests is not None else requests)
        start = (self.start_s(case) if start_s is None else start_s) if opens else 0.0
        return MARGIN * (warmups + requests) / case.schedule.rate + SLACK_S + start

    def need_s(self, case: Case, requests: int, warmup_rounds: int, opens: bool) -> float | None:
        """The seconds `case` (of `requests` requests) is predicted to take, `opens`: opening its engines (always,
        for a case on fresh engines); None where nothing predicts it (a burst on open engines, not yet measured).
        Not yet measured, a case is predicted by its
        schedule, times the most a measured one overran its own (a path that keeps up less well than the schedule
        says, as the study's burst mode under sustained load, overruns every rung alike)."""
        took = self._took.get(self._key(case, requests))
        if took is not None:  # a fresh case's time has its start in it
            return AGAIN * took + (self.start_s(case) if opens and case.start is not None else 0.0)
        scheduled = self._scheduled_s(case, requests, warmup_rounds, opens)
        if scheduled is None and opens:  # a burst on fresh engines: as long as the longest its path took, at least
            # its start (2026-12-06: a 64-request Flame burst took 180 s, predicted by its start at 157)
            bursts = [took for kind, took in self._took.items()
                      if kind.rate is None and kind.fresh and kind.system == case.system]
            return AGAIN * max(bursts) if bursts else self.start_s(case) + SLACK_S
        if scheduled is None:  # a burst on open engines: nothing predicts it
            return None
        return scheduled * self._slower

    def check(self, case: Case, requests: int, warmup_rounds: int, opens: bool) -> None:
        """ParityError, in one line, where `case` would not finish before the deadline."""
        if self.at is None:
            return
        need, left = self.need_s(case, requests, warmup_rounds, opens), self.at - self.clock()
        if need is not None and need > left:
            raise ParityError(f"deadline: {case.trial_id} needs about {need:.0f} s and {max(left, 0.0):.0f} s are "
                              "left, so it is not begun; the trials finished so far are kept for the rerun")

    def ran(self, case: Case, requests: int, warmup_rounds: int, opened: bool, wall_s: float,
            start_s: float | None = None) -> None:
        """`case` took `wall_s`, `start_s` of it opening its engines where it opened them (measured: learned per
        path); a rung that opened its shared start teaches nothing more (the start is in its time)."""
        if opened and start_s is not None:
            self._starts[case.system] = max(start_s, self._starts.get(case.system, 0.0))
        if case.start is None or not opened:
            key = self._key(case, requests)
            self._took[key] = max(wall_s, self._took.get(key, 0.0))
            scheduled = self._scheduled_s(case, requests, warmup_rounds, opened, start_s)
            if scheduled:
                self._slower = max(self._slower, wall_s / scheduled)
        self._keep()
