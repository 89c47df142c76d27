"""Routing on a real trace: a Mooncake request trace (parity.trace_mooncake), placed by every router and by the
hindsight placement, then each shard's requests run at once on a fresh simulated engine, as bench routing runs
its families (routing.evaluate). Each request asks for the trace's own `output_length` (at least one token); the
trace's arrivals are not replayed here: the offline limit's measure is a burst. The hindsight placement's documents
are each request's first two blocks (trace_mooncake.documents), a guess at the trace's documents, so here it is a
reference, not a bound: a router may beat it. Everything here is simulated.
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.bench.routing import Workload, evaluate, flag_text
from parity.engine.sim import SimParams
from parity.manifest import sha256_file
from parity.study import MAX_MODEL_LEN
from parity.trace_mooncake import documents, prompts, read_mooncake


def workload(path: Path, *, shards: int = 2, limit: int | None = None,
             context_tokens: int = MAX_MODEL_LEN) -> tuple[Workload, dict]:
    """The trace's requests that fit the context (token IDs as `parity trace-mooncake` writes them), and what
    was read and left out."""
    trace = read_mooncake(path, context_tokens=context_tokens, limit=limit)
    w = Workload("mooncake", path.name, prompts(trace), documents(trace), shards,
                 lengths=[max(1, r.output_length) for r in trace.requests])  # an engine makes at least one token
    return w, {"file": str(path), "sha256": sha256_file(path), "bytes": path.stat().st_size,
               "lines_read": trace.lines_read, "requests_read": trace.requests_read, "requests": len(trace.requests),
               "over_context": len(trace.over_context_lines), "over_context_lines": list(trace.over_context_lines),
               "context_tokens": context_tokens, "limit": limit}


def run(params: SimParams, path: Path, *, shards: int = 2, limit: int | None = None, progress=None) -> dict:
    """The trace's row; `progress(line)`, if given, hears of the reading and of each placement as it is done."""
    began = time.perf_counter()
    w, source = workload(path, shards=shards, limit=limit)
    if progress is not None:
        progress(f"{path.name}: {source['requests']} requests read ({source['over_context']} over the context, "
                 f"excluded) in {time.perf_counter() - began:.1f} s; each router places them, then the hindsight placement")
    return {"simulated": True, "params": params.source, "source": source, "rows": [evaluate(w, params, progress)]}


def summary_lines(result: dict) -> list[str]:
    """The trace's row: requests/s per placement and the prefix router against each (simulated)."""
    s, r = result["source"], result["rows"][0]
    rps = {p: v["requests_per_s"] for p, v in r["placements"].items()}
    return [f"{r['case']}: {s['requests']} requests over {r['shards']} shards, {r['documents']} documents; "
            f"{s['over_context']} of {s['requests_read']} read excluded (over {s['context_tokens']} tokens)",
            "req/s: " + ", ".join(f"{p} {v:.2f}" for p, v in rps.items()) + " (simulated)",
            f"prefix vs hindsight {r['prefix_vs_hindsight']:.1%}, alternating {r['prefix_vs_alternating']:.1%}, "
            f"sticky {r['prefix_vs_sticky']:.1%}; cached share (prefix) "
            f"{r['placements']['prefix']['cached_share']:.1%} {flag_text(r)}".rstrip()]
