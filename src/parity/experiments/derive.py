"""What an experiment manifest states, derived again from its trials and pairs (`parity.rederive`): a forged
rate or verdict re-hashed into experiment.json disagrees with the trial it links, and a pair dropped or
swapped disagrees with the cases it pairs."""

from __future__ import annotations

import os
from pathlib import Path

from parity.errors import ParityError
from parity.experiments.offline_limit import OFFLINE_LIMIT, limit
from parity.manifest import read_manifest
from parity.stats import trial_facts


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each thing an experiment manifest states that its trials and pairs do not give
    (`parity.rederive`): each case's facts, and one pair manifest for each pair of cases, linking those two."""
    path, found = Path(path), []
    groups, shards = {}, {}
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
        if case.get("pair") is not None:
            groups.setdefault((case.get("stage"), case["trace_name"], case["pair"]), set()).add(trial)
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
