"""Manifests: written atomically, hashed, and validated against `schemas/`, with links checked by hash.

Every step leaves its evidence as a JSON manifest carrying `kind`, `schema_version` and `simulated`.
A JSON object with exactly the keys `path` and `sha256` (optionally `bytes`) is a file reference,
relative to the manifest's folder, so the evidence is a hash-linked tree that `validate_paths` checks
end to end. Writes go to a temporary file renamed into place: a crash never leaves half a manifest,
and an invalid document is refused before anything touches the disk.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from parity import __version__
from parity.errors import ParityError, first_problem
from parity.shipped import shipped

RUN_MANIFEST = "run.json"  # what `parity seal` writes at a tree's top and `parity sign` signs (declared here, the lowest)

SCHEMA_VERSION = 3  # 2: systems named by serving path (standalone, not vllm); `placement` for routing
# 3: inputs linked by path and hash (a trace's corpus and tokenizer, MLPerf's dataset); the `run` manifest
SCHEMA_SUFFIX = ".schema.json"
SCHEMA_ID_BASE = "https://parity.invalid/schemas/"
REFERENCE_KEYS = (frozenset({"path", "sha256"}), frozenset({"path", "sha256", "bytes"}))
_CHUNK = 1 << 20
_MESSAGE_LIMIT = 300


class ManifestError(ParityError):
    """A manifest that cannot be read, or one that would be written invalid; the message is one line."""


@dataclass(frozen=True)
class Problem:
    """One validation failure: which file, where in it (JSON pointer, "" for the root), which rule, what."""

    file: str
    pointer: str
    rule: str
    message: str

    def __str__(self) -> str:  # a file or key named with a line break is escaped: one problem, one line, so
        # no name can pose as a second problem's line (an outside tester's, 2026-12-06)
        return ": ".join(printable(part) for part in (self.file, self.pointer, self.rule, self.message))


def printable(text: str) -> str:
    """`text` with each control character (a newline in a file's name) written as its escape."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# ---- files and hashes --------------------------------------------------------------------------

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str) -> str:
    """Streamed, so multi-gigabyte weights and token files do not have to fit in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_ref(path: Path | str, relative_to: Path | str, *, sha256: str | None = None) -> dict:
    """A hash link to `path`, relative to `relative_to` (the folder of the manifest that will hold it);
    `sha256` where the caller has just hashed the file, so a large one is not read twice."""
    path = Path(path)
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(relative_to))
    return {"path": Path(rel).as_posix(), "sha256": sha256 or sha256_file(path), "bytes": path.stat().st_size}


def rebase(ref: dict, old_dir: Path | str, new_dir: Path | str) -> dict:
    """The same link, written for a manifest in `new_dir` instead of `old_dir` (a copied section)."""
    target = os.path.join(os.path.abspath(old_dir), ref["path"])
    return ref | {"path": Path(os.path.relpath(target, os.path.abspath(new_dir))).as_posix()}


@lru_cache(maxsize=1)
def _umask() -> int:
    """The process umask, read once (reading it means setting it), so new files get ordinary modes."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_WRITTEN: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("written", default=None)


@contextlib.contextmanager
def all_or_nothing(manifest: Path):
    """One output made of several files and written last, its `manifest` (a trace and its warm-ups, a report and its
    plots): should the command fail part-way (a full disk, a problem found late), every file `atomic_write_bytes`
    wrote inside this block is removed, with the manifest where any was (an earlier one would name files no longer
    there), and the manifest's folder too where the block made it and it is left empty: no part of an output is ever
    read as the whole, and none is half old, half new; a command that fails before writing anything leaves an
    earlier output as it was."""
    written: list[Path] = []
    made = not manifest.parent.exists()
    token = _WRITTEN.set(written)
    try:
        yield
    except BaseException:
        for path in written + ([manifest] if written else []):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):  # only where nothing else is in it
                manifest.parent.rmdir()
        raise
    finally:
        _WRITTEN.reset(token)


def first_difference(pointer: str, stated, derived) -> tuple[str, object, object]:
    """The first place two JSON values differ (its JSON pointer, and each value there), so a line that names a
    disagreement names the number, not the whole table."""
    if isinstance(stated, dict) and isinstance(derived, dict):
        for key in sorted(set(stated) | set(derived)):
            if stated.get(key) != derived.get(key):
                return first_difference(f"{pointer}/{key}", stated.get(key), derived.get(key))
    if isinstance(stated, list) and isinstance(derived, list) and len(stated) == len(derived):
        for index, (a, b) in enumerate(zip(stated, derived)):
            if a != b:
                return first_difference(f"{pointer}/{index}", a, b)
    return pointer, stated, derived


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename it into place; on failure leave nothing.

    An OSError (a full disk, a read-only folder) names `path`, not the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = tempfile.NamedTemporaryFile(delete=False, dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        _name(exc, path)
        raise
    try:
        with tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp.name, 0o666 & ~_umask())  # NamedTemporaryFile makes 0600; evidence is meant to be shared
        os.replace(tmp.name, path)
    except BaseException as exc:
        Path(tmp.name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            _name(exc, path)
        raise
    if (written := _WRITTEN.get()) is not None:  # inside all_or_nothing: undone if the output fails
        written.append(path)


def _name(exc: OSError, path: Path) -> None:
    """Make an OSError of the system (one with an errno) name `path` instead of the temporary file."""
    if exc.errno is not None:
        exc.filename, exc.filename2 = str(path), None


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# ---- documents ---------------------------------------------------------------------------------

def header(kind: str, *, simulated: bool) -> dict:
    """The fields every manifest starts with."""
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "simulated": bool(simulated),
            "parity_version": __version__}


def dumps(doc) -> str:
    """Deterministic JSON: the same document always gives the same bytes, so hashes are reproducible."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    """json's parse_float: a number too large for a float (1e400) is read as infinity by Python, which the
    NaN/Infinity check never sees; no manifest states one (an outside tester's forged rate, 2026-12-06)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond what a float holds, read as {value}")
    return value


def _unique_keys(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(f"duplicate key(s) {', '.join(map(repr, duplicates))}")
    return dict(pairs)


def loads(text: str, **hooks):
    """JSON text parsed, every way it can fail a ValueError, so a reader's one `except ValueError` names it in one
    line: bad JSON (a JSONDecodeError, which says where), a number past Python's 4,300 digits, and a document nested
    past Python's recursion limit (json raises RecursionError, which no reader would think to catch)."""
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise ValueError("nested more deeply than Python's JSON parser reads") from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError) or not str(exc).startswith("Exceeds the limit"):
            raise
        raise ValueError(f"a number of more than {sys.get_int_max_str_digits()} digits, more than Python reads "
                         "as an integer") from None


def strict_loads(text: str):
    """Strict JSON: no NaN/Infinity, no number past a float's range, no duplicate keys, which Python's json would
    silently accept."""
    return loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys)


def read_regular(path: Path, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (unless `follow`, never through a symbolic link: ELOOP), opened
    without blocking and checked on the open file, so a named pipe or a device is refused (ManifestError), never
    waited on (an outside tester's FIFO hung `check` and `validate`, 2026-12-06)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise ManifestError(f"{path}: not a regular file (a named pipe or a device)")
        with open(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def read_manifest(path: Path | str) -> dict:
    """The parsed manifest; ManifestError if it is missing, not JSON, or not a JSON object."""
    path = Path(path)
    try:
        doc = strict_loads(read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: is a directory, not a manifest") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ManifestError(f"{path}: not valid JSON: {one_line(str(exc))}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{path}: not a JSON object but {type(doc).__name__}")
    return doc


def write_manifest(path: Path | str, doc: dict) -> dict:
    """Validate, then write atomically; an invalid document is refused and nothing is written.

    A value JSON cannot hold (NaN, infinity) raises ValueError from `dumps`, also before any write.
    """
    problems = validate_document(doc, path=path)
    if problems:
        raise ManifestError(f"refusing to write an invalid manifest: {first_problem(problems)}")
    data = dumps(doc).encode("utf-8")
    atomic_write_bytes(path, data)
    return {"path": str(path), "sha256": sha256_bytes(data), "bytes": len(data)}


# ---- schemas -----------------------------------------------------------------------------------

def schemas_dir() -> Path:
    """The checkout's `schemas/` when running from source, else the copy packaged in the wheel."""
    return shipped("schemas")


@lru_cache(maxsize=1)
def _validators() -> dict:
    """One validator per kind, from every `*.schema.json`; a new schema file is a new kind."""
    from jsonschema import Draft202012Validator, FormatChecker
    from jsonschema.exceptions import SchemaError
    from referencing import Registry, Resource

    schemas = {}
    for file in sorted(schemas_dir().glob(f"*{SCHEMA_SUFFIX}")):
        schema = json.loads(file.read_text(encoding="utf-8"))
        if schema.get("$id") != SCHEMA_ID_BASE + file.name:
            raise ManifestError(f"{file}: $id must be {SCHEMA_ID_BASE + file.name}, got {schema.get('$id')!r}")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ManifestError(f"{file}: not a valid JSON Schema: {one_line(exc.message)}") from None
        schemas[file.name[: -len(SCHEMA_SUFFIX)]] = schema
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    return {kind: Draft202012Validator(schema, registry=registry, format_checker=FormatChecker())
            for kind, schema in schemas.items() if kind != "common"}


def known_kinds() -> list[str]:
    return sorted(_validators())


def one_line(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    """Messages can quote whole sub-documents; keep each problem to one readable line."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pointer(parts: Iterable) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def validate_document(doc, *, path: Path | str | None = None) -> list[Problem]:
    """Every schema problem of one document, sorted by JSON pointer; [] if it is valid."""
    file = str(path) if path is not None else "<document>"
    if not isinstance(doc, dict):
        return [Problem(file, "", "type", f"a manifest is a JSON object, not {type(doc).__name__}")]
    kind = doc.get("kind")
    validator = _validators().get(kind) if isinstance(kind, str) else None
    if validator is None:
        what = "no kind" if kind is None else f"kind {kind!r}"
        return [Problem(file, "/kind", "unknown-kind", f"{what}; known kinds: {', '.join(known_kinds())}")]
    problems = {Problem(file, _pointer(error.absolute_path), str(error.validator), one_line(error.message))
                for error in validator.iter_errors(doc)}
    if any(p.rule != "unevaluatedProperties" for p in problems):  # a failing subschema leaves the fields it
        # declares unevaluated, so beside another problem this would name declared fields as unexpected
        problems = {p for p in problems if p.rule != "unevaluatedProperties"}
    return sorted(problems, key=lambda p: (p.pointer, p.rule, p.message))


# ---- hash links --------------------------------------------------------------------------------

def is_file_reference(node) -> bool:
    return isinstance(node, dict) and frozenset(node) in REFERENCE_KEYS


def _references(doc) -> Iterable[tuple[str, dict]]:
    """(pointer, reference) for every file reference in the document, in document order."""
    stack = [("", doc)]
    while stack:
        pointer, node = stack.pop()
        if is_file_reference(node):
            yield pointer, node
        elif isinstance(node, dict):
            stack += reversed([(pointer + _pointer([k]), v) for k, v in node.items() if isinstance(v, (dict, list))])
        elif isinstance(node, list):  # scalars hold no reference: a 100 MB list of numbers named none of its
            # 50 million items (it took 7.5 GB; an outside tester's, 2026-12-06)
            stack += reversed([(f"{pointer}/{i}", v) for i, v in enumerate(node) if isinstance(v, (dict, list))])


def _resolve(ref: dict, manifest_path: Path, root: Path | None = None) -> tuple[Path | None, str | None]:
    """The referenced file, or why the reference's path is unusable. With a `root` (the evidence tree), the
    path is resolved as written, following no symbolic link, and must stay inside the root and pass through
    no link: evidence names its files, and a link could make a checked file stand for one outside the tree."""
    rel = ref["path"]
    if not isinstance(rel, str) or not rel:
        return None, f"path must be a non-empty string, got {rel!r}"
    if rel.startswith("/") or "\\" in rel or (len(rel) > 1 and rel[1] == ":"):
        return None, f"path {rel!r} must be relative, with forward slashes"
    target = manifest_path.parent / rel
    if root is None:
        return target, None
    root = Path(os.path.abspath(root))
    plain = Path(os.path.normpath(os.path.abspath(target)))
    if not plain.is_relative_to(root):
        return None, (f"path {rel!r} leaves the evidence tree {root} (name the tree's top folder, or the work "
                      "folder holding its Snakefile)")
    for step in [plain, *plain.parents]:
        if step == root:
            break
        if step.is_symlink():
            return None, f"path {rel!r} passes through the symbolic link {step}: evidence links name files, not links"
    return plain, None


def evidence_root(path: Path | str) -> Path:
    """The folder a named path's links may not leave: the work folder it lies in (the nearest folder holding
    a Snakefile: a run's `resources/` are evidence too, and a bundle's `data/` holds its Snakefile), else the
    named folder itself (a named file's own folder); where no Snakefile is found, the nearest sealed tree holding it
    (a folder with the seal's run.json), so a manifest or a folder inside a sealed tree is checked within it."""
    here = Path(os.path.abspath(path))
    start = here if here.is_dir() else here.parent
    for folder in [start, *start.parents]:
        if (folder / "Snakefile").is_file():
            return folder
    return next((folder for folder in [start, *start.parents] if (folder / RUN_MANIFEST).is_file()), start)


def check_references(doc, manifest_path: Path | str, *, hashes: dict | None = None,
                     root: Path | None = None) -> list[Problem]:
    """Every file reference exists and has the recorded SHA-256 (and size, when recorded); with a `root`,
    each lies inside it and passes through no symbolic link (`_resolve`).

    `hashes` caches digests by (path, size, mtime) across manifests, so a file linked from many
    manifests is read once.
    """
    manifest_path = Path(manifest_path)
    file = str(manifest_path)
    hashes = {} if hashes is None else hashes
    problems = []
    for pointer, ref in _references(doc):
        target, why = _resolve(ref, manifest_path, root)
        if target is None:
            problems.append(Problem(file, pointer, "bad-path", why))
            continue
        if not target.is_file():
            what = "is not a file" if target.exists() else "does not exist"
            problems.append(Problem(file, pointer, "file-missing", f"{target} {what}"))
            continue
        info = target.stat()
        key = (os.path.abspath(target), info.st_size, info.st_mtime_ns)
        try:
            if key not in hashes:
                hashes[key] = sha256_file(target)
        except OSError as exc:
            problems.append(Problem(file, pointer, "unreadable", one_line(f"{target}: {exc}")))
            continue
        size_note = (f" ({info.st_size} bytes, the manifest says {ref['bytes']!r})"
                     if "bytes" in ref and ref["bytes"] != info.st_size else "")
        if hashes[key] != ref["sha256"]:
            problems.append(Problem(file, pointer, "sha256-mismatch",
                                    f"{target} has SHA-256 {hashes[key]}, the manifest says {ref['sha256']!r}"
                                    + size_note))
        elif size_note:  # right content, wrong recorded size: the manifest writer has a bug
            problems.append(Problem(file, pointer, "bytes-mismatch", f"{target} has the recorded SHA-256" + size_note))
    return problems


# ---- validating trees --------------------------------------------------------------------------

def looks_like_manifest(doc) -> bool:
    """A JSON object with a `schema_version`, or one whose `kind` names a manifest kind (a schema of `schemas/`):
    validating one that lacks its kind or its schema version names what it lacks. Needing both let a manifest with
    its `schema_version` deleted pass for one of the tree's plain files: `parity validate` counted one manifest
    fewer and passed, and `parity seal` linked it as a plain file (an outside evaluator's pass)."""
    if not isinstance(doc, dict):
        return False
    if "schema_version" in doc:  # with or without its kind: one deleted is named by validating it
        return True
    return isinstance(doc.get("kind"), str) and doc["kind"] in _validators()


def is_manifest_file(path: Path | str) -> bool:
    """A readable file holding a manifest as the tree's walk finds one (`looks_like_manifest`); a file that is not a
    JSON object is a plain file here."""
    try:
        return looks_like_manifest(read_manifest(path))
    except ParityError:
        return False


MANIFEST_NAMES = frozenset({"experiment.json", "report.json", "mlperf-run.json", "fetch-receipt.json",
                            "articles.receipt.json", "cleanup-replicas.json", "cleanup-flame.json"})
MANIFEST_FOLDERS = frozenset({"trials", "pairs", "cleanup"})  # an experiment's folders, holding manifests alone


def _manifest_belongs(file: Path) -> bool:
    """Whether parity writes a manifest at this path (`MANIFEST_NAMES`, or a file of `MANIFEST_FOLDERS`): one
    found there that is not a manifest is named, not skipped as a plain file (an outside tester's `null` in
    place of experiment.json passed `parity validate`)."""
    return file.name in MANIFEST_NAMES or file.parent.name in MANIFEST_FOLDERS


def _found_in(folder: Path) -> list[Path]:
    """`*.json` under a folder, sorted, leaving out hidden files and folders (.snakemake, editors' files). A
    folder named `*.json` is in it, so it is reported where a manifest belongs (a manifest replaced by a folder
    passed an unsealed tree silently); other special files are `seal.not_evidence`'s to name."""
    return sorted(p for p in folder.rglob("*.json") if (p.is_file() or p.is_dir())
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _not_plain(file: Path) -> Problem:
    return Problem(str(file), "", "not-json", f"{file} is not a plain file (a folder, named pipe, socket or device): "
                   "a manifest is a plain JSON file")


def manifests_in(folder: Path | str, unreadable: list[Problem] | None = None) -> list[tuple[Path, dict]]:
    """Every manifest under a folder, as `validate_paths` finds them, parsed; a `*.json` that is not JSON is
    skipped, or added to `unreadable` as `validate_paths` reports it (a manifest emptied or cut short is not
    JSON, and must not pass for one of the tree's plain files), as is JSON that is not a manifest where one
    belongs (`_manifest_belongs`)."""
    found = []
    for file in _found_in(Path(folder)):
        if not file.is_file():
            if unreadable is not None:
                unreadable.append(_not_plain(file))
            continue
        try:
            doc = strict_loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            if unreadable is not None:
                unreadable.append(Problem(str(file), "", "not-json", one_line(str(exc))))
            continue
        if looks_like_manifest(doc):
            found.append((file, doc))
        elif unreadable is not None and _manifest_belongs(file):
            unreadable += validate_document(doc, path=file)
    return found


def linked_files(doc, manifest_path: Path | str) -> list[Path]:
    """The files a manifest links by hash, resolved from its folder (links with unusable paths left out)."""
    targets = (_resolve(ref, Path(manifest_path))[0] for _, ref in _references(doc))
    return [Path(os.path.abspath(t)) for t in targets if t is not None]


def _derived(derive: Callable[[Path, dict], list[Problem]], file: Path, doc: dict,
             missing: list[str]) -> list[Problem]:
    """`derive(file, doc)` for a sound document, even where a file it links is missing: a forged trial beside an
    unarchived trace must still be named. What the derivation says of a missing link restates it, so it is left
    out, and a derivation the missing file stops is skipped (the missing file is already named)."""
    if not missing:
        return derive(file, doc)
    try:
        found = derive(file, doc)
    except (OSError, ValueError, ParityError):
        return []
    return [p for p in found if not any(p.pointer == m or p.pointer.startswith(m + "/") for m in missing)]


def validate_paths(paths: Iterable[Path | str], *, derive: Callable[[Path, dict], list[Problem]] | None = None,
                   contained: bool = False, root: Path | None = None) -> tuple[int, list[Problem]]:
    """Validate manifests and everything they link by hash; returns (manifests checked, problems).

    A named file is always validated. In a named folder, every `*.json` that is a JSON object with
    `kind` and `schema_version`, or with a `kind` that names a manifest kind, is a manifest
    (`looks_like_manifest`); other JSON (a tokenizer.json, say) is skipped, but a file that is not valid
    JSON at all is reported, and so is any JSON where parity writes a manifest (`_manifest_belongs`).
    Manifests linked from a checked manifest (`*.json` references) are checked too, wherever they live, so
    naming the top of a tree checks all of it. Each manifest is checked once. `derive(path, doc)`
    (`parity.rederive`) is asked, for each manifest that is schema-valid with every link's hash right, what it
    states that its content does not give; a link's file missing does not stop that (`_derived`).
    `contained`: every link stays inside the named path's evidence tree (`evidence_root`, or `root` for all),
    through no symbolic link.
    """
    queue: list[tuple[Path, bool, Path | None]] = []  # (file, named explicitly, the evidence tree it may not leave)
    for raw in paths:
        named = Path(raw)
        tree = (root or evidence_root(named)) if contained else None
        queue += [(f, False, tree) for f in _found_in(named)] if named.is_dir() else [(named, True, tree)]

    seen: set[str] = set()
    hashes: dict = {}
    checked, problems = 0, []
    while queue:
        file, explicit, tree = queue.pop(0)
        key = os.path.abspath(file)
        if key in seen:
            continue
        seen.add(key)
        if file.exists() and not file.is_file():  # reading a named pipe would wait for a writer forever
            problems.append(_not_plain(file))
            checked += explicit
            continue
        try:
            doc = strict_loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            problems.append(Problem(str(file), "", "file-missing", f"{file} does not exist"))
            continue
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # a JSON list or string is fine here
            problems.append(Problem(str(file), "", "not-json", one_line(str(exc))))
            checked += explicit
            continue
        if not explicit and not looks_like_manifest(doc) and not _manifest_belongs(file):
            continue
        checked += 1
        found = validate_document(doc, path=file) + check_references(doc, file, hashes=hashes, root=tree)
        if derive is not None and all(p.rule == "file-missing" for p in found):  # a sound document, maybe
            found += _derived(derive, file, doc, missing=[p.pointer for p in found])  # with a file missing
        problems += found
        linked = []
        for _, ref in _references(doc):
            target, _why = _resolve(ref, file, tree)
            if target is not None and target.suffix == ".json" and target.is_file():
                linked.append((target, False, tree))
        queue = linked + queue  # depth-first: a manifest's links are reported right after it
    return checked, problems
