"""Simulator speed: CPU seconds to run a burst in virtual time, beside the engine seconds it models."""

from __future__ import annotations

import time
from pathlib import Path

from parity.engine.sim import SimEngine
from parity.trace import load_trace

TARGET_CPU_S = 2.0


def run(trace_path: Path, repeats: int = 3) -> dict:
    prompts = list(load_trace(trace_path).prompts)
    best, modelled = float("inf"), 0.0
    for _ in range(repeats):
        engine = SimEngine()
        start = time.process_time()
        completions = engine.generate(prompts)
        best = min(best, time.process_time() - start)
        modelled = max(c.complete_s for c in completions)
    return {"requests": len(prompts), "cpu_s": best, "modelled_s": modelled, "speedup": modelled / best,
            "target_cpu_s": TARGET_CPU_S, "meets_target": best < TARGET_CPU_S}
