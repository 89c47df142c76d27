"""The Flame client: sessions on a Flame cluster (real v0.6.0 or the stand-in), a batcher per session queue.

Placements, as in the study:
- `global`: one session with one worker per GPU; tasks go FIFO to whichever worker asks first, so a
  shared prefix may land on either worker.
- `sticky`: one persistent session per shard (one worker each, one application per GPU), and the
  affinity router chooses the shard.
The Flame serving path (`parity.paths.flame`) opens these sessions for each trial.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import flamepy

from parity.errors import ParityError
from parity.flame import codec
from parity.flame.batcher import Batcher
from parity.flame.harvester import Harvester
from parity.flame.service import FAILURE_DIR_ENV
from parity.flame.settings import FlameSettings
from parity.routing import facts_of


GLOBAL_APP = "parity-all-gpus"


def shard_app(index: int) -> str:
    return f"parity-gpu{index}"


SEARCH_PATHS = ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH")


def absolute_search_paths(env: dict) -> dict:
    """`env` with the entries of its search paths made absolute, from this process's folder: Flame v0.6.0 starts a
    worker in its executor's own folder, where `PYTHONPATH=src` would name nothing, and Python would then import
    whichever parity is installed (seen: a checkout's editable install, not the code under test)."""
    return env | {key: os.pathsep.join(os.path.abspath(p) if p else p for p in env[key].split(os.pathsep))
                  for key in SEARCH_PATHS if key in env}


def register_applications(endpoint: str, gpus: list[str], *, simulated: bool, delay_release: int = 86_400,
                          extra_env: dict | None = None) -> None:
    """One application per GPU (pinned with CUDA_VISIBLE_DEVICES) and one for a global session.

    A long `delay_release` keeps workers (and their engines) bound between bursts: Flame kills a
    service process when its executor is released, and rebinding reloads the model.
    """
    import sys

    extra_env = absolute_search_paths(extra_env or {})
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

    def __init__(self, cluster, gpus: int, settings: FlameSettings, data: bytes | list[bytes], *, placement: str,
                 name: str = "parity", output_tokens: int = 16):
        """`data`: the workers' session data (settings.session_data), or one per session; `output_tokens`:
        the workers' engines' max_tokens (the room each task keeps for its outputs)."""
        self.cluster, self.gpus, self.settings, self.name = cluster, gpus, settings, name
        self.output_tokens = output_tokens
        self.data, self.placement = data, placement
        self.sessions: list = []
        self.batchers: list[Batcher | Harvester] = []  # per session: a batcher, or a harvester in harvest mode
        self.retired: list[tuple] = []  # (session, batcher) replaced after a restart fault
        self.rotated: list[dict] = []  # harvest rotate_tasks: per session left behind, its id and executors' records
        self._lock = threading.Lock()  # a rotation (a harvester's thread) against closing
        self._closing = False

    def __enter__(self) -> "FlameSessions":
        self.connection = flamepy.connect(self.cluster.endpoint)
        try:
            if facts_of(self.placement).shared_session:
                specs = [(GLOBAL_APP, self.gpus)]
            else:
                specs = [(shard_app(index), 1) for index in range(self.gpus)]
            self.specs = specs
            for index in range(len(specs)):
                session, batcher = self._open(index, f"{self.name}-{index}")
                self.sessions.append(session)
                self.batchers.append(batcher)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _session(self, index: int, session_id: str):
        """Session `session_id` for shard `index` (its application, its workers)."""
        app, workers = self.specs[index]
        folder = os.environ.get(FAILURE_DIR_ENV)
        if folder:  # a report left by an earlier run of this trial is not about this one
            (Path(folder) / f"{session_id}.txt").unlink(missing_ok=True)
        return self.connection.create_session(flamepy.SessionAttributes(
            id=session_id, application=app, common_data=self.data[index] if isinstance(self.data, list) else self.data,
            min_instances=workers, max_instances=workers))

    def _open(self, index: int, session_id: str):
        """Session `session_id` for shard `index`, and its batcher."""
        s, session = self.settings, self._session(index, session_id)
        if s.mode == "harvest":  # ours: one task outstanding, admitting and harvesting (parity.flame.harvester)
            return session, Harvester(session.run, s, name=session.id, output_tokens=self.output_tokens,
                                      rotate=lambda: self.rotate(index))
        return session, Batcher(session.run, s, name=session.id, output_tokens=self.output_tokens)

    def replace(self, shard: int) -> None:
        """A new session (so a new worker and engine) in place of shard `shard`'s, whose worker was killed (the
        restart fault, parity.restart): Flame v0.6.0 starts no new service for a session whose service died.
        (Nor, observed, an executor for the new session: the dead one's stays, failing each task with
        "Connection refused" and never unbinding; the stand-in starts one.) The old session is closed now, or
        with the others at the end if Flame refuses."""
        old, batcher = self.sessions[shard], self.batchers[shard]
        batcher.close()
        try:  # before the new one opens, so the old session's queued tasks fail now and it holds nothing
            self.connection.close_session(old.id)
        except Exception:  # noqa: BLE001 - closed again, and reported if it still fails, at the end
            self.retired.append((old, batcher))
        else:
            self.retired.append((None, batcher))
        self.sessions[shard], self.batchers[shard] = self._open(shard, f"{self.name}-{shard}-r{len(self.retired)}")

    def rotate(self, shard: int, wait_s: float = 120.0):
        """A fresh session for shard `shard` in place of its drained one, which is closed and deleted, so that
        Flame's session manager drops its tasks (v0.6.0 keeps them all in memory until then); the new one opens
        once the old one's worker has let its GPU go. Returns the new session's `run` (the harvest mode's
        `rotate_tasks`, called from the harvester's thread)."""
        from parity import gpu_lock

        with self._lock:
            if self._closing:
                raise ParityError("the sessions are closing")
            old = self.sessions[shard]
            self.rotated.append({"session_id": old.id, "shard": shard,
                                 "executors": [e for e in self.executors() if e["session_id"] == old.id]})
            self.connection.close_session(old.id)
            delete_session(self.connection, old.id)
            deadline = time.monotonic() + wait_s
            while gpu_lock.live_holder(gpu_lock.lock_dir(), old.id) is not None:
                if time.monotonic() > deadline:
                    raise ParityError(f"the worker of session {old.id} still holds its GPU {wait_s:g} s after "
                                      f"it closed")
                time.sleep(0.05)
            self.sessions[shard] = self._session(shard, f"{self.name}-{shard}-n{len(self.rotated)}")
            return self.sessions[shard].run

    @property
    def all_batchers(self) -> list[Batcher | Harvester]:
        """Every batcher of these sessions, a replaced one's too."""
        return [b for _, b in self.retired] + self.batchers

    def __exit__(self, *exc) -> None:
        with self._lock:  # a rotation under way finishes first, so its new session is closed below
            self._closing = True
        for batcher in self.all_batchers:
            batcher.close()
        errors = []
        with self._lock:
            sessions = [s for s, _ in self.retired if s is not None] + self.sessions
        for session in sessions:
            try:
                self.connection.close_session(session.id)
            except Exception as error:  # keep closing the others; report at the end
                errors.append(f"{session.id}: {error}")
        if exc[0] is not None:  # tasks may never finish (a dead executor manager): end their watch streams,
            self.connection._channel.close()  # which flamepy's close() would otherwise wait for
        self.connection.close()
        if exc[0] is None:  # a worker that died once its answers were in is a fault of the run all the same
            problems = self.cluster.unexpected_deaths()
            if errors:
                problems.append(f"could not close Flame sessions: {'; '.join(errors)}")
            if problems:
                raise ParityError("; ".join(problems))

    def reset_prefix_caches(self, timeout_s: float = 600) -> None:
        """Every session's engine starts the next trial cold (a control task, parity.flame.codec), as a fresh
        engine would: between the rungs of a shared start. Only while no request is queued or running."""
        busy = [b.name for b in self.batchers if not b.idle()]
        if busy:
            raise ParityError(f"cannot reset the prefix caches while sessions {', '.join(busy)} have requests")
        data = codec.encode_control("reset_prefix_cache")
        for future in [session.run(data) for session in self.sessions]:
            codec.decode_output(future.result(timeout=timeout_s))

    @property
    def shards(self) -> int:
        return len(self.batchers)

    def worker(self, shard: int, wait_s: float = 0.0) -> dict:
        """The GPU lock record (pid, executor_id, ...) of the live worker bound to shard `shard`'s session,
        waiting up to `wait_s` for one still starting."""
        from parity import gpu_lock

        deadline = time.monotonic() + wait_s
        while (record := gpu_lock.live_holder(gpu_lock.lock_dir(), self.sessions[shard].id)) is None:
            if time.monotonic() > deadline:
                raise ParityError(f"no live worker holds a GPU for session {self.sessions[shard].id}")
            time.sleep(0.05)
        return record

    def check_failures(self) -> None:
        """Raise the error a worker left for one of these sessions (see service.report_failure), or
        name a process of the cluster that died (but a worker the restart fault killed): with its
        executor manager gone, Flame's tasks would stay pending for ever."""
        folder = os.environ.get(FAILURE_DIR_ENV)
        for session in self.sessions if folder else ():
            report = Path(folder) / f"{session.id}.txt"
            if report.exists():
                said = report.read_text(errors="replace").strip()
                if not said:  # being written now, or its writing failed too (a full disk: an outsider's)
                    time.sleep(0.5)
                    said = report.read_text(errors="replace").strip() or (
                        f"its failure report {report} is empty: the worker could not write it (is the disk full?)")
                raise ParityError(f"a worker of session {session.id} failed: {said}")
        deaths = self.cluster.unexpected_deaths()
        if deaths:
            raise ParityError("; ".join(deaths))

    def executors(self) -> list[dict]:
        """The cluster's own executor records: which executor is bound to which session, on which node."""
        return [{"executor_id": e.metadata.id, "session_id": e.status.session_id, "node": e.spec.node}
                for e in self.connection.list_executors()]


def delete_session(connection, session_id: str) -> None:
    """Drop a closed session, and every task it ran, from Flame's session manager (v0.6.0's DeleteSession, which
    flamepy 0.6.0 does not wrap); closing alone keeps it in memory for ever without `limits.max_sessions`."""
    from flamepy.proto.frontend_pb2 import DeleteSessionRequest

    connection._frontend.DeleteSession(DeleteSessionRequest(session_id=session_id))


def verify_placement(results, session_ids: list[str], executors: list[dict]) -> None:
    """Every prompt was served by an executor the cluster lists as bound to the session it was sent to
    (`session_ids`, one per result)."""
    bound = {e["executor_id"]: e["session_id"] for e in executors}
    for result, session_id in zip(results, session_ids, strict=True):
        executor = result.worker.get("executor_id")
        if bound.get(executor) != session_id:
            raise ParityError(f"request {result.request_id} was served by executor {executor}, which the cluster "
                              f"lists under session {bound.get(executor)}, not {session_id}")
