"""The study's published numbers (config/study-reference.yaml), read and checked for the sections we print.

They are transcribed by hand from the study text and committed, so a reviewer can compare them with
the study line by line; the report never computes them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from parity.errors import ParityError

SECTIONS = ("final_throughput", "locality", "admission", "gc", "mlperf")
DEFAULT_REFERENCE = Path(__file__).resolve().parents[3] / "config" / "study-reference.yaml"  # the repository's, from
# any working folder


def load_reference(path: Path) -> dict:
    """The reference as a dict; ParityError if the file is missing or lacks a section the report prints."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ParityError(f"{path}: no study reference file") from None
    except UnicodeDecodeError as exc:  # bytes of something else
        raise ParityError(f"{path}: not text (UTF-8): byte {exc.start} cannot be read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParityError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict):
        raise ParityError(f"{path}: the study reference is not a mapping")
    missing = [s for s in SECTIONS if not isinstance(doc.get(s), dict) or "section" not in doc[s]]
    if missing:
        raise ParityError(f"{path}: missing section(s) {', '.join(missing)} (each with the study section it came from)")
    return doc
