"""The engine's offline limit: a trace handed straight to one engine, with no serving path around it.

All prompts at once (`batch=None`), as `LLM.generate` would take a shard's whole burst, or in fixed
batches, as a synchronous Flame adapter hands them over. Warmup rounds run the token-shifted variants
first, so the measured prefixes are cold. This is also how the simulator is calibrated.
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.engine import Engine
from parity.errors import ParityError
from parity.manifest import write_manifest
from parity.record import Placement, cached_share, request_records, trial_manifest
from parity.trace import load_trace


def run_burst(engine: Engine, prompts, batch: int | None) -> tuple[float, list]:
    """Release the burst and return (release time, completions in burst order)."""
    size = batch or len(prompts)
    release = engine.now()
    completions = []
    for start in range(0, len(prompts), size):
        completions += engine.generate(prompts[start:start + size])
    return release, completions


def run_offline(engine: Engine, trace_path: Path, out: Path, *, batch: int | None = None,
                warmup_rounds: int = 2, trial_id: str | None = None, log=print) -> dict:
    """Warm up on shifted variants, measure the trace, write a trial manifest; return a summary."""
    trace = load_trace(trace_path)
    engine.reset_prefix_cache()  # earlier runs on this engine must not warm this one
    for round_index in range(1, warmup_rounds + 1):
        warm = load_trace(trace_path, f"warmup{round_index}")
        started = time.monotonic()
        run_burst(engine, list(warm.prompts), batch)
        log(f"  warmup {round_index}: {len(warm.prompts)} requests in {time.monotonic() - started:.1f} s (wall)")
    release, completions = run_burst(engine, list(trace.prompts), batch)
    bad = [c for c in completions if len(c.output_token_ids) != 16]
    if bad:
        raise ParityError(f"{len(bad)} request(s) did not return exactly 16 tokens")
    described = engine.describe()
    gpu = described.get("gpu_uuid", "unknown")
    placements = [Placement(0, described["name"], gpu, None if batch is None else f"b{i // batch}")
                  for i in range(len(completions))]
    records = request_records(trace, completions, placements)
    config = {"engine": described["name"], "batch": batch, "warmup_rounds": warmup_rounds,
              "mode": described.get("mode"), "clock": described.get("clock")}
    trial_id = trial_id or f"offline-{described['name']}-{trace.name}" + (f"-b{batch}" if batch else "")
    doc = trial_manifest(trial_id=trial_id, experiment="offline", system="engine", engine=described,
                         trace=trace, config=config, records=records, release_s=release,
                         gpus=[{"uuid": gpu, "name": str(described.get("device", ""))}], manifest_path=out,
                         extra={"engine_description": described})
    write_manifest(out, doc)
    summary = {"trial": trial_id, "engine": described["name"], "trace": trace.name,
               "trace_sha256": trace.sha256, "batch": batch, "gpu_uuid": gpu, "device": described.get("device"),
               "versions": doc["versions"],
               "requests": len(records), "duration_s": doc["timing"]["duration_s"],
               "requests_per_s": doc["timing"]["requests_per_s"], "cached_share": cached_share(records),
               "simulated": doc["simulated"], "manifest": str(out)}
    return summary
