"""The four per-request checks of every trial, and its verdict.

- input: each record's input hash equals the trace's hash for that request (what was submitted is
  what the trace holds, also after compression and decompression);
- coverage: every request of the trace appears exactly once, and nothing else does;
- output length: every request produced exactly 16 tokens;
- placement: each logical shard ran on one GPU, the GPUs named in the trial, and, where a pinning is
  given (e.g. from the paired standalone trial), the same GPU UUID per shard.
A trial that fails a check is marked failed with the reasons, and excluded from statistics later; the
checks only ever write the verdict, never a record.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from parity.engine import OUTPUT_TOKENS
from parity.errors import ParityError
from parity.manifest import read_manifest, write_manifest
from parity.trace import Trace, load_trace

CHECKS = ("input", "coverage", "output_length", "placement")


def shard_gpus(records: list[dict]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for r in records:
        out.setdefault(r["shard"], set()).add(r["gpu_uuid"])
    return out


def pinning_of(doc: dict) -> dict[int, str]:
    """Shard → GPU UUID as a trial actually ran (only for shards that ran on one GPU)."""
    return {shard: next(iter(gpus)) for shard, gpus in shard_gpus(doc["records"]).items() if len(gpus) == 1}


def _input(doc: dict, trace: Trace) -> list[str]:
    expected = {r.id: r.sha256 for r in trace.requests}
    bad = [r["request_id"] for r in doc["records"]
           if r["request_id"] in expected and r["input_sha256"] != expected[r["request_id"]]]
    return [f"{len(bad)} request(s) submitted inputs that differ from the trace, e.g. {bad[0]}"] if bad else []


def _coverage(doc: dict, trace: Trace) -> list[str]:
    seen = Counter(r["request_id"] for r in doc["records"])
    wanted = {r.id for r in trace.requests}
    reasons = []
    if missing := sorted(wanted - set(seen)):
        reasons.append(f"{len(missing)} request(s) missing, e.g. {missing[0]}")
    if twice := sorted(rid for rid, n in seen.items() if n > 1):
        reasons.append(f"{len(twice)} request(s) recorded more than once, e.g. {twice[0]}")
    if extra := sorted(set(seen) - wanted):
        reasons.append(f"{len(extra)} record(s) not in the trace, e.g. {extra[0]}")
    return reasons


def _output_length(doc: dict) -> list[str]:
    bad = [r["request_id"] for r in doc["records"] if len(r["output_token_ids"]) != OUTPUT_TOKENS]
    return [f"{len(bad)} request(s) without exactly {OUTPUT_TOKENS} output tokens, e.g. {bad[0]}"] if bad else []


def _placement(doc: dict, pinning: dict[int, str] | None, exclusive: bool) -> list[str]:
    reasons = []
    named = {g["uuid"] for g in doc["gpus"]}
    for shard, gpus in sorted(shard_gpus(doc["records"]).items()):
        if exclusive and len(gpus) != 1:
            reasons.append(f"shard {shard} ran on {len(gpus)} GPUs: {sorted(gpus)}")
        if gpus - named:
            reasons.append(f"shard {shard} ran on GPUs the trial does not name: {sorted(gpus - named)}")
        if pinning is not None and shard in pinning and gpus != {pinning[shard]}:
            reasons.append(f"shard {shard} ran on {sorted(gpus)}, pinned to {pinning[shard]}")
    return reasons


def check_trial(doc: dict, trace: Trace, pinning: dict[int, str] | None = None) -> dict:
    """The verdict of one trial: every check with its outcome, and the reasons for any failure."""
    exclusive = doc.get("config", {}).get("placement") != "global"  # a global session shares one queue
    found = {"input": _input(doc, trace), "coverage": _coverage(doc, trace),
             "output_length": _output_length(doc), "placement": _placement(doc, pinning, exclusive)}
    checks = {name: ({"passed": False, "detail": "; ".join(r)} if r else {"passed": True})
              for name, r in found.items()}
    reasons = [f"{name}: {reason}" for name, rs in found.items() for reason in rs]
    return {"status": "failed" if reasons else "passed", "checks": checks, "reasons": reasons}


def check_file(path: Path, pinning: dict[int, str] | None = None) -> dict:
    """Check a trial manifest against the trace it links, and write its verdict (only the verdict)."""
    doc = read_manifest(path)
    trace = load_trace(path.parent / doc["trace"]["path"])
    if trace.manifest_sha256 != doc["trace"]["sha256"]:
        raise ParityError(f"{path} names trace {doc['trace']['path']} with SHA-256 {doc['trace']['sha256']}, "
                          f"but that file now has {trace.manifest_sha256}")
    doc["verdict"] = check_trial(doc, trace, pinning)
    write_manifest(path, doc)
    return doc["verdict"]
