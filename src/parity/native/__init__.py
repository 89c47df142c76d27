"""The standalone vLLM path: pinned replicas behind HTTP, and a client that routes each request.

`run_trial` is the path's one entry point for experiments: given running replicas, a routing policy
and a trace, it warms up on the token-shifted variants, releases the measured burst, and writes a
trial manifest in the same shape as the Flame path's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from parity.affinity import make_router
from parity.engine import MODEL_REVISION
from parity.errors import ParityError
from parity.manifest import write_manifest
from parity.native.client import NativeClient, Reply
from parity.native.replicas import ReplicaSet
from parity.record import Placement, cached_share, package_versions, request_records, trial_manifest
from parity.trace import load_trace, token_sha256


def _completions(replies: list[Reply]):
    from parity.engine import Completion

    return [Completion(r.output_token_ids, r.prompt_tokens, r.cached_tokens, r.submit_s, r.complete_s) for r in replies]


async def _run(replicas: ReplicaSet, routing: str, trace_path: Path, warmup_rounds: int, revision: str, log):
    trace = load_trace(trace_path)
    ids = [r.id for r in trace.requests]
    async with NativeClient([r.url for r in replicas.replicas], replicas.args.model) as client:
        for round_index in range(1, warmup_rounds + 1):
            warm = load_trace(trace_path, f"warmup{round_index}")
            release, _, replies = await client.burst(list(warm.prompts), ids, make_router(routing, len(replicas.replicas), revision))
            log(f"  warmup {round_index}: {len(replies)} requests in {max(r.complete_s for r in replies) - release:.2f} s")
        router = make_router(routing, len(replicas.replicas), revision)
        release, shards, replies = await client.burst(list(trace.prompts), ids, router)
    return trace, release, shards, replies, router.stats()


def run_trial(replicas: ReplicaSet, routing: str, trace_path: Path, out: Path, *, experiment: str, trial_id: str,
              warmup_rounds: int = 2, revision: str = MODEL_REVISION, log=print) -> dict:
    """One standalone trial on cold prefix caches; returns a summary and writes the trial manifest."""
    replicas.reset_prefix_caches()
    trace, release, shards, replies, router_stats = asyncio.run(
        _run(replicas, routing, trace_path, warmup_rounds, revision, log))
    sent = [token_sha256(p) for p in trace.prompts]
    echoed = [token_sha256(r.prompt_token_ids) if r.prompt_token_ids is not None else s for r, s in zip(replies, sent)]
    mismatched = [t.id for t, h in zip(trace.requests, echoed) if h != t.sha256]
    if mismatched:
        raise ParityError(f"{len(mismatched)} replica(s) echoed prompts that differ from the trace, e.g. {mismatched[0]}")
    by_shard = replicas.replicas
    placements = [Placement(s, by_shard[s].worker_id, by_shard[s].reported_gpu or by_shard[s].gpu) for s in shards]
    records = request_records(trace, _completions(replies), placements, input_hashes=echoed)
    simulated = replicas.kind == "sim"
    engine = {"name": "sim-server" if simulated else "vllm-serve", "simulated": simulated,
              "version": None if simulated else package_versions()["vllm"], "args": replicas.args.to_dict()}
    config = {"path": "standalone", "routing": routing, "replicas": replicas.kind, "shards": len(by_shard),
              "warmup_rounds": warmup_rounds, "revision_salt": revision}
    doc = trial_manifest(trial_id=trial_id, experiment=experiment, system="vllm", engine=engine, trace=trace,
                         config=config, records=records, release_s=release,
                         gpus=[{"uuid": r.reported_gpu or r.gpu, "index": r.index} for r in by_shard],
                         manifest_path=out, extra={"router": router_stats})
    write_manifest(out, doc)
    return {"trial": trial_id, "routing": routing, "trace": trace.name, "requests": len(records),
            "requests_per_s": doc["timing"]["requests_per_s"], "duration_s": doc["timing"]["duration_s"],
            "cached_share": cached_share(records), "simulated": simulated, "manifest": str(out)}

