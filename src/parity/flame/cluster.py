"""Start and stop a real local Flame v0.6.0 cluster (session manager + executor manager) from binaries.

Why by hand and not through `flmadm`: the study needs a cluster it can start in a scratch directory,
pin per GPU, and tear down to a provably clean machine (a cleanup receipt), without installing
anything system-wide. Facts checked against the v0.6.0 source (`common/src/ctx.rs`, the two
`main.rs`, `executor_manager/src/shims/*`):

* both binaries take only `--config <file>`; the fallback path is baked in at compile time;
* the session manager serves the frontend on the endpoint's port and the backend on port + 1,
  both on 0.0.0.0;
* logs go to `$FLAME_HOME/logs/{fsm,fem}-<hostname>.<date>` (and stdout);
* the socket directory comes only from env `FLAME_SOCKET_DIR` (no YAML key), and executor ids are
  36-character UUIDs, so the directory must stay short to fit the 108-byte Unix socket limit;
* an executor's auto working directory is `<EM cwd>/<executor id>`;
* services are spawned in their own process group, as children of the executor manager.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from parity.errors import ParityError
from parity.manifest import header

SESSION_MANAGER = "flame-session-manager"
EXECUTOR_MANAGER = "flame-executor-manager"
BINARIES = (SESSION_MANAGER, EXECUTOR_MANAGER)
DEFAULT_POLICIES = ("priority", "drf", "gang")  # v0.6.0 allocates nothing without gang (PR #500)
UNIX_PATH_MAX = 108  # sun_path, including the trailing NUL
EXECUTOR_ID_LEN = 36  # a UUID
CONFIG_NAME = "flame-cluster.yaml"
STOP_TIMEOUT_S = 10.0
_LOG_TAIL_LINES = 30


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


# ---- binaries and ports ------------------------------------------------------------------------

def find_binaries(bin_dir: Path | str | None = None) -> dict[str, Path]:
    """Both service binaries from `bin_dir`, else env FLAME_BIN_DIR; ParityError says what is missing."""
    if bin_dir is None:
        bin_dir = os.environ.get("FLAME_BIN_DIR")
        if not bin_dir:
            raise ParityError(f"no Flame binaries: pass bin_dir or set FLAME_BIN_DIR to a directory holding "
                              f"{' and '.join(BINARIES)}")
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


def _port_free(port: int) -> bool:
    """Whether a listener could bind `port` on all interfaces, as the session manager does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # tokio sets it too: TIME_WAIT is fine
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_port_pair(attempts: int = 50) -> int:
    """A free port p with p + 1 also free (frontend and backend); racy by nature, so checked just before use."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("0.0.0.0", 0))
            port = sock.getsockname()[1]
        if port < 65535 and _port_free(port) and _port_free(port + 1):
            return port
    raise ParityError(f"no free pair of adjacent TCP ports found in {attempts} attempts")


# ---- processes ---------------------------------------------------------------------------------

def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, start time, name) from /proc/<pid>/stat; the start time guards against pid reuse."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is the state, the 3rd field of stat
        table[int(entry)] = (int(fields[1]), int(fields[19]), name)
    return table


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """Every process below `pid`, by walking ppid links in /proc."""
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def processes_using_socket_dir(socket_dir: Path | str) -> list[int]:
    """Services launched for this cluster, found by FLAME_INSTANCE_ENDPOINT even after the EM is gone."""
    prefix = str(socket_dir).rstrip("/") + "/"
    return [pid for pid in _proc_table()
            if pid != os.getpid() and _env_of(pid).get("FLAME_INSTANCE_ENDPOINT", "").startswith(prefix)]


def _alive(pid: int, start_time: int) -> bool:
    """Alive and still the same process (not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[19]) == start_time


def _signal_name(signum: int | None) -> str | None:
    return None if signum is None else signal.Signals(signum).name


def _signal_group_or_pid(pid: int, signum: int) -> None:
    """Signal the process group a service leads (the EM makes one per service), else the process."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_foreign(pids_with_start: dict[int, tuple[int, str]], timeout_s: float = STOP_TIMEOUT_S) -> list[dict]:
    """SIGTERM, wait, SIGKILL for processes that are not our children; one receipt entry each."""
    entries = {pid: {"pid": pid, "name": name, "exit_code": None, "signal": None}
               for pid, (_, name) in pids_with_start.items()}
    for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        alive = [pid for pid, (start, _) in pids_with_start.items() if _alive(pid, start)]
        if not alive:
            break
        for pid in alive:
            _signal_group_or_pid(pid, signum)
            entries[pid]["signal"] = _signal_name(signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_alive(p, pids_with_start[p][0]) for p in alive):
            time.sleep(0.05)
    return list(entries.values())


def stop_child(proc: subprocess.Popen, name: str, timeout_s: float = STOP_TIMEOUT_S) -> dict:
    """SIGTERM our child's process group, wait, then SIGKILL; the receipt entry says how it ended."""
    if proc.poll() is None:
        for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    code = proc.poll()
    return {"pid": proc.pid, "name": name,
            "exit_code": code if code is not None and code >= 0 else None,
            "signal": _signal_name(-code) if code is not None and code < 0 else None}


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path}: no log)"
    return "\n".join(text.splitlines()[-lines:]) or f"({path}: empty)"


# ---- the cluster -------------------------------------------------------------------------------

class FlameCluster:
    """A context manager around one session manager and one executor manager on loopback.

    Everything lives in `work_dir`: the config, `logs/` (FLAME_HOME=work_dir), and `executors/`
    (the EM's cwd, so executors' auto working directories land there). `receipt` is set on exit.
    """

    def __init__(self, bin_dir: Path | str | None, work_dir: Path | str, *, port: int = 0,
                 startup_timeout_s: float = 60, env: dict[str, str] | None = None):
        self.binaries = find_binaries(bin_dir)
        self.work_dir = Path(work_dir).resolve()
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(env or {})
        self.log_dir = self.work_dir / "logs"
        self.socket_dir: Path | None = None
        self._own_socket_dir = False
        self._procs: dict[str, subprocess.Popen] = {}
        self._conn = None
        self._gpus: list[str] = []
        self.applications: list[str] = []
        self.receipt: dict | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- start --

    def _choose_socket_dir(self) -> Path:
        """`work_dir/sockets` when short enough, else a fresh short directory in /tmp removed on exit."""
        preferred = self.work_dir / "sockets"
        if socket_path_len(preferred) < UNIX_PATH_MAX:
            preferred.mkdir(parents=True, exist_ok=True)
            return preferred
        self._own_socket_dir = True
        return Path(tempfile.mkdtemp(prefix="flm-", dir="/tmp"))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.update(self.extra_env)
        env["FLAME_HOME"] = str(self.work_dir)
        env["FLAME_SOCKET_DIR"] = str(self.socket_dir)
        return env

    def _spawn(self, binary: str, short: str, cwd: Path) -> subprocess.Popen:
        """Own process group (start_new_session) so one killpg stops it and anything left in its group."""
        out = open(self.log_dir / f"{short}.out", "ab")
        try:
            proc = subprocess.Popen([str(self.binaries[binary]), "--config", str(self.config_path)],
                                    cwd=cwd, env=self._env(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        self._procs[binary] = proc
        return proc

    def _fail(self, what: str) -> ParityError:
        tails = "\n".join(f"--- {p.name} (last {_LOG_TAIL_LINES} lines)\n{log_tail(p)}"
                          for p in sorted(self.log_dir.glob("*.out")))
        return ParityError(f"Flame cluster at {self.endpoint}: {what}; logs in {self.log_dir}\n{tails}")

    def _wait_frontend(self, deadline: float) -> None:
        import grpc

        proc = self._procs[SESSION_MANAGER]
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        try:
            while True:
                if proc.poll() is not None:
                    raise self._fail(f"{SESSION_MANAGER} exited with code {proc.returncode} during startup")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"frontend not ready after {self.startup_timeout_s}s")
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
                raise self._fail(f"{EXECUTOR_MANAGER} exited with code {proc.returncode} during startup")
            try:
                if self.connection.list_nodes():
                    return
                problem = "registered no node"
            except Exception as exc:  # flamepy.FlameError or grpc errors while the SM settles
                problem = f"could not list nodes ({exc})"
            if time.monotonic() > deadline:
                raise self._fail(f"{EXECUTOR_MANAGER} {problem} after {self.startup_timeout_s}s")
            time.sleep(0.2)

    def start(self) -> "FlameCluster":
        deadline = time.monotonic() + self.startup_timeout_s
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "executors").mkdir(exist_ok=True)
        if self.port == 0:
            self.port = pick_port_pair()
        elif not (_port_free(self.port) and _port_free(self.port + 1)):
            raise ParityError(f"port {self.port} or {self.port + 1} is in use; Flame needs both")
        self.socket_dir = self._choose_socket_dir()
        self.config_path = write_cluster_config(self.work_dir / CONFIG_NAME, port=self.port,
                                                socket_dir=self.socket_dir)
        try:
            self._spawn(SESSION_MANAGER, "fsm", self.work_dir)
            self._wait_frontend(deadline)
            self._spawn(EXECUTOR_MANAGER, "fem", self.work_dir / "executors")
            self._wait_node(deadline)
        except BaseException:
            self.stop()
            raise
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

    # -- stop --

    def stop(self) -> dict:
        """Stop EM then SM, then any service left behind; build the cleanup receipt."""
        errors: list[str] = []
        processes: list[dict] = []
        table = _proc_table()
        leftovers: dict[int, tuple[int, str]] = {}
        em = self._procs.get(EXECUTOR_MANAGER)
        if em is not None and em.poll() is None:  # snapshot services while they are still the EM's children
            for pid in descendants(em.pid, table):
                leftovers[pid] = (table[pid][1], table[pid][2])
        for binary in (EXECUTOR_MANAGER, SESSION_MANAGER):
            proc = self._procs.get(binary)
            if proc is not None:
                processes.append(stop_child(proc, binary))
                if proc.poll() is None:
                    errors.append(f"{binary} (pid {proc.pid}) survived SIGKILL")
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception as exc:  # the server is gone; a failed close must not hide the receipt
                errors.append(f"closing the flamepy connection: {exc}")
            self._conn = None
        if self.socket_dir is not None:  # orphans whose EM died before we could see them as children
            table = _proc_table()
            for pid in processes_using_socket_dir(self.socket_dir):
                if pid in table:
                    leftovers.setdefault(pid, (table[pid][1], table[pid][2]))
        stopped = stop_foreign(leftovers)
        processes.extend(stopped)
        for entry in stopped:
            if _alive(entry["pid"], leftovers[entry["pid"]][0]):
                errors.append(f"service {entry['name']} (pid {entry['pid']}) survived SIGKILL")
        ports = [self.port, self.port + 1] if self.port else []
        released = [port for port in ports if _port_free(port)]
        errors.extend(f"port {port} is still in use after shutdown" for port in ports if port not in released)
        if self._own_socket_dir and self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        self.receipt = {
            **header("cleanup-receipt", simulated=False),
            "what": f"flame cluster {self.endpoint} ({self.work_dir})",
            "processes": processes,
            "ports_released": released,
            "gpus_released": list(self._gpus),
            "clean": not errors,
            "errors": errors,
        }
        self._procs.clear()
        return self.receipt

    def __exit__(self, *exc) -> None:
        self.stop()
