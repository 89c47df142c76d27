"""Simulator speed: CPU seconds to run a burst in virtual time, beside the engine seconds it models."""

from __future__ import annotations

import time
from pathlib import Path

from parity.engine.sim import SimEngine
from parity.stats import range_text
from parity.trace import load_trace

TARGET_CPU_S = 2.0


def run(trace_path: Path, repeats: int = 3) -> dict:
    """The CPU time of each of `repeats` simulations of the burst (the best judged against the target)."""
    prompts = list(load_trace(trace_path).prompts)
    runs, modelled = [], 0.0
    for _ in range(repeats):
        engine = SimEngine()
        start = time.process_time()
        completions = engine.generate(prompts)
        runs.append(time.process_time() - start)
        modelled = max(c.complete_s for c in completions)
    best = min(runs)
    return {"requests": len(prompts), "cpu_s": best, "cpu_s_runs": runs, "repeats": repeats, "modelled_s": modelled,
            "speedup": modelled / best, "target_cpu_s": TARGET_CPU_S, "meets_target": best < TARGET_CPU_S}


def summary_line(r: dict) -> str:
    verdict = "meets" if r["meets_target"] else "MISSES"
    return (f"{r['requests']} requests: {r['cpu_s']:.3f} s of CPU to simulate {r['modelled_s']:.2f} s of engine time "
            f"(x{r['speedup']:.0f}; best of {r['repeats']} runs, {range_text(r['cpu_s_runs'], 3)} s); {verdict} the "
            f"{r['target_cpu_s']:.0f} s target")
