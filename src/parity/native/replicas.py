"""Standalone replicas: one `vllm serve` (or simulator server) per GPU, pinned, on loopback, always torn down.

Each replica is its own process group, pinned with `CUDA_VISIBLE_DEVICES=<GPU UUID>`, bound to
127.0.0.1 on a free port, and waited for on `/health` with a timeout; a replica that does not come up
fails with the tail of its log. Its GPU is then read back (NVML through nvidia-smi for vLLM, the
identity endpoint for the simulator) and a mismatch with the requested pinning is an error. Teardown
ends every process group, checks the ports are free again, and returns a cleanup receipt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from parity.engine import EngineArgs
from parity.engine import vllm_compat as compat
from parity.errors import ParityError
from parity.manifest import header

KINDS = ("sim", "vllm")


@dataclass
class Replica:
    index: int
    gpu: str  # the requested GPU UUID (sim-N for simulator replicas)
    port: int
    log_path: Path
    process: subprocess.Popen
    reported_gpu: str | None = None
    closed: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"replica-{self.index}:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens there any more (connections left in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _command(kind: str, args: EngineArgs, port: int, gpu: str, sim_params: Path | None) -> list[str]:
    if kind == "vllm":
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *compat.serve_arguments(args, port)]
    command = [sys.executable, "-m", "parity", "native", "sim-server", "--port", str(port), "--gpu-uuid", gpu]
    return command + (["--sim-params", str(sim_params)] if sim_params else [])


def _environment(kind: str, gpu: str, args: EngineArgs) -> dict[str, str]:
    env = dict(os.environ)
    env.update(compat.ENVIRONMENT)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # enables /reset_prefix_cache between trials
    if kind == "vllm":
        env["CUDA_VISIBLE_DEVICES"] = gpu
    else:  # the simulator replica builds its engine from the same settings a `vllm serve` gets as flags
        env["PARITY_ENGINE_ARGS"] = json.dumps(args.to_dict())
    return env


def _session_pids(leader: int) -> list[int]:
    """Every process in the replica's session (the server and its engine-core children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == leader and fields[0] != "Z":  # session id; zombies hold nothing
                pids.append(int(entry.name))
    return pids


def _drain(leader: int, timeout_s: float) -> list[int]:
    """Wait for the children of a stopped replica (vLLM's engine core) to finish exiting."""
    deadline = time.monotonic() + timeout_s
    while (pids := _session_pids(leader)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def gpu_of_processes(pids: list[int]) -> set[str]:
    """GPU UUIDs on which any of the pids holds a CUDA context, read from NVML via nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    wanted = set(pids)
    return {uuid.strip() for pid, uuid in (line.split(",") for line in out.splitlines() if "," in line)
            if int(pid) in wanted}


def _identify(kind: str, replica: Replica) -> str:
    if kind == "sim":
        return httpx.get(f"{replica.url}/parity/identity", timeout=10).json()["gpu_uuid"]
    gpus = gpu_of_processes(_session_pids(replica.process.pid))
    if len(gpus) != 1:
        raise ParityError(f"replica {replica.index} runs on GPUs {sorted(gpus) or 'none found'}, expected exactly {replica.gpu}")
    return gpus.pop()


class ReplicaSet:
    """Start replicas on enter; always tear them down on exit, leaving a cleanup receipt."""

    def __init__(self, kind: str, gpus: list[str], args: EngineArgs, log_dir: Path, *,
                 startup_timeout_s: float = 600, sim_params: Path | None = None):
        if kind not in KINDS:
            raise ParityError(f"unknown replica kind {kind!r}: use one of {', '.join(KINDS)}")
        if not gpus:
            raise ParityError("no GPUs given for the replicas")
        self.kind, self.gpus, self.args = kind, gpus, args
        self.log_dir, self.startup_timeout_s, self.sim_params = log_dir, startup_timeout_s, sim_params
        self.replicas: list[Replica] = []
        self.receipt: dict | None = None

    def __enter__(self) -> "ReplicaSet":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for index, gpu in enumerate(self.gpus):
                port = free_port()
                log_path = self.log_dir / f"replica-{index}.log"
                log = log_path.open("wb")
                process = subprocess.Popen(_command(self.kind, self.args, port, gpu, self.sim_params),
                                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=_environment(self.kind, gpu, self.args), start_new_session=True)
                log.close()
                self.replicas.append(Replica(index, gpu, port, log_path, process))
            self._wait_healthy()
            for replica in self.replicas:
                replica.reported_gpu = _identify(self.kind, replica)
                if replica.reported_gpu != replica.gpu:
                    raise ParityError(f"replica {replica.index} reports GPU {replica.reported_gpu}, "
                                      f"but was pinned to {replica.gpu}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(self.replicas)
        while pending:
            for replica in list(pending):
                if replica.process.poll() is not None:
                    raise ParityError(f"replica {replica.index} exited with code {replica.process.returncode} "
                                      f"before becoming healthy; last log lines:\n{log_tail(replica.log_path)}")
                try:
                    if httpx.get(f"{replica.url}/health", timeout=2).status_code == 200:
                        pending.remove(replica)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                r = pending[0]
                raise ParityError(f"replica {r.index} not healthy after {self.startup_timeout_s:.0f} s; "
                                  f"last log lines of {r.log_path}:\n{log_tail(r.log_path)}")
            if pending:
                time.sleep(0.5)

    def reset_prefix_caches(self) -> None:
        """Start the next trial cold: vLLM's dev-mode endpoint, or the simulator's twin."""
        for replica in self.replicas:
            try:
                response = httpx.post(f"{replica.url}/reset_prefix_cache", timeout=60)
            except httpx.HTTPError as exc:
                raise ParityError(f"replica {replica.index} did not answer ({exc}); last log lines:\n"
                                  f"{log_tail(replica.log_path)}") from None
            if response.status_code != 200:
                raise ParityError(f"replica {replica.index} refused to reset its prefix cache: HTTP {response.status_code}")

    def __exit__(self, *exc) -> None:
        processes, errors = [], []
        for replica in self.replicas:
            proc = replica.process
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                    errors.append(f"replica {replica.index} (pid {proc.pid}) needed SIGKILL")
                except ProcessLookupError:
                    pass
            code = proc.returncode
            processes.append({"pid": proc.pid, "name": f"{self.kind}-replica-{replica.index}",
                              "exit_code": code if code is not None and code >= 0 else None,
                              "signal": signal.Signals(-code).name if code is not None and code < 0 else None})
            leftovers = _drain(proc.pid, timeout_s=30)
            if leftovers:
                for pid in leftovers:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                errors.append(f"replica {replica.index} left processes {leftovers}; killed")
            if not port_is_free(replica.port):
                errors.append(f"port {replica.port} still in use after teardown")
        self.receipt = header("cleanup-receipt", simulated=self.kind == "sim") | {
            "what": f"{len(self.replicas)} {self.kind} replicas",
            "processes": processes,
            "ports_released": [r.port for r in self.replicas if port_is_free(r.port)],
            "gpus_released": sorted({r.gpu for r in self.replicas}),
            "clean": not errors, "errors": errors,
        }
