"""Standalone replicas: one `vllm serve` (or simulator server) per GPU, pinned, on loopback, always torn down.

Each replica is spawned through `parity.procs` (its own session, killed with this process, stopped by
the watchdog if this process is killed), pinned with `CUDA_VISIBLE_DEVICES=<GPU UUID>`, bound to
127.0.0.1 on a free port, and waited for on `/health` with a timeout; a replica that does not come up
fails with one line naming it, how it ended and its log. Its GPU is then read back (NVML through
nvidia-smi for vLLM, the identity endpoint for the simulator) and a mismatch with the requested
pinning is an error. A replica that dies during the run turns the run's error into one that names it.
Teardown ends every replica's session, checks the ports are free again, and leaves a cleanup receipt.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from parity import jit, procs
from parity.engine import EngineArgs
from parity.engine import vllm_compat as compat
from parity.errors import ParityError
from parity.gpus import check as check_gpus

KINDS = ("sim", "vllm")
STOP_TIMEOUT_S = 60.0  # vLLM's graceful shutdown frees the GPU before it exits


@dataclass
class Replica:
    index: int
    gpu: str  # the requested GPU UUID (sim-N for simulator replicas)
    port: int
    log_path: Path
    process: subprocess.Popen
    reported_gpu: str | None = None
    events_endpoint: str | None = None  # where its KV cache events are published (parity.kv_events), if on

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"replica-{self.index}:{self.port}"

    @property
    def label(self) -> str:
        return f"replica {self.index} (GPU {self.gpu}, pid {self.process.pid}, port {self.port})"

    def ended(self, when: str) -> str:
        """One line: this replica is gone, how, and where its log is."""
        code = self.process.poll()
        if when == "exited before becoming healthy" and code is not None and not procs.port_free(self.port):
            return (f"{self.label} could not bind its port: {procs.port_user(self.port)} took it after it was "
                    f"picked; log: {self.log_path}")
        return f"{self.label} {when}: {procs.ended(code)} ({procs.last_line(self.log_path)}); log: {self.log_path}"


def _command(kind: str, args: EngineArgs, port: int, gpu: str, sim_params: Path | None) -> list[str]:
    if kind == "vllm":
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *compat.serve_arguments(args, port)]
    command = [sys.executable, "-m", "parity", "standalone", "sim-server", "--port", str(port), "--gpu-uuid", gpu]
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


def gpu_of_processes(pids: list[int]) -> set[str]:
    """GPU UUIDs on which any of the pids holds a CUDA context, read from NVML via nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    wanted = set(pids)
    return {uuid.strip() for pid, uuid in (line.split(",") for line in out.splitlines() if "," in line)
            if int(pid) in wanted}


def _identify(kind: str, replica: Replica) -> str:
    if kind == "sim":
        try:
            return httpx.get(f"{replica.url}/parity/identity", timeout=10).json()["gpu_uuid"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:  # one that died after its /health: a
            # traceback (an outsider's, 2026-12-07); now one line, naming how it ended
            with contextlib.suppress(subprocess.TimeoutExpired):  # a refused connection: it may be dying
                replica.process.wait(timeout=2)
            if replica.process.poll() is not None:
                raise ParityError(replica.ended("died before it said which GPU it runs on")) from None
            raise ParityError(f"{replica.label} did not say which GPU it runs on ({type(exc).__name__}: {exc}); log: "
                              f"{replica.log_path}") from None
    gpus = gpu_of_processes(procs.session_members(replica.process.pid))
    if len(gpus) != 1:
        raise ParityError(f"replica {replica.index} runs on GPUs {sorted(gpus) or 'none found'}, expected exactly {replica.gpu}")
    return gpus.pop()


class ReplicaSet(procs.Supervisor):
    """Start replicas on enter; always tear them down on exit, leaving a cleanup receipt."""

    def __init__(self, kind: str, gpus: list[str], args: EngineArgs, log_dir: Path, *,
                 startup_timeout_s: float = 600, sim_params: Path | None = None,
                 kv_events: list[str] | None = None, serve_flags: tuple[str, ...] = ()):
        """`kv_events`: per replica, the loopback endpoint its engine (`vllm serve` or the simulator) sends its
        KV cache events to (a `parity.kv_events.Subscriber`'s); `serve_flags`: more `vllm serve` flags (a
        smaller cache: --num-gpu-blocks-override N)."""
        if kind not in KINDS:
            raise ParityError(f"unknown replica kind {kind!r}: use one of {', '.join(KINDS)}")
        if serve_flags and kind != "vllm":
            raise ParityError("serve flags are vllm serve's; the simulator replicas take none")
        if kv_events is not None and len(kv_events) != len(gpus):
            raise ParityError(f"{len(kv_events)} KV event endpoints for {len(gpus)} replicas")
        self.kv_events, self.serve_flags = kv_events, tuple(serve_flags)
        if not gpus:
            raise ParityError("no GPUs given for the replicas")
        check_gpus(list(gpus), simulated=kind == "sim")  # one replica per GPU, each one this machine has
        self.kind, self.gpus, self.args = kind, gpus, args
        self.log_dir, self.startup_timeout_s, self.sim_params = log_dir, startup_timeout_s, sim_params
        self.replicas: list[Replica] = []
        self.retired: list[Replica] = []  # replicas replaced after a restart fault
        self.receipt: dict | None = None

    def jit_logs(self) -> list[Path]:
        """Each `vllm serve` replica's file of JIT compilations (parity.jit); none for the simulator."""
        return [r.log_path.with_suffix(".jit") for r in self.retired + self.replicas] if self.kind == "vllm" else []

    def kv_cache_tokens(self) -> int | None:
        """The smallest KV cache any `vllm serve` replica reports in its log ("GPU KV cache size: N tokens")."""
        import re

        sizes = []
        for replica in self.replicas:
            text = replica.log_path.read_text(errors="replace") if replica.log_path.exists() else ""
            found = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
            if found:
                sizes.append(int(found[-1].replace(",", "")))
        return min(sizes) if len(sizes) == len(self.replicas) and sizes else None

    def __enter__(self) -> "ReplicaSet":
        self._supervise()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.replicas = [self._start(index, gpu) for index, gpu in enumerate(self.gpus)]
            self._wait_healthy(self.replicas)
        except BaseException as exc:
            self.close(exc)
            raise
        return self

    def _start(self, index: int, gpu: str, log_name: str | None = None) -> Replica:
        port = procs.free_port()
        command = _command(self.kind, self.args, port, gpu, self.sim_params) + list(self.serve_flags)
        endpoint = self.kv_events[index] if self.kv_events else None
        if endpoint and self.kind == "vllm":
            from parity import kv_events

            command += ["--kv-events-config", kv_events.config_json(endpoint)]
        elif endpoint:
            command += ["--kv-events", endpoint]
        log_path = self.log_dir / f"{log_name or f'replica-{index}'}.log"
        env = _environment(self.kind, gpu, self.args)
        if self.kind == "vllm":  # its JIT monitor's records, each compilation after its warm-up (parity.jit)
            env |= jit.environment(log_path.with_suffix(".jit"))
        with log_path.open("wb") as log:
            process = procs.spawn(command, stdout=log, env=env)
        return Replica(index, gpu, port, log_path, process, events_endpoint=endpoint)

    def replace(self, index: int) -> Replica:
        """A new replica in place of replica `index`, which was killed: same GPU, a new port, waited for
        and identified as at start. The dead one stays in the teardown and its receipt."""
        old = self.replicas[index]
        old.process.wait(timeout=30)
        self.retired.append(old)
        new = self._start(index, old.gpu, f"replica-{index}-restart{len(self.retired)}")
        self.replicas[index] = new
        self._wait_healthy([new])
        return new

    def _wait_healthy(self, replicas: list[Replica]) -> None:
        """Each of `replicas` answers /health within the startup timeout and runs on the GPU it was pinned to."""
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(replicas)
        while pending:
            for replica in list(pending):
                if replica.process.poll() is not None:
                    raise ParityError(replica.ended("exited before becoming healthy"))
                try:
                    if httpx.get(f"{replica.url}/health", timeout=2).status_code == 200:
                        pending.remove(replica)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise ParityError(pending[0].ended(f"is not healthy after {self.startup_timeout_s:.0f} s"))
            if pending:
                time.sleep(0.5)
        for replica in replicas:
            replica.reported_gpu = _identify(self.kind, replica)
            if replica.reported_gpu != replica.gpu:
                raise ParityError(f"replica {replica.index} reports GPU {replica.reported_gpu}, "
                                  f"but was pinned to {replica.gpu}")

    def reset_prefix_caches(self) -> None:
        """Start the next trial cold: vLLM's dev-mode endpoint, or the simulator's twin."""
        for replica in self.replicas:
            try:
                response = httpx.post(f"{replica.url}/reset_prefix_cache", timeout=60)
            except httpx.HTTPError as exc:
                if replica.process.poll() is not None:
                    raise ParityError(replica.ended("died before the trial")) from None
                raise ParityError(f"{replica.label} did not answer ({exc}); log: {replica.log_path}") from None
            if response.status_code != 200:
                raise ParityError(f"replica {replica.index} refused to reset its prefix cache: HTTP {response.status_code}")

    def deaths(self) -> list[str]:
        """One line for each replica that exited by itself (not stopped by us)."""
        return [r.ended("died during the run") for r in self.replicas if r.process.poll() is not None]

    def _teardown(self, exc: BaseException | None) -> None:
        processes, errors, released = [], [], []
        for replica in self.retired + self.replicas:
            processes.append(procs.stop(replica.process, f"{self.kind}-replica-{replica.index}", STOP_TIMEOUT_S))
            if replica.process.poll() is None:
                errors.append(f"{replica.label} survived SIGKILL")
            left = procs.stop_session(replica.process.pid, grace_s=30)
            if left:
                processes.extend(left)
                errors.append(f"replica {replica.index} left processes {[e['pid'] for e in left]}; stopped them")
            if procs.released(replica.port):
                released.append(replica.port)
            else:
                errors.append(f"port {replica.port} still in use after teardown")
        self.receipt = procs.receipt(
            f"{len(self.replicas)} {self.kind} replicas" + (f" ({len(self.retired)} replaced)" if self.retired else ""),
            processes=processes, ports_released=released,
            gpus_released=sorted({r.gpu for r in self.replicas}), errors=errors, simulated=self.kind == "sim",
            ended_by=procs.termination.ended_by(exc))
