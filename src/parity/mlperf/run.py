"""One arm of the Offline control in this process: start the path, estimate target_qps, run LoadGen,
read its logs, and write the run manifest (`mlperf-run.json`) with the compliance label.

Everything that was started is torn down, with a cleanup receipt, whatever happens. The engines run
with prefix caching off and MLPerf's generation settings (greedy, up to 128 new tokens, at least 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from parity import procs, routing
from parity.backend import Backend
from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.flame.settings import FlameSettings
from parity.manifest import file_ref, header, write_manifest
from parity.mlperf import ARMS, DATASET_SAMPLES, LOADGEN_VERSION, MAX_NEW_TOKENS, MODEL, MODES, SCENARIO
from parity.mlperf import logs as lglogs
from parity.mlperf.compliance import compliance
from parity.mlperf.dataset import load_dataset
from parity.mlperf.qsl import PromptQSL
from parity.mlperf.settings import UserConf, loadgen, log_settings, mlperf_conf_sha256, offline_settings
from parity.record import package_versions

ENGINES = ("sim", "vllm", "vllm-sync", "vllm-async")
MANIFEST = "mlperf-run.json"
RECEIPTS = ("cleanup-replicas.json", "cleanup-flame.json")  # what each path's teardown left running: nothing
# Where an arm runs without --backend: the simulator, the GPUs named by --gpu (none: sim-0), replicas given 600 s.
BACKEND = Backend(gpus=(), startup_timeout_s=600.0)
# The Flame arm's settings where the workflow (mlperf.flame_arms) names none: the study's larger MLPerf batch, a
# 4 MiB payload budget; the API each worker drives follows the engine (`flame_settings`).
FLAME = FlameSettings(batch_limit=64, budget_mib=4)
# The Flame arm's session layouts: its SUT takes the sessions in turn (no router chooses), so a placement whose router
# would follow the engines' KV cache events has nothing to follow them.
PLACEMENTS = tuple(p for p in routing.FLAME if not routing.facts_of(p).follows_kv_events)


@dataclass
class RunSpec:
    """What one `parity mlperf run` does: where (a `Backend`; its first GPU serves) and, for the Flame arm, with
    which `FlameSettings`; None keeps mlperf.conf's value or the derived default."""

    arm: str
    dataset: Path
    out: Path
    mode: str = "performance"
    backend: Backend = BACKEND
    flame: FlameSettings = FLAME
    max_tokens: int = MAX_NEW_TOKENS
    samples: int | None = None  # the first N dataset entries (all by default)
    target_qps: float | None = None  # None: estimate with a probe
    probe_samples: int = 256
    warmup_samples: int = 16  # untimed, before the probe and LoadGen: engine start-up and kernel JIT
    qps_margin: float = 1.1
    min_duration_ms: int | None = None
    min_query_count: int | None = None
    performance_sample_count: int | None = None
    max_in_flight: int = 512  # standalone
    placement: str = "sticky"  # flame
    progress_s: float = 10.0

    def check(self) -> None:
        if self.arm not in ARMS:
            raise ParityError(f"unknown arm {self.arm!r}: use one of {', '.join(ARMS)}")
        if self.mode not in MODES:
            raise ParityError(f"unknown mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.backend.engine not in ENGINES:
            raise ParityError(f"unknown engine {self.backend.engine!r}: use one of {', '.join(ENGINES)}")
        if not self.backend.simulated and not self.backend.gpus:
            raise ParityError("a real engine needs the GPUs: --gpu UUID (one per replica or worker)")
        if self.target_qps is not None and self.target_qps <= 0:
            raise ParityError("--target-qps must be positive")
        if self.warmup_samples < 0:
            raise ParityError("--warmup-samples must be 0 or more")

    def mlperf_args(self) -> EngineArgs:
        """The engine settings MLPerf requires: no cross-query prefix caching, up to max_tokens, EOS honoured."""
        return dataclasses.replace(self.backend.args(), enable_prefix_caching=False, max_tokens=self.max_tokens,
                                   ignore_eos=False)

    @property
    def gpus(self) -> list[str]:
        return list(self.backend.gpus) or ["sim-0"]

    @property
    def sim_params(self) -> Path | None:
        return Path(self.backend.sim_params) if self.backend.sim_params else None


def arm_backend(backend: Backend) -> Backend:
    """The backend an arm runs on, from the experiments' (`--backend`): its first GPU serves (auto: the node's
    first, from nvidia-smi); engine, cluster, model, engine arguments and start-up timeout as they are."""
    return dataclasses.replace(backend, gpus=tuple(backend.gpu_uuids()[:1]))


def flame_settings(spec: RunSpec) -> FlameSettings:
    """The Flame arm's settings, the API each worker drives following the engine (`vllm` alone: AsyncLLM)."""
    return dataclasses.replace(spec.flame, api="sync" if spec.backend.engine in ("sim", "vllm-sync") else "async")


def _vllm_version_of(url: str) -> str | None:
    import httpx

    try:
        return httpx.get(f"{url}/version", timeout=10).json().get("version")
    except (httpx.HTTPError, ValueError):
        return None


@contextlib.contextmanager
def standalone_path(spec: RunSpec, args: EngineArgs, prompts, stack: contextlib.ExitStack):
    from parity.mlperf.sut_standalone import StandaloneSUT
    from parity.standalone.replicas import ReplicaSet

    kind = "sim" if spec.backend.simulated else "vllm"
    gpus = spec.gpus
    replicas = ReplicaSet(kind, gpus, args, spec.out / "logs", startup_timeout_s=spec.backend.startup_timeout_s,
                          sim_params=spec.sim_params)
    stack.callback(lambda: replicas.receipt and write_manifest(spec.out / RECEIPTS[0], replicas.receipt))
    with replicas:
        urls = [r.url for r in replicas.replicas]
        versions = {None} if kind == "sim" else {_vllm_version_of(u) for u in urls}
        if len(versions) > 1:
            raise ParityError(f"replicas report different vLLM versions: {sorted(map(str, versions))}")
        version = versions.pop()
        sut = StandaloneSUT(prompts, urls, args.model, args.sampling(), max_in_flight=spec.max_in_flight)
        try:
            yield sut, {"engine": "sim-server" if kind == "sim" else "vllm-serve",
                        "vllm_version": version, "vllm_version_source": None if kind == "sim" else "replica /version",
                        "path": {"replicas": kind, "gpus": [r.reported_gpu or r.gpu for r in replicas.replicas],
                                 "max_in_flight": spec.max_in_flight, "placement": "round-robin"}}
        finally:
            sut.close()


@contextlib.contextmanager
def flame_path(spec: RunSpec, args: EngineArgs, prompts, stack: contextlib.ExitStack):
    """The Flame serving path's cluster and sessions (`parity.paths.flame`), fed by LoadGen instead of a burst."""
    from parity.engine import engine_kind
    from parity.mlperf.sut_flame import FlameSUT
    from parity.paths.flame import FlamePath, cluster

    family = "sim" if spec.backend.simulated else "vllm"
    settings = flame_settings(spec)
    engine = engine_kind(family, settings.api)[0]
    gpus = spec.gpus
    with cluster(spec.backend.cluster, gpus, spec.out, simulated=family == "sim", bin_dir=spec.backend.flame_bin_dir,
                 receipt_path=spec.out / RECEIPTS[1]) as running:
        path = FlamePath(running, gpus, settings, engine=family, engine_args=args,
                         sim_params=str(spec.sim_params) if spec.sim_params else None)
        with path.trial(f"mlperf-{spec.mode}", routing.RouterSettings(spec.placement)):
            sut = FlameSUT(prompts, path.sessions)
            try:
                yield sut, {"engine": engine, "vllm_version": None if family == "sim" else package_versions()["vllm"],
                            "vllm_version_source": None if family == "sim" else "worker interpreter (the client's)",
                            "path": {"cluster": running.describe()["cluster"], "network": running.describe()["network"],
                                     "gpus": gpus, "placement": spec.placement, "batch_limit": settings.batch_limit,
                                     "window_s": settings.window_s, "sessions": path.shards}}
            finally:
                sut.close()


@contextlib.contextmanager
def _signals_abort(sut):
    """While LoadGen's test runs, a stop signal fails every outstanding sample (`sut.abort`), so the test returns
    at once and the run tears down in order. LoadGen holds the main thread in C++, where Python runs no signal
    handler until the test returns (a SIGTERM waited out the whole run; raised inside a callback it was a
    segfault: an outsider's, 2026-12-07); the signal's byte on Python's wakeup fd is read by a thread instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    earlier = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    stop = threading.Event()

    def watch():  # stays until the test returns: LoadGen logs through a per-thread logger, and a thread that
        # completed samples and ended while the test ran left it to be reaped under LoadGen (a segfault, 2026-12-07)
        while not stop.is_set():
            ready, _, _ = select.select([read_fd], [], [], 0.1)
            if ready:
                for signum in os.read(read_fd, 64):
                    if signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                        sut.abort(f"stopped by {signal.Signals(signum).name}")

    watcher = threading.Thread(target=watch, name="mlperf-signals", daemon=True)
    watcher.start()
    # Ctrl-C: Python's own handler raised KeyboardInterrupt inside a LoadGen callback, a segfault with no receipt (an
    # outsider's, 2026-12-07); noted here instead (its byte still reaches the watcher) and raised once the test returns
    interrupted: list[int] = []
    earlier_int = signal.getsignal(signal.SIGINT)
    if earlier_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    if procs.termination.pending is not None:  # it came before the wakeup fd was ours: no byte for the watcher
        sut.abort(f"stopped by {signal.Signals(procs.termination.pending).name}")
    try:
        yield
    finally:
        stop.set()
        signal.set_wakeup_fd(earlier)
        if earlier_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, earlier_int)
        watcher.join()  # gone before LoadGen is torn down (it is back from `select` within 0.1 s)
        os.close(read_fd)
        os.close(write_fd)
        if interrupted:  # Ctrl-C's own exception, now that LoadGen's test has returned
            raise KeyboardInterrupt


def _progress(sut, log: Callable[[str], None], every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        log(f"  {sut.progress()}")


def _drop_empty_trace(log_dir: Path) -> None:
    """LoadGen writes its trace log empty with the trace off: not JSON, so `validate` named it in a stopped run's
    folder (an outsider's)."""
    trace = log_dir / "mlperf_log_trace.json"
    if trace.is_file() and trace.stat().st_size == 0:
        trace.unlink()


STOPPED_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")  # where LoadGen states a result


def _set_aside_stopped(log_dir: Path) -> None:
    """A stopped run's LoadGen logs renamed `*.stopped`: LoadGen counted the samples parity failed on purpose as
    completed and its summary said "Result is : VALID" at 1,077 samples/s (a clean run gives 62; outside pass K),
    where a reader or MLCommons' log parser would take it as the run's result. Kept, under a name nothing reads
    as a result, for what they say of the run until it stopped."""
    for name in STOPPED_LOGS:
        with contextlib.suppress(FileNotFoundError):
            (log_dir / name).replace(log_dir / f"{name}.stopped")


def run_arm(spec: RunSpec, log: Callable[[str], None] = print) -> dict:
    """Run one arm in one mode; returns a short summary. Raises ParityError if any sample failed."""
    spec.check()
    loadgen()  # fail before starting anything
    dataset = load_dataset(spec.dataset, spec.samples)  # a bad dataset refused before OUT is made
    if (spec.performance_sample_count or 0) > len(dataset.prompts):  # LoadGen would state a pool it never loaded
        raise ParityError(f"--performance-sample-count {spec.performance_sample_count} is more than the "
                          f"{len(dataset.prompts)} samples the dataset gives")
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    for name in (*RECEIPTS, MANIFEST, "user.conf"):  # an earlier run's receipt must not be linked as this run's, nor
        (out / name).unlink(missing_ok=True)  # its manifest or settings stand beside this run's logs if this one stops
    args = spec.mlperf_args()
    simulated = spec.backend.simulated
    total = len(dataset.prompts)
    pool = spec.performance_sample_count or min(total, DATASET_SAMPLES)
    override = pool if spec.performance_sample_count or total < DATASET_SAMPLES else None
    log(f"{spec.arm} ({spec.mode}): {total} samples of {dataset.origin}, pool {pool}, engine {spec.backend.engine}")

    log_dir = out / "loadgen"  # checked by the command (`cli.mlperf`): LoadGen unable to write there segfaulted
    log_dir.mkdir(parents=True, exist_ok=True)
    for name in (*STOPPED_LOGS, lglogs.ACCURACY, "mlperf_log_trace.json"):  # an earlier run's LoadGen logs, stopped or
        # not: a rerun stopped before its LoadGen test left the last run's "Result is : VALID" (outside pass M)
        (log_dir / name).unlink(missing_ok=True)
        (log_dir / f"{name}.stopped").unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        stack.callback(_drop_empty_trace, log_dir)  # last, whether the run ended or was stopped
        opener = standalone_path if spec.arm == "standalone" else flame_path
        sut, path_info = stack.enter_context(opener(spec, args, dataset.prompts, stack))
        # Flame binds its workers (and starts their engines) on the first task; vLLM compiles some kernels
        # on first use. Both arms run the same untimed warmup so neither lands in the probe or LoadGen.
        warmup = {"samples": 0, "seconds": 0.0}
        if spec.mode == "performance" and spec.warmup_samples:
            warmup = sut.probe(list(range(min(spec.warmup_samples, total))))
            log(f"  warmup (untimed): {warmup['samples']} samples in {warmup['seconds']:.1f} s")
        target = {"value": spec.target_qps, "source": "option", "probe": None}
        if spec.mode == "performance" and spec.target_qps is None:
            probe = sut.probe(list(range(min(spec.probe_samples, total))))
            target = {"value": round(probe["samples_per_s"] * spec.qps_margin, 3), "source": "probe",
                      "probe": {**probe, "margin": spec.qps_margin}}
            log(f"  probe: {probe['samples']} samples in {probe['seconds']:.1f} s = {probe['samples_per_s']:.2f} "
                f"samples/s; target_qps {target['value']}")
        user_conf = UserConf(target_qps=target["value"], min_duration=spec.min_duration_ms,
                             min_query_count=spec.min_query_count, performance_sample_count_override=override)
        user_conf.write(out / "user.conf")
        settings = offline_settings(out / "user.conf", spec.mode)
        qsl = PromptQSL(dataset, pool)
        stack.callback(qsl.close)
        sut.construct()
        stop = threading.Event()
        watcher = threading.Thread(target=_progress, args=(sut, log, spec.progress_s, stop), daemon=True)
        watcher.start()
        log(f"  LoadGen {LOADGEN_VERSION} {SCENARIO} {spec.mode} ...")
        try:  # a SIGTERM now aborts the samples (`_signals_abort`) and is raised once LoadGen's test returns
            with procs.termination.shielded(), _signals_abort(sut):
                loadgen().StartTestWithLogSettings(sut.handle, qsl.handle, settings, log_settings(log_dir), "")
        finally:
            stop.set()
            if sut.stopped:
                _set_aside_stopped(log_dir)
        failed, first_error, completed, tokens = sut.failed, sut.first_error, sut.completed, sut.tokens

    result = lglogs.read_logs(log_dir)
    label = compliance(spec.mode, args, result, dataset, simulated, failed)
    doc = header("mlperf", simulated=simulated) | {
        "step": "run", "arm": spec.arm, "mode": spec.mode, "scenario": SCENARIO, "model": MODEL,
        "loadgen": {"package": package_versions()["mlperf_loadgen"], "reported": result["loadgen_version"]},
        "settings": {"mlperf_conf_sha256": mlperf_conf_sha256(), "user_conf": file_ref(out / "user.conf", out),
                     "user_conf_values": {k: v for k, v in dataclasses.asdict(user_conf).items() if v is not None},
                     "effective": result["effective"], "target_qps": target,
                     "warmup": {"samples": warmup["samples"], "seconds": round(warmup["seconds"], 3)}},
        "dataset": dataset.describe(out),
        "engine": {"name": path_info["engine"], "simulated": simulated, "vllm_version": path_info["vllm_version"],
                   "vllm_version_source": path_info["vllm_version_source"], "args": args.to_dict(),
                   "sampling": args.sampling()},
        "path": path_info["path"],
        "result": lglogs.result_fields(result, spec.mode, failed),
        "sut": {"completed": completed, "failed": failed, "first_error": first_error, "output_tokens": tokens},
        "compliance": label,
        "logs": {name: file_ref(log_dir / name, out) for name in (lglogs.SUMMARY, lglogs.DETAIL, lglogs.ACCURACY)
                 if (log_dir / name).is_file()},
        "cleanup": [file_ref(out / name, out) for name in RECEIPTS if (out / name).is_file()],  # written at teardown
        "versions": package_versions(),
    }
    write_manifest(out / MANIFEST, doc)
    log(f"  {spec.arm}: {doc['result']['validity'] or 'accuracy run'}, {result['samples_per_second']} samples/s, "
        f"{result['tokens_per_second']} tokens/s, {result['duration_s']} s, {result['sample_count']} samples; "
        f"{'compliant' if label['compliant'] else 'NON-COMPLIANT: ' + '; '.join(label['reasons'])}")
    if failed:
        raise ParityError(f"{failed} sample(s) failed (first: {first_error}); see {out / MANIFEST}")
    return {"arm": spec.arm, "mode": spec.mode, "validity": doc["result"]["validity"],
            "compliant": label["compliant"], "samples_per_second": result["samples_per_second"],
            "tokens_per_second": result["tokens_per_second"], "manifest": str(out / MANIFEST)}
