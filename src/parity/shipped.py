"""Files the repository ships beside the code (the schemas, the study's reference numbers, the calibrated
simulator): the checkout's copy when running from source, else the one the wheel packages (pyproject's
force-include), so a non-editable install (the container's) finds them from any working folder."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped(relative: str) -> Path:
    """The shipped file or folder at `relative` (a path in the repository, e.g. "config/study-reference.yaml")."""
    checkout = Path(__file__).resolve().parents[2] / relative
    if checkout.exists():
        return checkout
    return Path(str(resources.files("parity") / relative))
