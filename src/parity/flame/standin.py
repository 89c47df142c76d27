"""An in-process stand-in of Flame v0.6.0's session manager + executor manager.

This is a stand-in for CPU tests and the smoke workflow, not Flame: results produced through it are
labelled as such (trials say `cluster: "stand-in"`, its cleanup receipt says `simulated: true`).
It serves the Frontend gRPC API that unmodified flamepy 0.6.0 calls and drives real service
processes through the shim (`Instance`) API on Unix sockets, so the service code under test is the
code Flame would run.

Mimicked from v0.6.0 (see the Flame fact sheet): one task at a time per executor; tasks pop FIFO
to whichever executor asks first; WatchTask sends no Pending message (first Running, then the final
state); CloseSession is refused while a task runs; unbinding (on close, or after `delay_release`
idle seconds, default 60) calls OnSessionLeave and kills the process group, and every bind starts
a fresh process; gRPC's default 4 MiB receive limit on every hop (frontend and shim); the service
gets the application's environments plus FLAME_INSTANCE_ENDPOINT=<socket dir>/<executor id>.sock.

Differences from Flame:
* binding times out (`bind_timeout_s`, default 120 s) with the tail of the service's .err log;
  Flame's executor manager waits for the socket forever;
* no scheduler: a session gets max(min_instances, 1) executors at once and more, up to
  max_instances, as tasks queue; no resources, DRF, gang, priorities or GPU accounting; one node;
* a failed bind fails the session's pending tasks at once (Flame retries a bind up to 5 times);
* closing a session fails its pending tasks ("session closed"): flamepy 0.6.0 has no Cancelled;
* the service runs in the application's `working_directory` or this process's cwd (no
  per-executor directory, no TMPDIR); its logs go to `log_dir/<executor id>.{out,err}`;
* a service that dies fails its task with a line naming it (pid, session, GPU, how it ended, log), and, as
  in Flame (whose executor stays bound to the dead service), every later task of its session; but a new
  session then gets an executor, where Flame v0.6.0 gave none in our tests (parity.restart);
* re-registering an application replaces it, a closed session's id may be reused; nothing persists;
* DeleteSession closes an open session first (v0.6.0 drops it whatever its state).

Services are spawned through `parity.procs` (own session, die with this process, watchdog); the
frontend listens on 127.0.0.1 only. Without a `socket_dir` the stand-in makes a short one in /tmp
and removes it on exit.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from flamepy.proto import frontend_pb2_grpc, shim_pb2, shim_pb2_grpc, types_pb2 as pb

from parity import netns, procs
from parity.errors import ParityError
from parity.flame import cluster as real_cluster

PENDING, RUNNING, SUCCEED, FAILED = pb.Pending, pb.Running, pb.Succeed, pb.Failed
DEFAULT_DELAY_RELEASE_S = 60  # Flame's default
SOCKET_PATH_MAX = 100  # under the 108-byte sun_path limit, with room to spare
STOP_TIMEOUT_S = 5.0
_POLL_S = 0.05  # socket-file poll while a service starts (Flame polls too, without a deadline)


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Task:
    def __init__(self, task_id: str, session_id: str, data: bytes | None):
        self.id, self.session_id, self.input = task_id, session_id, data
        self.state, self.output, self.message = PENDING, None, None
        self.creation_time, self.completion_time = _now_ms(), None

    def finish(self, state: int, output: bytes | None = None, message: str | None = None) -> None:
        self.state, self.output, self.message, self.completion_time = state, output, message, _now_ms()

    def proto(self) -> pb.Task:
        """Input and output together, as Flame's replies carry them (both count toward 4 MiB)."""
        status = pb.TaskStatus(state=self.state, creation_time=self.creation_time, completion_time=self.completion_time)
        if self.state == FAILED:  # flamepy takes a failed future's message from this event
            status.events.append(pb.Event(code=FAILED, message=self.message or "", creation_time=self.completion_time))
        return pb.Task(metadata=pb.Metadata(id=self.id), status=status,
                       spec=pb.TaskSpec(session_id=self.session_id, input=self.input, output=self.output))


class _Session:
    def __init__(self, session_id: str, spec: pb.SessionSpec, app_spec: pb.ApplicationSpec):
        self.id, self.spec, self.app_spec = session_id, spec, app_spec
        self.open, self.creation_time, self.completion_time = True, _now_ms(), None
        self.tasks: dict[str, _Task] = {}
        self.queue: deque[_Task] = deque()
        self.executors: list[_Executor] = []  # bound or binding, not yet unbinding
        self.service_died: str | None = None  # how its bound service died: Flame v0.6.0 then serves it no more

    @property
    def cap(self) -> int:
        return self.spec.max_instances if self.spec.HasField("max_instances") and self.spec.max_instances else 1 << 30

    @property
    def delay_release(self) -> float:
        spec = self.app_spec
        return spec.delay_release if spec.HasField("delay_release") else DEFAULT_DELAY_RELEASE_S

    def proto(self) -> pb.Session:
        states = [t.state for t in self.tasks.values()]
        status = pb.SessionStatus(state=pb.Open if self.open else pb.Closed, creation_time=self.creation_time,
                                  completion_time=self.completion_time, pending=states.count(PENDING),
                                  running=states.count(RUNNING), succeed=states.count(SUCCEED),
                                  failed=states.count(FAILED))
        return pb.Session(metadata=pb.Metadata(id=self.id, name=self.id), spec=self.spec, status=status)


class _Executor:
    def __init__(self, session: _Session, socket_dir: Path):
        self.id = str(uuid.uuid4())  # Flame's executor ids are UUIDs too
        self.session, self.socket = session, socket_dir / f"{self.id}.sock"
        self.state, self.stop, self.task = pb.ExecutorBinding, False, None
        self.proc: subprocess.Popen | None = None
        self.bound = False  # its OnSessionEnter succeeded: from then on it serves the session
        self.stopping = False  # set when we end its process
        self.death: str | None = None  # the line saying how it died, when it was gone before we ended it
        self.channel: grpc.Channel | None = None
        self.thread: threading.Thread | None = None

    def proto(self, node: str) -> pb.Executor:
        spec = pb.ExecutorSpec(node=node, shim=pb.Host)
        if self.session.spec.HasField("resreq"):
            spec.resreq.CopyFrom(self.session.spec.resreq)
        return pb.Executor(metadata=pb.Metadata(id=self.id, name=self.id), spec=spec,
                           status=pb.ExecutorStatus(state=self.state, session_id=self.session.id))


class StandInCluster(procs.Supervisor, frontend_pb2_grpc.FrontendServicer):
    """The Frontend servicer plus the executors it runs; use as a context manager (`receipt` on exit)."""

    label = "stand-in"

    def __init__(self, *, log_dir: Path, socket_dir: Path | None = None, host: str = "127.0.0.1", port: int = 0,
                 bind_timeout_s: float = 120.0):
        self._own_socket_dir = socket_dir is None
        self.socket_dir = Path(socket_dir) if socket_dir is not None else None
        self.log_dir = Path(log_dir)
        self.host, self.port, self.bind_timeout_s = host, port, bind_timeout_s
        self.node = socket.gethostname()
        self.receipt: dict | None = None
        self._cond = threading.Condition()  # one lock guards everything below
        self._apps: dict[str, tuple[pb.ApplicationSpec, int]] = {}
        self._sessions: dict[str, _Session] = {}
        self._all_executors: list[_Executor] = []
        self._stopped: list[dict] = []  # receipt entries of every unbound service process
        self._errors: list[str] = []
        self._server: grpc.Server | None = None
        self._started = 0.0

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> dict:
        """What a trial records about the cluster it ran on."""
        return {"cluster": self.label, "binaries": None, "network": netns.record(self.label, self.port)}

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "StandInCluster":
        if self.socket_dir is not None:
            longest = len(str(self.socket_dir.absolute() / f"{uuid.uuid4()}.sock"))
            if longest >= SOCKET_PATH_MAX:
                raise ParityError(f"socket dir {self.socket_dir} is too long for Unix sockets ({longest} bytes "
                                  f">= {SOCKET_PATH_MAX}); use a short one such as /tmp/pf-XXXX")
        self._supervise()
        try:
            if self._own_socket_dir:
                self.socket_dir = procs.scratch_dir("pf-")  # sun_path is short; gone on exit, or by the watchdog
            self.socket_dir = self.socket_dir.absolute()
            self.socket_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            if self.port:
                procs.check_ports_free([self.port], self.host, "the Flame stand-in's frontend")
            # Default options on purpose: a 4 MiB receive limit, like Flame's.
            self._server = grpc.server(ThreadPoolExecutor(max_workers=64, thread_name_prefix="standin"))
            frontend_pb2_grpc.add_FrontendServicer_to_server(self, self._server)
            try:
                self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
            except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
                raise ParityError(f"the Flame stand-in cannot listen on {self.host}:{self.port}: {exc}") from None
            self._server.start()
        except BaseException as exc:
            self.close(exc)
            raise
        self._started = time.time()
        return self

    def _teardown(self, exc: BaseException | None) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()  # first, so no RPC can start an executor behind our back
        with self._cond:
            for session in self._sessions.values():
                self._close(session)
            executors = list(self._all_executors)
            busy = [ex for ex in executors if ex.proc is not None
                    and (ex.task is not None or ex.state == pb.ExecutorBinding)]
        for ex in busy:  # a running task or a slow OnSessionEnter is not waited for: kill, the call then fails
            self._stop_service(ex)
        for ex in executors:
            if ex.thread is not None:
                ex.thread.join(timeout=STOP_TIMEOUT_S * 3)
                if ex.thread.is_alive():
                    self._errors.append(f"executor {ex.id} did not stop")
        if self._own_socket_dir and self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        self.receipt = self._receipt(exc)

    def _stop_service(self, ex: _Executor) -> None:
        if ex.proc.poll() is not None and not ex.stopping and ex.bound and ex.death is None:
            ex.death = self._death(ex)
        ex.stopping = True
        entries = [procs.stop(ex.proc, f"service {ex.id}", STOP_TIMEOUT_S)]
        entries += procs.stop_session(ex.proc.pid, grace_s=STOP_TIMEOUT_S)  # e.g. vLLM's engine core
        with self._cond:
            self._stopped.extend(entries)

    def _exited(self, ex: _Executor, what: str, error: Exception) -> str | None:
        """The death line of a service that exited under a call (its socket closed), else None."""
        if ex.proc is None or ex.stop or (ex.proc.poll() is None and not isinstance(error, grpc.RpcError)):
            return None
        try:
            ex.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None
        ex.death = self._death(ex, what)
        return ex.death

    def _death(self, ex: _Executor, what: str = "died") -> str:
        """One line: this executor's service died by itself."""
        gpus = {r["pid"]: r.get("gpu") for r in real_cluster.dead_workers(self.endpoint, self._started)}
        gpu = gpus.get(ex.proc.pid) or next((e.value for e in ex.session.app_spec.environments
                                             if e.name == "PARITY_GPUS"), "?")
        return (f"Flame worker pid {ex.proc.pid} (session {ex.session.id}, executor {ex.id}, GPU {gpu}) {what}: "
                f"{procs.ended(ex.proc.returncode)} ({procs.last_line(self.log_dir / f'{ex.id}.err')}); "
                f"log: {self.log_dir / ex.id}.err")

    def deaths(self) -> list[str]:
        """One line for each service that exited by itself (not stopped by us) under a call or once bound."""
        with self._cond:
            executors = list(self._all_executors)
        return [ex.death or self._death(ex) for ex in executors if ex.death or
                (ex.bound and not ex.stopping and ex.proc.poll() is not None)]

    def _receipt(self, exc: BaseException | None) -> dict:
        errors = list(self._errors)
        for ex in self._all_executors:
            if ex.proc is not None and ex.proc.poll() is None:
                errors.append(f"service {ex.id} (pid {ex.proc.pid}) is still running")
        released = [self.port] if self.port and procs.released(self.port) else []
        if self.port and not released:
            errors.append(f"port {self.port} is still in use after shutdown")
        gpus = {env.value for ex in self._all_executors for env in ex.session.app_spec.environments
                if env.name == "CUDA_VISIBLE_DEVICES"}
        # Each process once: a killed-while-running service is recorded by __exit__, not again by unbind.
        processes = list({entry["pid"]: entry for entry in self._stopped}.values())
        return procs.receipt(f"flame stand-in {self.endpoint} (sockets {self.socket_dir}, logs {self.log_dir})",
                             processes=processes, ports_released=released, gpus_released=sorted(gpus),
                             errors=errors, simulated=True, ended_by=procs.termination.ended_by(exc))

    # ---- executors ---------------------------------------------------------------------------

    def _scale(self, session: _Session, *, at_least: int = 0) -> None:
        """Start executors up to the demand (pending + running), clamped to [min, max]. Lock held."""
        demand = len(session.queue) + sum(t.state == RUNNING for t in session.tasks.values())
        want = min(session.cap, max(session.spec.min_instances, at_least, demand))
        for _ in range(want - len(session.executors)):
            ex = _Executor(session, self.socket_dir)
            session.executors.append(ex)
            self._all_executors.append(ex)
            ex.thread = threading.Thread(target=self._run_executor, args=(ex,), name=f"executor-{ex.id[:8]}",
                                         daemon=True)
            ex.thread.start()

    def _bind(self, ex: _Executor) -> shim_pb2_grpc.InstanceStub:
        """Spawn the service in its own process group, wait for its socket, then OnSessionEnter."""
        spec = ex.session.app_spec
        env = {**os.environ, **{e.name: e.value for e in spec.environments},
               "FLAME_INSTANCE_ENDPOINT": str(ex.socket), "FLAME_ENDPOINT": self.endpoint}
        # Spawned from this executor's thread, which outlives the service (it stops it in _unbind).
        with open(self.log_dir / f"{ex.id}.out", "wb") as out, open(self.log_dir / f"{ex.id}.err", "wb") as err:
            ex.proc = procs.spawn([spec.command, *spec.arguments], env=env, stdout=out, stderr=err,
                                  cwd=spec.working_directory or None)
        deadline = time.monotonic() + self.bind_timeout_s
        while not ex.socket.exists():
            self._still_binding(ex, deadline, f"did not open {ex.socket}")
            time.sleep(_POLL_S)
        ex.channel = grpc.insecure_channel(f"unix://{ex.socket}")  # default 4 MiB receive limit, like Flame
        ready = grpc.channel_ready_future(ex.channel)
        while True:  # in slices: a service stopped (or dead) while its socket does not answer is not waited for
            try:
                ready.result(timeout=_POLL_S)
                break
            except grpc.FutureTimeoutError:
                self._still_binding(ex, deadline, f"did not answer on {ex.socket}")
        stub = shim_pb2_grpc.InstanceStub(ex.channel)
        app = shim_pb2.ApplicationContext(name=ex.session.spec.application, shim=spec.shim, command=spec.command,
                                          working_directory=spec.working_directory or None)
        common = ex.session.spec.common_data if ex.session.spec.HasField("common_data") else None
        result = stub.OnSessionEnter(shim_pb2.SessionContext(session_id=ex.session.id, application=app,
                                                             common_data=common))
        if result.return_code != 0:
            raise ParityError(f"OnSessionEnter failed ({result.return_code}): {result.message}")
        return stub

    def _still_binding(self, ex: _Executor, deadline: float, late: str) -> None:
        """Raise if the binding is over: its session closed, its service exited, or `deadline` passed (`late`
        says at what, with the bind timeout)."""
        if ex.stop:
            raise ParityError("session closed while binding")
        if ex.proc.poll() is not None or time.monotonic() > deadline:
            log = self.log_dir / f"{ex.id}.err"
            what = procs.ended(ex.proc.returncode) if ex.proc.poll() is not None else \
                f"{late} within {self.bind_timeout_s:.0f} s"
            raise ParityError(f"the service for executor {ex.id} (pid {ex.proc.pid}) failed to start: "
                              f"{what} ({procs.last_line(log)}); log: {log}")

    def _run_executor(self, ex: _Executor) -> None:
        """Bind, then a strictly serial loop of one task at a time, then unbind."""
        session = ex.session
        try:
            stub = self._bind(ex)
        except Exception as error:
            message = self._exited(ex, "died while binding", error) or (
                str(error) if isinstance(error, ParityError) else f"binding executor {ex.id}: {_one_line(error)}")
            with self._cond:
                while session.queue:  # Flame would retry the bind; the stand-in fails fast
                    session.queue.popleft().finish(FAILED, message=message)
                self._detach(ex)
            self._unbind(ex, None)
            return
        with self._cond:
            ex.state, ex.bound = pb.ExecutorBound, True
            self._cond.notify_all()
        while True:
            with self._cond:
                idle_until = time.monotonic() + session.delay_release
                while not session.queue and not ex.stop and time.monotonic() < idle_until:
                    self._cond.wait(idle_until - time.monotonic())
                if ex.stop or not session.queue:  # closed, or idle past delay_release
                    self._detach(ex)
                    break
                task = ex.task = session.queue.popleft()
                task.state = RUNNING
                self._cond.notify_all()
            try:
                result = stub.OnTaskInvoke(shim_pb2.TaskContext(task_id=task.id, session_id=session.id,
                                                                input=task.input))
                done = (SUCCEED, result.output if result.HasField("output") else None, None) \
                    if result.return_code == 0 else \
                    (FAILED, None, result.message or f"task failed with return_code {result.return_code}")
            except grpc.RpcError as error:  # e.g. "Received message larger than max (... vs. 4194304)"
                done = (FAILED, None, self._exited(ex, "died", error) or _one_line(error))
            with self._cond:
                task.finish(*done)
                ex.task = None
                if ex.proc.poll() is not None:  # the service died: as Flame v0.6.0, whose executor stays bound
                    session.service_died = done[2] or "its service died"  # to the dead service, every task of
                    while session.queue:  # the session fails from now on and no other executor comes for it
                        session.queue.popleft().finish(FAILED, message=session.service_died)
                    self._detach(ex)
                    break
                self._cond.notify_all()
        self._unbind(ex, stub)

    def _detach(self, ex: _Executor) -> None:
        """Take the executor off its session before it unbinds, so new tasks get a new one. Lock held."""
        ex.state = pb.ExecutorUnbinding
        if ex in ex.session.executors:
            ex.session.executors.remove(ex)
        if ex.session.open and ex.session.queue:
            self._scale(ex.session)
        self._cond.notify_all()

    def _unbind(self, ex: _Executor, stub) -> None:
        """OnSessionLeave, then kill the process group (Flame kills the service on every unbind)."""
        if stub is not None and ex.proc.poll() is None:
            try:
                stub.OnSessionLeave(pb.EmptyRequest(), timeout=STOP_TIMEOUT_S)
            except grpc.RpcError:
                pass  # the process is killed next anyway
        if ex.channel is not None:
            ex.channel.close()
        if ex.proc is not None:
            self._stop_service(ex)
        ex.socket.unlink(missing_ok=True)
        with self._cond:
            ex.state = pb.ExecutorReleased
            self._cond.notify_all()

    def _close(self, session: _Session) -> None:
        """Close, fail what never ran, tell the executors to unbind. Lock held."""
        session.open, session.completion_time = False, session.completion_time or _now_ms()
        while session.queue:
            session.queue.popleft().finish(FAILED, message="session closed before the task ran")
        for ex in session.executors:
            ex.stop = True
        self._cond.notify_all()

    # ---- Frontend RPCs -----------------------------------------------------------------------

    def _session(self, session_id: str, context) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"session {session_id} not found")
        return session

    def _task(self, request, context) -> _Task:
        task = self._session(request.session_id, context).tasks.get(request.task_id)
        if task is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"task {request.task_id} not found in {request.session_id}")
        return task

    def RegisterApplication(self, request, context):  # noqa: N802
        with self._cond:
            spec = pb.ApplicationSpec()
            spec.CopyFrom(request.application)
            self._apps[request.name] = (spec, _now_ms())
        return pb.Result(return_code=0)

    def UnregisterApplication(self, request, context):  # noqa: N802
        with self._cond:
            self._apps.pop(request.name, None)
        return pb.Result(return_code=0)

    def _app_proto(self, name: str) -> pb.Application:
        spec, created = self._apps[name]
        return pb.Application(metadata=pb.Metadata(id=name, name=name), spec=spec,
                              status=pb.ApplicationStatus(state=pb.Enabled, creation_time=created))

    def GetApplication(self, request, context):  # noqa: N802
        with self._cond:
            if request.name not in self._apps:
                context.abort(grpc.StatusCode.NOT_FOUND, f"application {request.name} not found")
            return self._app_proto(request.name)

    def ListApplication(self, request, context):  # noqa: N802
        with self._cond:
            return pb.ApplicationList(applications=[self._app_proto(name) for name in self._apps])

    def CreateSession(self, request, context):  # noqa: N802
        with self._cond:
            existing = self._sessions.get(request.session_id)
            if existing is not None and existing.open:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"session {request.session_id} already exists")
            if request.session.application not in self._apps:
                context.abort(grpc.StatusCode.NOT_FOUND, f"application {request.session.application} not found")
            spec, app_spec = pb.SessionSpec(), pb.ApplicationSpec()
            spec.CopyFrom(request.session)
            app_spec.CopyFrom(self._apps[request.session.application][0])
            session = _Session(request.session_id, spec, app_spec)
            self._sessions[session.id] = session
            self._scale(session, at_least=1)
            return session.proto()

    def OpenSession(self, request, context):  # noqa: N802
        with self._cond:
            session = self._sessions.get(request.session_id)
        if session is None and request.HasField("session"):
            return self.CreateSession(request, context)
        with self._cond:
            if session is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"session {request.session_id} not found")
            if not session.open:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"session {session.id} is closed")
            return session.proto()

    def GetSession(self, request, context):  # noqa: N802
        with self._cond:
            return self._session(request.session_id, context).proto()

    def ListSession(self, request, context):  # noqa: N802
        with self._cond:
            return pb.SessionList(sessions=[s.proto() for s in self._sessions.values()])

    def CloseSession(self, request, context):  # noqa: N802
        with self._cond:
            session = self._session(request.session_id, context)
            if any(t.state == RUNNING for t in session.tasks.values()):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"session {session.id} has running tasks; wait for them before closing")
            self._close(session)
            return session.proto()

    def DeleteSession(self, request, context):  # noqa: N802
        """As v0.6.0: the session and its tasks are dropped (an open one is closed first, here)."""
        with self._cond:
            session = self._session(request.session_id, context)
            if session.open:
                self._close(session)
            del self._sessions[session.id]
            return session.proto()

    def CreateTask(self, request, context):  # noqa: N802
        with self._cond:
            session = self._session(request.task.session_id, context)
            if not session.open:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"session {session.id} is closed")
            data = request.task.input if request.task.HasField("input") else None
            task = _Task(str(len(session.tasks) + 1), session.id, data)
            session.tasks[task.id] = task
            if session.service_died:  # Flame v0.6.0: its executor finds no service for it
                task.finish(FAILED, message=session.service_died)
                return task.proto()
            session.queue.append(task)
            self._scale(session)
            self._cond.notify_all()
            return task.proto()

    def GetTask(self, request, context):  # noqa: N802
        with self._cond:
            return self._task(request, context).proto()

    def ListTask(self, request, context):  # noqa: N802
        with self._cond:
            tasks = [t.proto() for t in self._session(request.session_id, context).tasks.values()]
        yield from tasks

    def WatchTask(self, request, context):  # noqa: N802
        """No Pending message: one at Running (if seen), one at the final state, then the stream ends."""
        with self._cond:
            task = self._task(request, context)
        sent = PENDING
        while context.is_active():
            with self._cond:
                # Wake up now and then to notice a client that went away.
                self._cond.wait_for(lambda: task.state != sent, timeout=1.0)
                state, message = task.state, task.proto()
            if state != sent:
                yield message
                sent = state
            if state in (SUCCEED, FAILED):
                return

    def ListExecutor(self, request, context):  # noqa: N802
        with self._cond:
            return pb.ExecutorList(executors=[ex.proto(self.node) for s in self._sessions.values()
                                              for ex in s.executors])


def _one_line(error: BaseException) -> str:
    """A gRPC error as 'CODE: details', anything else as its repr, on one line."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return f"{error.code().name}: {error.details()}"
    return " ".join(repr(error).split())
