"""Assemble the report: OUT/report.md, OUT/*.png, OUT/report.html (the same, one self-contained page) and
OUT/report.json linking all of it by hash.

The header says plainly where the numbers come from (simulator + Flame stand-in, real GPUs + Flame
v0.6.0, or a mix), so no simulated figure is read as a measurement. report.json is written last and
links every manifest and file it used, so `parity validate OUT` checks the whole tree.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from parity.errors import ParityError
from parity.manifest import (atomic_write_bytes, atomic_write_text, file_ref, first_difference, header,
                             write_manifest)
from parity.report import plots, tables
from parity.report.inputs import EXPERIMENTS, Derive, load_experiments, load_mlperf
from parity.report.reference import load_reference

CLUSTERS = {"stand-in": "the CPU Flame stand-in (not Flame itself)", "flame-v0.6.0": "real Flame v0.6.0"}
EVIDENCE = {
    "simulated": "**Simulated** (CPU simulator engine). No reproduced number below is a measurement; none can "
                 "confirm or refute the study's measured numbers.",
    "measured": "**Measured** (real vLLM on real GPUs). Every reproduced number below is a measurement.",
    "mixed": "**Mixed: simulated and measured.** Some reproduced numbers come from the CPU simulator, some from "
             "real vLLM on real GPUs; each row's Source column says which.",
    None: "**No reproduced numbers.** No experiment or MLPerf manifest was given.",
}


def _clusters(experiments: dict, runs: list) -> list[str]:
    found = {c["cluster"] for e in experiments.values() for c in e.cases if c.get("system") == "flame" and c.get("cluster")}
    found |= {r.doc["path"].get("cluster") for r in runs if r.doc["arm"] == "flame" and r.doc["path"].get("cluster")}
    return sorted(found)


def _engine(experiment) -> str:
    """The engine as its trials recorded it: the simulator, or vLLM's version and the weights it loaded."""
    backend = experiment.doc["backend"]
    if backend["engine"] == "sim":
        return "simulator"
    versions = sorted({d["engine"]["version"] for d in experiment.trials.values() if d["engine"].get("version")})
    weights = backend.get("load_format")
    weights = "dummy (random) weights" if weights == "dummy" else "real weights"
    return f"vLLM {', '.join(versions) or '(version not recorded)'}, {weights}"


def _header(experiments: dict, runs: list, evidence: str | None, clusters: list[str], ref: dict, out: Path) -> str:
    cluster = " and ".join(CLUSTERS.get(c, c) for c in clusters) if clusters else "— (no Flame trial)"
    lines = [f"# Reproduction report: {ref['study']}", "", "Evidence: " + EVIDENCE[evidence], "",
             f"Flame cluster: {cluster}.", "",
             f"The study's numbers (source “study (B200, measured)”) are transcribed in `study-reference.yaml`, "
             f"each with the section it came from; they were measured by the study on "
             f"{ref['final_throughput']['hardware']}, not by this artifact. Only trials that passed every check "
             f"count; failed trials are listed under “Excluded trials”. “—” means no number exists.", "",
             "| Experiment | Manifest | Trials passed / failed | Evidence | Engine | Flame cluster |",
             "|---|---|---|---|---|---|"]
    for name in EXPERIMENTS:
        e = experiments.get(name)
        if e is None:
            lines.append(f"| {name} | — (not run) | — | — | — | — |")
            continue
        docs = list(e.trials.values())
        failed = sum(c["status"] != "passed" for c in e.cases)
        clusters_used = sorted({c["cluster"] for c in e.cases if c.get("cluster")}) or ["—"]
        rel = Path(file_ref(e.path, out)["path"]).as_posix()
        lines.append(f"| {name} | `{rel}` | {len(e.cases) - failed} / {failed} | {tables.evidence(docs)} | "
                     f"{_engine(e)} | {', '.join(clusters_used)} |")
    lines.append(f"| mlperf | {len(runs)} performance run(s) | — | {tables.evidence([r.doc for r in runs]) or '—'} "
                 f"| — | — |")
    sizes = {}
    for e in experiments.values():
        if e.name == "offline-limit":
            continue  # its trials are shards
        for doc in e.trials.values():
            sizes.setdefault(doc["trace_name"], len(doc["records"]))
    study_sizes = {k: v["requests"] for k, v in ref["final_throughput"]["traces"].items()}
    if sizes:
        lines += ["", "Traces: " + ", ".join(
            f"{name} {n} requests (study: {study_sizes.get(name, '—')})" for name, n in sorted(sizes.items()))
                  + ". Rates of traces of different sizes are not comparable with the study's; the ratios are."]
    return "\n".join(lines) + "\n"


@dataclass
class Composed:
    """A report as its inputs give it, before anything is written: the page, the manifest's fields, the plots."""

    markdown: str
    fields: dict  # report.json's own fields (all but the header and the links to the written files)
    plots: dict[str, Path]
    evidence: str | None
    final_table: str


def compose(experiments: dict, runs: list, compares: list, ref: dict, out: Path, plot_dir: Path) -> Composed:
    """Tabulate and plot (into `plot_dir`); the page's links are written as from `out`. Pure but for the plots,
    so `rederive` can compose a written report again from the files it cites and compare."""
    docs = [d for e in experiments.values() for d in e.trials.values()] + [r.doc for r in runs]
    evidence = tables.evidence(docs)
    clusters = _clusters(experiments, runs)
    get = experiments.get
    final, final_data = tables.final_throughput(get("confirmation"), get("offline-limit"), ref)
    flame_arms = tables.confirmation_flame_arms(get("confirmation"))  # none unless the settings name flame_arms
    timeline, histograms = tables.shard_timeline(get("confirmation"))
    locality, locality_data = tables.locality(get("locality"), ref)
    admission, admission_data = tables.admission(get("admission"), get("confirmation"), ref)
    gc, gc_data = tables.gc_diagnostics(get("gc"), ref)
    control = tables.mlperf(runs, compares, ref)
    routing, routing_data = tables.routing(get("routing"), get("confirmation"))
    sustained, sustained_data = tables.sustained(get("sustained"))
    steps, steps_data = tables.sustained_steps(get("sustained"))
    restarts = tables.restarts(get("sustained"))
    excluded = tables.excluded(experiments)

    conf_evidence = tables.evidence([d for e in [get("confirmation")] if e for d in e.trials.values()])
    loc_evidence = tables.evidence([d for e in [get("locality")] if e for d in e.trials.values()])
    routing_evidence = tables.evidence([d for e in [get("routing")] if e for d in e.trials.values()])
    sustained_evidence = tables.evidence([d for e in [get("sustained")] if e for d in e.trials.values()])
    drawn = {name: p for name, p in (
        ("throughput", plots.throughput(final_data["plot"], conf_evidence, plot_dir / "throughput.png")),
        ("ratios", plots.ratios(final_data["plot"], conf_evidence, plot_dir / "ratios.png")),
        ("cached-share", plots.cached_share(locality_data["plot"], loc_evidence, plot_dir / "cached-share.png")),
        ("routing", plots.routing(routing_data["plot"], routing_evidence, plot_dir / "routing.png")),
        ("sustained", plots.sustained(sustained_data["plot"], sustained_evidence, plot_dir / "sustained.png")),
        ("sustained-steps", plots.sustained_steps(steps_data["plot"], sustained_evidence,
                                                  plot_dir / "sustained-steps.png")),
    ) if p is not None}

    parts = [_header(experiments, runs, evidence, clusters, ref, out),
             "## 1. Final throughput\n", final.markdown(), *(t.markdown() for t in flame_arms), timeline.markdown(),
             "## 2. Prefix affinity\n", *(t.markdown() for t in locality),
             "## 3. Admission\n", *(t.markdown() for t in admission),
             "## 4. Python startup heap (GC)\n", gc.markdown(),
             "## 5. MLPerf control\n", control.markdown(),
             "## 6. Routing beyond the study (ours)\n", *(t.markdown() for t in routing),
             "## 7. Sustained load and streaming latency (ours)\n", steps.markdown(), sustained.markdown(),
             restarts.markdown(),
             "## Excluded trials\n"]
    if excluded:
        parts.append("| Experiment | Trial | Why |\n|---|---|---|\n" + "".join(
            f"| {x['experiment']} | {x['trial_id']} | {'; '.join(x['reasons']).replace('|', '/')} |\n" for x in excluded))
    else:
        parts.append("None: every trial passed its checks.\n")
    parts.append("## Plots\n")
    parts.append("".join(f"![{name}]({p.name})\n\n" for name, p in drawn.items())
                 or "None drawn: no confirmation or locality numbers.\n")
    fields = {
        "evidence": evidence or "none",
        "flame_clusters": clusters,
        "missing_experiments": [name for name in EXPERIMENTS if name not in experiments],
        "excluded_trials": excluded,
        "headline": final_data["headline"],
        "batch_histograms": {trace: {str(n): k for n, k in h.items()} for trace, h in histograms.items()},
        "locality_gains": locality_data["gains"],
        "admission_stages": admission_data,
        "gc_max_worker_pause_s": gc_data,
        "sustained_steps": steps_data["steps"],
    }
    return Composed("\n".join(parts), fields, drawn, evidence, final.markdown())


def write_report(experiment_paths: list[Path], mlperf_dir: Path | None, reference_path: Path, out: Path, *,
                 derive: Derive | None = None) -> dict:
    """Read, tabulate, plot, write; returns the report manifest (`derive`: as `load_experiment`). Every file is
    written into a hidden folder inside `out` first and only then moved into place (`_put`): a full disk, or an
    earlier report.html that cannot be replaced, leaves an earlier report whole, never half old, half gone."""
    ref = load_reference(reference_path)
    experiments = load_experiments(experiment_paths, derive)
    runs, compares = load_mlperf(mlperf_dir)
    if not experiments and not runs:
        raise ParityError("nothing to report: no experiment manifest and no MLPerf run was given")
    made_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=out, prefix=".report-") as staged:  # the same file system: a rename
            stage = Path(staged)
            made = compose(experiments, runs, compares, ref, out, stage)
            atomic_write_text(stage / "report.md", made.markdown)
            from parity.report.html import render

            atomic_write_text(stage / "report.html", render(made.markdown, stage))  # the same page, self-contained
            atomic_write_bytes(stage / "study-reference.yaml", Path(reference_path).read_bytes())
            fields = made.fields
            doc = header("report", simulated=made.evidence in ("simulated", "mixed")) | {
                "evidence": fields["evidence"],
                "flame_clusters": fields["flame_clusters"],
                "reference": file_ref(stage / "study-reference.yaml", stage),
                "experiments": {name: file_ref(e.path, out) for name, e in sorted(experiments.items())},
                "missing_experiments": fields["missing_experiments"],
                "mlperf": [file_ref(r.path, out) for r in runs] + [file_ref(p, out) for p, _ in compares],
                "outputs": {"markdown": file_ref(stage / "report.md", stage),
                            "html": file_ref(stage / "report.html", stage),
                            "plots": {name: file_ref(p, stage) for name, p in made.plots.items()}},
            } | {key: fields[key] for key in REDERIVED}
            write_manifest(stage / "report.json", doc)
            names = [p.name for p in made.plots.values()] + ["report.md", "report.html", "study-reference.yaml",
                                                            "report.json"]  # report.json last
            _put(stage, out, names, [name for name in _earlier_plots(out) if name not in names])
    except BaseException:
        if made_out:
            with contextlib.suppress(OSError):  # only where nothing else is in it
                out.rmdir()
        raise
    return {"manifest": doc, "markdown": made.markdown, "final_table": made.final_table, "evidence": made.evidence}


def _put(stage: Path, out: Path, names: list[str], drop: list[str]) -> None:
    """Move the files `names` from `stage` into `out`, and an earlier report's plots `drop` out of it, each earlier
    file set aside in `stage` first: should one move fail (an immutable file), every move made is undone."""
    aside = stage / ".earlier"
    aside.mkdir()
    done, placed = [], []  # names whose earlier file was set aside (or that had none); names put in place
    try:
        for name in [*drop, *names]:
            target = out / name
            if target.is_dir() and not target.is_symlink():
                raise ParityError(f"{target}: a folder where the report writes a file: move it away")
            try:
                earlier = target.exists() or target.is_symlink()
                if earlier:
                    os.replace(target, aside / name)
                done.append((name, earlier))
                if name in names:
                    os.replace(stage / name, target)
                    placed.append(name)
            except OSError as exc:
                if exc.errno is not None:  # name the report's file, not the hidden folder
                    exc.filename, exc.filename2 = str(target), None
                raise
    except BaseException:
        for name, earlier in reversed(done):
            with contextlib.suppress(OSError):
                if name in placed:
                    (out / name).unlink()
                if earlier:
                    os.replace(aside / name, out / name)
        raise


def _earlier_plots(out: Path) -> list[str]:
    """The plots an earlier report in `out` linked (its report.json's outputs), which this one removes: a plot it
    does not draw would stay beside it unlinked, as if it were this run's. Nothing else there is touched: what
    report.json did not link is not a report's."""
    import json

    try:
        plots_linked = json.loads((out / "report.json").read_text(encoding="utf-8"))["outputs"]["plots"].values()
        names = [Path(ref["path"]) for ref in plots_linked]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []  # no earlier report, or none that can be read: nothing of its to remove
    return [name.name for name in names if name.parent == Path(".") and name.suffix == ".png"]  # beside report.json


REDERIVED = ("excluded_trials", "headline", "batch_histograms", "locality_gains", "admission_stages",
             "gc_max_worker_pause_s", "sustained_steps")  # report.json's numbers beyond its header fields


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each part of a written report that its cited manifests do not give now: composed
    again from the experiments, MLPerf runs and study reference it links (by hash, checked before this), the
    page, every table cell on it, the HTML, which plots there are and report.json's numbers must come out the
    same. A plot's pixels are not compared: they depend on matplotlib and its fonts, not on the evidence."""
    import json

    from parity.report.html import render
    from parity.report.inputs import load_experiment, mlperf_from_files

    out = Path(path).parent
    try:
        ref = load_reference(out / doc["reference"]["path"])
        experiments = {name: load_experiment(out / r["path"]) for name, r in doc["experiments"].items()}
        runs, compares = mlperf_from_files([out / r["path"] for r in doc["mlperf"]])
        if wrong := [name for name, e in experiments.items() if e.name != name]:
            return [(f"/experiments/{wrong[0]}", f"links the {experiments[wrong[0]].name} experiment as {wrong[0]}")]
        with tempfile.TemporaryDirectory(prefix="parity-report-") as plot_dir:
            made = compose(experiments, runs, compares, ref, out, Path(plot_dir))
    except ParityError as exc:
        return [("", f"cannot be composed again from what it links: {exc}")]
    found = []
    if doc["simulated"] != (made.evidence in ("simulated", "mixed")):
        found.append(("/simulated", f"states {doc['simulated']}, its linked manifests give the opposite (evidence "
                                    f"{made.evidence})"))
    outputs = doc["outputs"]
    if (out / outputs["markdown"]["path"]).read_text(encoding="utf-8") != made.markdown:
        found.append(("/outputs/markdown", f"{outputs['markdown']['path']} is not the page its linked manifests give"
                      f"{_first_difference((out / outputs['markdown']['path']).read_text(encoding='utf-8'), made.markdown)}"))
    elif (out / outputs["html"]["path"]).read_text(encoding="utf-8") != render(made.markdown, out):
        found.append(("/outputs/html", f"{outputs['html']['path']} is not report.md rendered"))
    if sorted(outputs["plots"]) != sorted(made.plots):
        found.append(("/outputs/plots", f"links plots {sorted(outputs['plots'])}, its manifests draw {sorted(made.plots)}"))
    for key in ("evidence", "flame_clusters", "missing_experiments", *REDERIVED):
        derived = json.loads(json.dumps(made.fields[key]))  # as JSON holds it (string keys)
        if derived != doc.get(key):
            pointer, stated, given = first_difference(f"/{key}", doc.get(key), derived)
            found.append((pointer, f"states {_short(stated)}, its linked manifests give {_short(given)}"))
    return found


def _first_difference(stated: str, derived: str) -> str:
    """Where a page first differs from the one derived: the line as stated and as derived."""
    for number, (a, b) in enumerate(zip(stated.splitlines(), derived.splitlines()), start=1):
        if a != b:
            return f" (line {number}: {_short(a)} here, {_short(b)} derived)"
    return " (one is longer)"


def _short(value, limit: int = 120) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
