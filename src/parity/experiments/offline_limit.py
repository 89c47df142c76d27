"""The engine's offline limit: each shard's whole burst handed to the engine at once, on its own GPU.

The sticky router splits the trace into the shards both serving paths use; each shard becomes a trace
of its own (linked to the original by hash) and runs through `parity engine run` in its own process,
pinned to its GPU, all shards at the same time. The ceiling for the pair of GPUs is all requests over
the slowest shard's duration; the report gives each path as a share of it.

A shard's trial on disk is kept under the experiment runner's rule (`runner.must_run`): finished, made
with the same shard trace and settings, unchanged since an earlier experiment.json recorded it, and
its timing and verdict what its records give; so a rerun after an interruption runs only the shards
still missing, and an edited or stale shard is run again.

With more shards than GPUs (`shards: 2` on a one-GPU host) the shards run in waves, one GPU each, and
the ceiling supposes they had run side by side on identical GPUs; the manifest and the report say so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from parity.affinity import make_router
from parity.checks import check_file
from parity.engine import MODEL_REVISION
from parity.errors import ParityError
from parity.procs import ended, last_line, spawn
from parity.experiments.backend import Backend
from parity.experiments.runner import fits_engine, keep, ran_with, recorded_hashes, sim_params_sha256
from parity.manifest import file_ref, header, read_manifest, write_manifest
from parity.stats import cached_share
from parity.trace import load_trace, write_subset


def shard_positions(trace_path: Path, shards: int, revision: str = MODEL_REVISION) -> list[list[int]]:
    """Burst positions per shard, as the sticky router assigns them."""
    router = make_router("sticky", shards, revision)
    out: list[list[int]] = [[] for _ in range(shards)]
    for position, prompt in enumerate(load_trace(trace_path).prompts):
        out[router.route(prompt)].append(position)
    return out


def _command(backend: Backend, trace: Path, out_dir: Path) -> list[str]:
    """`parity engine run` for one shard, with the backend's engine settings (values as JSON, which YAML reads back)."""
    command = [sys.executable, "-m", "parity", "engine", "run", "--trace", str(trace), "--out", str(out_dir),
               "--warmup-rounds", str(backend.warmup_rounds)]
    if backend.simulated:
        command += ["--engine", "sim", "--clock", "virtual"]
        if backend.sim_params:
            command += ["--sim-params", backend.sim_params]
    else:
        command += ["--engine", "vllm-sync"]  # LLM.generate with every prompt at once
    if backend.model:
        command += ["--model", backend.model]
    if backend.load_format:
        command += ["--load-format", backend.load_format]
    for key, value in backend.engine_args.items():
        command += ["--engine-arg", f"{key}={json.dumps(value)}"]
    return command


def shard_count(settings: dict, gpus: list[str]) -> int:
    """The number of shards: the serving paths' (one per GPU) unless the settings name another."""
    shards = settings.get("shards", len(gpus))
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ParityError(f"offline limit: shards must be a whole number ≥ 1, got {shards!r}")
    return shards


def _trial_path(backend: Backend, shard_trace: Path, trials_dir: Path) -> Path:
    return trials_dir / f"{'sim' if backend.simulated else 'vllm-sync'}-{shard_trace.stem}.json"


def _run_shards(backend: Backend, shard_traces: list[Path], gpus: list[str], trials_dir: Path, logs: Path,
                recorded: dict, log) -> bool:
    """Each shard in its own process on its GPU, in waves where shards outnumber GPUs; True if all ran at once."""
    wanted = {t: ran_with(backend, gpus, t, routing="sticky", flame=None) for t in shard_traces}
    kept = [t for t in shard_traces
            if keep(_trial_path(backend, t, trials_dir), f"  {t.stem}", wanted[t], recorded, log)]
    todo = [t for t in shard_traces if t not in kept]
    for start in range(0, len(todo), len(gpus)):
        wave = todo[start:start + len(gpus)]
        if len(todo) > len(gpus):
            log(f"  wave {start // len(gpus) + 1}: {', '.join(t.stem for t in wave)}")
        procs = []
        for shard_trace, gpu in zip(wave, gpus):
            env = dict(os.environ)
            if not backend.simulated:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            with open(logs / f"{shard_trace.stem}.log", "wb") as out:  # dies with this run (parity.procs)
                procs.append(spawn(_command(backend, shard_trace, trials_dir), stdout=out, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            bad = [f"{t.stem} ({ended(c)}: {last_line(logs / f'{t.stem}.log')})" for t, c in zip(wave, codes) if c]
            raise ParityError(f"offline limit: shard run(s) failed: {'; '.join(bad)}; logs in {logs}")
        for shard_trace in wave:
            path = _trial_path(backend, shard_trace, trials_dir)
            write_manifest(path, read_manifest(path) | {"ran_with": wanted[shard_trace]})
    return not kept and len(todo) <= len(gpus)


def run(traces: list[Path], backend: Backend, out_dir: Path, *, settings: dict, log=print) -> Path:
    """Run every shard of every trace, at once where there are GPUs enough; write OUT/experiment.json."""
    gpus = backend.gpu_uuids()
    shards = shard_count(settings, gpus)
    for trace in traces:  # before anything is written
        fits_engine(trace, backend.args())
    trials_dir, logs = out_dir / "trials", out_dir / "logs"
    recorded = recorded_hashes(out_dir)  # read before any shard is run again
    logs.mkdir(parents=True, exist_ok=True)
    cases, limits = [], []
    for trace in traces:
        name = load_trace(trace).name
        positions = shard_positions(trace, shards)
        shard_traces = [write_subset(trace, p, f"{name}-shard{k}", out_dir / "traces") for k, p in enumerate(positions) if p]
        log(f"{name}: shards of {', '.join(str(len(p)) for p in positions)} requests, one process per GPU"
            + ("" if len(shard_traces) <= len(gpus) else f", in waves on {len(gpus)} GPU(s)"))
        side_by_side = _run_shards(backend, shard_traces, gpus, trials_dir, logs, recorded, log)
        shard_rows = []
        for shard, shard_trace in enumerate(shard_traces):
            path = _trial_path(backend, shard_trace, trials_dir)
            verdict = check_file(path)
            doc = read_manifest(path)
            row = {"shard": shard, "requests": len(doc["records"]), "duration_s": doc["timing"]["duration_s"],
                   "requests_per_s": doc["timing"]["requests_per_s"], "gpu_uuid": doc["gpus"][0]["uuid"],
                   "status": verdict["status"]}
            shard_rows.append(row)
            cases.append({"trial_id": doc["trial_id"], "system": "engine", "routing": "sticky", "trace_name": name,
                          "stage": f"shard{shard}", "pair": None, "flame": None, "status": verdict["status"],
                          "requests_per_s": row["requests_per_s"], "cached_share": cached_share(doc),
                          "simulated": doc["simulated"], "cluster": None, "manifest": file_ref(path, out_dir)})
        total = sum(r["requests"] for r in shard_rows)
        ceiling = total / max(r["duration_s"] for r in shard_rows)
        passed = all(r["status"] == "passed" for r in shard_rows)
        limits.append({"trace_name": name, "requests": total, "shards": shard_rows, "side_by_side": side_by_side,
                       "requests_per_s": ceiling if passed else 0.0, "passed": passed})
        log(f"{name}: offline limit {ceiling:.3f} req/s ({'simulated' if backend.simulated else 'measured'})"
            + ("" if passed else " — a shard failed its checks; excluded"))
    doc = header("experiment", simulated=backend.simulated) | {
        "experiment": "offline-limit", "settings": settings,
        "backend": {"engine": backend.engine, "cluster": backend.cluster, "gpus": gpus,
                    "warmup_rounds": backend.warmup_rounds, "load_format": backend.load_format,
                    "sim_params_sha256": sim_params_sha256(backend)},
        "cases": cases, "pairs": [], "limits": limits,
    }
    out = out_dir / "experiment.json"
    write_manifest(out, doc)
    return out
