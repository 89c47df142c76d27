"""Child processes that cannot outlive the run: ports, spawning, the process tree, teardown, receipts.

One home for what the replica set, the real Flame cluster and its stand-in all need, since each
starts children that hold ports and GPUs and each must leave the machine clean however the run ends:

* `spawn` starts a child as the leader of its own session (one killpg stops it and what it forks in
  its group) with PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it if the *thread* that spawned it
  dies, even by SIGKILL. Spawn from a thread that outlives the child. The signal survives the exec
  and is not inherited by the child's own children.
* Grandchildren escape both: Flame's executor manager puts every service in its own process group,
  and vLLM's engine core is a child of `vllm serve` or of the Flame worker. So every process a run
  starts carries the run in its environment ($PARITY_TREE lists "pid.starttime" of each spawning
  process), and a watchdog in its own session waits for the spawner to die, by any signal, then
  stops every process still carrying its mark (SIGTERM, wait, SIGKILL).
* `Termination` turns SIGTERM and SIGHUP into `Terminated` (a SystemExit, status 128 + signal)
  while a cluster or replica set is up, so their context managers tear down and the callers write
  the cleanup receipts; teardown itself runs `shielded`, so a signal then waits for it to finish,
  and a second signal exits at once. An event loop in the main thread runs through `run`: a signal
  (Ctrl-C too) then cancels its task, and is raised once the loop is back, never inside the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from parity.errors import ParityError

TREE_ENV = "PARITY_TREE"  # space-separated "pid.starttime" of every spawning process above
STOP_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0
_POLL_S = 0.05


# ---- ports -------------------------------------------------------------------------------------

ISSUED_FOR_S = 120.0  # a port this process handed out is not handed out again for this long
_issued: dict[int, float] = {}  # port -> when free_port handed it out (time.monotonic)
_issued_lock = threading.Lock()


def free_port(host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port nothing listens on now, and none this process handed out in the last ISSUED_FOR_S: a replica that
    has its number but has not bound it yet leaves it free, and under load the kernel gave the same number to the
    next replica of the set (2026-12-05: "could not bind its port: pid ... took it after it was picked"). Still
    racy against other processes, so a child that then fails to bind is told apart."""
    with _issued_lock:
        now = time.monotonic()
        for port, at in list(_issued.items()):
            if now - at > ISSUED_FOR_S:
                del _issued[port]
        for _ in range(attempts):
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _issued:
                _issued[port] = now
                return port
    raise ParityError(f"no free TCP port found in {attempts} attempts that this process had not just handed out")


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on `host:port` (connections left in TIME_WAIT do not count, as for the servers)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def released(port: int) -> bool:
    """Nothing listens on `port` any more: what a cleanup receipt asks of a server it stopped. Not `port_free`,
    which a bind answers: another process's connection may take the same number as its own local port once
    we let it go (two suites on one machine did so), and that is no server of ours left behind."""
    return not listeners(port)


def free_port_pair(host: str = "0.0.0.0", attempts: int = 50) -> int:
    """A free port p with p + 1 also free (Flame's frontend and backend), neither handed out by this process in the
    last ISSUED_FOR_S (free_port's rule, for p + 1 too: a replica's unbound port is free to the kernel)."""
    for _ in range(attempts):
        port = free_port(host)
        with _issued_lock:
            if port < 65535 and port + 1 not in _issued and port_free(port, host) and port_free(port + 1, host):
                _issued[port + 1] = time.monotonic()
                return port
    raise ParityError(f"no free pair of adjacent TCP ports found in {attempts} attempts")


def listeners(port: int) -> list[tuple[str, int | None]]:
    """(address, pid or None) of every TCP socket listening on `port` in this network namespace."""
    inodes: dict[str, str] = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, local_port = fields[1].split(":")
            if fields[3] == "0A" and int(local_port, 16) == port:  # 0A: LISTEN
                inodes[fields[9]] = _address(address, width)
    owners: dict[str, int] = {}
    if inodes:
        for pid in _pids():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if link.startswith("socket:[") and link[8:-1] in inodes:
                            owners.setdefault(link[8:-1], pid)
    return [(address, owners.get(inode)) for inode, address in inodes.items()]


def _address(hex_address: str, width: int) -> str:
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, bytes.fromhex(hex_address)[::-1])
    raw = bytes.fromhex(hex_address)
    address = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return address.removeprefix("::ffff:") if address.startswith("::ffff:") and "." in address else address


def port_user(port: int) -> str:
    """Who listens on `port`, for an error message: 'pid 12 (python3) on 0.0.0.0', or 'another process'."""
    found = listeners(port)
    if not found:
        return "another process"
    return ", ".join(f"{describe(pid)} on {address}" if pid else f"a process on {address}"
                     for address, pid in found)


def check_ports_free(ports: list[int], host: str, needed_by: str) -> None:
    """One-line error naming the holder when a port that `needed_by` must bind is taken."""
    for port in ports:
        if not port_free(port, host):
            raise ParityError(f"port {port} on {host} is in use by {port_user(port)}; {needed_by} needs it")


# ---- /proc -------------------------------------------------------------------------------------

def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """(name, fields from the state on) of /proc/<pid>/stat; fields[0] is the state, [1] the ppid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1: text.rindex(")")], text[text.rindex(")") + 2:].split()


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, start time, name) of every live process; the start time guards against pid reuse."""
    table = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat and stat[1][0] != "Z":  # zombies hold nothing
            table[pid] = (int(stat[1][1]), int(stat[1][19]), stat[0])
    return table


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return int(stat[1][19]) if stat else None


def alive(pid: int, started: int | None = None) -> bool:
    """Running (not a zombie) and, when `started` is given, still the same process (not a reused pid)."""
    stat = _stat(pid)
    return bool(stat) and stat[1][0] != "Z" and (started is None or int(stat[1][19]) == started)


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """Every process below `pid`, by walking ppid links."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def session_members(sid: int) -> list[int]:
    """Live processes in session `sid`: what a child we started as session leader left behind, also
    in process groups of their own (Flame's services) and after the leader is gone."""
    members = []
    for pid in _pids():
        stat = _stat(pid)
        if stat and stat[1][0] != "Z" and int(stat[1][3]) == sid:
            members.append(pid)
    return members


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with (readable for our own processes only)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def rss_kib(pid: int) -> int | None:
    """A process's resident memory now (VmRSS of /proc/<pid>/status, KiB); None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS


def cpu_s(pid: int) -> float | None:
    """CPU seconds a process has used so far, user and system, all its threads (utime + stime of
    /proc/<pid>/stat); None once it is gone."""
    stat = _stat(pid)
    if stat is None:
        return None
    return (int(stat[1][11]) + int(stat[1][12])) / os.sysconf("SC_CLK_TCK")


def describe(pid: int) -> str:
    """'pid 12 (python -m parity flame worker)' for messages; the command line cut to 80 characters."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        cmdline = " ".join(raw.replace("\0", " ").split())
    except OSError:
        cmdline = ""
    if not cmdline:
        stat = _stat(pid)
        cmdline = stat[0] if stat else "gone"
    return f"pid {pid} ({cmdline[:80]}{'...' if len(cmdline) > 80 else ''})"


# ---- the run's tree and its watchdog -----------------------------------------------------------

def mark(pid: int | None = None) -> str | None:
    """'pid.starttime', this process's entry in $PARITY_TREE."""
    pid = os.getpid() if pid is None else pid
    started = start_time(pid)
    return None if started is None else f"{pid}.{started}"


def tree_alive(tree: str) -> bool:
    """Whether every spawner a $PARITY_TREE value lists is still running (else its holder is a leftover)."""
    for entry in tree.split():
        pid, _, started = entry.partition(".")
        if not alive(int(pid), int(started)):
            return False
    return True


def marked(entry: str) -> dict[int, tuple[int, str]]:
    """pid -> (start time, name) of every live process whose environment carries `entry`."""
    table, found = proc_table(), {}
    for pid, (_, started, name) in table.items():
        if pid != os.getpid() and entry in environ(pid).get(TREE_ENV, "").split():
            found[pid] = (started, name)
    return found


def scratch_dir(prefix: str) -> Path:
    """A fresh short folder in /tmp (Unix socket paths must stay under 108 bytes), named after this
    process so that its watchdog removes it if the process is killed before it can."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"{prefix}{mark()}-", dir="/tmp"))


def _remove_scratch_dirs(entry: str) -> None:
    import glob
    import shutil

    for path in glob.glob(f"/tmp/*-{entry}-*"):
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.geteuid() and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)


_watchdog_lock = threading.Lock()


def _ensure_watchdog() -> None:
    """Once per process: start the watchdog, then add this process to $PARITY_TREE for all children."""
    entry = mark()
    with _watchdog_lock:
        tree = os.environ.get(TREE_ENV, "").split()
        if entry in tree:
            return
        package_root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        pid, started = entry.split(".")
        # It forks once more and returns at once: the watchdog is nobody's child and in its own session.
        subprocess.run([sys.executable, "-m", "parity.procs", pid, started], env=env, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        os.environ[TREE_ENV] = " ".join([*tree, entry])


def _wait_for_death(pid: int, started: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = None
    if fd is not None:
        if alive(pid, started):
            select.select([fd], [], [])  # readable once the process exits
        os.close(fd)
    while alive(pid, started):  # no pidfd, or it named a zombie's successor: poll
        time.sleep(0.5)


def watch(pid: int, started: int) -> None:
    """The watchdog: when process `pid` is gone, stop every process still carrying its mark, then
    remove the scratch folders it made."""
    entry = f"{pid}.{started}"
    _wait_for_death(pid, started)
    left = marked(entry)
    if left:
        stopped = stop_foreign(left, timeout_s=STOP_TIMEOUT_S)
        names = ", ".join(f"{e['pid']} ({e['name']})" for e in stopped)
        with contextlib.suppress(OSError):
            sys.stderr.write(f"parity watchdog: process {pid} ended without stopping {len(stopped)} "
                             f"process(es) it started; stopped {names}\n")
    _remove_scratch_dirs(entry)


# ---- spawning ----------------------------------------------------------------------------------

# The child arms its death signal itself, in a few lines of Python that then exec the command: a
# preexec_fn would run Python in the forked child of a threaded parent (gRPC's fork handlers crash there).
_ARM_DEATH_SIGNAL = """\
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the spawner died before the signal was armed
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.exit(f"cannot start {sys.argv[2]}: {exc.strerror}")
"""


_spawned = 0  # children `spawn` started in this process (what a stop signal's message names)


def spawn(argv: list[str], *, stdout, stderr=subprocess.STDOUT, env: dict | None = None,
          cwd: Path | str | None = None) -> subprocess.Popen:
    """Start a child in its own session, killed with its spawning thread, marked for the watchdog."""
    global _spawned
    _ensure_watchdog()
    _spawned += 1
    env = dict(os.environ if env is None else env)
    env[TREE_ENV] = os.environ[TREE_ENV]
    command = [sys.executable, "-I", "-S", "-c", _ARM_DEATH_SIGNAL, str(os.getpid()), *map(str, argv)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
                            start_new_session=True)


# ---- how a process ended -----------------------------------------------------------------------

def entry(pid: int, name: str, returncode: int | None) -> dict:
    """A cleanup receipt's process entry: exit code, or the signal that ended it (None while running)."""
    return {"pid": pid, "name": name,
            "exit_code": returncode if returncode is not None and returncode >= 0 else None,
            "signal": signal.Signals(-returncode).name if returncode is not None and returncode < 0 else None}


def ended(returncode: int | None) -> str:
    """'exit code 3', 'killed by SIGKILL' or 'still running', for messages."""
    if returncode is None:
        return "still running"
    return f"exit code {returncode}" if returncode >= 0 else f"killed by {signal.Signals(-returncode).name}"


def last_line(path: Path, about: tuple[str, ...] = ()) -> str:
    """The last non-blank line of a log (usually the error), for a one-line message; with `about`, the last line that
    holds one of those words (any case), or "" where none does (a known cause is then not given a line about
    something else: a bind race quoted the session manager's last startup line, outside pass I's nit)."""
    try:
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "" if about else "no log"
    if about:
        lines = [line for line in lines if any(word in line.lower() for word in about)]
        return lines[-1][:300] if lines else ""
    return lines[-1][:300] if lines else "empty log"


# ---- teardown ----------------------------------------------------------------------------------

def _signal_group_or_pid(pid: int, signum: int) -> None:
    """Signal the process group `pid` leads, else the process alone. A SIGTERM is followed by SIGCONT: a stopped
    (SIGSTOP) process handles it only once continued, so a frozen replica cost the whole wait, then SIGKILL (an
    outsider's, 2026-12-07)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        send = os.killpg if os.getpgid(pid) == pid else os.kill
        send(pid, signum)
        if signum == signal.SIGTERM:
            send(pid, signal.SIGCONT)


def stop(proc: subprocess.Popen, name: str, timeout_s: float = STOP_TIMEOUT_S) -> dict:
    """SIGTERM our child's process group, wait, then SIGKILL; the receipt entry says how it ended."""
    for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
        if proc.poll() is None:
            _signal_group_or_pid(proc.pid, signum)  # our children lead their groups (`spawn`)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait_s)
    return entry(proc.pid, name, proc.poll())


def stop_session(leader: int, grace_s: float = STOP_TIMEOUT_S) -> list[dict]:
    """What is left in a stopped child's session gets `grace_s` to exit by itself (vLLM's engine core
    follows its server), then SIGTERM and SIGKILL; one receipt entry for each that had to be signalled."""
    deadline = time.monotonic() + grace_s
    while (left := session_members(leader)) and time.monotonic() < deadline:
        time.sleep(_POLL_S * 4)
    table = proc_table()
    return stop_foreign({pid: table[pid][1:] for pid in left if pid in table and pid != os.getpid()})


def stop_foreign(pids: dict[int, tuple[int, str]], timeout_s: float = STOP_TIMEOUT_S) -> list[dict]:
    """SIGTERM, wait, SIGKILL for processes that are not our children; one receipt entry each."""
    entries = {pid: {"pid": pid, "name": name, "exit_code": None, "signal": None}
               for pid, (_, name) in pids.items()}
    for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
        living = [pid for pid, (started, _) in pids.items() if alive(pid, started)]
        if not living:
            break
        for pid in living:
            _signal_group_or_pid(pid, signum)
            entries[pid]["signal"] = signal.Signals(signum).name
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p, pids[p][0]) for p in living):
            time.sleep(_POLL_S)
    return list(entries.values())


def receipt(what: str, *, processes: list[dict], ports_released: list[int], gpus_released: list[str],
            errors: list[str], simulated: bool, ended_by: str) -> dict:
    """The cleanup receipt every teardown leaves (schemas/cleanup-receipt.schema.json)."""
    from parity.manifest import header

    return header("cleanup-receipt", simulated=simulated) | {
        "what": what, "processes": processes, "ports_released": ports_released,
        "gpus_released": gpus_released, "clean": not errors, "errors": errors, "ended_by": ended_by}


def receipt_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) where a cleanup receipt's verdict disagrees with its own lines (`parity.rederive`): it is
    clean exactly when it names no error. (What each process did is recorded as seen, not derived.)"""
    if doc["clean"] != (not doc["errors"]):
        return [("/clean", f"states {doc['clean']}, its errors ({len(doc['errors'])}) give the opposite")]
    return []


# ---- SIGTERM as an orderly exit ----------------------------------------------------------------

class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived: leave through the context managers, then exit with 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signal = signal.Signals(signum).name


class Termination:
    """While entered (nested is fine), SIGTERM/SIGHUP raise `Terminated` in the main thread.

    Once one has arrived the handler stays until the process ends; in a `shielded` block (teardown)
    the raise waits for the block's end. A second signal exits at once, for a teardown that hangs:
    the death signals and the watchdog then stop what is left. While `run` runs an event loop, a
    signal (Ctrl-C's too) cancels its task instead and is raised once the loop is back.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.depth, self.shield, self.saved = 0, 0, {}
        self.received: str | None = None
        self.pending: int | None = None
        self.task: asyncio.Task | None = None  # what `run` runs now

    def _handler(self, signum, frame):
        if self.received is not None:
            with contextlib.suppress(OSError):
                os.write(2, f"parity: {signal.Signals(signum).name} again: exiting now\n".encode())
            os._exit(128 + signum)
        self.received = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            what = "stopping the processes this run started" if _spawned else "leaving in order"
            os.write(2, f"parity: {self.received}: {what}\n".encode())
        self._stop(signum)

    def _interrupt(self, signum, frame):
        """Ctrl-C while `run` runs a loop: as SIGTERM; a second one raises at once, as asyncio.run's."""
        if self.pending is not None:
            raise KeyboardInterrupt
        self._stop(signum)

    def _stop(self, signum):
        if self.task is not None:  # a loop runs: its task cancelled between two of its callbacks, raised by `run`
            self.task.get_loop().call_soon_threadsafe(self.task.cancel)
        elif not self.shield:
            _raise(signum)
        self.pending = signum

    def enter(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self.depth == 0 and self.received is None:
            self.saved = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
            # a blocked signal is inherited across exec (a parent that spawned us from a thread masking it):
            # it would stay pending, and the run would not stop until it ended by itself
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.SIGNALS)
        self.depth += 1

    def exit(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self.depth == 0:
            return
        self.depth -= 1
        if self.depth == 0 and self.received is None:
            for signum, handler in self.saved.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def shielded(self):
        """Teardown: a SIGTERM arriving now raises only once the block is done."""
        self.shield += 1
        try:
            yield
        finally:
            self.shield -= 1
            if not self.shield and self.pending is not None:
                signum, self.pending = self.pending, None
                _raise(signum)

    def run(self, loop: asyncio.AbstractEventLoop, coroutine):
        """`loop.run_until_complete(coroutine)`, in the main thread with the signals' exception raised here.

        A signal handler runs inside whatever the main thread runs at that moment: in a loop, that is
        aiohttp, a task being created, or a gc callback, which swallows what the handler raises (a CI run
        lost its signal so). So while the loop runs, a signal only cancels the coroutine's task, as
        asyncio.run does for Ctrl-C: it unwinds through its own awaits (a burst cancels its requests
        there), and the signal's exception is raised here once the loop is back.
        """
        if threading.current_thread() is not threading.main_thread():
            return loop.run_until_complete(coroutine)
        task = loop.create_task(coroutine)
        outer, self.task = self.task, task
        sigint = signal.getsignal(signal.SIGINT)
        if sigint is signal.default_int_handler:  # as asyncio.run: a handler of the caller's own is left alone
            signal.signal(signal.SIGINT, self._interrupt)
        try:
            return loop.run_until_complete(task)
        finally:
            self.task = outer
            if sigint is signal.default_int_handler:
                signal.signal(signal.SIGINT, sigint)
            if not self.shield and self.pending is not None:
                signum, self.pending = self.pending, None
                _raise(signum)

    def ended_by(self, exc: BaseException | None) -> str:
        """For the receipt: the signal that ended the run, 'error', or 'normal'."""
        if isinstance(exc, Terminated):
            return exc.signal
        if isinstance(exc, KeyboardInterrupt):
            return "SIGINT"
        if self.received:
            return self.received
        return "normal" if exc is None else "error"


def _raise(signum: int):
    """The exception a signal leaves by: Ctrl-C's KeyboardInterrupt, else Terminated."""
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


termination = Termination()


class Supervisor:
    """What starts children (the replica set, the real Flame cluster, its stand-in) as a context manager.

    `_supervise()` at start arms SIGTERM as an orderly exit; `close()` runs the subclass's `_teardown`
    shielded from it, once per start; leaving the block after the body failed while a child had died
    raises the death instead, since that is the cause.
    """

    _supervising = False

    def deaths(self) -> list[str]:
        """One line per child that died while it should be running."""
        return []

    def expect_death(self, pid: int) -> None:
        """A child about to be killed on purpose (the restart fault, parity.restart): its death is no error."""
        self._expected = getattr(self, "_expected", frozenset()) | {pid}

    def unexpected_deaths(self) -> list[str]:
        """`deaths()` but those expected (their lines name the child as "pid N (")."""
        expected = getattr(self, "_expected", frozenset())
        return [line for line in self.deaths() if not any(f"pid {pid} (" in line for pid in expected)]

    def _teardown(self, exc: BaseException | None):
        raise NotImplementedError

    def _supervise(self) -> None:
        termination.enter()
        self._supervising = True

    def close(self, exc: BaseException | None = None):
        try:
            with termination.shielded():
                return self._teardown(exc)
        finally:
            if self._supervising:
                self._supervising = False
                termination.exit()

    def __exit__(self, exc_type, exc, tb) -> None:
        deaths = self.unexpected_deaths() if isinstance(exc, Exception) else []
        self.close(exc)
        if deaths:  # the caller's error, but the cause is the dead child
            raise ParityError("; ".join(deaths)) from exc


if __name__ == "__main__":  # the watchdog: python -m parity.procs PID STARTTIME
    if os.fork():
        os._exit(0)  # the spawner waits for this one only; the watchdog runs on, nobody's child
    watch(int(sys.argv[1]), int(sys.argv[2]))
