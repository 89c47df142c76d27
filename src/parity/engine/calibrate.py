"""Calibrating the simulator from real runs: a linear least-squares fit of the step-time model.

A burst's schedule does not depend on the step-time coefficients, so simulating each measured run
once gives its work totals (steps, prefill tokens, decode sequences, attention pairs, and the number
of synchronously admitted requests), and the measured duration is a linear function of them:

    duration = fixed_s*steps + prefill_token_s*prefill + decode_seq_s*decode + attention_pair_s*pairs
               + frontend_request_s*sync_requests

The fit minimises relative error (rows scaled by 1/duration) with non-negative coefficients.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml

from parity.engine import EngineArgs
from parity.engine.sim import SimEngine, SimParams
from parity.errors import ParityError
from parity.manifest import atomic_write_text, read_manifest
from parity.trace import load_trace

FEATURES = ("steps", "prefill_tokens", "decode_seqs", "attention_pairs", "sync_requests")
COEFFICIENTS = ("fixed_s", "prefill_token_s", "decode_seq_s", "attention_pair_s", "frontend_request_s")


def work_totals(prompts, batch: int | None, params: SimParams, args: EngineArgs, sync: bool) -> dict:
    """Simulate one burst (virtual clock, no front-end cost) and return its work totals."""
    engine = SimEngine(args, dataclasses.replace(params, frontend_request_s=0.0))
    size = batch or len(prompts)
    completions = []
    for start in range(0, len(prompts), size):
        completions += engine.generate(prompts[start:start + size])
    totals = dict(engine.stats()["work"])
    totals["sync_requests"] = len(prompts) if sync else 0
    totals["cached_share"] = sum(c.cached_tokens for c in completions) / sum(c.prompt_tokens for c in completions)
    return totals


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients: drop the most negative, refit, repeat."""
    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        if active:
            x[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        negative = [i for i in active if x[i] < 0]
        if not negative:
            return x
        active.remove(min(negative, key=lambda i: x[i]))


def predicted_duration(totals: dict, params: SimParams) -> float:
    return sum(getattr(params, c) * totals[f] for c, f in zip(COEFFICIENTS, FEATURES))


MEASURED_ENGINES = ("vllm-sync", "vllm-async")  # what a calibration run measured (parity.engine.ENGINES less sim)
MAX_KV_CACHE_TOKENS = 2**31 - 1  # far past any GPU's KV pool (an H200's: under a million tokens)
RUN_FIELDS = {"trace": str, "trace_sha256": str, "engine": str, "requests": int, "duration_s": (int, float)}


def check_measurements(measurements: Path, data: dict) -> None:
    """ParityError, naming the run and key, where the file lacks what the fit reads or has it mistyped."""
    if not isinstance(data.get("runs"), list):
        raise ParityError(f"{measurements}: expected a `runs` list, got {type(data.get('runs')).__name__}")
    kv = data.get("kv_cache_tokens")
    if kv is not None and (type(kv) is not int or not 1 <= kv <= MAX_KV_CACHE_TOKENS):  # 10**30 overflowed a list
        raise ParityError(f"{measurements}: kv_cache_tokens must be an integer from 1 to {MAX_KV_CACHE_TOKENS:,}, "
                          f"got {kv!r}")
    for i, run in enumerate(data["runs"]):
        where = f"{measurements}: runs[{i}]"
        if not isinstance(run, dict):
            raise ParityError(f"{where}: expected an object, got {type(run).__name__}")
        for key, kind in RUN_FIELDS.items():
            if key not in run:
                raise ParityError(f"{where}: missing {key}")
            value = run[key]
            if isinstance(value, bool) or not isinstance(value, kind) or (kind is not str and value <= 0):
                expected = "a string" if kind is str else "a positive number"
                raise ParityError(f"{where}: {key} must be {expected}, got {value!r}")
        batch = run.get("batch")
        if batch is not None and (type(batch) is not int or batch < 1):
            raise ParityError(f"{where}: batch must be a positive integer or null, got {batch!r}")
        if run["engine"] not in MEASURED_ENGINES:  # an outsider's "banana" was fitted as an async run
            raise ParityError(f"{where}: engine must be one of {', '.join(MEASURED_ENGINES)}, got {run['engine']!r}")
        if not 1e-3 <= run["duration_s"] <= 1e6:  # 1e-300 fitted subnormal costs and wrote them out
            raise ParityError(f"{where}: duration_s must be from 0.001 to 1,000,000 seconds, got {run['duration_s']!r}")
        share = run.get("cached_share")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1):
            raise ParityError(f"{where}: cached_share must be a number from 0 to 1 or absent, got {share!r}")
        if "/" in run["trace"] or "\\" in run["trace"] or run["trace"] in (".", ".."):  # a trace of --traces alone
            raise ParityError(f"{where}: trace must name a trace in --traces, got {run['trace']!r}")


def load_runs(measurements: Path, traces: Path) -> tuple[dict, list[dict]]:
    """The measurement file and, per run, the trace prompts it used (checked by SHA-256)."""
    data = read_manifest(measurements)
    check_measurements(measurements, data)
    runs = []
    for run in data["runs"]:
        variant = load_trace(traces / f"{run['trace']}.json")
        if variant.sha256 != run["trace_sha256"]:
            raise ParityError(f"trace {run['trace']} in {traces} has SHA-256 {variant.sha256}, the measurement "
                              f"used {run['trace_sha256']}: rebuild the traces from the same inputs")
        if run["requests"] != len(variant.prompts):  # 100,000 stated of a 4-request trace was reported as measured
            raise ParityError(f"{measurements}: a run on trace {run['trace']} states {run['requests']} requests, the "
                              f"trace holds {len(variant.prompts)}")
        runs.append(run | {"prompts": list(variant.prompts)})
    return data, runs


def calibrate(measurements: Path, traces: Path, base: SimParams, *, fit_engines=("vllm-sync", "vllm-async")) -> tuple[SimParams, list[dict]]:
    """Fit on the all-at-once runs of `fit_engines`; the others (batched, async) are held out."""
    data, runs = load_runs(measurements, traces)
    args = EngineArgs()
    if "kv_cache_tokens" in data:  # the KV pool the real engine reported
        base = dataclasses.replace(base, kv_cache_tokens=int(data["kv_cache_tokens"]))
    rows, targets = [], []
    for run in runs:
        run["totals"] = work_totals(run["prompts"], run.get("batch"), base, args, sync=run["engine"] == "vllm-sync")
        run["fitted_on"] = run["engine"] in fit_engines
        if run["fitted_on"]:
            rows.append([run["totals"][f] / run["duration_s"] for f in FEATURES])
            targets.append(1.0)
    if len(rows) < 3:
        raise ParityError(f"need at least 3 runs of {', '.join(fit_engines)} to calibrate, got {len(rows)}")
    coefficients = nnls(np.array(rows), np.array(targets))
    fitted = dataclasses.replace(base, **{c: float(v) for c, v in zip(COEFFICIENTS, coefficients)},
                                 source=f"fitted by parity sim calibrate from {measurements.name}")
    report = []
    for run in runs:
        predicted = predicted_duration(run["totals"], fitted)
        report.append({"trace": run["trace"], "engine": run["engine"], "batch": run.get("batch"),
                       "measured_rps": run["requests"] / run["duration_s"],
                       "predicted_rps": run["requests"] / predicted,
                       "error": predicted / run["duration_s"] - 1.0,
                       "measured_cached": run.get("cached_share"), "predicted_cached": run["totals"]["cached_share"],
                       "fitted_on": run["fitted_on"]})
    return fitted, report


def write_params(path: Path, params: SimParams, report: list[dict], measurements: Path) -> None:
    """The fitted parameters with the evidence: which measurements, and each run's error (ParityError, nothing
    written, where a fitted value is past its sane bound: the file could not be read back)."""
    try:
        params.within_bounds()
    except ParityError as exc:
        raise ParityError(f"the fit is unusable, {path} not written: {exc} (check the measurements)") from None
    values = params.to_dict()
    source = values.pop("source")
    doc = {"source": source, "measurements": measurements.name, "params": values,
           "fit_report": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in report]}
    atomic_write_text(path, "# Written by `parity sim calibrate`; see the measurements file for GPU, versions and date.\n"
                      + yaml.safe_dump(doc, sort_keys=False))
