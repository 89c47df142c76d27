"""Statistics of trials and pairs, as the study reports them; nothing here runs anything.

Per system: median [min–max] requests/s over passed trials. Per pair (a fresh standalone reference
and a fresh Flame candidate on the same trace): the throughput ratio candidate / reference. Across
pairs: the median difference, whether both medians are within 1%, and whether every pair reaches 99%.
Failed trials never contribute a number; they are counted and named instead.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from parity import record
from parity.checks import pinning_of
from parity.errors import ParityError
from parity.manifest import file_ref, header, read_manifest, write_manifest

TARGET = 0.99


def rps(doc: dict) -> float:
    return doc["timing"]["requests_per_s"]


def passed(doc: dict) -> bool:
    return doc["verdict"]["status"] == "passed"


def summary(values: list[float]) -> dict:
    """Median with the observed minimum and maximum."""
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def range_text(values, digits: int = 2) -> str:
    """Repeated runs' range as the benches print it beside their best or median: `min-max`."""
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def describe(docs: list[dict]) -> dict:
    """Median [min–max] requests/s of the passed trials, and which trials were left out."""
    good = [d for d in docs if passed(d)]
    out = {"excluded": [d["trial_id"] for d in docs if not passed(d)]}
    if good:
        out["requests_per_s"] = summary([rps(d) for d in good])
        out["cached_share"] = summary([cached_share(d) for d in good])
    return out


def cached_share(doc: dict) -> float:
    """Cached share of a trial's prompt tokens (parity.record.cached_share over its records)."""
    return record.cached_share(doc["records"])


def trial_facts(doc: dict) -> dict:
    """What an experiment's entry for a case says of its trial, all read from the trial manifest."""
    return {"trial_id": doc["trial_id"], "system": doc["system"], "trace_name": doc["trace_name"],
            "status": doc["verdict"]["status"], "requests_per_s": doc["timing"]["requests_per_s"],
            "cached_share": cached_share(doc), "simulated": doc["simulated"], "cluster": doc.get("flame_cluster")}


def batch_histogram(doc: dict) -> dict[int, int]:
    """How many tasks carried how many prompts (Flame trials)."""
    return dict(sorted(Counter(doc.get("batch_sizes", [])).items()))


def shard_finish_s(doc: dict) -> dict[int, float]:
    """Seconds from burst release to each shard's last completion: where a pair's gap sits."""
    release = doc["timing"]["release_s"]
    finish: dict[int, float] = {}
    for r in doc["records"]:
        finish[r["shard"]] = max(finish.get(r["shard"], 0.0), r["complete_s"] - release)
    return dict(sorted(finish.items()))


def shard_tasks(doc: dict) -> dict[int, list[tuple[int, float]]]:
    """A Flame trial's tasks per shard, in the order sent: (prompts, seconds inside the engine)."""
    shard_of = {r["batch_id"]: r["shard"] for r in doc["records"] if r.get("batch_id")}
    tasks: dict[int, list[tuple[int, float]]] = {}
    for b in doc.get("batches", []):
        tasks.setdefault(shard_of.get(b["batch_id"], -1), []).append((b["prompts"], b["engine_s"]))
    return dict(sorted(tasks.items()))


def compare(pairs: list[tuple[dict, dict]]) -> dict:
    """Paired scores of candidate vs reference; only pairs whose two trials both passed count."""
    good = [(r, c) for r, c in pairs if passed(r) and passed(c)]
    if not good:
        return {"pairs": 0, "excluded_pairs": len(pairs)}
    ratios = [rps(c) / rps(r) for r, c in good]
    reference = statistics.median(rps(r) for r, _ in good)
    candidate = statistics.median(rps(c) for _, c in good)
    difference = candidate / reference - 1
    return {"pairs": len(good), "excluded_pairs": len(pairs) - len(good),
            "reference": summary([rps(r) for r, _ in good]), "candidate": summary([rps(c) for _, c in good]),
            "ratios": ratios, "ratio_range": [min(ratios), max(ratios)], "median_difference": difference,
            "medians_within_1pct": abs(difference) <= 1 - TARGET,
            "every_pair_meets_99": all(x >= TARGET for x in ratios)}


REFERENCE = "standalone"  # every pair's reference: standalone vLLM, against the path under test (parity.paths)


def pair_doc(path: Path, index: int, reference: tuple[Path, dict], candidate: tuple[Path, dict], *,
             experiment: str | None = None, stage: str | None = None) -> dict:
    """The pair manifest at `path` for two trials: both linked by hash, with their ratio."""
    (ref_path, ref), (cand_path, cand) = reference, candidate
    if cand["system"] == REFERENCE:  # sides swapped turn a ratio r into 1/r (an outside tester's forgery, 2026-12-06)
        raise ParityError(f"a pair's candidate is the path under test, never the {REFERENCE} reference "
                          f"({ref['system']} against {cand['system']})")
    if ref["trace_name"] != cand["trace_name"]:
        raise ParityError(f"a pair needs one trace: {ref['trace_name']} vs {cand['trace_name']}")
    ratio = rps(cand) / rps(ref)
    return header("pair", simulated=ref["simulated"] or cand["simulated"]) | {
        "trace_name": ref["trace_name"], "pair_index": index,
        "reference": {"manifest": file_ref(ref_path, path.parent), "system": ref["system"], "requests_per_s": rps(ref)},
        "candidate": {"manifest": file_ref(cand_path, path.parent), "system": cand["system"], "requests_per_s": rps(cand)},
        "ratio": ratio, "meets_99": ratio >= TARGET,
    } | ({"experiment": experiment} if experiment else {}) | ({"stage": stage} if stage else {})


def write_pair(path: Path, index: int, reference: tuple[Path, dict], candidate: tuple[Path, dict], *,
               experiment: str | None = None, stage: str | None = None) -> dict:
    """Write the pair manifest (`pair_doc`)."""
    doc = pair_doc(path, index, reference, candidate, experiment=experiment, stage=stage)
    write_manifest(path, doc)
    return doc


def pair_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each thing a pair manifest states that its two trials do not give (`parity.rederive`):
    its rates, ratio and verdict, and the candidate's pinning, which must be the reference's GPUs as it ran."""
    path = Path(path)
    sides = {}
    for side in ("reference", "candidate"):
        trial = path.parent / doc[side]["manifest"]["path"]
        try:
            sides[side] = (trial, read_manifest(trial))
        except ParityError as exc:
            return [(f"/{side}/manifest", str(exc))]
    try:
        derived = pair_doc(path, doc["pair_index"], sides["reference"], sides["candidate"],
                           experiment=doc.get("experiment"), stage=doc.get("stage"))
    except (ParityError, KeyError, TypeError, ZeroDivisionError) as exc:
        return [("", f"cannot be derived from its trials: {exc!r}")]
    found = [(f"/{key}", f"states {doc.get(key)!r}, its trials give {derived.get(key)!r}")
             for key in ("trace_name", "ratio", "meets_99", "simulated") if doc.get(key) != derived.get(key)]
    found += [(f"/{side}/{key}", f"states {doc[side].get(key)!r}, its trial gives {derived[side][key]!r}")
              for side in ("reference", "candidate") for key in ("system", "requests_per_s")
              if doc[side].get(key) != derived[side][key]]
    (_, reference), (_, candidate) = sides["reference"], sides["candidate"]
    pinned = candidate.get("verdict", {}).get("pinning")
    if pinned is not None and pinned != {str(k): v for k, v in pinning_of(reference).items()}:
        found.append(("/candidate/manifest", f"its candidate was held to pinning {pinned}, its reference ran on "
                      f"{pinning_of(reference)}"))
    return found


def gc_pause_by_worker(doc: dict) -> dict[str, float]:
    """Seconds of GC pause inside inference per Flame worker, summed over the measured burst's batches."""
    totals: dict[str, float] = {}
    for batch in doc.get("batches", []):
        worker = batch.get("executor_id") or "?"
        totals[worker] = totals.get(worker, 0.0) + batch.get("gc_pause_s", 0.0)
    return dict(sorted(totals.items()))


def max_worker_gc_pause(doc: dict) -> float | None:
    """The study's GC figure: the largest per-worker pause total; None where no batch timed its GC."""
    if not any("gc_pause_s" in b for b in doc.get("batches", [])):
        return None
    return max(gc_pause_by_worker(doc).values())


def encoded_input_bytes(doc: dict) -> int | None:
    """Bytes the Flame service received for the measured burst (after compression, if any)."""
    sizes = [b["input_bytes"] for b in doc.get("batches", []) if "input_bytes" in b]
    return sum(sizes) if sizes else None
