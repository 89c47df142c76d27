"""Arrival schedules: when each request of a trial is released, as offsets from the trial's release.

The study released every request at once (`burst`), and that is the only kind so far. Each kind is
one branch of `Schedule.offsets`; the serving paths release request k at `release + offsets[k]`, so a
new kind (Poisson, gamma, a replayed trace) is added here and nowhere else. The schedule is recorded
in every trial manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.errors import ParityError
from parity.settings import Settings

KINDS = ("burst",)


@dataclass(frozen=True)
class Schedule(Settings):
    what = "schedule setting"
    kind: str = "burst"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ParityError(f"unknown arrival schedule {self.kind!r}: use one of {', '.join(KINDS)}")

    def offsets(self, count: int) -> list[float]:
        """Seconds after the release at which each of `count` requests is sent, in burst order."""
        return [0.0] * count  # burst: all at once
