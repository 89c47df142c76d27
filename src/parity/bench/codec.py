"""Flame task inputs: encoded size of a burst raw and with zlib level 1, and encode + decode time per batch.

Measured side by side on the same trace; the study reports 6,210,432 → 387,795 bytes for its reuse
burst (its corpus and tokenizer; the smoke profile's synthetic news is more repetitive still).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.flame import codec
from parity.trace import load_trace

STUDY_BYTES = {"raw": 6_210_432, "zlib": 387_795}


def _best_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start) * 1000)
    return best


def run(trace_path: Path, batch: int = 128, budget: int = 4 * 1024 * 1024, repeats: int = 5) -> dict:
    trace = load_trace(trace_path)
    prompts = [codec.Prompt(r.id, p) for r, p in zip(trace.requests, trace.prompts)]
    sizes = {name: sum(len(codec.encode(prompts[i:i + batch], compress=name == "zlib"))
                       for i in range(0, len(prompts), batch)) for name in ("raw", "zlib")}
    first = prompts[:batch]
    timing = {}
    for name in ("raw", "zlib"):
        encoded = codec.encode(first, compress=name == "zlib")
        timing[name] = {"encode_ms": _best_ms(lambda: codec.encode(first, compress=name == "zlib"), repeats),
                        "decode_ms": _best_ms(lambda: codec.decode(encoded, budget=budget), repeats),
                        "batch_bytes": len(encoded)}
    return {"trace": trace.name, "requests": len(prompts), "batch": len(first), "bytes": sizes,
            "ratio_zlib_to_raw": sizes["zlib"] / sizes["raw"], "per_batch": timing, "study_bytes": STUDY_BYTES}
