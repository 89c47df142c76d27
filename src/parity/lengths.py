"""Output lengths per request (ours, beyond the study): a seeded distribution, each length exact.

The study asked every request for exactly 16 new tokens (EOS ignored), and that stays the default: a
trial without `OutputLengths` asks each request for its engine's `max_tokens`. Answers of real
traffic vary in length, so `OutputLengths` draws one length per request from a log-normal law
(`median`, `sigma`), rounded and clipped to [`low`, `high`], seeded: the same settings give the same
lengths in every process, in burst order. Each request then asks for exactly its length, EOS
ignored, on both serving paths (standalone: the request's own `max_tokens`/`min_tokens`; Flame: a
length per prompt in the task payload), and `describe` records the lengths' SHA-256, so both sides
of a pair can be shown to have asked for the same answers. With `replay` (ours: a replay file that
lists `output_lengths`, as `parity trace-mooncake` writes one beside its trace) the lengths are the
file's, in order, in place of the drawn ones: a real trace's answers, exact (one under `low` asks for
`low`: an engine makes at least one token; `high` is not applied, the trace's reader already kept only
requests whose prompt and answer fit the context).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.errors import ParityError
from parity.settings import Settings


@dataclass(frozen=True)
class OutputLengths(Settings):
    what = "output length setting"
    recorded_when_set = ("replay",)  # drawn lengths record what they always did
    median: int = 64  # tokens: half the answers are shorter
    sigma: float = 0.8  # of the log of the length: the spread (0: every answer `median` long)
    low: int = 1
    high: int = 512  # also the engine's max_tokens for the trial (what its context check allows for)
    seed: int = 0
    replay: str = ""  # ours: a file whose `output_lengths` are the lengths (NAME.replay.json); unset: drawn

    def check(self):
        if not 1 <= self.low <= self.median <= self.high:
            raise ParityError(f"output lengths need 1 <= low <= median <= high, got low {self.low!r}, "
                              f"median {self.median!r}, high {self.high!r}")
        if not 0 <= self.sigma <= 4:
            raise ParityError(f"output length sigma must be in [0, 4], got {self.sigma!r}")

    @property
    def ceiling(self) -> int:
        """The longest answer it asks for: `high`, or the replay file's longest (the engine's max_tokens)."""
        if not self.replay:
            return self.high
        return max((max(n, self.low) for n in replayed_lengths(self.replay)), default=self.low)

    def draw(self, count: int) -> list[int]:
        """The exact output length of each of `count` requests, in burst order."""
        if self.replay:
            return [max(n, self.low) for n in replayed_lengths(self.replay, count)]
        rng = np.random.default_rng(self.seed)
        values = np.exp(np.log(self.median) + self.sigma * rng.standard_normal(count))
        return np.clip(np.rint(values), self.low, self.high).astype(int).tolist()

    def describe(self, count: int) -> dict:
        """As a trial records it: the settings, the SHA-256 of the lengths drawn, and their mean and range."""
        lengths = self.draw(count)
        replayed = {"replay_sha256": hashlib.sha256(Path(self.replay).read_bytes()).hexdigest()} if self.replay else {}
        return self.to_dict() | replayed | {"requests": count, "lengths_sha256": lengths_sha256(lengths),
                                            "mean": float(np.mean(lengths)) if lengths else 0.0,
                                            "min": min(lengths, default=0), "max": max(lengths, default=0)}



def replayed_lengths(path: str, count: int | None = None) -> list[int]:
    """The first `count` (None: all) of a replay file's `output_lengths`; ParityError, in one line, for fewer
    or for anything but integers >= 0."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParityError(f"output lengths {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParityError(f"output lengths {path}: not JSON ({exc})") from None
    lengths = data.get("output_lengths") if isinstance(data, dict) else None
    if not isinstance(lengths, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                for n in lengths):
        raise ParityError(f"output lengths {path}: expected {{\"output_lengths\": [...]}}, integers >= 0")
    if count is not None and len(lengths) < count:
        raise ParityError(f"output lengths {path}: {len(lengths)} lengths for {count} requests")
    return lengths[:count]


def lengths_sha256(lengths: list[int]) -> str:
    """SHA-256 of a list of lengths as compact JSON: what a trial's records are checked against."""
    return hashlib.sha256(json.dumps([int(n) for n in lengths], separators=(",", ":")).encode()).hexdigest()
