"""Manifests: written atomically, hashed, and validated against `schemas/` with links checked by hash.

Every manifest carries `kind`, `schema_version` and `simulated`. A JSON object with exactly the keys
`path` and `sha256` (and optionally `bytes`) is a file reference, relative to the manifest's folder;
`validate_paths` checks every such link, so the evidence is a hash-linked tree. Writes go to a
temporary file that is renamed into place, so an interrupted run never leaves half a manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable

from parity import __version__
from parity.errors import ParityError

SCHEMA_VERSION = 1
SCHEMA_SUFFIX = ".schema.json"
REFERENCE_KEYS = ({"path", "sha256"}, {"path", "sha256", "bytes"})


class ManifestError(ParityError):
    """A manifest that cannot be read, or one that would be written invalid."""


@dataclass(frozen=True)
class Problem:
    """One validation failure: which file, where in it (JSON pointer), which rule, and what."""

    file: str
    pointer: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.pointer or '/'}: {self.rule}: {self.message}"


# ---- files and hashes --------------------------------------------------------------------------

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_ref(path: Path | str, relative_to: Path | str) -> dict:
    """A hash link to `path`, relative to the folder of the manifest that will hold it."""
    path = Path(path)
    rel = Path(os.path.relpath(path.resolve(), Path(relative_to).resolve())).as_posix()
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename; on failure nothing is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.NamedTemporaryFile(delete=False, dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)
    except BaseException:
        Path(tmp.name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# ---- documents ---------------------------------------------------------------------------------

def header(kind: str, *, simulated: bool) -> dict:
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "simulated": simulated, "parity_version": __version__}


def dumps(doc: dict) -> str:
    """Deterministic JSON: same document, same bytes."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def read_manifest(path: Path | str) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None


def write_manifest(path: Path | str, doc: dict) -> dict:
    """Validate, then write atomically; an invalid document is refused and nothing is written."""
    problems = validate_document(doc, path=path)
    if problems:
        raise ManifestError(f"refusing to write an invalid manifest: {problems[0]}")
    text = dumps(doc)
    atomic_write_text(path, text)
    data = text.encode("utf-8")
    return {"path": str(path), "sha256": sha256_bytes(data), "bytes": len(data)}


# ---- schemas -----------------------------------------------------------------------------------

def schemas_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "schemas"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("parity") / "schemas"))


@lru_cache(maxsize=1)
def _validators() -> dict:
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource

    schemas = {p.name[: -len(SCHEMA_SUFFIX)]: json.loads(p.read_text()) for p in sorted(schemas_dir().glob(f"*{SCHEMA_SUFFIX}"))}
    registry = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in schemas.values())
    return {kind: Draft202012Validator(schema, registry=registry, format_checker=FormatChecker())
            for kind, schema in schemas.items() if kind != "common"}


def known_kinds() -> list[str]:
    return sorted(_validators())


def validate_document(doc, *, path: Path | str | None = None) -> list[Problem]:
    """Schema problems of one document, sorted by JSON pointer."""
    file = str(path) if path is not None else "<document>"
    kind = doc.get("kind") if isinstance(doc, dict) else None
    validator = _validators().get(kind) if isinstance(kind, str) else None
    if validator is None:
        return [Problem(file, "/kind", "unknown-kind", f"kind {kind!r} is not one of {', '.join(known_kinds())}")]
    problems = [Problem(file, _pointer(error.absolute_path), str(error.validator), error.message)
                for error in validator.iter_errors(doc)]
    return sorted(problems, key=lambda p: (p.pointer, p.rule, p.message))


def _pointer(parts) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def check_references(doc, manifest_path: Path | str) -> list[Problem]:
    """Every file reference in the document exists and has the recorded SHA-256 (and size)."""
    base = Path(manifest_path).parent
    problems = []

    def walk(node, pointer):
        if isinstance(node, dict):
            if set(node) in REFERENCE_KEYS and isinstance(node.get("path"), str):
                target = base / node["path"]
                if not target.is_file():
                    problems.append(Problem(str(manifest_path), pointer, "file-missing", f"{target} does not exist"))
                    return
                actual = sha256_file(target)
                if actual != node["sha256"]:
                    problems.append(Problem(str(manifest_path), pointer, "sha256-mismatch",
                                            f"{target} has SHA-256 {actual}, the manifest says {node['sha256']}"))
                elif "bytes" in node and target.stat().st_size != node["bytes"]:
                    problems.append(Problem(str(manifest_path), pointer, "bytes-mismatch",
                                            f"{target} has {target.stat().st_size} bytes, the manifest says {node['bytes']}"))
                return
            for key, value in node.items():
                walk(value, f"{pointer}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{pointer}/{index}")

    walk(doc, "")
    return problems


def _is_manifest(doc) -> bool:
    return isinstance(doc, dict) and "kind" in doc and "schema_version" in doc


def validate_paths(paths: Iterable[Path | str]) -> tuple[int, list[Problem]]:
    """Validate named files, and every manifest found under named folders; returns (checked, problems).

    In folders, JSON files that are not manifests (no kind and schema_version) are skipped, so inputs
    such as tokenizer.json do not count; a file named explicitly is always validated.
    """
    checked, problems = 0, []
    for raw in paths:
        root = Path(raw)
        files = sorted(root.rglob("*.json")) if root.is_dir() else [root]
        for file in files:
            try:
                doc = read_manifest(file)
            except ManifestError as exc:
                if root.is_dir() and file.name.startswith("."):
                    continue
                problems.append(Problem(str(file), "", "not-json", str(exc)))
                continue
            if root.is_dir() and not _is_manifest(doc):
                continue
            checked += 1
            problems += validate_document(doc, path=file)
            problems += check_references(doc, file)
    return checked, problems
