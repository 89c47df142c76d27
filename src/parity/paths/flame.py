"""The Flame path: sessions on a Flame cluster whose workers embed the engine, fed by a batcher per session.

`cluster` is the one way a run starts its cluster (the CPU stand-in or real Flame v0.6.0): the workers'
environment, stale GPU locks cleared, one application per GPU registered, the receipt written on exit.
An experiment starts it once and shares it; each trial opens new sessions (so new workers and
engines), and every prompt must have been served by an executor the cluster lists under its shard's
session.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import wait
from pathlib import Path

from parity import jit
from parity.engine import Completion, EngineArgs, engine_kind
from parity.errors import ParityError
from parity.flame.client import FlameSessions, register_applications, verify_placement
from parity.flame.settings import FlameSettings, session_data
from parity.paths import Burst, Described, ServingPath, register
from parity.record import Placement
from parity.routing import FLAME
from parity.schedule import Quiet, wait_until
from parity.trace import token_sha256

# What a Flame worker must inherit to find the same Python packages and engine settings as this process.
PASSED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_NO_USAGE_STATS",
              "HF_HUB_OFFLINE", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "PARITY_GPU_LOCK_DIR", "PARITY_FAILURE_DIR",
              "PARITY_JIT_DIR")
RELEASE_TIMEOUT_S = 3600


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """Set environment variables while the block runs (children started meanwhile inherit them)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def cluster(kind: str, gpus: list[str], out_dir: Path, *, simulated: bool, bin_dir: Path | str | None = None,
            receipt_path: Path | None = None, log=None):
    """A running cluster (`kind`: standin or flame) with one application per GPU; torn down on exit.

    Locks on the GPUs left by a run that died are cleared first; a GPU a live run holds is an error. Before
    that, a GPU named twice or one this machine lacks is refused (`parity.gpus`): one worker per GPU.
    """
    from parity import gpu_lock
    from parity.flame.service import worker_environment
    from parity.gpus import check as check_gpus

    check_gpus(list(gpus), simulated=simulated)
    with environment(worker_environment(out_dir, simulated)):  # the workers inherit it
        gpu_lock.clear_stale(gpu_lock.lock_dir(), gpus, log=log)
        if kind == "standin":
            from parity.flame.standin import StandInCluster

            running = StandInCluster(log_dir=out_dir / "logs")  # its short socket dir in /tmp goes on exit
        else:
            from parity.flame.cluster import FlameCluster

            running = FlameCluster(bin_dir, out_dir / "flame", **({"log": log} if log else {}))
        if log and kind == "standin":  # real Flame says it starts once its binaries said they are v0.6.0 (said
            # before, "starting Flame v0.6.0" came above the refusal of binaries that were not)
            log("starting the Flame stand-in ...")
        try:
            with running:
                register_applications(running.endpoint, gpus, simulated=simulated,
                                      extra_env={k: os.environ[k] for k in PASSED_ENV if k in os.environ})
                yield running
        finally:
            if receipt_path is not None and getattr(running, "receipt", None) is not None:
                from parity.manifest import write_manifest

                write_manifest(receipt_path, running.receipt)


@register("flame")
class FlamePath(ServingPath):
    placements = FLAME

    def __init__(self, running_cluster, gpus: list[str], settings: FlameSettings, *, engine: str,
                 engine_args: EngineArgs, sim_params: str | None = None, stream: bool = False,
                 shared_start: str | None = None):
        """`engine`: the family the workers build (sim or vllm), through `settings.api`; `stream`: the workers'
        engines time every output token (flamepy 0.6.0 returns a task's outputs together, so in the study's burst
        mode the client still receives each answer with its batch; in the harvest mode, ours, each token comes
        back with the task that harvested it: parity.flame.harvester). `shared_start` (ours): the sessions, so
        workers and engines, are opened by the first trial under that name and kept for every later one, each
        of which starts with their prefix caches reset (a ladder's rungs on one engine start)."""
        self.cluster, self.gpus, self.settings = running_cluster, gpus, settings
        self.engine, self.engine_args, self.sim_params, self.stream = engine, engine_args, sim_params, stream
        self.shared_start = shared_start
        self.data = self._data()
        self.sessions: FlameSessions | None = None

    def _data(self, kv_events: str | None = None) -> bytes:
        return session_data(self.settings, self.engine, self.engine_args.to_dict(), self.sim_params,
                            kv_events=kv_events, token_times=self.stream)

    @classmethod
    def for_case(cls, case, runner) -> "FlamePath":
        """The experiment's one cluster (started by its first Flame case), fresh sessions per trial."""
        b = runner.backend
        shared = runner.shared("flame-cluster", lambda: cluster(
            b.cluster, runner.gpus, runner.out_dir, simulated=b.simulated, bin_dir=b.flame_bin_dir,
            receipt_path=runner.out_dir / "cleanup" / "flame-cluster.json", log=runner.log))
        return cls(shared, runner.gpus, case.flame, engine=b.engine, engine_args=runner.args(case), sim_params=b.sim_params,
                   stream=case.stream, shared_start=case.start)

    @property
    def shards(self) -> int:
        return self.sessions.shards

    @property
    def cache_tokens(self) -> int | None:
        """The simulated workers' KV pool (a vLLM worker's is in its own log, not here)."""
        if self.engine != "sim":
            return None
        from parity.engine.sim import SimParams

        blocks = self.engine_args.num_gpu_blocks_override
        return blocks * self.engine_args.block_size if blocks else SimParams.load(self.sim_params).kv_cache_tokens

    @contextlib.contextmanager
    def trial(self, trial_id: str, router):
        """New sessions (so new workers and engines); under the prefix router each session's engine publishes
        its KV cache events to a subscriber of this trial's (its endpoint in that session's data)."""
        if self.shared_start is not None:
            yield from self._kept(router)
            return
        data = self.data
        if router.facts.follows_kv_events:
            from parity.kv_events import Subscriber

            self.events = Subscriber.for_revision(len(self.gpus), router.revision)
            data = [self._data(kv_events=e) for e in self.events.endpoints]
        try:
            with FlameSessions(self.cluster, len(self.gpus), self.settings, data, placement=router.placement,
                               name=trial_id, output_tokens=self.engine_args.max_tokens) as self.sessions:
                yield
        finally:
            self.sessions = None
            if self.events is not None:
                self.events.close()
                self.events = None

    def _kept(self, router):
        """A trial on the shared start's sessions: opened by its first trial, reset (cold caches) for later ones.
        Under the prefix router (the bounded arm's) one subscriber lives as long as the sessions, as a standalone
        start's does: each trial's router follows it from what the reset and its warm-ups left."""
        if self.sessions is None:
            data = self.data
            if router.facts.follows_kv_events:
                from parity.kv_events import Subscriber

                self.events = Subscriber.for_revision(len(self.gpus), router.revision)
                data = [self._data(kv_events=e) for e in self.events.endpoints]
            try:
                self.sessions = FlameSessions(self.cluster, len(self.gpus), self.settings, data,
                                              placement=router.placement, name=self.shared_start,
                                              output_tokens=self.engine_args.max_tokens).__enter__()
            except BaseException:  # no sessions to close later: the subscriber goes now
                if self.events is not None:
                    self.events.close()
                    self.events = None
                raise
        else:
            if (self.events is not None) != router.facts.follows_kv_events:
                raise ParityError(f"shared start {self.shared_start}: its trials' routers must all follow KV cache "
                                  "events or none (its sessions were opened for the first trial's)")
            self.sessions.reset_prefix_caches()
        yield

    def close(self, *exc) -> None:
        """A shared start's sessions close with it (a fresh-start path's close with each trial), then its subscriber."""
        if self.shared_start is not None and self.sessions is not None:
            sessions, self.sessions = self.sessions, None
            try:
                sessions.__exit__(*exc)
            finally:
                if self.events is not None:
                    self.events.close()
                    self.events = None

    def jit_logs(self) -> list[Path]:
        """Each session's worker engine's file of JIT compilations (parity.jit), for vLLM workers."""
        folder = os.environ.get(jit.DIR_ENV)  # set while the cluster runs (parity.flame.service.worker_environment)
        if self.engine == "sim" or not folder or self.sessions is None:
            return []
        return [Path(folder) / f"{s.id}.jit" for s in [s for s, _ in self.sessions.retired if s] + self.sessions.sessions]

    def release(self, prompts, request_ids, router, schedule, restart=None, lengths=None, admission=None) -> Burst:
        """Route and submit each prompt at its time; wait for all (a worker's failure is raised); check that
        the cluster lists each prompt's executor under the session it was sent to. `restart` (parity.restart):
        kill that shard's worker mid-run; a new session for the shard (a new worker and engine) gets every
        request whose task failed with the dead worker, and what arrives for the shard from then on.
        `lengths`: each request's exact output length (parity.lengths), carried in its task's payload.
        `admission` (parity.admission.Controller over `router`): bounded admission, the standalone client's own; a
        refused request never enters a task (tried again after its Retry-After as the client's policy allows) and
        one refused for good is recorded with its reason; a harvested answer's first token
        releases its prefill, any other's completion does."""
        if admission is not None and restart is not None:
            raise ParityError("bounded admission runs without the restart fault: a restarted worker's learned rate "
                              "and booked work would start over")
        sessions = self.sessions
        sent_before = {id(b): len(b.batch_sizes) for b in sessions.batchers}
        tasks_before = {id(b): len(getattr(b, "tasks", ())) for b in sessions.batchers}
        offsets = schedule.offsets(len(prompts))
        outage, bound_before = (self._arm(restart, offsets), sessions.executors()) if restart else (None, [])
        release = outage.release_s if outage else time.monotonic()
        shards, futures, sent, sent_to, due = ([None] * len(prompts) for _ in range(5))  # by burst index
        refused: dict[int, str] = {}  # burst index -> why bounded admission refused it
        booking: dict[str, int] = {}  # request id -> the controller's routing index (admitted under admission)
        if admission is not None:
            def first(request_id: str) -> None:  # a harvester's thread, its lock held: the controller learns the
                # wait under its own lock (microseconds; a decision never takes the harvester's)
                admission.first_token(booking[request_id], time.monotonic())
            for batcher in sessions.batchers:
                batcher.on_first = first

        def submit(index: int) -> None:
            shard = shards[index]
            future = sessions.batchers[shard].submit(request_ids[index], prompts[index],
                                                     None if lengths is None else lengths[index])
            futures[index], sent_to[index] = future, sessions.sessions[shard].id  # a resend replaces the first
            if outage:
                outage.watch(future, index)
            if admission is not None:  # its prefill (if not yet) and its router booking released as it comes back
                future.add_done_callback(lambda _, booked=booking[request_ids[index]]:
                                         admission.complete(booked, time.monotonic()))
            elif router.released_on_completion:  # its load released as its answer comes back (the batcher's thread)
                future.add_done_callback(lambda _, index=index: router.complete(index))

        try:
            attempts = admission.attempts(offsets) if admission is not None else \
                ((offset, index, 0) for index, offset in enumerate(offsets))
            for offset, index, attempt in attempts:  # a refused try may come again later (the client's policy)
                if offset > 0:
                    wait_until(release + offset)
                sent[index] = time.monotonic()
                if attempt:  # a retry, due at its Retry-After (the send lag is measured from it)
                    due[index] = release + offset
                if admission is not None:
                    decision = admission.decide(prompts[index], sent[index], attempt, arrived=release + offsets[index])
                    if not decision.admitted:  # never sent: no future, no session
                        if not attempts.again(index, attempt, sent[index] - release + decision.retry_after_s):
                            refused[index] = attempts.final(decision.reason, attempt)
                        continue
                    shards[index] = decision.shard
                    booking[request_ids[index]] = decision.index
                else:
                    shards[index] = router.route(prompts[index])
                submit(index)
                if outage:
                    self._recover(outage, submit, request_ids, futures, sent_to)
            deadline, pending = release + RELEASE_TIMEOUT_S, {f for f in futures if f is not None}
            quiet = Quiet("flame", len(futures), len(pending), deadline, time.monotonic())
            while pending:
                _, pending = wait(pending, timeout=1.0 if not outage else 0.05)
                quiet.note(len(pending), time.monotonic())
                if outage:
                    pending |= {futures[i] for i in self._recover(outage, submit, request_ids, futures, sent_to)}
                    self._check_recovery(outage, futures, sent_to)
                sessions.check_failures()
                if pending and time.monotonic() > deadline:
                    raise ParityError(f"{len(pending)} of {len(futures)} requests unanswered after {RELEASE_TIMEOUT_S} s")
        finally:
            if outage:
                outage.disarm()
            for batcher in sessions.batchers:
                batcher.on_first = None
        if refused:  # from here on, the admitted requests alone
            kept = [i for i in range(len(futures)) if i not in refused]
            refused_ids = {request_ids[i]: refused[i] for i in sorted(refused)}
            prompts, request_ids = [prompts[i] for i in kept], [request_ids[i] for i in kept]
            shards, futures, sent, sent_to, due = ([xs[i] for i in kept] for xs in (shards, futures, sent, sent_to, due))
        results = [f.result() for f in futures]
        executors = sessions.executors()
        extra = {}
        if outage:  # the dead worker's earlier answers are checked against the cluster's list from before
            executors = [e for e in bound_before if e["executor_id"] not in {x["executor_id"] for x in executors}] + executors
            self._check_recovery(outage, futures, sent_to)
            extra["restart"] = outage.record(len(results), len(results))
        verify_placement(results, sent_to, executors)
        workers = {r.worker.get("executor_id"): r.worker for r in results}
        batches = {r.batch_id: {"batch_id": r.batch_id, "executor_id": r.worker.get("executor_id"), **r.task_timings}
                   for r in results if r.batch_id is not None}  # none in harvest mode: a request spans tasks
        if admission is not None:
            extra["admission"] = admission.stats()
        if self.settings.mode == "harvest":
            extra["harvest"] = harvest_summary([t for b in sessions.all_batchers
                                                for t in b.tasks[tasks_before.get(id(b), 0):]])
        return Burst(
            release,
            [Completion(r.output_token_ids, r.prompt_tokens, r.cached_tokens, r.submit_s, r.complete_s,
                        token_s=r.token_s, sent_s=s, due_s=d) for r, s, d in zip(results, sent, due)],
            [Placement(s, r.worker.get("executor_id", "?"), r.worker.get("gpu_uuid", "?"), r.batch_id)
             for s, r in zip(shards, results)],
            [r.input_sha256 or token_sha256(p) for r, p in zip(results, prompts)],
            {"workers": sorted(workers.values(), key=lambda w: w["executor_id"]),
             "batch_sizes": [n for b in sessions.all_batchers for n in b.batch_sizes[sent_before.get(id(b), 0):]],
             "batches": [batches[k] for k in sorted(batches)], "executors": executors, "placement_verified": True}
            | extra, refused=refused_ids if refused else {})

    def _arm(self, restart, offsets):
        """The outage of `restart`, its kill (the shard's bound worker and what it started) timed from now."""
        from parity.restart import Outage

        outage = Outage(restart, time.monotonic(), restart.delay_s(offsets, self.shards))

        def find() -> int:
            worker = self.sessions.worker(restart.shard, wait_s=RELEASE_TIMEOUT_S)
            outage.executor_id = worker.get("executor_id")
            self.cluster.expect_death(int(worker["pid"]))
            return int(worker["pid"])
        outage.arm(find)
        return outage

    def _check_recovery(self, outage, futures, sent_to) -> None:
        """The shard's new session answered within the restart's timeout, else the trial fails in one line
        naming the executors the cluster lists (on Flame v0.6.0 the dead worker's stays, bound while idle and
        ExecutorUnbinding for ever once a task finds no service, and no executor comes for the new session)."""
        new_id = self.sessions.sessions[outage.restart.shard].id
        for future, session_id in zip(futures, sent_to):
            if session_id == new_id and future.done() and future.exception() is None:
                outage.answered(future.result().complete_s)
        if outage.overdue(time.monotonic()):
            listed = ", ".join(f"{e['id'][:8]} {e['state']} (session {e['session_id']})"
                               for e in getattr(self.cluster, "executors", list)()) or "none"
            raise ParityError(f"shard {outage.restart.shard}'s session after the restart, {new_id}, answered nothing within "
                              f"{outage.restart.timeout_s:g} s after its worker was killed; the cluster's executors: {listed}")

    def _recover(self, outage, submit, request_ids, futures, sent_to) -> list[int]:
        """Once the worker is killed, the shard gets a new session (Flame v0.6.0 gives a session whose service
        died no new one), and every request of the old session not yet answered goes to it; so does each
        request lost later (its task failed), once: twice is an error, by name. The indices sent again."""
        if not outage.killed:
            return []
        again = []
        if not outage.replaced:
            old = self.sessions.sessions[outage.restart.shard].id
            self.sessions.replace(outage.restart.shard)
            outage.replaced = True
            again = [i for i, (f, session_id) in enumerate(zip(futures, sent_to))
                     if session_id == old and not (f.done() and f.exception() is None)]
        again += [i for i, f in outage.take_lost() if futures[i] is f and i not in again]  # not one superseded
        for index in again:
            outage.resend(request_ids[index])
            submit(index)
        return again

    def describe(self, burst: Burst) -> Described:
        workers = burst.extra["workers"]
        versions = sorted({str(w.get("engine_version")) for w in workers if w.get("engine_version")})
        if len(versions) > 1:
            raise ParityError(f"the Flame workers ran different engine versions: {', '.join(versions)}")
        kind, sim_mode = engine_kind(self.engine, self.settings.api)
        ran_on = self.cluster.describe()
        engine = {"name": kind, "simulated": self.engine == "sim", "version": versions[0] if versions else None,
                  "args": self.engine_args.to_dict()}  # the version the workers report, not this client's
        config = {"flame": self.settings.to_dict(), "engine": kind, "sim_mode": sim_mode, "cluster": ran_on["cluster"]}
        config |= {"stream": True} if self.stream else {}
        return Described(engine, [{"uuid": g} for g in sorted({w["gpu_uuid"] for w in workers})], config,
                         {"flame_cluster": ran_on["cluster"], "flame_binaries": ran_on["binaries"],
                          "network": ran_on["network"]})


def harvest_summary(tasks: list[dict]) -> dict:
    """What a harvest-mode burst's tasks did (parity.flame.harvest), compact: a task per engine event or hold
    is thousands per trial. `admit_s`/`wait_s`: the service admitting a task's prompts, then waiting for an event;
    `round_trip_s`: the client sending a task to holding its result; the waits per prompt and per token where
    the worker shares the client's clock (parity.flame.harvester)."""
    from parity.latency import percentiles

    return {"tasks": len(tasks), "empty_tasks": sum(1 for t in tasks if not t.get("prompts")),
            "events": sum(t.get("events", 0) for t in tasks),
            "completions": sum(t.get("completions", 0) for t in tasks),
            **({"express_tasks": sum(1 for t in tasks if t.get("express"))} if any("express" in t for t in tasks)
               else {}),  # sent behind another (FlameSettings express)
            **{key: percentiles(t[key] for t in tasks if key in t) for key in ("admit_s", "wait_s", "round_trip_s")},
            # per prompt and per token, where the worker ran on this host (one CLOCK_MONOTONIC): a prompt's
            # arrival to the service seeing it and to its admission, an engine token to the client holding it
            **{key: percentiles(v for t in tasks for v in t.get(key, ()))
               for key in ("arrival_to_seen_s", "arrival_to_admitted_s", "event_to_client_s")
               if any(key in t for t in tasks)}}
