"""Flame task inputs: encoded size of a burst raw and with zlib level 1, and encode + decode time per batch.

Measured side by side on the same trace; the study reports 6,210,432 → 387,795 bytes for its reuse
burst (its corpus and tokenizer; the smoke profile's synthetic news is more repetitive still).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.errors import ParityError
from parity.flame import codec
from parity.stats import range_text
from parity.trace import load_trace

STUDY_BYTES = {"raw": 6_210_432, "zlib": 387_795}


def _runs_ms(fn, repeats: int) -> list[float]:
    """Each of `repeats` timed calls, in ms (the bench reports the best and their range)."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1000)
    return runs


def run(trace_path: Path, batch: int = 128, budget: int = 4 * 1024 * 1024, repeats: int = 5) -> dict:
    """Burst bytes raw and zlib-1 (whole burst, in batches of `batch`), and the first batch's encode and decode
    times, each the best of `repeats` with every run kept."""
    trace = load_trace(trace_path)
    prompts = [codec.Prompt(r.id, p) for r, p in zip(trace.requests, trace.prompts)]
    sizes = {name: sum(len(codec.encode(prompts[i:i + batch], compress=name == "zlib"))
                       for i in range(0, len(prompts), batch)) for name in ("raw", "zlib")}
    first = prompts[:batch]
    timing = {}
    for name in ("raw", "zlib"):
        encoded = codec.encode(first, compress=name == "zlib")
        encode = _runs_ms(lambda: codec.encode(first, compress=name == "zlib"), repeats)
        try:
            decode = _runs_ms(lambda: codec.decode(encoded, budget=budget), repeats)
        except ParityError as exc:  # a batch over Flame's payload budget: say what to change
            raise ParityError(f"{exc} (a batch of {len(first)} of this trace's prompts: give a smaller --batch)") \
                from None
        timing[name] = {"encode_ms": min(encode), "decode_ms": min(decode), "encode_ms_runs": encode,
                        "decode_ms_runs": decode, "batch_bytes": len(encoded)}
    return {"trace": trace.name, "requests": len(prompts), "batch": len(first), "bytes": sizes, "repeats": repeats,
            "ratio_zlib_to_raw": sizes["zlib"] / sizes["raw"], "per_batch": timing, "study_bytes": STUDY_BYTES}


def summary_lines(r: dict) -> list[str]:
    """The burst's bytes, then per codec the first batch's times: the best of the runs, and their range."""
    lines = [f"{r['trace']} ({r['requests']} requests): raw {r['bytes']['raw']:,} bytes, zlib-1 {r['bytes']['zlib']:,} "
             f"bytes (ratio {r['ratio_zlib_to_raw']:.3f}; study: {r['study_bytes']['raw']:,} -> "
             f"{r['study_bytes']['zlib']:,})"]
    for name, t in r["per_batch"].items():
        lines.append(f"  {name:<4} batch of {r['batch']}: {t['batch_bytes']:,} bytes, encode {t['encode_ms']:.2f} ms "
                     f"({range_text(t['encode_ms_runs'])}), decode {t['decode_ms']:.2f} ms "
                     f"({range_text(t['decode_ms_runs'])})")
    runs = "one run" if r["repeats"] == 1 else f"the best of {r['repeats']} runs"
    lines.append(f"  (times: {runs} on this machine, then the runs' range)")
    return lines
