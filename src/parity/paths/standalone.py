"""The standalone path: one replica per GPU (`vllm serve`, or a simulator server), HTTP, a routing client.

The replica set is started on enter and torn down on exit (its receipt at `receipt_path`). Each trial
starts on cold prefix caches and keeps one connection pool for its warmups and its measured burst; a
replica must echo the token IDs it was sent (vLLM's `return_token_ids`), else the trial fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from parity import procs
from parity.engine import Completion, EngineArgs
from parity.errors import ParityError
from parity.standalone.client import NativeClient
from parity.standalone.replicas import ReplicaSet
from parity.paths import Burst, Described, ServingPath, register
from parity.record import Placement, package_versions
from parity.trace import token_sha256


@register("standalone")
class StandalonePath(ServingPath):

    def __init__(self, kind: str, gpus: list[str], args: EngineArgs, log_dir: Path, *, startup_timeout_s: float = 600,
                 sim_params: Path | None = None, receipt_path: Path | None = None, events_revision: str | None = None,
                 stream: bool = False):
        """`events_revision`: the model revision whose block hashes the replicas' KV cache events are read
        into (the prefix router follows them); None: no events. `stream`: server-sent events, each token
        timed as it arrives."""
        self.replicas = ReplicaSet(kind, gpus, args, log_dir, startup_timeout_s=startup_timeout_s, sim_params=sim_params)
        self.receipt_path, self.events_revision, self.stream = receipt_path, events_revision, stream
        self._loop = self._client = None

    @classmethod
    def for_case(cls, case, runner) -> "StandalonePath":
        """Fresh replicas for each case: the replicas are its engines. A case of a shared start (`case.start`) is
        opened once for all of that start's cases (parity.experiments.runner); each trial resets the prefix
        caches, so its rung starts cold."""
        b, name = runner.backend, case.start or case.trial_id
        return cls("sim" if b.simulated else "vllm", runner.gpus, runner.args(case), runner.out_dir / "logs" / name,
                   startup_timeout_s=b.startup_timeout_s, sim_params=Path(b.sim_params) if b.sim_params else None,
                   receipt_path=runner.out_dir / "cleanup" / f"{name}.json",
                   events_revision=case.router.revision if case.router.facts.follows_kv_events else None, stream=case.stream)

    def __enter__(self) -> "StandalonePath":
        if self.events_revision is not None:  # bound before the replicas start: each engine connects to its port
            from parity.kv_events import Subscriber

            self.events = Subscriber.for_revision(len(self.replicas.gpus), self.events_revision)
            self.replicas.kv_events = self.events.endpoints
        try:
            self.replicas.__enter__()
        except BaseException:
            try:
                self._close_events()
            finally:  # the replicas it started are torn down: their receipt says so (a SIGTERM while they started
                self.write_receipt()  # left none, though the log said "teardown: clean": an outsider's)
            raise
        return self

    def jit_logs(self) -> list[Path]:
        return self.replicas.jit_logs()

    def close(self, *exc) -> None:
        try:
            self.replicas.__exit__(*exc)
        finally:
            self._close_events()

    def _close_events(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None

    @property
    def receipt(self) -> dict | None:
        return self.replicas.receipt

    @property
    def shards(self) -> int:
        return len(self.replicas.replicas)

    @property
    def cache_tokens(self) -> int | None:
        """The simulator replicas' KV pool; for `vllm serve`, the size its log reports."""
        if self.replicas.kind == "sim":
            from parity.engine.sim import SimParams

            args = self.replicas.args
            if args.num_gpu_blocks_override:
                return args.num_gpu_blocks_override * args.block_size
            return SimParams.load(self.replicas.sim_params).kv_cache_tokens
        return self.replicas.kv_cache_tokens()

    @contextlib.contextmanager
    def trial(self, trial_id: str, router):
        self.replicas.reset_prefix_caches()
        self._loop = asyncio.new_event_loop()
        self._client = NativeClient([r.url for r in self.replicas.replicas], self.replicas.args.model,
                                    sampling=self.replicas.args.sampling(), stream=self.stream)
        try:
            procs.termination.run(self._loop, self._client.__aenter__())
            yield
        finally:
            try:
                with procs.termination.shielded():  # a signal now waits for the pool to close
                    cancel_all(self._loop)
                    self._loop.run_until_complete(self._client.__aexit__(None, None, None))
            finally:
                self._loop.close()
                self._loop = self._client = None

    def release(self, prompts, request_ids, router, schedule, restart=None, lengths=None, admission=None) -> Burst:
        """`restart` (parity.restart.Restart): kill that shard's replica mid-run; a new one is started at
        once, as a supervisor would, and every request the dead one had not answered is sent to it.
        `lengths`: each request's exact output length (parity.lengths), sent as its own max_tokens.
        `admission` (parity.admission.Controller over `router`): bounded admission; a refused request is never
        sent, the burst's completions are the admitted requests' and `refused` holds each refusal's reason."""
        if admission is not None and restart is not None:
            raise ParityError("bounded admission runs without the restart fault: a restarted replica's learned rate "
                              "and booked work would start over")
        offsets = schedule.offsets(len(prompts))
        outage = self._arm(restart, offsets) if restart else None
        samplings = None if lengths is None else [self.replicas.args.sampling(n) for n in lengths]
        try:
            release, shards, replies = procs.termination.run(self._loop,  # the outage's clock starts with the burst
                self._client.burst(prompts, request_ids, router, offsets, outage.release_s if outage else None,
                                   samplings, admission))
        finally:
            if outage:
                outage.disarm()
                self._client.on_lost = None
        refused = {request_ids[i]: reason for i, reason in self._client.refusals.items()}
        if refused:  # from here on, the admitted requests alone
            kept = [i for i, reply in enumerate(replies) if reply is not None]
            prompts, request_ids = [prompts[i] for i in kept], [request_ids[i] for i in kept]
            shards, replies = [shards[i] for i in kept], [replies[i] for i in kept]
        sent = [token_sha256(p) for p in prompts]
        echoed = [token_sha256(r.prompt_token_ids) if r.prompt_token_ids is not None else s for r, s in zip(replies, sent)]
        mismatched = [rid for rid, e, s in zip(request_ids, echoed, sent) if e != s]
        if mismatched:
            raise ParityError(f"{len(mismatched)} replica(s) echoed prompts that differ from the trace, e.g. {mismatched[0]}")
        by_url = {r.url: r for r in self.replicas.retired + self.replicas.replicas}  # a restart's old and new
        answered = [by_url[r.url] for r in replies]
        placements = [Placement(s, a.worker_id, a.reported_gpu or a.gpu) for s, a in zip(shards, answered)]
        completions = [Completion(r.output_token_ids, r.prompt_tokens, r.cached_tokens, r.submit_s, r.complete_s,
                                  token_s=r.token_s, sent_s=r.sent_s, due_s=r.due_s) for r in replies]
        extra = {}
        if outage:
            new_url = self.replicas.replicas[restart.shard].url
            for reply in replies:
                if reply.url == new_url:
                    outage.answered(reply.complete_s)
            extra["restart"] = outage.record(len(replies), len(replies))
        if admission is not None:
            extra["admission"] = admission.stats()
        return Burst(release, completions, placements, echoed, extra, refused=refused)

    def _arm(self, restart, offsets):
        """The outage of `restart`, its kill timed from now; the client's lost requests wait for the new replica."""
        import time

        from parity.restart import Outage

        outage = Outage(restart, time.monotonic(), restart.delay_s(offsets, self.shards))
        replacing: list[asyncio.Future] = []

        async def on_lost(shard: int, request_id: str) -> bool:
            if shard != restart.shard or not outage.killed:
                return False
            outage.resend(request_id)
            if not replacing:  # the first request to find it dead starts its replacement
                replacing.append(self._loop.run_in_executor(None, self._replace, restart.shard, outage))
            await asyncio.shield(replacing[0])
            return True

        self._client.on_lost = on_lost
        outage.arm(lambda: self.replicas.replicas[restart.shard].process.pid)
        return outage

    def _replace(self, shard: int, outage) -> None:
        import time

        replica = self.replicas.replace(shard)
        self._client.urls[shard] = replica.url
        outage.ready_s = time.monotonic()

    def describe(self, burst: Burst) -> Described:
        simulated = self.replicas.kind == "sim"
        engine = {"name": "sim-server" if simulated else "vllm-serve", "simulated": simulated,
                  "version": None if simulated else package_versions()["vllm"], "args": self.replicas.args.to_dict()}
        gpus = [{"uuid": r.reported_gpu or r.gpu, "index": r.index} for r in self.replicas.replicas]
        return Described(engine, gpus, {"replicas": self.replicas.kind, "shards": self.shards}
                         | ({"stream": True} if self.stream else {}))


def cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the loop still runs, as asyncio.run would, so no request runs on into the closed pool.
    A signal mid-burst cancels the burst's task (`procs.termination.run`); this is for what else leaves
    tasks behind, such as an exception raised inside the loop by a signal handler other than parity's.
    A task that exception landed in raises it again as it finishes (asyncio re-raises SystemExit): the run
    is stopping already, so it is not raised a second time, and every task's outcome is read so none is
    logged as never retrieved."""
    while pending := asyncio.all_tasks(loop):
        for task in pending:
            task.cancel()
        try:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except (SystemExit, KeyboardInterrupt):
            pass
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()
