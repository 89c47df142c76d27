"""The study's tables, each row of the study beside the matching row we reproduced.

Every table keeps the study's columns and adds a Source column: "study (…)" for a published number,
"ours, simulated" / "ours, measured" / "ours, mixed" for ours, so a simulated figure can never pass
for a measurement. Numbers come from `parity.stats` over passed trials only; an experiment that was
not run gives "—" and a note. Each builder also returns the plain numbers the plots and report.json use.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from parity import stats
from parity.engine import OUTPUT_TOKENS, EngineArgs
from parity.flame.settings import FlameSettings, running_arms
from parity.report import format as f
from parity.report.inputs import Experiment, MlperfRun
from parity.routing import STUDY

STUDY_GPU = "study (B200, measured)"
STUDY_MLPERF = "study (measured)"  # its MLPerf control's GPUs are not named


def flame_of(recorded: dict | None) -> FlameSettings:
    """Flame settings as a case entry or the settings record them (a case entry's `label` aside), read back through
    their class: a key a manifest leaves out has the class's default, the one place it is declared."""
    return FlameSettings.from_dict({k: v for k, v in (recorded or {}).items() if k != "label"})


def engine_of(doc: dict) -> EngineArgs:
    """The engine settings a trial recorded, read back through their class (the same holds for a key left out)."""
    return EngineArgs.from_dict(doc["engine"].get("args"))


@dataclass
class Table:
    title: str
    section: str | None  # the study section its published numbers came from (None: ours only)
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def line(cells):
            return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

        source = (f"Study numbers from the section “{self.section}”." if self.section
                  else "The study publishes no such table: ours only.")
        out = [f"### {self.title}", "", source, "", line(self.columns), "|" + "---|" * len(self.columns)]
        out += [line(row) for row in self.rows]
        if self.notes:
            out += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(out) + "\n"


def evidence(docs: list[dict]) -> str | None:
    """simulated, measured or mixed, from the manifests' own `simulated` flags; None for no manifest."""
    flags = {bool(d["simulated"]) for d in docs}
    if not flags:
        return None
    return "mixed" if len(flags) == 2 else ("simulated" if True in flags else "measured")


def ours(docs: list[dict]) -> str:
    label = evidence(docs)
    return "ours" if label is None else f"ours, {label}"


def not_run(name: str) -> str:
    return f"— : the {name} experiment was not given to the report (not run), so it has no numbers."


def _trace_names(reference: dict, experiment: Experiment | None) -> list[str]:
    names = list(reference)
    if experiment is not None:
        names += sorted({c["trace_name"] for c in experiment.cases} - set(names))
    return names


def _below(ratios: list[float]) -> int:
    return sum(r < stats.TARGET for r in ratios)


# ---- 1. final throughput ------------------------------------------------------------------------

def final_throughput(confirmation: Experiment | None, offline: Experiment | None, ref: dict) -> tuple[Table, dict]:
    """Median [min–max] per system, the median difference and paired ratios per trace; headline numbers."""
    study = ref["final_throughput"]
    table = Table("Final throughput (confirmation pairs)", study["section"],
                  ["Workload", "Source", "Standalone vLLM requests/s", "Flame requests/s", "Flame vs vLLM median",
                   "Paired throughput ratios", "Pairs counted / excluded", "Every pair ≥ 99%",
                   "Medians within 1%", "Share of offline limit (vLLM / Flame)"])
    limits = {x["trace_name"]: x for x in (offline.doc.get("limits", []) if offline else [])}
    headline, plot = {}, {}
    for trace in _trace_names(study["traces"], confirmation):
        s = study["traces"].get(trace)
        label = s["label"] if s else trace
        if s:
            below = s.get("pairs_below_99", 0)
            table.rows.append([label, STUDY_GPU, f.spread(s["standalone"]), f.spread(s["flame"]),
                               f.signed_pct(f.from_pct(s["median_difference_pct"])),
                               f.pct_range(*(f.from_pct(x) for x in s["ratio_range_pct"])),
                               f"{study['pairs_per_trace']} / 0",
                               f.yes_no(study["every_pair_meets_99"][trace])
                               + (f" ({below} of {study['pairs_per_trace']} below)" if below else ""),
                               f.yes_no(study["medians_within_1pct"][trace]), f.MISSING])
        if confirmation is None:
            table.rows.append([label, "ours", *[f.MISSING] * 8])
            continue
        pairs = confirmation.pairs_where("final", trace)
        c = stats.compare(pairs)
        docs = [d for pair in pairs for d in pair]
        if not c["pairs"]:
            table.rows.append([label, ours(docs), *[f.MISSING] * 4, f"0 / {c['excluded_pairs']}", *[f.MISSING] * 3])
            others = sorted({p.get("stage") for p, _, _ in confirmation.pairs
                             if p["trace_name"] == trace and p.get("stage") != "final"})
            table.notes.append(f"{label}: — : no pair of the study's final configuration (stage final) on the {trace} "
                               "trace " + ("had two passed trials" if c["excluded_pairs"] else "was run")
                               + (f"; this run's pairs there are of stage {', '.join(map(str, others))} "
                                  "(the arm table)." if others else "."))
            continue
        limit = limits.get(trace)
        share = f.MISSING
        if limit and limit.get("passed", True) and limit["requests_per_s"] > 0:
            share = (f"{f.pct(c['reference']['median'] / limit['requests_per_s'], 1)} / "
                     f"{f.pct(c['candidate']['median'] / limit['requests_per_s'], 1)}")
        below = _below(c["ratios"])
        table.rows.append([label, ours(docs), f.spread(c["reference"]), f.spread(c["candidate"]),
                           f.signed_pct(c["median_difference"]), f.pct_range(*c["ratio_range"]),
                           f"{c['pairs']} / {c['excluded_pairs']}",
                           f.yes_no(c["every_pair_meets_99"]) + (f" ({below} of {c['pairs']} below)" if below else ""),
                           f.yes_no(c["medians_within_1pct"]), share])
        headline[trace] = {"pairs": c["pairs"], "excluded_pairs": c["excluded_pairs"],
                           "reference_median": c["reference"]["median"], "candidate_median": c["candidate"]["median"],
                           "median_difference": c["median_difference"], "ratio_range": c["ratio_range"],
                           "every_pair_meets_99": c["every_pair_meets_99"],
                           "medians_within_1pct": c["medians_within_1pct"], "evidence": evidence(docs),
                           "offline_limit": limit["requests_per_s"] if share != f.MISSING else None}
        plot[trace] = {"vllm": c["reference"], "flame": c["candidate"], "ratios": c["ratios"],
                       "study_ratio_range": [x / 100 for x in s["ratio_range_pct"]] if s else None}
    if confirmation is None:
        table.notes.append(not_run("confirmation"))
    if offline is None:
        table.notes.append("Share of offline limit: — : no offline-limit experiment was given.")
    table.notes.extend(_offline_limit_notes(limits, confirmation))
    if confirmation is not None and confirmation.doc["settings"].get("shards") == 1:
        table.notes.append(_ONE_SHARD + " Rates compare with the study's through the ratios only.")
    if confirmation is not None:  # what was counted as the final configuration: a profile may change it
        recorded = confirmation.doc["settings"].get("flame")
        table.notes.append(f"Flame configuration of these pairs (the confirmation's `flame` settings): "
                           f"{flame_of(recorded).label()}{'' if recorded else ' (none recorded: the class defaults)'}"
                           "; config/experiments.yaml "
                           "holds the study's final configuration, which a profile's `flame` changes for this table too.")
    if confirmation is not None and flame_of(confirmation.doc["settings"].get("flame")).order == "prefix":
        table.notes.append("Our Flame configuration admits each batch in prefix order (parity.flame.admission): "
                           "prompts that share a document reach its engine side by side. The study's adapter "
                           "admitted in arrival order; the standalone vLLM reference keeps its clients' arrival order.")
    table.notes.append("The study does not publish the engine's offline limit (—). Ratios are Flame / vLLM per "
                       "fresh pair; only pairs whose two trials passed every check count.")
    return table, {"headline": headline, "plot": plot}


def confirmation_flame_arms(confirmation: Experiment | None) -> list[Table]:
    """The confirmation's Flame arms (settings `flame_arms`, ours): its pairs again with only the Flame side
    changed (stage `final-NAME`), each pair's Flame / standalone ratio, the worst and the median, beside the
    study's final configuration's pairs of the same run; the study's final-throughput table never counts them."""
    arms = list(running_arms(confirmation.doc["settings"].get("flame_arms"))) if confirmation else []  # null: an arm
    # the profile switched off, never run
    if not arms:
        return []
    table = Table("Confirmation pairs, Flame arms (ours)", None,
                  ["Workload", "Flame arm", "Flame configuration", "Source", "Standalone vLLM requests/s",
                   "Flame requests/s", "Each pair's Flame / vLLM", "Worst pair", "Median pair",
                   "Pairs counted / excluded", "Every pair ≥ 99%"])
    labels = {c["stage"]: c["flame"]["label"] for c in confirmation.cases if c.get("flame")}
    stages = (("final", "final (the study's)"), *((f"final-{arm}", arm) for arm in arms))
    if ran := confirmation.doc["settings"].get("stages"):  # a run of some stages alone (settings stages): those
        stages = tuple(stage for stage in stages if stage[0] in ran)
    for trace, stage, name, c, docs in _stage_comparisons(confirmation, stages):
        head = [trace, name, labels.get(stage, f.MISSING), ours(docs)]
        if not c["pairs"]:
            table.rows.append([*head, *[f.MISSING] * 5, f"0 / {c['excluded_pairs']}", f.MISSING])
            continue
        below = _below(c["ratios"])
        table.rows.append([*head, f.spread(c["reference"]), f.spread(c["candidate"]),
                           ", ".join(f.pct(r) for r in c["ratios"]), f.pct(c["ratio_range"][0]),  # 98.96% is no 99.0%
                           f.pct(stats.summary(c["ratios"])["median"]), f"{c['pairs']} / {c['excluded_pairs']}",
                           f.yes_no(c["every_pair_meets_99"]) + (f" ({below} of {c['pairs']} below)" if below else "")])
    table.notes.append("Ours only: the study's confirmation pairs again (fresh, interleaved, sticky, GPU-pinned, the "
                       "standalone side unchanged) with only the Flame side changed; the target is ≥ 99% for every pair. "
                       "Pairs are listed in order; only pairs whose two trials passed every check count.")
    if confirmation.doc["settings"].get("shards") == 1:
        table.notes.append(_ONE_SHARD)
    return [table]


def _stage_comparisons(confirmation: Experiment, stages):
    """Per trace (sorted), per (stage, name) of `stages`: (trace, stage, name, stats.compare of its pairs, their
    trials), the rows both tables of the confirmation's extra arms are made of."""
    for trace in sorted({c["trace_name"] for c in confirmation.cases}):
        for stage, name in stages:
            pairs = confirmation.pairs_where(stage, trace)
            yield trace, stage, name, stats.compare(pairs), [d for pair in pairs for d in pair]


_ONE_SHARD = ("These pairs ran one sticky shard per side on one GPU (settings shards: 1, a one-GPU host): each side "
              "served the whole burst on one engine, where the study split it over two GPUs.")


def _offline_limit_notes(limits: dict, confirmation: Experiment | None) -> list[str]:
    """Where the offline limit was not measured as the confirmation ran: shards in waves, or other GPUs."""
    notes = []
    paired = {g["uuid"] for d in (confirmation.trials.values() if confirmation else []) if not d["simulated"]
              for g in d["gpus"]}
    for trace, limit in limits.items():
        if not limit.get("side_by_side", True):
            notes.append(f"Offline limit, {trace}: its {len(limit['shards'])} shards did not all run at once (more "
                         "shards than GPUs, or kept from an earlier run); the ceiling supposes they had run side by "
                         "side on identical GPUs.")
        used = {row["gpu_uuid"] for row in limit["shards"]}
        if paired and not used <= paired:
            notes.append(f"Offline limit, {trace}: measured on other GPUs ({', '.join(sorted(used))}) than the "
                         "confirmation pairs, so the shares compare hosts as well as paths.")
    return notes


def shard_timeline(confirmation: Experiment | None) -> tuple[Table, dict]:
    """Per pair and shard: when each system finished, and the Flame tasks that shard ran (batch sizes)."""
    table = Table("Where the time goes: shard finish times and Flame tasks (confirmation pairs)", None,
                  ["Workload", "Pair", "Shard", "Source", "Standalone finish (s)", "Flame finish (s)",
                   "Flame tasks: prompts (engine s)"])
    histograms: dict[str, dict[int, int]] = {}
    if confirmation is None:
        table.notes.append(not_run("confirmation"))
        return table, histograms
    for trace in _trace_names({}, confirmation):
        counts: Counter = Counter()
        for pair, ref, cand in confirmation.pair_manifests_where("final", trace):
            if not (stats.passed(ref) and stats.passed(cand)):
                continue
            counts.update(stats.batch_histogram(cand))
            vllm, flame, tasks = stats.shard_finish_s(ref), stats.shard_finish_s(cand), stats.shard_tasks(cand)
            for shard in sorted(set(vllm) | set(flame)):
                table.rows.append([trace, str(pair["pair_index"]), str(shard), ours([ref, cand]), _seconds(vllm.get(shard)),
                                   _seconds(flame.get(shard)),
                                   " + ".join(f"{n} ({s:.2f})" for n, s in tasks.get(shard, [])) or f.MISSING])
        if counts:
            histograms[trace] = dict(sorted(counts.items()))
            table.notes.append(f"{trace}: Flame batch sizes over the counted pairs (prompts: tasks): "
                               + ", ".join(f"{n}: {k}" for n, k in sorted(counts.items())) + ".")
    table.notes.append("A shard's finish is its last completion after burst release. Flame invocations on a worker "
                       "run one at a time, so a shard with more than one task waits for each in turn.")
    return table, histograms


def _seconds(value: float | None) -> str:
    return f.MISSING if value is None else f"{value:.2f}"


# ---- 2. prefix affinity -------------------------------------------------------------------------

def locality(experiment: Experiment | None, ref: dict) -> tuple[list[Table], dict]:
    """The four placements x (no-reuse, reuse, cached share on reuse), then the affinity gains on reuse."""
    study = ref["locality"]
    table = Table("Prefix affinity (locality)", study["section"],
                  ["Configuration", "Source", "No reuse requests/s", "Prefix reuse requests/s",
                   "Cached input tokens on reuse"])
    medians, plot = {}, {}
    for key, s in study["configurations"].items():
        table.rows.append([s["label"], STUDY_GPU, f.spread(s["no-reuse"]), f.spread(s["reuse"]),
                           f.pct(f.from_pct(s["cached_share_reuse_pct"]))])
        if experiment is None:
            table.rows.append([s["label"], "ours", f.MISSING, f.MISSING, f.MISSING])
            continue
        no_reuse = experiment.trials_where(stage=key, trace_name="no-reuse")
        reuse = experiment.trials_where(stage=key, trace_name="reuse")
        a, b = stats.describe(no_reuse), stats.describe(reuse)
        share = b.get("cached_share", {}).get("median")
        medians[key] = b.get("requests_per_s", {}).get("median")
        plot[key] = {"label": s["label"], "ours": share, "study": s["cached_share_reuse_pct"] / 100}
        table.rows.append([s["label"], ours(no_reuse + reuse), f.spread(a.get("requests_per_s")),
                           f.spread(b.get("requests_per_s")), f.pct(share)])
    if experiment is None:
        table.notes.append(not_run("locality"))
    else:
        others = sorted({c["trace_name"] for c in experiment.cases} - {"no-reuse", "reuse"})
        if others:  # its rows read the study's two workloads alone: a run on others was shown as not run at all
            table.notes.append(f"This run's trials on {', '.join(others)} are not rows here: the table compares "
                               "the study's two workloads, the traces named no-reuse and reuse.")
        repeats = experiment.doc["settings"].get("repeats")
        flame = flame_of(experiment.doc["settings"].get("flame"))
        table.notes.append(f"Ours: {repeats} repetitions per configuration, Flame batch limit "
                           f"{flame.batch_limit}, window {flame.window_ms:g} ms "
                           f"(study: {study['repeats']} repetitions, batch {study['batch_limit']}, "
                           f"{study['window_ms']} ms).")

    def gain(a: str, b: str) -> float | None:
        return medians[a] / medians[b] - 1 if medians.get(a) and medians.get(b) else None

    gains = {"vllm": gain("vllm-sticky", "vllm-alternating"), "flame": gain("flame-sticky", "flame-global"),
             "flame_vs_vllm_sticky": gain("flame-sticky", "vllm-sticky")}
    label = ours(experiment.trials_where(trace_name="reuse")) if experiment else "ours"
    gains_table = Table("Affinity gains on the reuse trace (median requests/s)", study["section"],
                        ["Comparison", STUDY_GPU, label])
    for name, key, published in (("vLLM: sticky vs alternating", "vllm", study["reuse_gain_pct"]["vllm"]),
                                 ("Flame: sticky sessions vs global session", "flame", study["reuse_gain_pct"]["flame"]),
                                 ("Flame sticky vs vLLM sticky", "flame_vs_vllm_sticky",
                                  study["flame_sticky_vs_vllm_sticky_pct"])):
        gains_table.rows.append([name, f.signed_pct(f.from_pct(published), 1), f.signed_pct(gains[key], 1)])
    if experiment is None:
        gains_table.notes.append(not_run("locality"))
    return [table, gains_table], {"gains": gains, "plot": plot}


# ---- 3. admission -------------------------------------------------------------------------------

def _bytes(value: int | None) -> str:
    return f.MISSING if value is None else f"{value:,}"


def _pilot_rows(experiment: Experiment, group: str, describe_config) -> list[list[str]]:
    rows = []
    for case in experiment.cases:
        if not (case.get("stage") or "").startswith(f"{group}-"):
            continue
        doc = experiment.trials[case["trial_id"]]
        ok = stats.passed(doc)
        rows.append([describe_config(flame_of(case["flame"])), case["trace_name"], ours([doc]) + ", pilot",
                     f.rate(stats.rps(doc)) if ok else f.MISSING, f.pct(stats.cached_share(doc)) if ok else f.MISSING,
                     _bytes(stats.encoded_input_bytes(doc)) if ok else f.MISSING,
                     "passed" if ok else "failed (excluded)"])
    return rows


def _stage_row(label: str, experiment: Experiment | None, stage: str) -> tuple[list[str], dict]:
    if experiment is None:
        return [label, "ours", f.MISSING, f.MISSING, f.MISSING, f.MISSING], {}
    results, docs = {}, []
    for trace in ("no-reuse", "reuse"):
        pairs = experiment.pairs_where(stage, trace)
        docs += [d for pair in pairs for d in pair]
        results[trace] = stats.compare(pairs)
    diff = {t: r.get("median_difference") for t, r in results.items()}
    both = None if None in diff.values() else all(r["medians_within_1pct"] for r in results.values())
    counts = " · ".join(f"{t}: {r['pairs']} / {r['excluded_pairs']}" for t, r in results.items())
    return ([label, ours(docs), f.signed_pct(diff["no-reuse"]), f.signed_pct(diff["reuse"]), f.yes_no(both), counts],
            {"median_difference": diff, "both_within_1pct": both})


def admission(experiment: Experiment | None, confirmation: Experiment | None, ref: dict) -> tuple[list[Table], dict]:
    """Screening pilots (labelled, never confirmation), then the three paired stages of the study."""
    study = ref["admission"]
    screen = study["screening"]
    columns = ["Source", "Requests/s", "Cached input share", "Encoded service inputs (bytes)", "Status"]
    batch = Table("Admission screening: batch limit × formation window (pilots)", study["section"],
                  ["Pilot (batch limit, window)", "Trace", *columns])
    api = Table("Admission screening: engine API × input codec (pilots)", study["section"],
                ["Pilot (API, codec)", "Trace", *columns])
    order = Table("Admission screening: order of a batch's prompts into the engine (pilots)", None,
                  ["Pilot (admission order)", "Trace", *columns])
    order.notes.append("The study's adapter admitted each batch in arrival order; `prefix` sorts a batch so that "
                       "prompts sharing a document reach the engine side by side (parity.flame.admission).")
    sel = screen["selected"]
    batch.rows.append([f"{screen['batch_windows']} combinations screened; selected batch {sel['batch_limit']}, "
                       f"{sel['window_ms']} ms", f.MISSING, STUDY_GPU, f.MISSING, f.MISSING, f.MISSING, f.MISSING])
    # (the study names no trace for its batch screen)
    raw, zlib = screen["encoded_reuse_input_bytes"]["raw"], screen["encoded_reuse_input_bytes"]["zlib"]
    api.rows.append(["raw inputs (reuse burst)", "reuse", STUDY_GPU, f.MISSING, f.MISSING, f"{raw:,}", f.MISSING])
    api.rows.append(["zlib level 1 inputs (reuse burst)", "reuse", STUDY_GPU, f.MISSING, f.MISSING, f"{zlib:,}",
                     f.MISSING])
    for t in (batch, api, order):
        t.notes.append("Pilots choose a configuration; they are never paired and never count as confirmation. "
                       "The study publishes no pilot scores (—).")
    if experiment is None:
        for t in (batch, api, order):
            t.notes.append(not_run("admission"))
    else:
        batch.rows += _pilot_rows(experiment, "screen-batch",
                                  lambda c: f"batch {c.batch_limit}, {c.window_ms:g} ms")
        api.rows += _pilot_rows(experiment, "screen-api", lambda c: f"{c.api}, {'zlib' if c.compress else 'raw'}")
        order.rows += _pilot_rows(experiment, "screen-order",
                                  lambda c: f"{c.order} order ({c.api}, {'zlib' if c.compress else 'raw'})")
    stages = Table("Admission stages (paired medians)", study["section"],
                   ["Flame configuration", "Source", "Median difference without reuse", "Median difference with reuse",
                    "Both medians within 1%", "Pairs counted / excluded"])
    if experiment is not None:
        chosen = experiment.doc["settings"].get("selected", {})
        batch.notes.append(f"Ours: selected in the configuration before any pair ran: batch "
                           f"{chosen.get('batch_limit')}, {chosen.get('window_ms')} ms.")
        if chosen and chosen != sel:
            stages.notes.append(f"Our rows use batch {chosen.get('batch_limit')}, {chosen.get('window_ms')} ms where "
                                f"the study's labels say batch {sel['batch_limit']}, {sel['window_ms']} ms "
                                "(config/experiments.yaml says why).")
    data = {}
    for key, s in study["stages"].items():
        stages.rows.append([s["label"], STUDY_GPU, f.signed_pct(f.from_pct(s["no-reuse_pct"])),
                            f.signed_pct(f.from_pct(s["reuse_pct"])), f.yes_no(s["both_within_1pct"]),
                            f"{ref['final_throughput']['pairs_per_trace']} per trace"])
        source = confirmation if key == "final" else experiment
        row, data[key] = _stage_row(s["label"], source, key)
        stages.rows.append(row)
    if experiment is None:
        stages.notes.append(not_run("admission") + " (batch-window and async-zlib stages)")
    if confirmation is None:
        stages.notes.append(not_run("confirmation") + " (final stage)")
    return [batch, api, order, stages], data


# ---- 4. GC diagnostics --------------------------------------------------------------------------

def gc_diagnostics(experiment: Experiment | None, ref: dict) -> tuple[Table, dict]:
    """Normal collection vs startup-heap freeze: the largest per-worker GC pause total, per single trial."""
    study = ref["gc"]
    table = Table("GC diagnostics (single trials)", study["section"],
                  ["Collection", "Source", "Max per-worker GC pause total inside inference", "Requests/s", "Trial"])
    data = {}
    for mode, label in (("normal", "Normal collection"), ("freeze", "Startup-heap freeze")):
        table.rows.append([label, STUDY_GPU, f"{study['max_worker_gc_pause_ms'][mode]:.2f} ms", f.MISSING, f.MISSING])
        if experiment is None:
            table.rows.append([label, "ours", f.MISSING, f.MISSING, f.MISSING])
            continue
        for doc in experiment.trials_where(stage=mode):
            if not stats.passed(doc):
                table.rows.append([label, ours([doc]), f.MISSING, f.MISSING, f"{doc['trial_id']} (failed, excluded)"])
                continue
            pause = stats.max_worker_gc_pause(doc)
            data.setdefault(mode, []).append(pause)
            table.rows.append([label, ours([doc]), f.MISSING if pause is None else f"{pause * 1000:.2f} ms",
                               f.rate(stats.rps(doc)), doc["trial_id"]])
    table.notes.append("The study publishes no per-trial throughput for these diagnostics (—); they are "
                       "diagnostics, not confirmation.")
    if experiment is None:
        table.notes.append(not_run("gc"))
    return table, data


# ---- 5. MLPerf control --------------------------------------------------------------------------

def _compliance(doc: dict) -> str:
    label = doc["compliance"]
    if label["compliant"]:
        return "compliant"
    more = f" (+{len(label['reasons']) - 1} more)" if len(label["reasons"]) > 1 else ""
    return f"non-compliant: {label['reasons'][0]}{more}"


def mlperf(runs: list[MlperfRun], compares: list[tuple], ref: dict) -> Table:
    """The development Offline control; our runs carry their compliance label."""
    study = ref["mlperf"]
    table = Table("MLPerf Offline control", study["section"],
                  ["Development Offline configuration", "Source", "Completed requests/s", "Tokens/s",
                   "LoadGen performance result", "Compliance"])
    by_key = {r.key: r for r in runs}
    for key in list(study["runs"]) + sorted(set(by_key) - set(study["runs"])):
        s = study["runs"].get(key)
        label = s["label"] if s else key
        if s:  # the study's MLPerf runs name no GPU (individual trials, its Flame on vLLM 0.31.0)
            table.rows.append([label, STUDY_MLPERF, f.rate(s["requests_per_s"], 2), f.MISSING, s["result"],
                               "development run, not a submission"])
        run = by_key.get(key)
        if run is None:
            table.rows.append([label, "ours", f.MISSING, f.MISSING, "not run", f.MISSING])
            continue
        result = run.doc["result"]
        table.rows.append([label, ours([run.doc]), f.rate(result["samples_per_second"], 2),
                           f.rate(result["tokens_per_second"], 1), result["validity"] or f.MISSING,
                           _compliance(run.doc)])
    if not runs:
        table.notes.append("— : MLPerf not run (no `parity mlperf run` performance manifests were given).")
    for path, doc in compares:  # each note names its comparison (compare-b32, compare-b64: one per Flame arm)
        table.notes += [f"{Path(path).stem}: {flag}" for flag in doc["flags"]]
    table.notes.append("Tokens/s is the metric MLCommons' submission checker reports for Llama 3.1 8B Offline; "
                       "the study published completed requests/s only (— in its rows).")
    if study["runs"]:
        table.notes.append("The study's rows are individual trials on GPUs it does not name, its Flame service on "
                           "vLLM 0.31.0 and the native path on 0.28.0 (section “Separate this experiment from MLPerf”).")
    table.notes.append("These are development controls, not MLPerf results; a row is compliant only if "
                       "LoadGen says VALID and every rule the control checks holds.")
    return table


def excluded(experiments: dict[str, Experiment]) -> list[dict]:
    """Every failed trial, with the reasons its checks gave: listed, never counted."""
    out = []
    for name, experiment in experiments.items():
        for case in experiment.cases:
            doc = experiment.trials[case["trial_id"]]
            if not stats.passed(doc):
                out.append({"experiment": name, "trial_id": case["trial_id"], "reasons": doc["verdict"]["reasons"]})
    return out


# ---- 6. routing beyond the study (ours) ----------------------------------------------------------

ROUTERS = {"sticky": "the study's sticky router", "prefix": "ours (prefix-aware)"}


def _split_documents(doc: dict) -> int:
    """Documents whose requests went to more than one shard (ids `<trace>-d<doc>-q<question>`)."""
    shards: dict[str, set] = {}
    for r in doc["records"]:
        shards.setdefault(r["request_id"].rsplit("-q", 1)[0], set()).add(r["shard"])
    return sum(len(s) > 1 for s in shards.values())


def routing(experiment: Experiment | None, confirmation: Experiment | None = None) -> tuple[list[Table], dict]:
    """Per trace and path: the study's router beside ours (median requests/s, cached share, shard split,
    documents split), and ours over the study's; for ours, the hits it expected beside the realized."""
    table = Table("Routing beyond the study: the study's router and ours", None,
                  ["Trace", "Path", "Router", "Source", "Requests/s", "Cached input tokens", "Requests per shard",
                   "Documents split", "Expected / realized cached tokens", "Engine KV events: map / engine blocks",
                   "Ours vs the study's router"])
    plot: dict = {}
    arms = confirmation_arms(confirmation)
    if experiment is None:
        table.notes.append(not_run("routing"))
        return [table, *arms], {"plot": plot}
    for trace in sorted({c["trace_name"] for c in experiment.cases}):
        for system, path in (("vllm", "standalone"), ("flame", "Flame")):
            medians = {}
            for placement in dict.fromkeys(c["placement"] for c in experiment.cases):  # the order they ran in
                docs = experiment.trials_where(stage=f"{system}-{placement}", trace_name=trace)
                if not docs:
                    continue
                d = stats.describe(docs)
                medians[placement] = d.get("requests_per_s", {}).get("median")
                good = [doc for doc in docs if stats.passed(doc)]
                split = sorted({tuple(Counter(r["shard"] for r in doc["records"]).get(k, 0)
                                      for k in range(len(doc.get("router", {}).get("loads") or [0, 0]))) for doc in good})
                routers = [doc.get("router", {}) for doc in good]
                hits = [(r.get("expected_cached_tokens"), r.get("realized_cached_tokens")) for r in routers
                        if r.get("realized_cached_tokens")]
                ratio = (f"{sum(e for e, _ in hits):,} / {sum(r for _, r in hits):,}" if hits else f.MISSING)
                followed = [doc["kv_events"] for doc in good if doc.get("kv_events")]
                events = (f"{sum(sum(e.values()) for k in followed for e in k['events']):,} events; "
                          f"{sum(sum(k['router_held_blocks']) for k in followed):,} / "
                          f"{sum(sum(k['engine_held_blocks']) for k in followed):,}" if followed else f.MISSING)
                vs = (f.signed_pct(medians[placement] / medians[STUDY] - 1, 1)
                      if placement != STUDY and medians.get(STUDY) and medians.get(placement) else f.MISSING)
                table.rows.append([trace, path, ROUTERS.get(placement, placement), ours(docs),
                                   f.spread(d.get("requests_per_s")), f.pct(d.get("cached_share", {}).get("median")),
                                   " / ".join("+".join(map(str, s)) for s in split) or f.MISSING,
                                   ", ".join(str(_split_documents(doc)) for doc in good) or f.MISSING, ratio, events, vs])
            plot.setdefault(trace, {})[path] = medians
    repeats = experiment.doc["settings"].get("repeats")
    table.notes.append(f"Ours only, not a claim of the study: {repeats} repetition(s) per configuration, interleaved; "
                       "the study's tables keep its sticky router. Requests per shard: each trial's split; documents "
                       "split: documents whose questions went to two shards (the prefix router replicates a hot one). Ours "
                       "follows the engines' KV cache events (BlockStored / BlockRemoved / AllBlocksCleared): the "
                       "router blocks its map holds after the burst beside those the engines reported holding.")
    return [table, *arms], {"plot": plot}


def confirmation_arms(confirmation: Experiment | None) -> list[Table]:
    """The confirmation's extra arms (settings `arms`): its pairs again with both sides placed by our router,
    beside the study's arm (stage `final`); the study's final-throughput table never counts them."""
    arms = confirmation.doc["settings"].get("arms", []) if confirmation else []
    if not arms:
        return []
    table = Table("Confirmation pairs with our router (extra arms)", None,
                  ["Workload", "Router", "Source", "Standalone vLLM requests/s", "Flame requests/s",
                   "Flame vs vLLM median", "Paired throughput ratios", "Pairs counted / excluded"])
    stages = (("final", "the study's sticky router"), *((f"final-{arm}", ROUTERS.get(arm, arm)) for arm in arms))
    for trace, _, router, c, docs in _stage_comparisons(confirmation, stages):
        if not c["pairs"]:
            table.rows.append([trace, router, ours(docs), *[f.MISSING] * 4, f"0 / {c['excluded_pairs']}"])
            continue
        table.rows.append([trace, router, ours(docs), f.spread(c["reference"]), f.spread(c["candidate"]),
                           f.signed_pct(c["median_difference"]), f.pct_range(*c["ratio_range"]),
                           f"{c['pairs']} / {c['excluded_pairs']}"])
    table.notes.append("Ours only: the same fresh, interleaved, GPU-pinned pairs as the study's arm, both sides "
                       "placed by the named router.")
    return [table]


# ---- 7. sustained load and streaming latency (ours) ----------------------------------------------

PATHS = (("standalone", "standalone vLLM (streamed)"), ("flame", "Flame (tokens timed in the worker)"))
HARVESTED = "Flame (tokens timed at the client)"  # harvest mode: each token comes back with the task that took it
BURSTS = "bursts"  # the Flame configuration of a sustained pair with no arm: the experiment's own Flame settings


def _ms(summary: dict | None, *keys: str) -> str:
    if not summary:
        return f.MISSING
    return " / ".join(f"{summary[k] * 1e3:,.0f}" for k in keys)


REPLAY = "replay"  # a replayed case's offered rate, as the table writes it (sorted after every rung)


def _offered_arm(case: dict) -> tuple[str, str]:
    """(offered rate as its stage writes it, arm or "") of a sustained case, from the fields its entry records
    (`rate`, `arm`: parity.experiments.runner.ran). Fallback, only for a manifest written before entries recorded
    them: both parsed from its stage `KIND-R{-outN}{-ARM}` (plan.sustained; an arm's name has no hyphen, by the
    config schema). A replayed case (stage `replay`, `replay-ARM`: its trace's own arrivals) offers no one rate:
    its offered rate reads `replay`."""
    if case["stage"] == "replay" or case["stage"].startswith("replay-"):
        return REPLAY, case.get("arm") or case["stage"].removeprefix("replay").removeprefix("-")
    if "rate" in case:
        return f"{case['rate']:g}", case["arm"] or ""
    offered, *rest = case["stage"].split("-", 1)[1].split("-")
    return offered, "-".join(p for p in rest if not (p.startswith("out") and p[3:].isdigit()))


def _output_tokens(case: dict, doc: dict) -> int:
    """The answer length every request of a case asked for: its entry's `output_tokens`, else (the backend's, or a
    manifest written before entries recorded it) the engine setting its trial recorded."""
    return case.get("output_tokens") or engine_of(doc).max_tokens


def _arms(experiment: Experiment) -> list[str]:
    """The Flame configurations of the sustained pairs in the order they build on each other: bursts (no
    arm), then each arm of the settings in its order (arms whose pairs ran but are no longer named, after); the
    bounded arm and its comparator are no pairs' configurations (unpaired: their rows come after)."""
    named = list(experiment.doc["settings"].get("arms") or {})
    ran = {_offered_arm(c)[1] for c in experiment.cases
           if c["stage"].startswith("rate-") and c.get("pair") is not None}
    return ["", *named, *sorted(ran - set(named) - {""})]


def _path_label(case: dict, arm: str) -> str:
    """A sustained case's path as a row names it: a Flame side by its configuration (arm name, else bursts) and
    its Flame label; a standalone side of an arm's pairs as that arm's reference; the bounded arm's unpaired
    standalone cases (parity.admission, and with `bounded_rates` its own unbounded comparator) as what they are."""
    if case["system"] != "flame":
        label = dict(PATHS).get(case["system"], case["system"])
        if arm == "bounded" and case.get("pair") is None:
            return label + ", prefix router, bounded admission"
        if arm == "unbounded" and case.get("pair") is None:
            return label + ", sticky router, unbounded (the bounded arm's comparator)"
        return label + (f", the {arm} arm's reference" if arm else "")
    flame = case.get("flame") or {}
    label = HARVESTED if flame_of(flame).mode == "harvest" else dict(PATHS)["flame"]
    if arm == "bounded" and case.get("pair") is None:
        return label + ", prefix router, bounded admission"
    label += f", arm {arm}" if arm else f", {BURSTS}"
    return label + (f" ({flame['label']})" if flame.get("label") else "")


def _arm_notes(experiment: Experiment) -> str:
    """What each arm changed, as the settings name it, and what those changes mean."""
    arms = experiment.doc["settings"].get("arms") or {}
    if not arms:
        return ""
    changed = "; ".join(f"`{name}`: " + ", ".join(f"{k} {v}" for k, v in changes.items())
                        for name, changes in arms.items())
    text = f" An arm (ours) reruns the ladder's pairs with the Flame side changed ({changed})."
    if any(changes.get("inflight") for changes in arms.values()):
        text += (" An inflight of 1 holds the next batch while a task runs, so it goes as one task when the running "
                 "one returns.")
    if any(changes.get("mode") == "harvest" for changes in arms.values()):
        text += (" Mode harvest (parity.flame.harvest) keeps one task outstanding per session: each task admits the "
                 "prompts that arrived since the last into the engine's running batch and returns as soon as tokens "
                 "or completions exist (or after hold_ms), so a request spans many tasks and the client stamps each "
                 "token when its task returns: its engine and client TTFT columns are both that receipt.")
    return text


def sustained(experiment: Experiment | None) -> tuple[Table, dict]:
    """Per trace and offered rate, both paths under the same arrivals, for each Flame configuration (bursts and
    every arm): achieved rate, TTFT at the engine and at the client, end to end, inter-token, goodput against the
    objective, and whether the path or the sender fell behind; and the curves' numbers."""
    from parity import latency

    table = Table("Sustained load and streaming latency (ours)", None,
                  ["Trace", "Offered req/s", "Output tokens", "Path", "Source", "Achieved req/s", "TTFT engine p50 / p99 ms",
                   "TTFT client p50 / p99 ms", "E2E p50 / p99 ms", "Inter-token p99 ms", "Goodput req/s (client)",
                   "Met objective", "First-token goodput req/s (client)", "Saturated", "Send lag p99 ms"])
    curves: dict = {}
    if experiment is None:
        table.notes.append(not_run("sustained"))
        return table, {"plot": curves}
    objective = latency.Objective.from_dict(experiment.doc["settings"].get("objective"))
    order = {arm: i for i, arm in enumerate(_arms(experiment))}
    keys = []
    sustained_stages = ("rate-", "evict-", "lengths-", "replay")  # restarts: their own table
    shown = [c for c in experiment.cases if c["stage"].startswith(sustained_stages)]
    gpus = {c["trial_id"]: _gpus(experiment.trials[c["trial_id"]]) for c in shown}
    for case in shown:
        doc = experiment.trials[case["trial_id"]]
        # which seed's arrivals, and where the trials ran on more than one set of GPUs, which (a ladder spread over
        # device sessions: rows otherwise alike but for their numbers; an outsider's, 2026-12-07)
        seed = (doc.get("schedule") or {}).get("seed")
        source = ours([doc]) + ("" if seed is None else f"; arrivals seed {seed}") + (
            f"; {gpus[case['trial_id']]}" if len(set(gpus.values())) > 1 else "")
        s = latency.summarize(doc, objective) if stats.passed(doc) else None
        offered, arm = _offered_arm(case)
        engine = engine_of(doc)
        blocks = engine.num_gpu_blocks_override
        cache = f", KV cache {blocks * engine.block_size:,} tokens" if blocks else ""
        tokens = _output_tokens(case, doc)
        if own := doc.get("output_lengths"):  # lengths per request (parity.lengths)
            tokens = f"per request: median {own['median']}, mean {own['mean']:.0f}, {own['min']}-{own['max']}"
            if own.get("replay"):  # the recorded trace's own lengths: no drawn median
                tokens = f"per request, the trace's: mean {own['mean']:.0f}, {own['min']}-{own['max']}"
        label = _path_label(case, arm)
        rung = float("inf") if offered == REPLAY else float(offered)
        # a rung's arms together, the unbounded comparator before the bounded arm, and each seed's two paths side by side
        keys.append((case["trace_name"] + cache, str(tokens).zfill(8), rung, order.get(arm, len(order)),
                     arm != "unbounded", arm, -1 if seed is None else seed, case["system"] == "flame"))
        if s is None:
            table.rows.append([case["trace_name"] + cache, offered, tokens, label, source, *[f.MISSING] * 10])
            continue
        table.rows.append([case["trace_name"] + cache, offered, tokens, label, source, f.rate(s["achieved_per_s"], 2),
                           _ms(s["ttft_engine"], "p50", "p99"), _ms(s["ttft_client"], "p50", "p99"),
                           _ms(s["e2e"], "p50", "p99"), _ms(s["itl"], "p99"), f.rate(s["goodput_client_per_s"], 2),
                           f.pct(s["good_share_client"], 0), f.rate(s["goodput_ttft_client_per_s"], 2),
                           f.yes_no(s["saturated"]),
                           f"{s['lag']['p99_s'] * 1e3:.2f}" if s["lag"] else f.MISSING])
        if offered == REPLAY:  # no offered rate to draw it against: a row, not a curve
            continue
        trace = case["trace_name"] + ("" if tokens == OUTPUT_TOKENS else f", {tokens} output tokens") + cache
        if own:
            trace = case["trace_name"] + f", output lengths per request (median {own['median']})" + cache
        curves.setdefault(trace, {}).setdefault(case["system"] + (f"-{arm}" if arm else ""), []).append(
            {"offered": float(offered), "achieved": s["achieved_per_s"],  # latencies None: a window all refused
             **{f"{key}_{q}": (s[name] or {}).get(q) for key, name in (("ttft", "ttft_client"), ("e2e", "e2e"))
                for q in ("p50", "p99")},
             "goodput": s["goodput_client_per_s"], "goodput_ttft": s["goodput_ttft_client_per_s"]})
    table.rows = [row for _, row in sorted(zip(keys, table.rows), key=lambda kr: kr[0])]
    if saturation := _first_saturated(table.rows):
        table.notes.append(saturation)
    if placed := _engine_cpus(experiment):
        table.notes.append(placed)
    pairs = {c["pair"] for c in shown if c.get("pair") is not None}  # a pair's repeat at its rung
    alone = sum(1 for c in shown if c.get("pair") is None)
    shared = any(((experiment.trials[c["trial_id"]].get("ran_with") or {}).get("load") or {}).get("start")
                 for c in shown)
    if len(set(gpus.values())) == 1 and (only := next(iter(gpus.values()))):
        table.notes.append(f"Every trial ran on {only}.")
    cases = [f"{len(pairs)} pair(s) per offered rate and arm (the two paths under the same seeded arrivals, "
             "interleaved)"] if pairs else []
    cases += [f"{alone} unpaired case(s) (the bounded arm on each path and its unbounded comparator, each under its "
              "seed's arrivals)"] if alone else []
    table.notes.append(
        f"Ours only, beyond the study: {' and '.join(cases)}"
        + ("; cases that shared an engine start name it (each trial's ran_with.load.start), each after an untimed "
           "warm-up of its own" if shared else "; fresh engines per case")
        + "; every latency from the "
        "request's scheduled arrival on the host's monotonic clock, in the middle 80% of the schedule (by arrival). "
        f"Objective: first token within {objective.ttft_s:g} s, then tokens at most {objective.itl_s * 1e3:g} ms apart; "
        "goodput counts the requests that met it, per second; first-token goodput those whose first token met its "
        "first part (past saturation every engine step carries a prefill chunk of the study's "
        "max_num_batched_tokens, so no answer on any path keeps the second part, and only the first part shows what "
        "admission decides). Standalone vLLM streams each token to the client "
        "(server-sent events), so its engine and client TTFT are the same. In bursts (the experiment's own Flame "
        "settings, named by their label) the Flame path's worker times each "
        "token inside its engine, but flamepy 0.6.0 returns a task's outputs together and an executor runs one "
        "task at a time, so the client holds an answer only when its whole batch is done: its client TTFT is its "
        "end-to-end latency, and a batch formed while another runs waits for it." + _arm_notes(experiment)
        + " A row with a KV cache size ran each engine with that small a "
        "cache (the eviction case: the trace's documents do not all fit, so prefixes are evicted and prefilled again). A row of output lengths per request asked each request for its "
        "own exact length (EOS ignored), drawn seeded from a log-normal law, the same lengths on both sides. "
        "A row offered `replay` ran a recorded trace (parity trace-mooncake) at its own arrivals, each request "
        "asking for its recorded answer length, the same on both sides. "
        "Achieved: the window's requests over the time from the first's "
        "arrival to the last's answer; saturated: below 90% of the offered rate measured in the same window (the "
        "window's requests over its span, refused ones included, which differs from the rung's nominal rate by the "
        "draw).")
    for trace in curves:
        for points in curves[trace].values():
            points.sort(key=lambda p: p["offered"])
    return table, {"plot": curves}


def _gpus(doc: dict) -> str:
    """The GPUs a trial's requests ran on, each by its UUID's first block (GPU-0e1af380), as its records say."""
    used = sorted({r.get("gpu_uuid") for r in doc.get("records", []) if r.get("gpu_uuid")})
    return "+".join(u if not u.startswith("GPU-") else u[:12] for u in used)


def _engine_cpus(experiment: Experiment) -> str | None:
    """Where the trials ran their engine cores on CPUs of their own (backend.engine_cpus, parity.cpus), a note that
    says so: not the study's placement, the same on both paths."""
    counts = sorted({(doc.get("cpus") or {}).get("engine_cpus", 0) for doc in experiment.trials.values()})
    if not any(counts):
        return None
    return ("Engine cores on CPUs of their own (ours, backend.engine_cpus, the same on both paths): "
            + ", ".join(f"{n} each" if n else "none" for n in counts)
            + " (each trial records where its engine cores ran, `cpus`; the rest of the job on the other CPUs).")


def _first_saturated(rows: list[list]) -> str | None:
    """Each path's first over-saturated rung per trace, as the measurements found it (achieved below 90% of the
    offered rate in the row's own window), not as configured; rows in ladder order."""
    first: dict = {}
    for trace, offered, tokens, label, *_, saturated, _lag in rows:
        if saturated == f.yes_no(True) and offered != REPLAY:  # a replay is no rung of the ladder
            first.setdefault((trace, tokens, label), offered)
    if not first:
        return None

    def said(found: list) -> str:
        return "; ".join(f"{label} on {trace}: {offered} req/s" for (trace, _, label), offered in found)

    free = [item for item in first.items() if "bounded admission" not in item[0][2]]
    held = [item for item in first.items() if "bounded admission" in item[0][2]]
    return ((f"First over-saturated rung (measured: achieved below 90% of offered): {said(free)}." if free else "")
            + (" " if free and held else "")
            + (f"A bounded arm's achieved rate counts only what it admitted, so its first rung below 90% of offered "
               f"is where it refused (or fell behind) more than a tenth of the load: {said(held)}." if held else ""))


def _step_cell(pairs: list[tuple[dict, dict]], excluded: int) -> tuple[str, str, dict]:
    """The achieved and p99 client TTFT cells of one configuration's pairs at one rung, and their numbers."""
    if not pairs:
        missing = f.MISSING + (f" ({excluded} pair(s) excluded)" if excluded else "")
        return missing, missing, {"pairs": 0, "excluded_pairs": excluded}
    achieved = [c["achieved_per_s"] / r["achieved_per_s"] for r, c in pairs]
    p99 = [c["ttft_client"]["p99"] / r["ttft_client"]["p99"] for r, c in pairs]
    ref_ms, cand_ms = (stats.summary([s["ttft_client"]["p99"] * 1e3 for s in side])["median"]
                       for side in zip(*pairs))
    a, t = stats.summary(achieved), stats.summary(p99)
    spread = len(pairs) > 1
    cells = (f.pct(a["median"], 1) + (f" [{f.pct(a['min'], 1)}–{f.pct(a['max'], 1)}]" if spread else ""),
             f"{t['median']:.2f}×" + (f" [{t['min']:.2f}–{t['max']:.2f}×]" if spread else "")
             + f" ({cand_ms:,.0f} vs {ref_ms:,.0f} ms)")
    if excluded:
        cells = tuple(c + f", {excluded} pair(s) excluded" for c in cells)
    return *cells, {"pairs": len(pairs), "excluded_pairs": excluded, "achieved_ratio": a, "ttft_client_p99_ratio": t,
                    "ttft_client_p99_ms": {"flame": cand_ms, "standalone": ref_ms}}


def _medians(summaries: list[dict]) -> dict:
    """One point of a curve: the median achieved rate and client TTFT p50 and p99 over a rung's trials."""
    return {"achieved": stats.summary([s["achieved_per_s"] for s in summaries])["median"],
            "ttft_p50": stats.summary([s["ttft_client"]["p50"] for s in summaries])["median"],
            "ttft_p99": stats.summary([s["ttft_client"]["p99"] for s in summaries])["median"]}


def sustained_steps(experiment: Experiment | None) -> tuple[Table, dict]:
    """What each Flame configuration buys: on the ladder's rungs (trace, answer length, offered rate), each
    configuration's own pairs (bursts, then every arm in the settings' order) as Flame / standalone achieved
    rate and p99 client TTFT; and the curves' numbers (medians per rung) for the plot beside it."""
    from parity import latency

    table = Table("What each Flame configuration buys under sustained load (ours)", None,
                  ["Trace", "Output tokens", "Offered req/s", "Source"])
    if experiment is None:
        table.notes.append(not_run("sustained"))
        return table, {"steps": {}, "plot": {}}
    objective = latency.Objective.from_dict(experiment.doc["settings"].get("objective"))
    arms = _arms(experiment)
    names = [arm or BURSTS for arm in arms]
    labels = {}
    for case in experiment.cases:
        if case["system"] == "flame" and case["stage"].startswith("rate-") and case.get("flame"):
            labels.setdefault(_offered_arm(case)[1], case["flame"]["label"])
    entries = {case["trial_id"]: case for case in experiment.cases}
    table.columns += [f"Achieved, Flame / vLLM: {n}" for n in names]
    table.columns += [f"Client TTFT p99, Flame / vLLM: {n}" for n in names]
    rungs: dict = {}  # (trace, tokens, offered) -> arm -> its pairs: summaries of the passed, trials of all
    for pair, reference, candidate in experiment.pairs:
        if not (pair.get("stage") or "").startswith("rate-"):
            continue
        case = entries[reference["trial_id"]]  # a pair's sides share its rate, answer length and arm
        offered, arm = _offered_arm(case)
        rung = rungs.setdefault((pair["trace_name"], _output_tokens(case, reference), float(offered)), {}).setdefault(
            arm, {"good": [], "docs": []})
        rung["docs"] += [reference, candidate]
        if stats.passed(reference) and stats.passed(candidate):
            rung["good"].append((latency.summarize(reference, objective), latency.summarize(candidate, objective)))
    steps: dict = {}
    plot: dict = {}
    for (trace, tokens, offered), by_arm in sorted(rungs.items()):
        achieved, ttft = [], []
        stage = f"rate-{offered:g}" + ("" if tokens == OUTPUT_TOKENS else f"-out{tokens}")
        for arm, name in zip(arms, names):
            rung = by_arm.get(arm, {"good": [], "docs": []})
            good = rung["good"]
            a, t, numbers = _step_cell(good, len(rung["docs"]) // 2 - len(good))
            achieved.append(a)
            ttft.append(t)
            steps.setdefault(trace, {}).setdefault(stage, {})[name] = numbers | {"flame_label": labels.get(arm)}
            curve = plot.setdefault(trace + ("" if tokens == OUTPUT_TOKENS else f", {tokens} output tokens"), {})
            if good:  # the standalone curve: the bursts pairs' side (each arm's own reference repeats it)
                for key, side in ([] if arm else [("standalone", 0)]) + [("flame-" + name, 1)]:
                    curve.setdefault(key, []).append({"offered": offered} | _medians([p[side] for p in good]))
        docs = [d for rung in by_arm.values() for d in rung["docs"]]
        table.rows.append([trace, tokens, f"{offered:g}", ours(docs), *achieved, *ttft])
    table.notes.append(
        "Ours only: each Flame configuration against the standalone side of its own pairs (the same seeded arrivals, "
        "interleaved), the median over its pairs, [min–max] where there are several; Flame's p99 client TTFT against "
        "standalone's, with both in ms. The configurations build on each other: "
        + "; ".join(f"{name} ({labels.get(arm) or 'not run'})" for arm, name in zip(arms, names))
        + f". {BURSTS}: the sustained experiment's own Flame settings, one task per batch as the study ran them "
        "(in config/experiments.yaml the study's final configuration). A pair with a failed side is excluded.")
    return table, {"steps": steps, "plot": plot}


def restarts(experiment: Experiment | None) -> Table:
    """The worker-restart pairs: when each side's engine was killed, what it had to send again, how long
    until the new engine answered, and what the outage did to the latencies of the window."""
    from parity import latency

    table = Table("Worker restart under sustained load (ours)", None,
                  ["Trace", "Offered req/s", "Path", "Source", "Killed at s", "New replica healthy at s",
                   "Recovery s", "Sent again", "Lost", "E2E p50 / p99 ms", "Met objective"])
    cases = [c for c in experiment.cases if c["stage"].startswith("restart-")] if experiment else []
    if not cases:
        table.notes.append(not_run("sustained") if experiment is None else
                           "Not run: the sustained experiment's settings name no restart.")
        return table
    objective = latency.Objective.from_dict(experiment.doc["settings"].get("objective"))
    for case in cases:
        doc = experiment.trials[case["trial_id"]]
        label = dict(PATHS).get(case["system"], case["system"])
        offered, arm = _offered_arm(case)
        offered += f"-{arm}" if arm else ""  # an arm's restart pair, named as its stage names it
        fault = doc.get("restart")
        if not stats.passed(doc) or not fault:
            table.rows.append([case["trace_name"], offered, label, ours([doc]), *[f.MISSING] * 7])
            continue
        s = latency.summarize(doc, objective)
        table.rows.append([case["trace_name"], offered, label, ours([doc]),
                           f"{fault['killed_s']:.2f}", f.MISSING if fault["ready_s"] is None else f"{fault['ready_s']:.2f}",
                           f"{fault['recovery_s']:.2f}", f"{len(fault['resent'])} of {fault['requests']}",
                           str(fault["lost"]), _ms(s["e2e"], "p50", "p99"), f.pct(s["good_share_client"], 0)])
    table.notes.append(
        "Ours only, beyond the study: one pair per repeat, the same seeded arrivals as the ladder's rate, each "
        "side's engine of one shard killed (SIGKILL of its process and its children) at the same point of the "
        "schedule. Standalone: a new replica is started at once, as a supervisor would, and each request the dead "
        "one had not answered is sent to it when it is healthy. Flame: a new session for the shard (a new worker and "
        "engine) gets every request the dead worker had not answered and all that arrive for the shard after the "
        "kill. Recovery: from the "
        "kill to the new engine's first answer. Latencies are from each request's scheduled arrival, the outage "
        "inside them; a request that could not be answered would fail the trial, so Lost is 0 in every row shown. "
        "Real Flame v0.6.0 does not recover: the executor whose service was killed stays (bound while idle, "
        "ExecutorUnbinding for ever once a task finds no service) and the new session gets no executor, so on a real cluster the Flame "
        "side fails in one line after the restart's timeout (tested with Flame v0.6.0 binaries). A Flame row "
        "here comes from the CPU stand-in of the session manager, which starts a new executor; it shows the "
        "client's recovery, not Flame's.")
    return table
