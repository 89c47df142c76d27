"""What an experiment manifest states, derived again from its trials and pairs (`parity.rederive`): a forged
rate or verdict re-hashed into experiment.json disagrees with the trial it links, a pair swapped disagrees
with the cases it pairs, and a case dropped (with its trials, pair and log lines: a failed or unfavourable
pair hidden) disagrees with the cases its own settings plan on the traces its trials ran."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from parity.errors import ParityError
from parity.experiments.offline_limit import OFFLINE_LIMIT, limit
from parity.experiments.plan import for_experiment, runs_cases
from parity.experiments.runner import case_entry
from parity.manifest import first_difference, read_manifest
from parity.stats import trial_facts
from parity.trial import STUDY_LOAD, recorded_load


def admitted_against(trial_doc: dict) -> dict | None:
    """The objective a bounded trial's controller admitted against (None: a trial with no admission)."""
    ran_with = trial_doc.get("ran_with")
    load = ran_with.get("load") if isinstance(ran_with, dict) else None
    admission = load.get("admission") if isinstance(load, dict) else None  # (a forged shape: the schema names it)
    return admission.get("objective") if isinstance(admission, dict) else None


def _bounded(doc: dict) -> dict | None:
    """The bounded arm's settings an experiment manifest states, whole (defaults filled in), or None: none stated, or
    not settings at all (the schema names those)."""
    from parity.admission import BoundedSettings

    stated = (doc.get("settings") or {}).get("bounded")
    if not isinstance(stated, dict):
        return None
    try:
        return BoundedSettings.from_dict(stated).to_dict()
    except (ParityError, TypeError, ValueError):
        return None


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each thing an experiment manifest states that its trials and pairs do not give
    (`parity.rederive`): each case's facts, and one pair manifest for each pair of cases, linking those two."""
    path, found = Path(path), []
    groups, shards, traces, configs, admitted, ran, bounded = {}, {}, {}, {}, [], [], []
    stated = _bounded(doc)  # the bounded settings it states, whole: each bounded trial must have run with them
    for number, case in enumerate(doc["cases"]):
        trial = os.path.normpath(path.parent / case["manifest"]["path"])
        try:
            trial_doc = read_manifest(trial)
            facts = trial_facts(trial_doc)
        except (ParityError, KeyError, TypeError) as exc:
            found.append((f"/cases/{number}/manifest", f"its trial cannot be read: {exc!r}"))
            continue
        if doc["experiment"] == OFFLINE_LIMIT:  # a shard's trial runs a subset trace, named after the whole one
            facts["trace_name"] = facts["trace_name"].removesuffix(f"-{case.get('stage')}")
            shards.setdefault(facts["trace_name"], []).append(trial_doc)
        found += [(f"/cases/{number}/{key}", f"states {case.get(key)!r}, its trial gives {value!r}")
                  for key, value in facts.items() if case.get(key) != value]
        judged = admitted_against(trial_doc)
        if judged is not None and (doc.get("settings") or {}).get("objective") != judged:
            admitted.append((case.get("trial_id"), judged))
        if judged is not None and stated is not None:
            ran_by = {k: v for k, v in trial_doc["ran_with"]["load"]["admission"].items() if k != "objective"}
            if ran_by != stated:
                bounded.append((case.get("trial_id"), ran_by, stated))
        ran_with = trial_doc.get("ran_with")  # a trial made before its load was recorded ran the study's (trial.stale)
        configs[case.get("trial_id")] = (trial_doc.get("config") or {}) | (
            {"load": ran_with.get("load", STUDY_LOAD)} if isinstance(ran_with, dict) else {})
        if isinstance(ran_with, dict):
            ran.append(ran_with)
        if isinstance(trial_doc.get("trace"), dict):
            traces.setdefault(os.path.normpath(Path(trial).parent / trial_doc["trace"]["path"]), None)
        if case.get("pair") is not None:
            groups.setdefault((case.get("stage"), case["trace_name"], case["pair"]), set()).add(trial)
    if admitted:  # the report judges every case's goodput by the stated objective
        (trial_id, judged), more = admitted[0], len(admitted) - 1
        found.append(("/settings/objective", f"states {(doc.get('settings') or {}).get('objective')!r}, its trial "
                      f"{trial_id} was admitted against {judged!r}" + (f" (and {more} more)" if more else "")))
    if bounded:  # an outsider's (2026-12-07): settings that no trial ran with passed validate
        (trial_id, ran_by, stated), more = bounded[0], len(bounded) - 1
        changed = sorted(k for k in set(ran_by) | set(stated) if ran_by.get(k) != stated.get(k))
        found.append(("/settings/bounded", f"states {', '.join(f'{k} {stated.get(k)!r}' for k in changed)}, its trial "
                      f"{trial_id} ran with {', '.join(f'{k} {ran_by.get(k)!r}' for k in changed)}"
                      + (f" (and {more} more)" if more else "")))
    found += _unplanned(doc, [Path(t) for t in traces], configs)
    found += _backend(doc["backend"], ran)
    if doc["simulated"] != any(case.get("simulated") for case in doc["cases"]):
        found.append(("/simulated", f"states {doc['simulated']}, its cases give the opposite"))
    listed = []
    for number, ref in enumerate(doc["pairs"]):
        pair_path = path.parent / ref["path"]
        try:
            pair = read_manifest(pair_path)
        except ParityError as exc:
            found.append((f"/pairs/{number}", str(exc)))
            continue
        sides = {os.path.normpath(pair_path.parent / pair[s]["manifest"]["path"]) for s in ("reference", "candidate")}
        key = (pair.get("stage"), pair.get("trace_name"), pair.get("pair_index"))
        listed.append(key)
        if groups.get(key) != sides:
            found.append((f"/pairs/{number}", f"links trials {sorted(map(os.path.basename, sides))}, which are not the "
                          f"cases of pair {key[2]} of stage {key[0]} on {key[1]}"))
    if unlisted := sorted(set(groups) - set(listed), key=str):
        found.append(("/pairs", f"{len(unlisted)} pair(s) of its cases have no pair manifest, e.g. {unlisted[0]}"))
    for number, stated in enumerate(doc.get("limits", [])):
        derived = limit(stated["trace_name"], shards.get(stated["trace_name"], []), stated["side_by_side"])
        if derived != stated:
            key = next((k for k in derived if derived[k] != stated.get(k)), "trace_name")
            found.append((f"/limits/{number}/{key}", f"states {stated.get(key)!r}, its shards' trials give {derived[key]!r}"))
    return found


# the experiment's backend key → what each trial records it ran with (`trial.ran_with`) under
BACKEND_RAN_WITH = {"engine": "engine", "warmup_rounds": "warmup_rounds", "sim_params_sha256": "sim_params"}


def _backend(stated: dict, ran: list[dict]) -> list[tuple[str, str]]:
    """What the experiment states it ran on (engine family, GPUs, warm-up rounds, simulator parameters: the report's
    Engine column reads it) against what its trials record they ran with, so a simulated experiment cannot be
    relabelled vLLM on other GPUs by editing experiment.json. Its GPUs are those one of its trials ran on (a group
    kept from an earlier machine ran on that machine's: `runner.Runner.moved`)."""
    found = []
    for key, recorded in BACKEND_RAN_WITH.items():
        given = next((r.get(recorded) for r in ran if r.get(recorded) != stated.get(key)), stated.get(key))
        if key in stated and given != stated[key]:
            found.append((f"/backend/{key}", f"states {stated[key]!r}, its trials ran {given!r}"))
    if ran and not any(r.get("gpus") == stated["gpus"] for r in ran):
        found.append(("/backend/gpus", f"states {stated['gpus']!r}, no trial ran on them (its first ran on "
                                       f"{ran[0].get('gpus')!r})"))
    return found


def _unplanned(doc: dict, traces: list[Path], configs: dict[str, dict]) -> list[tuple[str, str]]:
    """The cases the experiment's settings plan on the traces its trials ran, against the cases it lists (the
    runner writes experiment.json only once every planned case ran, so a case missing was removed), and what it
    states of each (`runner.case_entry`: placement, stage, rate, arm, Flame settings) against the plan and against
    its trial's own config (`configs`, by trial id). The traces in each order (a few), since a ladder's first rate,
    which extra pairs default to, follows their order."""
    if not runs_cases(doc["experiment"]) or not traces:
        return []
    named = (doc.get("settings") or {}).get("traces") or []  # a trace its settings name whose rungs were all
    # narrowed away ran no trial, yet the plan needs it (session 26's archive); the plan reads a trace's name alone
    traces = traces + [traces[0].parent / f"{name}.json" for name in named
                       if isinstance(name, str) and name not in {t.stem for t in traces}]
    listed = {case.get("trial_id"): (number, case) for number, case in enumerate(doc["cases"])}
    once = len(listed) == len(doc["cases"])  # no case listed twice
    first = None
    for order in itertools.islice(itertools.permutations(traces), 120):
        try:
            planned = for_experiment(doc["experiment"], list(order), doc["settings"])
        except (ParityError, KeyError, TypeError, ValueError, OSError) as exc:
            return [("/settings", f"its cases cannot be planned again from its settings: {' '.join(str(exc).split())}")]
        if once and sorted(c.trial_id for c in planned) == sorted(listed):
            break
        first = first or [c.trial_id for c in planned]
    else:
        found = []
        if missing := [t for t in first if t not in listed]:
            found.append(("/cases", f"its settings plan {len(first)} case(s) on the traces its trials ran; "
                                    f"{len(missing)} are not listed, e.g. {missing[0]}"))
        if extra := [t for t in listed if t not in first]:
            found.append(("/cases", f"lists {len(extra)} case(s) its settings do not plan, e.g. {extra[0]}"))
        return found or [("/cases", "lists a case twice")]
    found, loads = [], []
    for case in planned:
        number, entry = listed[case.trial_id]
        stated = json.loads(json.dumps(case_entry(case)))  # as a manifest holds it
        for key, value in stated.items():
            if entry.get(key) != value:
                pointer, was, given = first_difference(f"/cases/{number}/{key}", entry.get(key), value)
                found.append((pointer, f"states {was!r}, its settings plan {given!r}"))
        config = configs.get(case.trial_id, {})
        # the trial's schedule is held to its ran_with.load (checks.py), and that here to the plan's, so a paced trial
        # relabelled a replay in both places is found (outside pass M); its admission is held to the stated objective
        # and bounded settings above, each in a line of its own
        planned_load = {k: v for k, v in json.loads(json.dumps(recorded_load(case.load))).items() if k != "admission"}
        if "load" not in config:  # every experiment's trial records it (runner.Runner: trial.ran_with)
            loads.append((f"/cases/{number}/manifest", "its trial records no ran_with (what it ran with: how its "
                                                       "requests arrived and were timed), which every experiment's "
                                                       "trial records"))
        elif not isinstance(config["load"], dict):  # (the trial schema names it too; here no traceback)
            loads.append((f"/cases/{number}/load", f"its trial ran with {config['load']!r}, not a load"))
        elif (ran := {k: v for k, v in config["load"].items() if k != "admission"}) != planned_load:
            pointer, was, given = first_difference(f"/cases/{number}/load", ran, planned_load)
            loads.append((pointer, f"its trial ran with {was!r}, its settings plan {given!r}"))
        if config.get("placement") not in (None, case.placement):
            found.append((f"/cases/{number}/placement", f"its trial's config says placement {config['placement']!r}, "
                                                        f"its settings plan {case.placement!r}"))
        planned_flame = {k: v for k, v in (stated["flame"] or {}).items() if k != "label"}
        if case.system == "flame" and "flame" in config and config["flame"] != planned_flame:
            pointer, was, given = first_difference(f"/cases/{number}/flame", config["flame"], planned_flame)
            found.append((pointer, f"its trial's config says {was!r}, its settings plan {given!r}"))
    if loads:  # one line for all of them (settings edited for every trial say so once)
        (pointer, why), more = loads[0], len(loads) - 1
        found.append((pointer, why + (f" (and {more} more)" if more else "")))
    return found
