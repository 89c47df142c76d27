"""The run manifest: every file a results tree keeps, linked by path and SHA-256 from one place.

Each step's manifest links what that step made (a trial its records, an experiment its trials and
cleanup receipts, a trace its corpus and tokenizer). `seal` validates them all, then writes
`RESULTS/run.json` (kind `run`) linking the rest: every manifest no other manifest links (the tree's
tops: experiments, MLPerf runs, the report, ...), every kept file no manifest links (logs, LoadGen's
side files, the tokenizer's config), and the run's inputs from outside the tree (fetch receipts). So
naming the tree checks every kept file, and a file added to a sealed tree is named (`unlinked`).

`all` seals on every run (the seal vouches for the tree as it is then); a tree that fails validation
is not sealed, and an earlier seal of it is removed, so nothing vouches for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from stat import S_ISREG

from parity.errors import ParityError
from parity.manifest import (RUN_MANIFEST, Problem, evidence_root, file_ref, header, linked_files, manifests_in,
                             read_manifest, write_manifest)
from parity.rederive import is_superseded, validate
from parity.signature import SIGNATURE

KIND = "run"
NOT_KEPT = (".lock",)  # GPU lock files: the lock, not evidence
LOG_SUFFIXES = (".log", ".out", ".err")  # kept unless empty


class SealError(ParityError):
    """A tree that cannot be sealed: its manifests do not validate, or it holds the command's own output."""


def kept(results: Path) -> list[Path]:
    """The files of a results tree a run keeps, relative to it: all but empty logs, GPU lock files and the
    signature over run.json (`parity.signature`: it vouches for the run manifest, so nothing can link it)."""
    files = []
    for path in sorted(Path(results).rglob("*")):
        if not path.is_file() or path.is_symlink() or path == Path(results) / SIGNATURE:
            continue
        if (path.suffix in NOT_KEPT or (path.suffix in LOG_SUFFIXES and path.stat().st_size == 0)
                or _leftover(path)):  # a killed write's temporary file is never evidence (`not_evidence` names it)
            continue
        files.append(path.relative_to(results))
    return files


def _leftover(path: Path) -> bool:
    """A temporary file of parity's atomic writes (`manifest.atomic_write_bytes`: `.NAME.XXXX.tmp`), left when
    the write was killed before its rename."""
    return path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file()


def not_evidence(results: Path) -> list[Problem]:
    """What must not be in an evidence tree, named, in one walk of it: symbolic links and special files (a named
    pipe, a socket, a device: evidence is plain files, and a link could stand for anything; a pipe was skipped
    silently until an outside evaluator's 2026-12-05 pass), and the temporary files killed writes left (its second
    pass: seal linked one into run.json and the bundle carried it)."""
    problems = []
    for path in sorted(Path(results).rglob("*")):
        if path.is_symlink():
            problems.append(Problem(str(path), "", "symlink", f"a symbolic link to {os.readlink(path)!r} in the "
                                    f"results tree {results}: evidence is plain files (copy the file in, or remove "
                                    "the link)"))
        elif not (path.is_file() or path.is_dir()):
            problems.append(Problem(str(path), "", "special-file", f"a special file (a named pipe, socket or device) "
                                    f"in the results tree {results}: evidence is plain files (remove it)"))
        elif _leftover(path):
            problems.append(Problem(str(path), "", "leftover", f"a temporary file a killed write left in the results "
                                    f"tree {results}: not evidence (remove it; the step that writes "
                                    f"{path.name[1:].removesuffix('.tmp').rsplit('.', 1)[0]} wrote it again or will)"))
    return problems


def _is_run_manifest(path: Path, doc: dict) -> bool:
    """Of kind `run`, with a schema version, so the walk of its tree validates it (`manifest.validate_paths`)."""
    return path.name == RUN_MANIFEST and doc.get("kind") == KIND and "schema_version" in doc


def _found(results: Path, unreadable: list[Problem] | None = None) -> tuple[list[tuple[Path, dict]], Path | None]:
    """The tree's manifests other than its run manifest, and the run manifest's path if it has one (`unreadable`:
    as `manifests_in`)."""
    manifests, seal = [], None
    for path, doc in manifests_in(results, unreadable):
        if path.parent == results and _is_run_manifest(path, doc):
            seal = path
        else:
            manifests.append((path, doc))
    return manifests, seal


def _linked(manifests: Iterable[tuple[Path, dict]]) -> set[Path]:
    return {target for path, doc in manifests for target in linked_files(doc, path)}


def seal(results: Path, inputs: Iterable[Path] = (), *, log=print) -> tuple[dict | None, list[Problem]]:
    """Validate the tree (and `inputs`), then write its run manifest; returns (summary, problems).

    With problems, no run manifest is written and an earlier one is removed.
    """
    results = Path(results)
    if not results.is_dir():
        raise ParityError(f"no results folder at {results}")
    inputs = [Path(i) for i in inputs]
    for receipt in inputs:  # the run's inputs from outside the tree, by their receipts: nothing else (an outsider's
        # `--input` of a trace inside the tree was linked as an input)
        if Path(os.path.abspath(receipt)).is_relative_to(Path(os.path.abspath(results))):
            raise SealError(f"--input {receipt} lies in {results}: the tree's own manifests are sealed as they are; "
                            "--input names a fetch receipt from outside it")
        kind = read_manifest(receipt).get("kind")
        if kind != "fetch-receipt":
            raise SealError(f"--input {receipt} is a manifest of kind {kind!r}, not a fetch receipt (fetch-receipt)")
    files = [rel for rel in kept(results) if rel != Path(RUN_MANIFEST)]
    own = _own_output()
    mine = [path for path in results.rglob("*") if own and path.is_file() and _identity(path) in own]
    if mine:  # (empty logs too: not kept now, kept once written) it would change after the seal, breaking it at once
        raise SealError(f"{mine[0]} is this command's own output: write it outside the tree it seals")
    unreadable: list[Problem] = []  # a *.json that is not JSON: `parity validate` of the tree reports it too
    manifests, old = _found(results, unreadable)
    if not manifests and not unreadable:
        raise SealError(f"nothing to seal in {results}: it holds no manifest (run the workflow's steps first)")
    log(f"seal: validating {len(manifests)} manifest(s) of {results} and {len(inputs)} input receipt(s)")
    checked, problems = validate([p for p, _ in manifests] + inputs, root=evidence_root(results))
    problems += unreadable + not_evidence(results)
    (results / SIGNATURE).unlink(missing_ok=True)  # it signed the earlier run.json: sign the new one again
    if problems:
        if old is not None:
            old.unlink()
        return None, problems
    before = _linked([(old, read_manifest(old))]) if old is not None else set()
    here = Path(os.path.abspath(results))
    linked = _linked(manifests)
    tops = [(p, d) for p, d in manifests if Path(os.path.abspath(p)) not in linked]
    superseded = [p for p, d in tops if is_superseded(p, d)]
    tops = [(p, d) for p, d in tops if p not in superseded]
    paths = {Path(os.path.abspath(p)) for p, _ in manifests}
    rest = [results / rel for rel in files if (here / rel) not in linked and (here / rel) not in paths]
    # simulated as its tops are (each derived from what it links: rederive), not as a superseded earlier run was
    doc = header(KIND, simulated=any(d.get("simulated") for _, d in tops)) | {
        "results": results.name,
        "manifests": [file_ref(p, results) for p, _ in tops],
        "files": [file_ref(p, results) for p in rest],
        "inputs": [file_ref(p, results) for p in inputs],
    } | ({"superseded": [file_ref(p, results) for p in superseded]} if superseded else {})
    write_manifest(results / RUN_MANIFEST, doc)
    if superseded:
        log(f"seal: {len(superseded)} manifest(s) in experiments' folders are none of their experiments' cases (an "
            "arm switched off, a plan narrowed: an earlier run's), linked as superseded, not as evidence: "
            + ", ".join(str(p.relative_to(results)) for p in superseded[:3]) + (" ..." if len(superseded) > 3 else ""))
    adopted = sorted((p for p in rest if Path(os.path.abspath(p)) not in before), key=str)
    if old is not None and adopted:  # a re-seal vouches for these now: say which, so a stray file is seen
        log(f"seal: {len(adopted)} file(s) linked by no manifest, and not by the earlier seal, are linked now: "
            + ", ".join(str(p.relative_to(results)) for p in adopted))
    summary = {"run_manifest": str(results / RUN_MANIFEST), "manifests": checked, "tops": len(tops),
               "files": len(rest), "inputs": len(inputs), "kept": len(files) + 1}
    return summary, []


def _identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino


def _own_output() -> set[tuple[int, int]]:
    """The files this process's stdout and stderr are redirected to."""
    found = set()
    for fd in (1, 2):
        try:
            stat = os.fstat(fd)
        except OSError:
            continue
        if S_ISREG(stat.st_mode):
            found.add((stat.st_dev, stat.st_ino))
    return found


def superseded(results: Path) -> set[Path]:
    """The files of a sealed tree that only its run manifest's `superseded` entries reach (those manifests and what
    they link, less what any other manifest links), relative to it: an earlier run's, never evidence of this one (the
    bundle names no GPU or version from them); empty for a tree not sealed or with none."""
    results = Path(results)
    manifests, run = _found(results)
    if run is None or not (refs := read_manifest(run).get("superseded")):
        return set()
    here = Path(os.path.abspath(results))
    old = {here / ref["path"] for ref in refs}
    reached = old | _linked([(p, d) for p, d in manifests if Path(os.path.abspath(p)) in old])
    current = _linked([(p, d) for p, d in manifests if Path(os.path.abspath(p)) not in reached])
    return {path.relative_to(here) for path in reached - current if path.is_relative_to(here)}


def unlinked(results: Path) -> list[Problem]:
    """In a sealed tree, every kept file no manifest links (one added after the seal); [] for an unsealed tree."""
    results = Path(results)
    manifests, run = _found(results)
    if run is None:
        return []
    linked = _linked(manifests + [(run, read_manifest(run))])
    here = Path(os.path.abspath(results))
    return [Problem(str(results / rel), "", "unlinked",
                    f"kept in the sealed tree {results} but linked by no manifest (added after its run manifest?)")
            for rel in kept(results) if (here / rel) not in linked and rel != Path(RUN_MANIFEST)]


def sealed_trees(folder: Path) -> list[Path]:
    """The sealed results trees under `folder` (each folder holding a run manifest), shallowest first."""
    trees = []
    for path in Path(folder).rglob(RUN_MANIFEST):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        try:
            if _is_run_manifest(path, read_manifest(path)):
                trees.append(path.parent)
        except ParityError:
            continue  # not a manifest: validating the tree reports it
    return sorted(trees, key=lambda t: (len(t.parts), str(t)))


def not_a_seal(results: Path) -> list[Problem]:
    """A `run.json` at the top of a tree that is not a run manifest (kind `run`, with a schema version, so it is
    validated as one), named: otherwise the tree reads as sealed to whoever sees the file, while nothing checks
    its kept files against it (an outside tester's `{}` passed `parity validate` with a file added and a log
    removed)."""
    path = Path(results) / RUN_MANIFEST
    why = f"a tree's {RUN_MANIFEST} is its run manifest, which `parity seal` writes"
    if not path.is_file() or path.is_symlink():  # none; or a folder, a named pipe, a link, which the walk of the
        return []  # tree (`manifest.validate_paths`) or `not_evidence` names (reading a pipe would wait forever)
    try:
        doc = read_manifest(path)
    except ParityError as exc:
        return [Problem(str(path), "", "not-a-seal", f"{str(exc).removeprefix(f'{path}: ')}: {why}")]
    if not _is_run_manifest(path, doc):
        return [Problem(str(path), "/kind", "not-a-seal", f"not a run manifest (kind {doc.get('kind')!r}"
                        + ("" if "schema_version" in doc else ", no schema_version") + f"): {why}")]
    return []


def certify(paths: Iterable[Path]) -> tuple[int, list[Problem]]:
    """What `parity validate` checks of named manifests and trees (`rederive.validate`) and, in each named tree,
    that nothing in it is not evidence (`not_evidence`), that a `run.json` there is a run manifest
    (`not_a_seal`) and, where it is sealed, that every kept file is linked; returns (manifests checked, problems)."""
    paths = [Path(p) for p in paths]
    checked, problems = validate(paths)
    return checked, problems + [problem for path in paths if path.is_dir()
                                for problem in not_a_seal(path) + unlinked(path) + not_evidence(path)]
