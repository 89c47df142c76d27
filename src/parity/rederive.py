"""What a re-hash cannot forge: the facts a result rests on, derived again from what each manifest cites.

A hash chain proves only that nothing changed since someone last hashed it. A forger who edits a trial
and re-writes the SHA-256 and sizes up the chain (trial → experiment → report → run) passes every hash
check. So validation also derives, from the content, what a manifest states that a result rests on and
names a disagreement (rule `disagrees`): a trial's timing from its records, its records against one another
(no more cached than a prompt holds, one request per position) and its verdict from its records and trace (each
prompt's hash and length the trace's), and whether its outputs are the simulator's (`checks`); a pair's rates, ratio and pinning from its
two trials (`stats`); an experiment's cases (every one its settings plan), pairs, offline limits and backend (engine, GPUs, warm-ups, simulator parameters) from its
trials (`experiments.derive`); an MLPerf run's result from its LoadGen logs, a comparison from its two runs
(`mlperf`); a report's page, tables, numbers and label, composed again from the manifests it links
(`report.build`); the run manifest's label from the manifests it links (here); a cleanup receipt's verdict
from its errors (`procs`); a trace as the engines would take it, and built again from its inputs and spec
(`trace`). A forgery of those must then be consistent with the trace and with itself on every line. Not
derived: what a manifest records as given (settings, versions, GPU names, `ran_with`, what each cleaned-up
process did); those, and a forger who re-runs all of it on invented records,
only a signature by a key the reviewer trusts can vouch for: `parity.signature`.

Each room keeps its own derivation beside the code that writes the manifest; this module only routes by
kind, so `manifest.validate_paths` (below every room) stays ignorant of what a kind means.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from parity.errors import ParityError
from parity.manifest import Problem, is_manifest_file, read_manifest, validate_paths

RULE = "disagrees"


def _derivers() -> dict:
    """kind → function(path, doc) giving (pointer, why) pairs; imported on first use (the report pulls in plots)."""
    from parity import checks, procs, stats, trace
    from parity.experiments import derive
    from parity.fetch import transfer
    from parity.mlperf import logs
    from parity.report import build

    return {"trial": checks.derived_problems, "pair": stats.pair_problems, "experiment": derive.derived_problems,
            "report": build.derived_problems, "mlperf": logs.derived_problems, "run": _run_problems,
            "cleanup-receipt": procs.receipt_problems, "fetch-receipt": transfer.receipt_problems,
            "trace": trace.derived_problems}


def problems(path: Path, doc: dict) -> list[Problem]:
    """What the manifest at `path` states that its content and the files it cites do not give."""
    derive = _derivers().get(doc.get("kind"))
    if derive is None:
        return []
    return [Problem(str(path), pointer, RULE, why) for pointer, why in derive(Path(path), doc)]


def validate(paths: Iterable[Path | str], root: Path | None = None) -> tuple[int, list[Problem]]:
    """`manifest.validate_paths` (schemas, hash links inside the evidence tree: `root`, or each named path's
    own), each sound manifest's statements derived again: what `parity validate`, `seal` and
    `validate --bundle` check."""
    return validate_paths(paths, derive=problems, contained=True, root=root)


def is_superseded(path: Path, doc: dict) -> bool:
    """A trial, pair or cleanup receipt no manifest links, in the folders of an experiment that has its manifest: of
    none of its cases (a Flame arm a profile switched off, fewer pairs, a device run's narrowed stage), an earlier
    run's. `parity.seal` links it as `superseded`, not among the tree's tops: the bundle carried a switched-off arm's
    pairs as evidence of a run whose settings say they never ran (outside pass M)."""
    return (doc.get("kind") in ("trial", "pair", "cleanup-receipt")
            and path.parent.name in ("trials", "pairs", "cleanup") and (path.parent.parent / "experiment.json").is_file())


def _run_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) where a run manifest's label (`parity.seal`, which validates through this module, so its one
    derivation lives here) disagrees with the manifests it links: it is `simulated` exactly when one of its tops
    is (each top's own label derived from its content in turn), so a simulated tree cannot be relabelled a
    measurement by editing run.json."""
    folder = Path(path).parent
    try:
        labels = [read_manifest(folder / ref["path"]).get("simulated") for ref in doc["manifests"]]
    except ParityError as exc:
        return [("/manifests", f"a manifest it links cannot be read: {exc}")]
    if doc["simulated"] != any(labels):
        return [("/simulated", f"states {doc['simulated']}, the manifests it links give the opposite")]
    for number, ref in enumerate(doc["files"]):  # nor is a plain file's list: a top listed there (a simulated
        # experiment, say) would leave the label above to the tops left (outside pass N)
        hidden = any(part.startswith(".") for part in Path(ref["path"]).parts)  # the seal's walk skips these too
        if ref["path"].endswith(".json") and not hidden and is_manifest_file(folder / ref["path"]):
            return [(f"/files/{number}", f"{ref['path']} is a manifest: the seal lists a manifest that none links "
                                         "under manifests, never among plain files")]
    for number, ref in enumerate(doc.get("superseded", [])):  # never a place to hide a top (an experiment, a report)
        target = folder / ref["path"]
        try:
            superseded = is_superseded(target, read_manifest(target))
        except ParityError as exc:
            return [(f"/superseded/{number}", f"cannot be read: {exc}")]
        if not superseded:
            return [(f"/superseded/{number}", f"{ref['path']} is no trial, pair or cleanup receipt in an experiment's "
                                              "folders: the seal links only those as superseded")]
    return []
