"""The Flame service that embeds the engine: what runs inside each Flame executor.

On session enter it leases a GPU, builds the engine (sim, vllm-sync or vllm-async) from the
session's common data and, optionally, freezes the long-lived startup heap (`gc.freeze()`), caching
`gc.get_freeze_count()` once: the study excluded a probe that queried it per batch, since it walks
the permanent heap. On each task it decodes a batch (raw or zlib), admits it to the engine in the
configured order (`admission`), and returns the outputs in input order with the worker's identity
(executor id, pid, GPU UUID), per-batch timings and the GC pauses that fell inside inference; in the
harvest mode (ours, `parity.flame.harvest`) it admits the task's prompts and returns the engine's events. On
session leave it unfreezes the heap and tears the engine down.

GPU lease (`parity.gpu_lock`): Flame counts GPUs but never assigns them. A worker takes the first
GPU of `PARITY_GPUS` whose lock it can hold, and pins itself with CUDA_VISIBLE_DEVICES before the
engine starts; an application registered per GPU lists one, a global session's application lists all.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import time
from pathlib import Path

import flamepy

from parity import gpu_lock, jit
from parity.engine import EngineArgs, engine_kind, make_engine
from parity.errors import ParityError
from parity.flame import admission, codec
from parity.flame.settings import FlameSettings
from parity.gpu_lock import GpuBusy
from parity.trace import token_sha256

FAILURE_DIR_ENV = "PARITY_FAILURE_DIR"


def short_temp_dir(limit: int = 40) -> None:
    """Flame gives each executor a deep TMPDIR; vLLM puts ZeroMQ sockets there, whose paths must stay
    under 107 bytes. Use /tmp when the given one is too long."""
    import tempfile

    if len(tempfile.gettempdir()) > limit:
        os.environ["TMPDIR"] = "/tmp"
        os.environ.setdefault("VLLM_RPC_BASE_PATH", "/tmp")
        tempfile.tempdir = None


def worker_environment(out_dir: Path, simulated: bool) -> dict[str, str]:
    """What the Flame workers of a run writing to `out_dir` inherit: where to report a failed bind, and
    whose GPU locks (the run's for simulated GPUs; for real ones this user's, as the node's GPUs are shared)."""
    env = {FAILURE_DIR_ENV: str((Path(out_dir) / "logs" / "worker-failures").resolve()),
           jit.DIR_ENV: str((Path(out_dir) / "logs" / "jit").resolve())}
    if simulated:
        env[gpu_lock.LOCK_DIR_ENV] = str(gpu_lock.run_dir(out_dir))
    return env


def report_failure(session_id: str, exc: BaseException) -> None:
    """Leave the error where the client looks ($PARITY_FAILURE_DIR): Flame retries a failed bind
    without telling the client, which would otherwise wait for its tasks forever."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{session_id}.txt").write_text(f"{type(exc).__name__}: {exc}\n")


class GcObserver:
    """Total GC pause time via gc.callbacks; cheap enough to leave on for every batch."""

    def __init__(self):
        self.pause_s = 0.0
        self.collections = 0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pause_s += time.perf_counter() - self._start
            self.collections += 1

    def close(self):
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


class ParityService(flamepy.FlameService):
    def __init__(self):
        self.engine = None
        self.frozen = False
        self.freeze_count = 0
        self.budget = FlameSettings().budget
        self.order = FlameSettings().order
        self.identity: dict = {}
        self.gc = None
        self._lease = None
        self.harvest = None  # the harvest mode's requests and events (parity.flame.harvest), else None

    def on_session_enter(self, context):
        try:
            self._enter(context)
        except GpuBusy:
            raise  # a surplus executor: Flame releases it, the one holding the GPU serves the session
        except Exception as exc:
            report_failure(context.session_id, exc)
            if self._lease is not None:  # a failed bind holds no GPU (and is not a worker that died)
                self._lease.release()
                self._lease = None
            raise

    def _enter(self, context):
        short_temp_dir()
        config = json.loads(context.common_data() or b"{}")  # parity.flame.settings.session_data
        gpus = [g for g in os.environ.get("PARITY_GPUS", "").split(",") if g]
        if not gpus:
            raise ParityError("PARITY_GPUS is not set for this application: which GPU(s) may a worker use?")
        flame = FlameSettings.from_dict(config.get("flame"))  # a bad setting fails the bind, not the first task
        self.order, self.budget = flame.order, flame.budget
        endpoint = os.environ.get(flamepy.FLAME_INSTANCE_ENDPOINT, "")
        executor_id = Path(endpoint).name.removesuffix(".sock")
        self._lease = gpu_lock.lease(gpus, session_id=context.session_id, executor_id=executor_id,
                                     flame_endpoint=os.environ.get("FLAME_ENDPOINT"))
        uuid = self._lease.gpu
        kind, sim_mode = engine_kind(config.get("engine", "sim"), flame.api)
        if kind != "sim":
            os.environ["CUDA_VISIBLE_DEVICES"] = uuid
        args = EngineArgs.from_dict(config.get("engine_args"))
        sim_options = {}
        if kind == "sim":
            from parity.engine.sim import SimParams

            sim_options = {"params": SimParams.load(config.get("sim_params")), "clock": "paced",
                           "gpu_uuid": uuid, "mode": sim_mode}
        if kind != "sim" and os.environ.get(jit.DIR_ENV):  # before vLLM is imported: its engine core inherits it
            where = Path(os.environ[jit.DIR_ENV])  # and its whole log: the worker's stdout goes with its executor
            name = context.session_id
            os.environ.update(jit.environment(where / f"{name}.jit", where / f"{name}.vllm.log"))
        harvest = flame.mode == "harvest"  # its events are the engine's streamed tokens
        self.engine = make_engine(kind, args, kv_events=config.get("kv_events"),
                                  token_times=bool(config.get("token_times")) or harvest, **sim_options)
        if harvest:
            from parity.flame.harvest import Harvest

            self.harvest = Harvest(self.engine, hold_s=flame.hold_s, order=flame.order)
        described = self.engine.describe()
        self.identity = {"executor_id": executor_id, "pid": os.getpid(),
                         "host": socket.gethostname(), "gpu_uuid": described["gpu_uuid"],
                         "session_id": context.session_id, "engine": described["name"],
                         "engine_version": described.get("version")}
        self.gc = GcObserver()
        if flame.gc_freeze:
            gc.collect()
            gc.freeze()
            self.frozen = True
            self.freeze_count = gc.get_freeze_count()  # once: it walks the permanent heap

    def on_task_invoke(self, context):
        started = time.perf_counter()
        if (op := codec.control_of(context.input or b"")) is not None:
            return self._control(op)
        prompts = codec.decode(context.input or b"", budget=self.budget)
        decoded = time.perf_counter()
        pauses, collections = self.gc.pause_s, self.gc.collections
        if self.harvest is not None:
            events, completions, timings = self.harvest.task(prompts)
            timings |= {"decode_s": decoded - started, "input_bytes": len(context.input or b""),
                        "gc_pause_s": self.gc.pause_s - pauses, "gc_collections": self.gc.collections - collections}
            return codec.encode_output(completions, self.identity, timings, events)
        order = admission.admission_order([p.tokens for p in prompts], self.order)
        own = prompts and prompts[0].max_tokens is not None  # lengths of their own (parity.lengths): all or none
        admitted = self.engine.generate([prompts[i].tokens for i in order],
                                        [prompts[i].max_tokens for i in order] if own else None)
        inferred = time.perf_counter()
        completions = [None] * len(prompts)
        for position, completion in zip(order, admitted):
            completions[position] = completion  # back in input order
        outputs = [{"request_id": p.request_id, "input_sha256": token_sha256(p.tokens),
                    "output_token_ids": [int(t) for t in c.output_token_ids],
                    "prompt_tokens": c.prompt_tokens, "cached_tokens": c.cached_tokens}
                   | ({"token_s": c.token_s} if c.token_s else {})
                   for p, c in zip(prompts, completions)]
        timings = {"decode_s": decoded - started, "engine_s": inferred - decoded, "prompts": len(prompts),
                   "input_bytes": len(context.input or b""), "gc_pause_s": self.gc.pause_s - pauses,
                   "gc_collections": self.gc.collections - collections, "gc_frozen": self.frozen,
                   "gc_freeze_count": self.freeze_count, "order": self.order}
        return codec.encode_output(outputs, self.identity, timings)

    def _control(self, op: str) -> bytes:
        """A control task (parity.flame.codec.CONTROLS), refused while a harvest session has requests running."""
        if self.harvest is not None and self.harvest.running():
            raise ParityError(f"{op}: {self.harvest.running()} requests are still running on this session")
        self.engine.reset_prefix_cache()
        return codec.encode_output([], self.identity, {"op": op})

    def on_session_leave(self):
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
        if self.gc is not None:
            self.gc.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.harvest = None
        if self._lease is not None:
            self._lease.release()  # the GPU is free for the next session's worker
            self._lease = None


def main() -> None:
    flamepy.run(ParityService())
