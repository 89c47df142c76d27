"""The Flame client: sessions on a Flame cluster (real v0.6.0 or the stand-in), a batcher per session queue.

Placement modes, as in the study:
- `global`: one session with one worker per GPU; tasks go FIFO to whichever worker asks first, so a
  shared prefix may land on either worker.
- `sticky`: one persistent session per shard (one worker each, one application per GPU), and the
  affinity router chooses the shard.
`run_trial` has the same shape as the standalone path's: warm up on the shifted variants, release the
measured burst, write a trial manifest whose records name the worker and GPU that served each prompt.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import wait
from dataclasses import dataclass, field
from pathlib import Path

import flamepy

from parity.affinity import make_router
from parity.engine import MODEL_REVISION, Completion
from parity.errors import ParityError
from parity.flame.batcher import Batcher
from parity.flame.service import FAILURE_DIR_ENV
from parity.manifest import write_manifest
from parity.record import Placement, cached_share, request_records, trial_manifest
from parity.trace import load_trace, token_sha256

PLACEMENTS = ("global", "sticky")


@dataclass
class FlameSettings:
    """The client and service knobs the study tuned (defaults: its first configuration)."""

    placement: str = "sticky"
    batch_limit: int = 32
    window_s: float = 0.002
    budget: int = 2 * 1024 * 1024
    compress: bool = False
    engine: str = "sim"
    engine_args: dict = field(default_factory=dict)
    sim_params: str | None = None
    sim_mode: str = "sync"
    gc_freeze: bool = False
    order: str = "arrival"  # how the service admits a batch into its engine (parity.flame.admission)

    def common_data(self) -> bytes:
        return json.dumps({"engine": self.engine, "engine_args": self.engine_args, "budget": self.budget,
                           "sim_params": self.sim_params, "sim_mode": self.sim_mode,
                           "gc_freeze": self.gc_freeze, "order": self.order}, sort_keys=True).encode()


GLOBAL_APP = "parity-all-gpus"


def shard_app(index: int) -> str:
    return f"parity-gpu{index}"


def register_applications(endpoint: str, gpus: list[str], *, simulated: bool, delay_release: int = 86_400,
                          extra_env: dict | None = None) -> None:
    """One application per GPU (pinned with CUDA_VISIBLE_DEVICES) and one for a global session.

    A long `delay_release` keeps workers (and their engines) bound between bursts: Flame kills a
    service process when its executor is released, and rebinding reloads the model.
    """
    import sys

    connection = flamepy.connect(endpoint)
    try:
        command = {"command": sys.executable, "arguments": ["-m", "parity", "flame", "worker"],
                   "delay_release": delay_release}
        for index, uuid in enumerate(gpus):
            env = {"PARITY_GPUS": uuid, **(extra_env or {})}
            if not simulated:
                env["CUDA_VISIBLE_DEVICES"] = uuid
            connection.register_application(shard_app(index), flamepy.ApplicationAttributes(environments=env, **command))
        connection.register_application(GLOBAL_APP, flamepy.ApplicationAttributes(
            environments={"PARITY_GPUS": ",".join(gpus), **(extra_env or {})}, **command))
    finally:
        connection.close()


class FlameSessions:
    """Open sessions (and so engines) for one case; close them, and every batcher, on exit."""

    def __init__(self, endpoint: str, gpus: int, settings: FlameSettings, *, name: str = "parity"):
        if settings.placement not in PLACEMENTS:
            raise ParityError(f"unknown placement {settings.placement!r}: use one of {', '.join(PLACEMENTS)}")
        self.endpoint, self.gpus, self.settings, self.name = endpoint, gpus, settings, name
        self.sessions: list = []
        self.batchers: list[Batcher] = []

    def __enter__(self) -> "FlameSessions":
        self.connection = flamepy.connect(self.endpoint)
        s = self.settings
        try:
            if s.placement == "global":
                specs = [(GLOBAL_APP, self.gpus)]
            else:
                specs = [(shard_app(index), 1) for index in range(self.gpus)]
            folder = os.environ.get(FAILURE_DIR_ENV)
            for index, (app, workers) in enumerate(specs):
                if folder:  # a report left by an earlier run of this trial is not about this one
                    (Path(folder) / f"{self.name}-{index}.txt").unlink(missing_ok=True)
                session = self.connection.create_session(flamepy.SessionAttributes(
                    id=f"{self.name}-{index}", application=app, common_data=s.common_data(),
                    min_instances=workers, max_instances=workers))
                self.sessions.append(session)
                self.batchers.append(Batcher(session.run, name=session.id, batch_limit=s.batch_limit,
                                             window_s=s.window_s, budget=s.budget, compress=s.compress))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for batcher in self.batchers:
            batcher.close()
        errors = []
        for session in self.sessions:
            try:
                self.connection.close_session(session.id)
            except Exception as error:  # keep closing the others; report at the end
                errors.append(f"{session.id}: {error}")
        if exc[0] is not None:  # tasks may never finish (a dead executor manager): end their watch streams,
            self.connection._channel.close()  # which flamepy's close() would otherwise wait for
        self.connection.close()
        if errors and exc[0] is None:
            raise ParityError(f"could not close Flame sessions: {'; '.join(errors)}")

    @property
    def shards(self) -> int:
        return len(self.batchers)

    def check_failures(self) -> None:
        """Raise the error a worker left for one of these sessions (see service.report_failure), or
        name a process of the cluster that died: with its executor manager gone, Flame's tasks would
        stay pending for ever."""
        folder = os.environ.get(FAILURE_DIR_ENV)
        for session in self.sessions if folder else ():
            report = Path(folder) / f"{session.id}.txt"
            if report.exists():
                raise ParityError(f"a worker of session {session.id} failed: {report.read_text().strip()}")
        from parity.flame.cluster import running

        cluster = running(self.endpoint)
        deaths = cluster.deaths() if cluster is not None else []
        if deaths:
            raise ParityError("; ".join(deaths))

    def executors(self) -> list[dict]:
        """The cluster's own executor records: which executor is bound to which session, on which node."""
        return [{"executor_id": e.metadata.id, "session_id": e.status.session_id, "node": e.spec.node}
                for e in self.connection.list_executors()]


def verify_placement(results, shards: list[int], session_ids: list[str], executors: list[dict]) -> None:
    """Every prompt was served by an executor the cluster lists as bound to that shard's session."""
    bound = {e["executor_id"]: e["session_id"] for e in executors}
    for result, shard in zip(results, shards):
        executor = result.worker.get("executor_id")
        if bound.get(executor) != session_ids[shard]:
            raise ParityError(f"request {result.request_id} was served by executor {executor}, which the cluster "
                              f"lists under session {bound.get(executor)}, not {session_ids[shard]}")


def release_burst(sessions: FlameSessions, prompts, request_ids, router, timeout_s: float = 3600):
    """Route and submit every prompt now; wait for all; (release, shards, results), failures raised."""
    release = time.monotonic()
    shards, futures = [], []
    for prompt, request_id in zip(prompts, request_ids):
        shard = router.route(prompt) if sessions.shards > 1 else 0
        shards.append(shard)
        futures.append(sessions.batchers[shard].submit(request_id, prompt))
    deadline, pending = release + timeout_s, set(futures)
    while pending:
        _, pending = wait(pending, timeout=1.0)
        sessions.check_failures()
        if pending and time.monotonic() > deadline:
            raise ParityError(f"{len(pending)} of {len(futures)} requests unanswered after {timeout_s:.0f} s")
    return release, shards, [f.result() for f in futures]


def cluster_record(endpoint: str, stand_in: bool) -> dict:
    """What the trial ran on, from the cluster this process started there (not from a flag): its label,
    the binaries' SHA-256 and `--version`, and what it listens on and how that was contained."""
    from parity.flame.cluster import running

    cluster = running(endpoint)
    if cluster is None:
        raise ParityError(f"no Flame cluster started by this process answers at {endpoint}; "
                          f"cannot record what the trial ran on")
    described = cluster.describe()
    if stand_in != (described["cluster"] == "stand-in"):
        raise ParityError(f"the cluster at {endpoint} is {described['cluster']}, "
                          f"not {'the stand-in' if stand_in else 'real Flame'} as asked")
    return described


def run_trial(endpoint: str, gpus: int, settings: FlameSettings, trace_path: Path, out: Path, *,
              experiment: str, trial_id: str, warmup_rounds: int = 2, revision: str = MODEL_REVISION,
              stand_in: bool = False, log=print) -> dict:
    """One Flame trial on fresh sessions (fresh engines); writes the trial manifest, returns a summary."""
    ran_on = cluster_record(endpoint, stand_in)
    trace = load_trace(trace_path)
    ids = [r.id for r in trace.requests]
    routing = "sticky" if settings.placement == "sticky" else "alternating"
    with FlameSessions(endpoint, gpus, settings, name=trial_id) as sessions:
        for round_index in range(1, warmup_rounds + 1):
            warm = load_trace(trace_path, f"warmup{round_index}")
            release, _, results = release_burst(sessions, list(warm.prompts), ids,
                                                make_router(routing, sessions.shards, revision))
            log(f"  warmup {round_index}: {len(results)} requests in {max(r.complete_s for r in results) - release:.2f} s")
        warm_batches = [len(b.batch_sizes) for b in sessions.batchers]
        router = make_router(routing, sessions.shards, revision)
        release, shards, results = release_burst(sessions, list(trace.prompts), ids, router)
        executors = sessions.executors()
        verify_placement(results, shards, [x.id for x in sessions.sessions], executors)
        batch_sizes = [size for b, skip in zip(sessions.batchers, warm_batches) for size in b.batch_sizes[skip:]]
    completions = [Completion(r.output_token_ids, r.prompt_tokens, r.cached_tokens, r.submit_s, r.complete_s)
                   for r in results]
    placements = [Placement(shard, r.worker.get("executor_id", "?"), r.worker.get("gpu_uuid", "?"), r.batch_id)
                  for shard, r in zip(shards, results)]
    sent = [token_sha256(p) for p in trace.prompts]
    received = [r.input_sha256 or s for r, s in zip(results, sent)]
    records = request_records(trace, completions, placements, input_hashes=received)
    simulated = settings.engine == "sim"
    workers = {r.worker.get("executor_id"): r.worker for r in results}
    batches = {r.batch_id: {"batch_id": r.batch_id, "executor_id": r.worker.get("executor_id"), **r.task_timings}
               for r in results}
    config = {"path": "flame", "placement": settings.placement, "batch_limit": settings.batch_limit,
              "window_s": settings.window_s, "budget": settings.budget, "compress": settings.compress,
              "engine": settings.engine, "sim_mode": settings.sim_mode, "gc_freeze": settings.gc_freeze,
              "order": settings.order, "warmup_rounds": warmup_rounds, "cluster": ran_on["cluster"]}
    versions = sorted({str(w.get("engine_version")) for w in workers.values() if w.get("engine_version")})
    if len(versions) > 1:
        raise ParityError(f"the Flame workers ran different engine versions: {', '.join(versions)}")
    engine = {"name": settings.engine, "simulated": simulated, "version": versions[0] if versions else None,
              "args": settings.engine_args}  # the version the workers report, not this client's
    gpus = sorted({w["gpu_uuid"] for w in workers.values()})
    doc = trial_manifest(trial_id=trial_id, experiment=experiment, system="flame", engine=engine, trace=trace,
                         config=config, records=records, release_s=release,
                         gpus=[{"uuid": g} for g in gpus], manifest_path=out,
                         extra={"workers": sorted(workers.values(), key=lambda w: w["executor_id"]),
                                "batch_sizes": batch_sizes, "batches": [batches[k] for k in sorted(batches)],
                                "executors": executors, "placement_verified": True,
                                "flame_cluster": config["cluster"], "flame_binaries": ran_on["binaries"],
                                "network": ran_on["network"]})
    write_manifest(out, doc)
    return {"trial": trial_id, "placement": settings.placement, "trace": trace.name, "requests": len(records),
            "requests_per_s": doc["timing"]["requests_per_s"], "duration_s": doc["timing"]["duration_s"],
            "cached_share": cached_share(records), "simulated": simulated, "cluster": config["cluster"],
            "batches": len(batch_sizes), "manifest": str(out)}
