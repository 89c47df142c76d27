"""Start and stop a real local Flame v0.6.0 cluster (session manager + executor manager) from binaries.

Why by hand and not through `flmadm`: the study needs a cluster it can start in a scratch directory,
pin per GPU, and tear down to a provably clean machine (a cleanup receipt), without installing
anything system-wide. Facts checked against the v0.6.0 source (`common/src/ctx.rs`, the two
`main.rs`, `executor_manager/src/shims/*`):

* both binaries take `--config <file>` and `--version` (clap: "flame-session-manager 0.6.0"; it
  also opens `$FLAME_HOME/logs/`); the fallback config path is baked in at compile time;
* the session manager serves the frontend on the endpoint's port and the backend on port + 1,
  both on 0.0.0.0 and unauthenticated, whatever the endpoint says (`parity.netns` contains that);
* logs go to `$FLAME_HOME/logs/{fsm,fem}-<hostname>.<date>` (and stdout);
* the socket directory comes only from env `FLAME_SOCKET_DIR` (no YAML key), and executor ids are
  36-character UUIDs, so the directory must stay short to fit the 108-byte Unix socket limit;
* an executor's auto working directory is `<EM cwd>/<executor id>`, with the service's
  `<executor id>.{out,err}` logs; the executor manager deletes it when the executor unbinds;
* services are spawned in their own process group (same session), as children of the executor
  manager, with its environment plus the application's.

Both binaries are spawned through `parity.procs`, so they and the services (which inherit the run's
mark) die with this process; their SHA-256 and `--version` are recorded, and anything but v0.6.0 is
refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from parity import gpu_lock, netns, procs
from parity.errors import ParityError
from parity.manifest import sha256_file

SESSION_MANAGER = "flame-session-manager"
EXECUTOR_MANAGER = "flame-executor-manager"
BINARIES = (SESSION_MANAGER, EXECUTOR_MANAGER)
VERSION = "0.6.0"
DEFAULT_POLICIES = ("priority", "drf", "gang")  # v0.6.0 allocates nothing without gang (PR #500)
UNIX_PATH_MAX = 108  # sun_path, including the trailing NUL
EXECUTOR_ID_LEN = 36  # a UUID
CONFIG_NAME = "flame-cluster.yaml"
STOP_TIMEOUT_S = 10.0
LABEL = f"flame-v{VERSION}"


# ---- config ------------------------------------------------------------------------------------

def socket_path_len(socket_dir: Path | str) -> int:
    """Bytes of the longest socket path the executor manager will create in `socket_dir`."""
    return len(os.fsencode(str(socket_dir))) + len(f"/{'x' * EXECUTOR_ID_LEN}.sock")


def check_socket_dir(socket_dir: Path | str) -> None:
    """Refuse a socket dir whose `<dir>/<uuid>.sock` would not fit in sun_path (bind would fail late)."""
    if not os.path.isabs(str(socket_dir)):
        raise ParityError(f"FLAME_SOCKET_DIR must be absolute, got {socket_dir!r}")
    length = socket_path_len(socket_dir)
    if length >= UNIX_PATH_MAX:
        raise ParityError(f"socket dir {socket_dir} is too long: executor sockets would be {length} bytes, "
                          f"the Unix limit is {UNIX_PATH_MAX - 1}; use a shorter directory")


def cluster_config(*, name: str = "parity", port: int, socket_dir: Path | str,
                   policies=DEFAULT_POLICIES, storage: str = "none",
                   schedule_interval_ms: int | None = None) -> dict:
    """The `flame-cluster.yaml` document for one loopback node.

    `socket_dir` is only checked here: v0.6.0 reads it from env FLAME_SOCKET_DIR, not the YAML.
    No `cache` section: the task API does not need the object cache, and without the section the
    executor manager passes no FLAME_CACHE_ENDPOINT to services.
    """
    if not 0 < port < 65535:
        raise ParityError(f"port must be in 1..65534 (the backend uses port + 1), got {port}")
    check_socket_dir(socket_dir)
    policies = list(policies)
    if "gang" not in policies:
        raise ParityError(f"policies {policies} lack 'gang': Flame v0.6.0 never allocates executors without it")
    cluster = {
        "name": name,
        "endpoint": f"http://127.0.0.1:{port}",
        "policies": policies,
        "storage": storage,
        "executors": {"shim": "host"},
    }
    if schedule_interval_ms is not None:
        cluster["schedule_interval"] = int(schedule_interval_ms)
    return {"cluster": cluster}


def write_cluster_config(path: Path | str, **kw) -> Path:
    """Write the YAML; a header comment records the socket dir, which must go in the environment."""
    path = Path(path)
    doc = cluster_config(**kw)
    text = (f"# Written by parity for Flame v0.6.0. Start both services with FLAME_SOCKET_DIR={kw['socket_dir']}\n"
            + yaml.safe_dump(doc, sort_keys=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---- binaries ----------------------------------------------------------------------------------

def find_binaries(bin_dir: Path | str | None = None) -> dict[str, Path]:
    """Both service binaries from `bin_dir`, else env FLAME_BIN_DIR; ParityError says what is missing."""
    named = "the Flame bin dir"
    if bin_dir is None:
        bin_dir, named = os.environ.get("FLAME_BIN_DIR"), "FLAME_BIN_DIR"
        if bin_dir is None:
            raise ParityError(f"no Flame binaries: give --flame-bin-dir (backend.flame_bin_dir) or set FLAME_BIN_DIR "
                              f"to a directory holding {' and '.join(BINARIES)} (or run on the CPU stand-in: "
                              f"--cluster standin)")
    if not str(bin_dir).strip():  # Path("") is the current folder, which the user did not name
        raise ParityError(f"{named} is empty: name the folder of the Flame v0.6.0 binaries")
    bin_dir = Path(bin_dir)
    if not bin_dir.is_dir():
        raise ParityError(f"Flame bin dir {bin_dir} does not exist or is not a directory")
    found, missing = {}, []
    for binary in BINARIES:
        path = bin_dir / binary
        if path.is_file() and os.access(path, os.X_OK):
            found[binary] = path.resolve()
        else:
            missing.append(binary + ("" if not path.exists() else " (not an executable file)"))
    if missing:
        raise ParityError(f"Flame bin dir {bin_dir} lacks {', '.join(missing)}")
    return found


def check_version(binary: str, path: Path, flame_home: Path) -> dict:
    """{path, sha256, version} of a binary that says it is v0.6.0; anything else is refused in one line."""
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "FLAME_HOME": str(flame_home)}, cwd=flame_home,
                              stdin=subprocess.DEVNULL)
        said = (done.stdout.strip().splitlines() or [""])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ParityError(f"{path}: `--version` failed ({exc}); parity needs Flame {VERSION}") from None
    if done.returncode != 0 or said != f"{binary} {VERSION}":
        got = said or (done.stderr.strip().splitlines() or ["nothing"])[-1]
        raise ParityError(f"{path} is not Flame v{VERSION}: `--version` says {got!r} (exit {done.returncode}), "
                          f"parity needs {binary} {VERSION}")
    return {"path": str(path), "sha256": sha256_file(path), "version": said}


# ---- processes ---------------------------------------------------------------------------------

def processes_using_socket_dir(socket_dir: Path | str) -> list[int]:
    """Services launched for this cluster, found by FLAME_INSTANCE_ENDPOINT even after the EM is gone."""
    prefix = str(socket_dir).rstrip("/") + "/"
    return [pid for pid in procs.proc_table()
            if pid != os.getpid() and procs.environ(pid).get("FLAME_INSTANCE_ENDPOINT", "").startswith(prefix)]


def dead_workers(endpoint: str, since: float) -> list[dict]:
    """Lock records of the workers of the cluster at `endpoint` (started at `since`) that died holding a
    GPU, for naming them; none when the lock folder cannot be used (a death is then named without them)."""
    try:
        return gpu_lock.dead_holders(gpu_lock.lock_dir(), endpoint, since)
    except ParityError:
        return []


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the cluster -------------------------------------------------------------------------------

class FlameCluster(procs.Supervisor):
    """A context manager around one session manager and one executor manager on loopback.

    Everything lives in `work_dir`: the config, `logs/` (FLAME_HOME=work_dir), and `executors/`
    (the EM's cwd, so executors' auto working directories land there). `receipt` is set on exit.
    """

    def __init__(self, bin_dir: Path | str | None, work_dir: Path | str, *, port: int = 0,
                 startup_timeout_s: float = 60, env: dict[str, str] | None = None, log=_log):
        self.binaries = find_binaries(bin_dir)
        self.work_dir = Path(work_dir).resolve()
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(env or {})
        self.log = log
        self.log_dir = self.work_dir / "logs"
        self.socket_dir: Path | None = None
        self.versions: dict[str, dict] = {}
        self._own_socket_dir = False
        self._procs: dict[str, subprocess.Popen] = {}
        self._conn = None
        self._gpus: list[str] = []
        self._started = 0.0
        self.applications: list[str] = []
        self.receipt: dict | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict:
        """What a trial records about the cluster it ran on."""
        return {"cluster": LABEL, "binaries": self.versions, "network": netns.record(LABEL, self.port)}

    # -- start --

    def _choose_socket_dir(self) -> Path:
        """`work_dir/sockets` when short enough, else a fresh short directory in /tmp removed on exit."""
        preferred = self.work_dir / "sockets"
        if socket_path_len(preferred) < UNIX_PATH_MAX:
            preferred.mkdir(parents=True, exist_ok=True)
            return preferred
        self._own_socket_dir = True
        return procs.scratch_dir("flm-")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.update(self.extra_env)
        env["FLAME_HOME"] = str(self.work_dir)
        env["FLAME_SOCKET_DIR"] = str(self.socket_dir)
        return env

    def _spawn(self, binary: str, cwd: Path) -> subprocess.Popen:
        with open(self._log_of(binary), "ab") as out:
            proc = procs.spawn([self.binaries[binary], "--config", self.config_path], stdout=out,
                               env=self._env(), cwd=cwd)
        self._procs[binary] = proc
        return proc

    def _log_of(self, binary: str) -> Path:
        return self.log_dir / ("fsm.out" if binary == SESSION_MANAGER else "fem.out")

    def _fail(self, binary: str, what: str) -> ParityError:
        log = self._log_of(binary)
        proc = self._procs[binary]
        exited = binary == SESSION_MANAGER and proc.poll() is not None
        taken = [port for port in (self.port, self.port + 1) if not procs.port_free(port, "0.0.0.0")] if exited else []
        said = procs.last_line(log)
        if taken:
            what = f"could not bind port {taken[0]}: {procs.port_user(taken[0])} took it after it was picked"
            said = procs.last_line(log, about=("address", "in use", "bind"))  # its log's line on it, if any
        quoted = f" ({said})" if said else ""
        return ParityError(f"Flame cluster at {self.endpoint}: {binary} (pid {proc.pid}) {what}{quoted}; log: {log}")

    def _wait_frontend(self, deadline: float) -> None:
        import grpc

        proc = self._procs[SESSION_MANAGER]
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        try:
            while True:
                if proc.poll() is not None:
                    raise self._fail(SESSION_MANAGER, f"exited during startup ({procs.ended(proc.returncode)})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(SESSION_MANAGER, f"frontend not ready after {self.startup_timeout_s}s")
                try:
                    grpc.channel_ready_future(channel).result(timeout=min(0.5, left))
                    return
                except grpc.FutureTimeoutError:
                    continue
        finally:
            channel.close()

    def _wait_node(self, deadline: float) -> None:
        """The executor manager is useful only once it has registered its node with the backend."""
        proc = self._procs[EXECUTOR_MANAGER]
        while True:
            if proc.poll() is not None:
                raise self._fail(EXECUTOR_MANAGER, f"exited during startup ({procs.ended(proc.returncode)})")
            try:
                if self.connection.list_nodes():
                    return
                problem = "registered no node"
            except Exception as exc:  # flamepy.FlameError or grpc errors while the SM settles
                problem = f"could not list nodes ({exc})"
            if time.monotonic() > deadline:
                raise self._fail(EXECUTOR_MANAGER, f"{problem} after {self.startup_timeout_s}s")
            time.sleep(0.2)

    def start(self) -> "FlameCluster":
        deadline = time.monotonic() + self.startup_timeout_s
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "executors").mkdir(exist_ok=True)
        self.versions = {name: check_version(name, path, self.work_dir) for name, path in self.binaries.items()}
        self.log(f"starting Flame v{VERSION} ...")
        if self.port == 0:
            self.port = procs.free_port_pair("0.0.0.0")
        else:
            procs.check_ports_free([self.port, self.port + 1], "0.0.0.0",
                                   f"Flame's session manager (frontend {self.port}, backend {self.port + 1})")
        self.socket_dir = self._choose_socket_dir()
        self.config_path = write_cluster_config(self.work_dir / CONFIG_NAME, port=self.port,
                                                socket_dir=self.socket_dir)
        self.log(f"Flame v{VERSION}'s session manager listens on 0.0.0.0:{self.port} and 0.0.0.0:{self.port + 1} "
                 f"(unauthenticated gRPC) whatever the endpoint says; containment: {netns.containment()}")
        self._supervise()
        try:
            self._spawn(SESSION_MANAGER, self.work_dir)
            self._wait_frontend(deadline)
            self._spawn(EXECUTOR_MANAGER, self.work_dir / "executors")
            self._wait_node(deadline)
        except BaseException as exc:
            self.close(exc)
            raise
        self._started = time.time()
        return self

    def __enter__(self) -> "FlameCluster":
        return self.start()

    # -- use --

    @property
    def connection(self):
        """One flamepy connection to this cluster, opened on first use and closed on stop."""
        if self._conn is None:
            import flamepy

            self._conn = flamepy.connect(self.endpoint)
        return self._conn

    def register_gpu_applications(self, name_prefix: str, command: str, arguments, gpu_uuids,
                                  environments: dict[str, str] | None = None, delay_release: int = 86400,
                                  working_directory: str | None = None) -> list[str]:
        """One application per GPU, pinned by CUDA_VISIBLE_DEVICES: Flame counts GPUs but never assigns them.

        A large `delay_release` keeps the service (and its loaded model) across idle gaps.
        """
        from flamepy import ApplicationAttributes

        names = []
        for index, uuid in enumerate(gpu_uuids):
            name = f"{name_prefix}-{index}"
            envs = {**(environments or {}), "CUDA_VISIBLE_DEVICES": uuid}
            attrs = ApplicationAttributes(command=command, arguments=list(arguments), environments=envs,
                                          delay_release=delay_release, working_directory=working_directory)
            self.connection.register_application(name, attrs)
            names.append(name)
            self._gpus.append(uuid)
        self.applications.extend(names)
        return names

    def executors(self) -> list[dict]:
        """The executors the session manager knows, flattened: id, node, bound session, state name."""
        from flamepy.proto.types_pb2 import ExecutorState

        return [{"id": e.metadata.id, "node": e.spec.node, "session_id": e.status.session_id or None,
                 "state": ExecutorState.Name(e.status.state)}
                for e in self.connection.list_executors()]

    def pid(self, binary: str) -> int:
        """The process id of one of the two services (SESSION_MANAGER or EXECUTOR_MANAGER), once started."""
        if binary not in self._procs:
            raise ParityError(f"{binary} is not running in the Flame cluster at {self.endpoint}")
        return self._procs[binary].pid

    # -- faults --

    def deaths(self) -> list[str]:
        """One line for each process of the cluster that died by itself: the two services, and workers
        that died holding a GPU (their lock records say which); their logs are kept in `logs/`."""
        lines = []
        for binary, proc in self._procs.items():
            if proc.poll() is not None:
                lines.append(f"{binary} (pid {proc.pid}) died during the run: {procs.ended(proc.returncode)}; "
                             f"log: {self._log_of(binary)}")
        for record in dead_workers(self.endpoint, self._started):
            executor = record.get("executor_id") or "?"
            kept = self.log_dir / f"worker-{executor}.err"
            for suffix in ("err", "out"):  # the EM deletes the executor's folder when it unbinds
                with_logs = self.work_dir / "executors" / executor / f"{executor}.{suffix}"
                if with_logs.exists():
                    shutil.copyfile(with_logs, self.log_dir / f"worker-{executor}.{suffix}")
            lines.append(f"Flame worker pid {record.get('pid')} (session {record.get('session_id')}, executor "
                         f"{executor}, GPU {record.get('gpu')}) died during the run (its exit status went to "
                         f"{EXECUTOR_MANAGER}, its parent); "
                         + (f"log: {kept}" if kept.exists() else f"no log kept ({EXECUTOR_MANAGER} had deleted it)"))
        return lines

    # -- stop --

    def _teardown(self, exc: BaseException | None) -> dict:
        """Stop EM then SM, then any service left behind; returns the cleanup receipt."""
        errors: list[str] = []
        processes: list[dict] = []
        table = procs.proc_table()
        leftovers: dict[int, tuple[int, str]] = {}
        em = self._procs.get(EXECUTOR_MANAGER)
        if em is not None:  # services, in process groups of their own but in the EM's session
            for pid in procs.session_members(em.pid) + procs.descendants(em.pid, table):
                if pid != em.pid and pid in table:
                    leftovers[pid] = table[pid][1:]
        for binary in (EXECUTOR_MANAGER, SESSION_MANAGER):
            proc = self._procs.get(binary)
            if proc is not None:
                processes.append(procs.stop(proc, binary, STOP_TIMEOUT_S))
                if proc.poll() is None:
                    errors.append(f"{binary} (pid {proc.pid}) survived SIGKILL")
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception as error:  # the server is gone; a failed close must not hide the receipt
                errors.append(f"closing the flamepy connection: {error}")
            self._conn = None
        if self.socket_dir is not None:  # orphans whose EM died before we could see them as children
            table = procs.proc_table()
            for pid in processes_using_socket_dir(self.socket_dir):
                if pid in table:
                    leftovers.setdefault(pid, table[pid][1:])
        stopped = procs.stop_foreign(leftovers)
        processes.extend(stopped)
        for entry in stopped:
            if procs.alive(entry["pid"], leftovers[entry["pid"]][0]):
                errors.append(f"service {entry['name']} (pid {entry['pid']}) survived SIGKILL")
        ports = [self.port, self.port + 1] if self.port else []
        released = [port for port in ports if procs.released(port)]
        errors.extend(f"port {port} is still in use after shutdown" for port in ports if port not in released)
        if self._own_socket_dir and self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        self.receipt = procs.receipt(f"flame cluster {self.endpoint} ({self.work_dir})", processes=processes,
                                     ports_released=released, gpus_released=list(self._gpus), errors=errors,
                                     simulated=False, ended_by=procs.termination.ended_by(exc))
        self._procs.clear()
        return self.receipt

