"""How the report writes numbers: the study's precision and signs, and "—" where no number exists.

A missing number is never 0: an experiment that did not run, or whose trials all failed, shows "—"
and the table says why in a note.
"""

from __future__ import annotations

MISSING = "—"
MINUS = "−"  # the study's sign: −0.55%


def rate(value: float | None, digits: int = 3) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def spread(summary: dict | None, digits: int = 3) -> str:
    """median [min–max], as the study writes requests/s."""
    if not summary:
        return MISSING
    return f"{summary['median']:.{digits}f} [{summary['min']:.{digits}f}–{summary['max']:.{digits}f}]"


def signed_pct(fraction: float | None, digits: int = 2) -> str:
    """A relative difference (−0.0055 → −0.55%)."""
    if fraction is None:
        return MISSING
    text = f"{fraction * 100:+.{digits}f}%"
    return text.replace("-", MINUS)


def pct(fraction: float | None, digits: int = 2) -> str:
    return MISSING if fraction is None else f"{fraction * 100:.{digits}f}%"


def pct_range(low: float | None, high: float | None, digits: int = 2) -> str:
    if low is None or high is None:
        return MISSING
    return f"{low * 100:.{digits}f}%–{high * 100:.{digits}f}%"


def yes_no(flag: bool | None) -> str:
    return MISSING if flag is None else ("Yes" if flag else "No")


def study_summary(values: dict | None) -> dict | None:
    """The study's {median, min, max} in the shape of parity.stats.summary."""
    return None if values is None else {"median": values["median"], "min": values["min"], "max": values["max"]}


def from_pct(value: float | None) -> float | None:
    """A percentage as the study writes it (−0.55) as a fraction (−0.0055)."""
    return None if value is None else value / 100
