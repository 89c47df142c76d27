"""Records: what happened to every request of a burst, as a schema-valid trial manifest.

Both serving paths and the engine-only runs end here, so a trial looks the same whichever system
produced it. The verdict starts `pending`; the checks decide it later and never change a record.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from parity import __version__
from parity.engine import Completion
from parity.manifest import dumps, file_ref, header, sha256_file
from parity.trace import Trace, token_sha256


@dataclass(frozen=True)
class Placement:
    """Where a request ran: logical shard, worker identity and the GPU it reported."""

    shard: int
    worker_id: str
    gpu_uuid: str
    batch_id: str | None = None


def package_versions() -> dict[str, str | None]:
    """Versions of everything that can change a number, None where not installed."""
    out: dict[str, str | None] = {"parity": __version__, "python": platform.python_version()}
    for name, dist in (("vllm", "vllm"), ("torch", "torch"), ("flamepy", "flamepy"),
                       ("mlperf_loadgen", "mlcommons-loadgen"), ("numpy", "numpy")):
        try:
            out[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


IMAGE_ENV = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")  # set by Apptainer's runtime inside a container


@lru_cache(maxsize=1)
def image() -> dict:
    """The Apptainer image this process runs in, by its SIF's SHA-256 read from the file itself (once per
    process), or that it runs on the host: a trial says which software ran it, not only which versions."""
    path = next((os.environ[name] for name in IMAGE_ENV if os.environ.get(name)), None)
    if path is None:
        return {"inside": False}
    sif = Path(path)
    if not sif.is_file():  # a sandbox folder, or an image not bound into the container
        return {"inside": True, "name": sif.name, "sha256": None,
                "why": f"{path} is not a file this process can read (a sandbox, or not bound in)"}
    return {"inside": True, "name": sif.name, "sha256": sha256_file(sif), "bytes": sif.stat().st_size}


def config_sha256(config: dict) -> str:
    return hashlib.sha256(dumps(config).encode()).hexdigest()


def request_records(trace: Trace, completions: list[Completion], placements: list[Placement],
                    input_hashes: list[str] | None = None, arrivals: list[float] | None = None,
                    lengths: list[int] | None = None, refused: dict[str, str] | None = None) -> list[dict]:
    """One record per request that ran, in burst order.

    `arrivals`: each request's scheduled arrival (release + its offset), the time every latency is
    measured from; with it, a record also says when the request left (`sent_s`) and, where the path
    knows, when each output token was produced or received (`token_s`), all on the host's clock.

    `input_hashes` are the hashes of the token IDs the server or worker reports it received, so the
    input check compares what arrived with the trace; without them (an engine called in-process, which
    receives the trace's own arrays) the submitted prompts are hashed. `lengths`: each request's own exact
    output length (parity.lengths), recorded as its `max_tokens`, what the output-length check holds it to.
    `refused` (bounded admission: request id -> reason): requests that never ran, so have no record here
    (`refused_records`); completions, placements and input hashes are the others', in burst order.
    """
    refused = refused or {}
    ran = [(i, r) for i, r in enumerate(trace.requests) if r.id not in refused]
    if input_hashes is None:
        input_hashes = [token_sha256(trace.prompts[i]) for i, _ in ran]
    records = []
    for (at, request), input_hash, completion, place in zip(ran, input_hashes, completions, placements, strict=True):
        record = {
            "request_id": request.id, "position": request.position, "input_sha256": input_hash,
            "shard": place.shard, "worker_id": place.worker_id, "gpu_uuid": place.gpu_uuid,
            "prompt_tokens": completion.prompt_tokens, "cached_tokens": completion.cached_tokens,
            "output_token_ids": [int(t) for t in completion.output_token_ids],
            "submit_s": completion.submit_s, "complete_s": completion.complete_s,
        }
        if place.batch_id is not None:
            record["batch_id"] = place.batch_id
        if lengths is not None:
            record["max_tokens"] = int(lengths[at])
        if arrivals is not None:
            record["arrival_s"] = arrivals[at]
            if completion.sent_s is not None:
                record["sent_s"] = completion.sent_s
            if completion.due_s is not None:
                record["due_s"] = completion.due_s
            if completion.token_s:
                record["token_s"] = [float(t) for t in completion.token_s]
        records.append(record)
    return records


def refused_records(trace: Trace, refused: dict[str, str], arrivals: list[float] | None = None) -> list[dict]:
    """One entry per request bounded admission refused, in burst order: never sent, never a completion; its
    scheduled arrival (the goodput window counts it, as a miss) and its one-line reason."""
    out = []
    for at, request in enumerate(trace.requests):
        if request.id in refused:
            entry = {"request_id": request.id, "position": request.position, "reason": refused[request.id]}
            out.append(entry | ({"arrival_s": arrivals[at]} if arrivals is not None else {}))
    return out


def timing(records: list[dict], release_s: float) -> dict:
    """A burst's timing from its records: release to the last completion, and requests over that span.

    The one place this is computed, so a trial's stated rate can always be recomputed from its records.
    """
    last = max(r["complete_s"] for r in records)
    duration = last - release_s
    return {"release_s": release_s, "last_completion_s": last, "duration_s": duration,
            "requests_per_s": len(records) / duration if duration > 0 else 0.0}


def trial_manifest(*, trial_id: str, experiment: str, system: str, engine: dict, trace: Trace,
                   config: dict, records: list[dict], release_s: float, gpus: list[dict],
                   manifest_path: Path, extra: dict | None = None) -> dict:
    """Assemble a trial manifest (verdict pending) linked by hash to its trace manifest."""
    doc = header("trial", simulated=bool(engine.get("simulated"))) | {
        "trial_id": trial_id, "experiment": experiment, "system": system,
        "engine": {"name": engine["name"], "version": engine.get("version"), "args": engine.get("args", {}),
                   "simulated": bool(engine.get("simulated"))},
        "trace": file_ref(trace.manifest_path, manifest_path.parent), "trace_name": trace.name,
        "config": config, "config_sha256": config_sha256(config), "versions": package_versions(),
        "image": image(), "gpus": gpus,
        "timing": timing(records, release_s),
        "records": records,
        "verdict": {"status": "pending", "checks": {}, "reasons": []},
    }
    if extra:
        doc |= json.loads(json.dumps(extra))
    return doc


def cached_share(records: list[dict]) -> float:
    prompt = sum(r["prompt_tokens"] for r in records)
    return sum(r["cached_tokens"] for r in records) / prompt if prompt else 0.0
