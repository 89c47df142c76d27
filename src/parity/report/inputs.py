"""The evidence a report reads: experiment and MLPerf manifests, every link checked by hash first.

A report is only as good as the files under it, so a missing manifest, a schema problem or a hash
mismatch stops it with one line instead of printing numbers from a tree that changed after the run.
Each trial must also be a valid trial manifest whose stated timing is what its records give, so a rate
edited before the experiment manifest recorded the trial is refused as well; and the experiment and each pair
must state what `parity validate` derives again from their trials (a re-hash forges no link), and so must each
trial; its verdict and whether its outputs are the simulator's only where its trace can be read (a session archive
holds none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path

from parity.checks import read_trial
from parity.errors import ParityError, first_problem
from parity.manifest import Problem, check_references, evidence_root, read_manifest, validate_document
from parity.workflow_config import experiment_names

EXPERIMENTS = tuple(experiment_names())  # the config schema's, the one list of them
MLPERF_RUN = "mlperf-run.json"
LINKED = "a symbolic link, which `parity validate` refuses: evidence names its files, not links"


def _checked(path: Path, kind: str, root: Path | None = None) -> dict:
    """A manifest of `kind`, schema-valid, whose file references all resolve with their recorded hashes (with a
    `root`, each inside it and through no symbolic link, as `parity validate` holds them)."""
    doc = read_manifest(path)
    if doc.get("kind") != kind:
        what = "not a parity manifest (no kind)" if doc.get("kind") is None else f"a {doc['kind']!r} manifest"
        raise ParityError(f"{path}: {what}, expected {kind!r}")
    problems = validate_document(doc, path=path) + check_references(doc, path, root=root)
    if problems:
        raise ParityError(first_problem(problems))
    return doc


Derive = Callable[[Path, dict], list[Problem]]  # parity.rederive.problems: what validate derives of a manifest


def _derived(path: Path, doc: dict, derive: Derive | None) -> None:
    """`derive(path, doc)` gives nothing, less "/trace" (a trial's trace cannot be read: a session archive holds
    none): a trial swapped, a pair linking another's trial, a stage relabelled, a case listed twice or a simulated
    trial relabelled, all re-hashed, would pass the hash checks alone. The caller gives `derive` (the `report`
    command gives parity.rederive's), since the re-derivation runs the plan, which this room does not import."""
    if derive is None:
        return
    found = [problem for problem in derive(path, doc) if problem.pointer != "/trace"]
    if found:
        raise ParityError(first_problem(found))


def _utf8(path: Path) -> None:
    """A path the report can name: report.md and report.json are UTF-8, which a name of other bytes is not."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise ParityError(f"{shown}: its name is not UTF-8, so the report cannot name it: rename it") from None


def _linked(ref: dict, manifest: Path) -> Path:
    return Path(os.path.normpath(manifest.parent / ref["path"]))


@dataclass
class Experiment:
    """One experiment manifest with its trial and pair manifests, read once."""

    path: Path
    doc: dict
    trials: dict[str, dict] = field(default_factory=dict)  # trial_id -> trial manifest
    pairs: list[tuple[dict, dict, dict]] = field(default_factory=list)  # (pair, reference, candidate)

    @property
    def name(self) -> str:
        return self.doc["experiment"]

    @property
    def cases(self) -> list[dict]:
        return self.doc["cases"]

    def trials_where(self, **match) -> list[dict]:
        """Trial manifests of the cases whose experiment.json entries carry every key=value given."""
        return [self.trials[c["trial_id"]] for c in self.cases if all(c.get(k) == v for k, v in match.items())]

    def pair_manifests_where(self, stage: str, trace_name: str) -> list[tuple[dict, dict, dict]]:
        """(pair, reference, candidate) of one stage on one trace."""
        return [(pair, ref, cand) for pair, ref, cand in self.pairs
                if pair.get("stage") == stage and pair["trace_name"] == trace_name]

    def pairs_where(self, stage: str, trace_name: str) -> list[tuple[dict, dict]]:
        return [(ref, cand) for _, ref, cand in self.pair_manifests_where(stage, trace_name)]


def load_experiment(path: Path, derive: Derive | None = None) -> Experiment:
    """An experiment manifest (file, or folder holding experiment.json) with its linked trials and pairs. Not
    `derive`: each trial, pair and the experiment derived again (`_derived`; the `report` command's)."""
    path = Path(path)
    if path.is_dir():
        path = path / "experiment.json"
    if path.exists() and not path.is_file():  # a pipe, a device: there, but no manifest (said as missing before)
        raise ParityError(f"{path}: not a regular file, so no experiment manifest")
    if not path.is_file():
        raise ParityError(f"{path}: no experiment manifest (run `parity experiment run` first)")
    _utf8(path)
    root = evidence_root(path)  # a trial linked through a symbolic link could stand for one outside the tree
    plain = Path(os.path.abspath(path))
    link = next((step for step in [plain, *plain.parents] if step == root or step.is_symlink()), root)
    if link != root:  # experiment.json, or a folder of its tree, standing for one elsewhere
        raise ParityError(f"{link}: {LINKED}")
    doc = _checked(path, "experiment", root)
    from parity.stats import rps

    experiment = Experiment(path, doc)
    by_path: dict[Path, dict] = {}
    for case in doc["cases"]:
        trial_path = _linked(case["manifest"], path)
        by_path[trial_path] = experiment.trials[case["trial_id"]] = read_trial(trial_path)
        _derived(trial_path, by_path[trial_path], derive)
    for ref in doc["pairs"]:
        pair_path = _linked(ref, path)
        pair = _checked(pair_path, "pair", root)
        sides = []
        for side in ("reference", "candidate"):
            trial_path = _linked(pair[side]["manifest"], pair_path)
            if trial_path not in by_path:
                by_path[trial_path] = read_trial(trial_path)
            sides.append(by_path[trial_path])
        if rps(sides[0]) <= 0:  # a ratio over it is undefined (stats divides by it)
            raise ParityError(f"{_linked(pair['reference']['manifest'], pair_path)}: /timing/requests_per_s: 0, so "
                              f"the ratio of pair {pair_path} is undefined (no request completed after release)")
        _derived(pair_path, pair, derive)
        experiment.pairs.append((pair, *sides))
    _derived(path, doc, derive)
    return experiment


def find_experiments(results: Path) -> list[Path]:
    """RESULTS/NAME/experiment.json, as the workflow lays them out; a NAME that is a symbolic link is refused (an
    experiment elsewhere would be reported as this run's, and `parity validate RESULTS` refuses it)."""
    found = sorted(results.glob("*/experiment.json"))
    if link := next((p.parent for p in found if p.parent.is_symlink()), None):
        raise ParityError(f"{link}: {LINKED}")
    return found


def load_experiments(paths: list[Path], derive: Derive | None = None) -> dict[str, Experiment]:
    """Experiments by name; two manifests of the same experiment are ambiguous and refused."""
    out: dict[str, Experiment] = {}
    for path in paths:
        experiment = load_experiment(path, derive)
        if experiment.name in out and out[experiment.name].path.resolve() == experiment.path.resolve():
            continue  # one manifest named twice (its folder and its file): once
        if experiment.name in out:
            raise ParityError(f"two {experiment.name} experiments: {out[experiment.name].path} and {experiment.path}")
        out[experiment.name] = experiment
    return out


@dataclass
class MlperfRun:
    """One `parity mlperf run` performance manifest, keyed like the study's rows (standalone, flame-b64)."""

    path: Path
    doc: dict

    @property
    def key(self) -> str:
        if self.doc["arm"] == "standalone":
            return "standalone"
        return f"flame-b{self.doc['path'].get('batch_limit')}"


def load_mlperf(folder: Path | None) -> tuple[list[MlperfRun], list[tuple[Path, dict]]]:
    """Performance runs and compare manifests under `folder`; ([], []) if it is absent or holds none."""
    if folder is None or not Path(folder).is_dir():
        return [], []
    found = []
    for path in sorted(Path(folder).rglob("*.json")):
        if path.name == MLPERF_RUN:  # a run's manifest by name: one that cannot be read is refused, not skipped
            found.append(path)  # (an arm otherwise shown "not run")
            continue
        try:
            doc = read_manifest(path)
        except ParityError:  # other JSON (a tokenizer, a dataset) is not evidence of the control
            continue
        if doc.get("kind") == "mlperf":
            found.append(path)
    return mlperf_from_files(found, folder)


def mlperf_from_files(paths: list[Path], folder: Path | None = None) -> tuple[list[MlperfRun], list[tuple[Path, dict]]]:
    """The performance runs and compare manifests among `paths` (MLPerf manifests; others are refused)."""
    runs, compares = [], []
    for path in paths:
        _utf8(path)
        doc = _checked(path, "mlperf")
        if doc["step"] == "run" and doc["mode"] == "performance":
            runs.append(MlperfRun(path, doc))
        elif doc["step"] == "compare":
            compares.append((path, doc))
    keys = [r.key for r in runs]
    if len(set(keys)) != len(keys):
        raise ParityError(f"{folder or 'the MLPerf manifests given'}: more than one MLPerf performance run of one configuration: {sorted(keys)}")
    return runs, compares
