"""The engine's offline limit: each shard's whole burst handed to the engine at once, on its own GPU.

The sticky router splits the trace into the shards both serving paths use; each shard becomes a trace
of its own (linked to the original by hash) and runs through `parity engine run` in its own process,
pinned to its GPU, all shards at the same time. The ceiling for the pair of GPUs is all requests over
the slowest shard's duration; the report gives each path as a share of it.

A shard's trial on disk is kept under every trial's rule (`parity.trial.must_run`): finished, made
with the same shard trace and settings, unchanged since an earlier experiment.json recorded it, and
its timing and verdict what its records give; so a rerun after an interruption runs only the shards
still missing, and an edited or stale shard is run again.

With more shards than GPUs (`shards: 2` on a one-GPU host) the shards run in waves, one GPU each, and
the ceiling supposes they had run side by side on identical GPUs; the manifest and the report say so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from parity import trial
from parity.routing import shard_positions
from parity.checks import check_file
from parity.errors import ParityError
from parity.backend import Backend
from parity.experiments.settings import OfflineLimitSettings
from parity.manifest import file_ref, header, read_manifest, write_manifest
from parity.procs import ended, last_line, spawn
from parity.stats import trial_facts
from parity.trace import load_trace, write_subset



OFFLINE_LIMIT = "offline-limit"


def limit(name: str, shards: list[dict], side_by_side) -> dict:
    """One trace's offline limit from its shards' trial manifests, in shard order: the requests over the
    slowest shard's duration, 0 where a shard failed its checks."""
    rows = [{"shard": shard, "requests": len(doc["records"]), "duration_s": doc["timing"]["duration_s"],
             "requests_per_s": doc["timing"]["requests_per_s"], "gpu_uuid": doc["gpus"][0]["uuid"],
             "status": doc["verdict"]["status"]} for shard, doc in enumerate(shards)]
    total = sum(r["requests"] for r in rows)
    ceiling = total / max(r["duration_s"] for r in rows) if rows else 0.0
    passed = bool(rows) and all(r["status"] == "passed" for r in rows)
    return {"trace_name": name, "requests": total, "shards": rows, "side_by_side": side_by_side,
            "requests_per_s": ceiling if passed else 0.0, "passed": passed}

def engine_kind(backend: Backend) -> str:
    """The engine a shard runs on: the simulator in virtual time, or LLM.generate with every prompt at once."""
    return "sim" if backend.simulated else "vllm-sync"


def _command(backend: Backend, trace: Path, out_dir: Path) -> list[str]:
    """`parity engine run` for one shard, given the backend whole (its GPUs resolved) as JSON."""
    return [sys.executable, "-m", "parity", "engine", "run", "--engine", engine_kind(backend), "--trace", str(trace),
            "--experiment", "offline-limit", "--backend", json.dumps(backend.to_dict()), "--out", str(out_dir)]


def shard_count(settings: OfflineLimitSettings, gpus: list[str]) -> int:
    """The number of shards: the serving paths' (one per GPU) unless the settings name another."""
    return len(gpus) if settings.shards is None else settings.shards


def _trial_path(backend: Backend, shard_trace: Path, trials_dir: Path) -> Path:
    return trials_dir / f"{engine_kind(backend)}-{shard_trace.stem}.json"  # as `parity engine run` names it


def _run_shards(backend: Backend, shard_traces: list[Path], gpus: list[str], trials_dir: Path, logs: Path,
                recorded: dict, log) -> bool:
    """Each shard in its own process on its GPU, in waves where shards outnumber GPUs; True if all ran at once."""
    kept = [t for t in shard_traces if trial.keep(_trial_path(backend, t, trials_dir), f"  {t.stem}",
                                                  trial.ran_with(backend, gpus, t, placement="sticky"), recorded, log)]
    todo = [t for t in shard_traces if t not in kept]
    for start in range(0, len(todo), len(gpus)):
        wave = todo[start:start + len(gpus)]
        if len(todo) > len(gpus):
            log(f"  wave {start // len(gpus) + 1}: {', '.join(t.stem for t in wave)}")
        procs = []
        for shard_trace, gpu in zip(wave, gpus):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)  # a simulated one too: its records name it
            with open(logs / f"{shard_trace.stem}.log", "wb") as out:  # dies with this run (parity.procs)
                procs.append(spawn(_command(backend, shard_trace, trials_dir), stdout=out, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            bad = [f"{t.stem} ({ended(c)}: {last_line(logs / f'{t.stem}.log')})" for t, c in zip(wave, codes) if c]
            raise ParityError(f"offline limit: shard run(s) failed: {'; '.join(bad)}; logs in {logs}")
    return not kept and len(todo) <= len(gpus)


def run(traces: list[Path], backend: Backend, out_dir: Path, *, settings: dict, log=print) -> Path:
    """Run every shard of every trace, at once where there are GPUs enough; write OUT/experiment.json (which
    records `settings`, the config's experiments.offline-limit, as given)."""
    typed = OfflineLimitSettings.from_dict(settings)  # before anything is started or written
    gpus = backend.gpu_uuids()
    backend = dataclasses.replace(backend, gpus=tuple(gpus))  # what a shard records it ran with
    shards = shard_count(typed, gpus)
    for trace in traces:  # before anything is written
        trial.fits_engine(trace, backend.args())
    trials_dir, logs = out_dir / "trials", out_dir / "logs"
    recorded = trial.recorded_hashes(out_dir)  # read before any shard is run again
    logs.mkdir(parents=True, exist_ok=True)
    cases, limits = [], []
    for trace in traces:
        name = load_trace(trace).name
        positions = shard_positions(load_trace(trace).prompts, shards)
        shard_traces = [write_subset(trace, p, f"{name}-shard{k}", out_dir / "traces") for k, p in enumerate(positions) if p]
        log(f"{name}: shards of {', '.join(str(len(p)) for p in positions)} requests, one process per GPU"
            + ("" if len(shard_traces) <= len(gpus) else f", in waves on {len(gpus)} GPU(s)"))
        side_by_side = _run_shards(backend, shard_traces, gpus, trials_dir, logs, recorded, log)
        docs = []
        for shard, shard_trace in enumerate(shard_traces):
            path = _trial_path(backend, shard_trace, trials_dir)
            check_file(path)
            docs.append(read_manifest(path))
            cases.append({"placement": "sticky", "stage": f"shard{shard}", "pair": None, "flame": None,
                          "manifest": file_ref(path, out_dir)} | trial_facts(docs[-1]) | {"trace_name": name})
        limits.append(limit(name, docs, side_by_side))
        log(f"{name}: offline limit {limits[-1]['requests_per_s']:.3f} req/s "
            f"({'simulated' if backend.simulated else 'measured'})"
            + ("" if limits[-1]["passed"] else " — a shard failed its checks; excluded"))
    doc = header("experiment", simulated=backend.simulated) | {
        "experiment": OFFLINE_LIMIT, "settings": settings,
        "backend": {"engine": backend.engine, "cluster": backend.cluster, "gpus": gpus,
                    "warmup_rounds": backend.warmup_rounds, "load_format": backend.load_format,
                    "sim_params_sha256": trial.sim_params_sha256(backend)},
        "cases": cases, "pairs": [], "limits": limits,
    }
    out = out_dir / "experiment.json"
    write_manifest(out, doc)
    return out
