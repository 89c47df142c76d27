"""The study's published numbers (config/study-reference.yaml), read and checked for the sections we print.

They are transcribed by hand from the study text and committed, so a reviewer can compare them with
the study line by line; the report never computes them.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from parity.errors import ParityError
from parity.shipped import shipped

SECTIONS = ("final_throughput", "locality", "admission", "gc", "mlperf")
DEFAULT_REFERENCE = shipped("config/study-reference.yaml")  # the repository's, from any working folder


def load_reference(path: Path) -> dict:
    """The reference as a dict; ParityError if the file is missing, lacks a section the report prints, or departs
    from the shipped reference's shape (a key the tables read missing, a value of another type)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a folder, a named pipe (reading one would wait for a writer)
        raise ParityError(f"{path}: not a regular file")
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
    if path.resolve() != DEFAULT_REFERENCE.resolve():
        shape = yaml.safe_load(DEFAULT_REFERENCE.read_text(encoding="utf-8"))
        if (problem := _departs(doc, shape, "")) is not None:
            raise ParityError(f"{path}: {problem} (the report reads what {DEFAULT_REFERENCE.name} holds)")
    if (problem := _unsound(doc, "")) is not None:  # the shipped file too: it is edited by hand
        raise ParityError(f"{path}: {problem}")
    return doc


def _is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _unsound(node, where: str) -> str | None:
    """What no shape says: a number that is NaN or infinite (YAML's .nan: the report would print "nan"), or a range
    (a key ending in `_range` or `_range_pct`) other than [low, high] of finite numbers (the tables unpack two)."""
    if isinstance(node, float) and not math.isfinite(node):
        return f"{where.rstrip('.')} is {node!r}, not a finite number"
    if where.rstrip(".").endswith(("_range", "_range_pct")):
        if not (isinstance(node, list) and len(node) == 2 and all(map(_is_number, node)) and node[0] <= node[1]):
            return f"{where.rstrip('.')} is {node!r}, not [low, high] of finite numbers"
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        inner = f"{where}{key}." if isinstance(node, dict) else f"{where.rstrip('.')}[{key}]."
        if (problem := _unsound(value, inner)) is not None:
            return problem
    return None


_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a mapping",
          type(None): "null"}  # by exact type, so True is a boolean, not a number


def _kind(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _departs(given, model, where: str) -> str | None:
    """Where `given` first departs from `model`'s shape: a key `model` has that it lacks, or a value of another
    kind (lists: each item as `model`'s first); None if it does not."""
    if model is not None and _kind(given) != _kind(model):
        return f"{where.rstrip('.') or 'the file'} is {_kind(given)}, not {_kind(model)}"
    if isinstance(model, dict):
        for key, value in model.items():
            if key not in given:
                return f"{where}{key} is missing"
            if (problem := _departs(given[key], value, f"{where}{key}.")) is not None:
                return problem
    if isinstance(model, list) and model:
        for index, item in enumerate(given):
            if (problem := _departs(item, model[0], f"{where.rstrip('.')}[{index}].")) is not None:
                return problem
    return None
