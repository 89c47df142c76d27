"""Run an experiment's cases on fresh engines; check every trial; write pairs and the experiment manifest.

Each case starts fresh engines: a new replica set for standalone vLLM, new sessions (so new worker
processes and engines) for Flame; the Flame session manager itself is started once per experiment.

A rerun after an interruption redoes only what is missing: a trial on disk is kept only when
`must_run` finds nothing against it. It must be a finished, schema-valid trial; made with every
setting that can change a result as the case would run now (`stale`, over `RESULT_SETTINGS`); byte
for byte what an earlier run's experiment.json and pair manifests recorded, where they exist; and
its timing and verdict must be what its records give when checked again. Anything else is run
again, and the log line says why, so an edited trial is never counted and a settings change never
passes old trials off as new ones.

A trial that failed its checks stays on disk with its reasons and is excluded from statistics. A
rerun keeps it as failed (its records still give that verdict) rather than running the case until
it passes; delete its manifest to run that case again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from parity.checks import check_file, pinning_of, read_trial, trace_of, unsupported
from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.experiments.backend import Backend
from parity.experiments.plan import Case, FlameConfig
from parity.flame.service import worker_environment
from parity.manifest import (
    ManifestError,
    file_ref,
    header,
    is_file_reference,
    read_manifest,
    sha256_file,
    write_manifest,
)
from parity.record import package_versions
from parity.stats import cached_share, write_pair
from parity.trace import check_context, load_trace

# What a Flame worker must inherit to find the same Python packages and engine settings as this process.
PASSED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_NO_USAGE_STATS",
              "HF_HUB_OFFLINE", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "PARITY_GPU_LOCK_DIR", "PARITY_FAILURE_DIR")

# Everything that can change a trial's result; a kept trial ran with the same value of each. The runner
# records them in the trial as `ran_with`; the trace, engine arguments and versions are read from what
# the run itself recorded. The trace hash covers its tokens; engine_args holds the model, revision,
# load_format and max_model_len; sim_params is the simulator file's content, not its path.
RESULT_SETTINGS = ("trace", "engine", "engine_args", "sim_params", "warmup_rounds", "gpus", "cluster",
                   "flame_binaries", "routing", "flame", "versions")
_UNRECORDED = object()  # a setting the trial does not record: never equal to a wanted value


def sim_params_sha256(backend: Backend) -> str | None:
    """SHA-256 of the simulator parameter file the engine will load (the default one when none is named)."""
    if not backend.simulated:
        return None
    from parity.engine.sim import DEFAULT_PARAMS

    path = Path(backend.sim_params) if backend.sim_params else DEFAULT_PARAMS
    return sha256_file(path) if path.is_file() else None


def flame_binaries_sha256(backend: Backend) -> dict[str, str] | None:
    """SHA-256 of each real Flame binary the cluster will start; None for the stand-in or when they are missing."""
    if backend.cluster != "flame":
        return None
    from parity.flame.cluster import find_binaries

    try:
        return {name: sha256_file(path) for name, path in sorted(find_binaries(backend.flame_bin_dir).items())}
    except ParityError:
        return None  # the run itself says what is missing


def ran_with(backend: Backend, gpus: list[str], trace: Path, *, routing: str | None,
             flame: FlameConfig | None, flame_binaries: dict | None = None) -> dict:
    """RESULT_SETTINGS as a trial of `trace` would run now (`flame`: the Flame case's configuration, else None)."""
    values = {"trace": sha256_file(trace), "engine": backend.engine, "engine_args": backend.args().to_dict(),
              "sim_params": sim_params_sha256(backend), "warmup_rounds": backend.warmup_rounds, "gpus": list(gpus),
              "cluster": backend.cluster if flame else None, "flame_binaries": flame_binaries if flame else None,
              "routing": routing, "flame": dataclasses.asdict(flame) if flame else None,
              "versions": package_versions()}
    return {name: values[name] for name in RESULT_SETTINGS}


def stale(doc: dict, wanted: dict) -> str | None:
    """Which of RESULT_SETTINGS a finished trial ran with other values of than `wanted`, else None."""
    recorded = doc.get("ran_with")
    if not isinstance(recorded, dict):
        return "it does not record what it ran with (made before parity recorded it)"
    recorded = recorded | {"trace": doc["trace"]["sha256"], "engine_args": doc["engine"]["args"],
                           "versions": doc["versions"]}
    changed = []
    for name in RESULT_SETTINGS:
        old, new = recorded.get(name, _UNRECORDED), wanted[name]
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{name}.{k}" for k in sorted(set(old) | set(new))
                        if old.get(k, _UNRECORDED) != new.get(k, _UNRECORDED)]
        else:
            changed.append(name)
    return f"it ran with other {', '.join(changed)}" if changed else None


def recorded_hashes(out_dir: Path) -> dict[str, list[tuple[Path, str]]]:
    """Trial manifest (absolute path) -> (recording manifest, SHA-256) for every earlier record of it.

    An earlier run's OUT/experiment.json names each case's trial by hash, and each OUT/pairs/*.json its
    two sides; a file that cannot be read records nothing.
    """
    out: dict[str, list[tuple[Path, str]]] = {}
    manifests = [out_dir / "experiment.json", *sorted((out_dir / "pairs").glob("*.json"))]
    for manifest in (m for m in manifests if m.is_file()):
        try:
            doc = read_manifest(manifest)
        except ManifestError:
            continue
        if doc.get("kind") == "experiment":
            refs = [c.get("manifest") for c in doc.get("cases", []) if isinstance(c, dict)]
        elif doc.get("kind") == "pair":
            refs = [doc.get(side, {}).get("manifest") for side in ("reference", "candidate")]
        else:
            continue
        for ref in refs:
            if is_file_reference(ref) and isinstance(ref["path"], str):
                trial = os.path.abspath(manifest.parent / ref["path"])
                out.setdefault(trial, []).append((manifest, ref["sha256"]))
    return out


def must_run(path: Path, wanted: dict, recorded: dict[str, list[tuple[Path, str]]]) -> str | None:
    """Why the case whose trial manifest is `path` must run (again), or None to keep the trial as it is."""
    if not path.exists():
        return "not run yet"
    try:
        doc = read_trial(path)
    except ParityError as exc:  # not JSON, not a trial, schema problems, a rate its records do not give
        return str(exc)
    if doc["verdict"]["status"] == "pending":
        return "the trial on disk was never checked"
    if why := stale(doc, wanted):
        return f"the trial on disk is stale: {why}"
    actual = sha256_file(path)
    for manifest, sha256 in recorded.get(os.path.abspath(path), []):
        if sha256 != actual:
            return f"the trial on disk changed after {manifest} recorded it (SHA-256 {actual}, recorded {sha256})"
    try:
        why = unsupported(doc, trace_of(path, doc))
    except ParityError as exc:
        return f"its trace cannot be checked again: {exc}"
    return f"the trial on disk is not what its records give: {why}" if why else None


def keep(path: Path, name: str, wanted: dict, recorded: dict[str, list[tuple[Path, str]]], log) -> bool:
    """Whether the trial at `path` is kept as it is (`must_run` finds nothing against it); the log says
    which, and why a trial on disk is run again."""
    why = must_run(path, wanted, recorded)
    if why is None:
        verdict = read_manifest(path)["verdict"]
        if verdict["status"] == "passed":
            log(f"{name}: kept (already run and checked)")
        else:
            log(f"{name}: kept as failed, excluded from statistics (delete {path} to run it again): "
                f"{'; '.join(verdict['reasons'])}")
        return True
    if path.exists():
        log(f"{name}: run again: {why}")
    return False


def fits_engine(trace: Path, args: EngineArgs) -> None:
    """A trace the engine can serve: valid, and every prompt with its new tokens within max_model_len."""
    check_context(load_trace(trace), args.max_model_len, args.max_tokens, "the engine's max_model_len")


def _flame_settings(case: Case, backend: Backend):
    from parity.flame.client import FlameSettings

    engine, sim_mode = backend.engine_kind(case.flame.api)
    return FlameSettings(placement=case.routing, batch_limit=case.flame.batch_limit,
                         window_s=case.flame.window_ms / 1000, budget=int(case.flame.budget_mib * 1024 * 1024),
                         compress=case.flame.compress, engine=engine, engine_args=backend.args().to_dict(),
                         sim_mode=sim_mode, sim_params=backend.sim_params, gc_freeze=case.flame.gc_freeze,
                         order=case.flame.order)


class Runner:
    """Holds the experiment's output folder and, once a Flame case needs it, one running cluster."""

    def __init__(self, experiment: str, backend: Backend, out_dir: Path, log=print):
        self.experiment, self.backend, self.out_dir, self.log = experiment, backend, out_dir, log
        self.trials_dir = out_dir / "trials"
        self.gpus = backend.gpu_uuids(needed=2, what=f"the {experiment} experiment (paired runs on two GPUs)")
        self.recorded = recorded_hashes(out_dir)  # read before any trial is run again
        self._stack = contextlib.ExitStack()
        self._flame = None
        self._flame_binaries = None

    def __enter__(self) -> "Runner":
        for sub in ("trials", "cleanup", "logs", "pairs"):
            (self.out_dir / sub).mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._stack.close()
        finally:
            if self._flame is not None and getattr(self._flame, "receipt", None) is not None:
                write_manifest(self.out_dir / "cleanup" / "flame-cluster.json", self._flame.receipt)

    def trial_path(self, case: Case) -> Path:
        return self.trials_dir / f"{case.trial_id}.json"

    def _cluster(self):
        if self._flame is None:
            from parity.flame.client import register_applications

            os.environ.update(worker_environment(self.out_dir, self.backend.simulated))
            self.log(f"starting {'the Flame stand-in' if self.backend.cluster == 'standin' else 'Flame v0.6.0'} ...")
            self._flame = self._stack.enter_context(self.backend.flame_cluster(self.out_dir))
            env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
            register_applications(self._flame.endpoint, self.gpus, simulated=self.backend.simulated, extra_env=env)
        return self._flame

    def _run_vllm(self, case: Case, path: Path) -> dict:
        from parity.native import run_trial
        from parity.native.replicas import ReplicaSet

        b = self.backend
        replicas = ReplicaSet("sim" if b.simulated else "vllm", self.gpus, b.args(), self.out_dir / "logs" / case.trial_id,
                              startup_timeout_s=b.startup_timeout_s, sim_params=Path(b.sim_params) if b.sim_params else None)
        try:
            with replicas:
                return run_trial(replicas, case.routing, case.trace, path, experiment=case.experiment,
                                 trial_id=case.trial_id, warmup_rounds=b.warmup_rounds, log=self.log)
        finally:
            if replicas.receipt is not None:
                write_manifest(self.out_dir / "cleanup" / f"{case.trial_id}.json", replicas.receipt)

    def _run_flame(self, case: Case, path: Path) -> dict:
        from parity.flame.client import run_trial

        cluster = self._cluster()
        return run_trial(cluster.endpoint, len(self.gpus), _flame_settings(case, self.backend), case.trace, path,
                         experiment=case.experiment, trial_id=case.trial_id, warmup_rounds=self.backend.warmup_rounds,
                         stand_in=self.backend.cluster == "standin", log=self.log)

    def run(self, case: Case) -> Path:
        """One fresh case: its trial manifest, checked (pinning is checked later, once its pair exists)."""
        path = self.trial_path(case)
        wanted = self.wanted(case)
        if keep(path, case.trial_id, wanted, self.recorded, self.log):
            return path
        started = time.monotonic()
        summary = (self._run_vllm if case.system == "vllm" else self._run_flame)(case, path)
        write_manifest(path, read_manifest(path) | {"ran_with": wanted})
        verdict = check_file(path)
        label = "simulated" if summary["simulated"] else "measured"
        self.log(f"{case.trial_id}: {summary['requests_per_s']:.3f} req/s ({label}), cached "
                 f"{summary['cached_share']:.2%}, {verdict['status']}"
                 + "".join(f"\n  {r}" for r in verdict["reasons"]) + f"  [{time.monotonic() - started:.0f} s]")
        return path

    def wanted(self, case: Case) -> dict:
        """RESULT_SETTINGS as this case runs now."""
        flame = case.flame if case.system == "flame" else None
        if flame is not None and self._flame_binaries is None:
            self._flame_binaries = flame_binaries_sha256(self.backend)  # hashed once per experiment
        return ran_with(self.backend, self.gpus, case.trace, routing=case.routing, flame=flame,
                        flame_binaries=self._flame_binaries)


def _pair_cases(cases: list[Case]) -> dict[tuple, dict[str, Case]]:
    out: dict[tuple, dict[str, Case]] = {}
    for case in cases:
        if case.pair is not None:
            out.setdefault((case.stage, case.trace.stem, case.pair), {})[case.system] = case
    return out


def run_experiment(experiment: str, cases: list[Case], backend: Backend, out_dir: Path, *, settings: dict,
                   log=print) -> Path:
    """Run every case in order, then pin-check and pair them; write OUT/experiment.json."""
    if not cases:
        raise ParityError(f"experiment {experiment} has no cases")
    ids = [c.trial_id for c in cases]
    if len(set(ids)) != len(ids):
        raise ParityError(f"experiment {experiment} names a trial twice")
    for trace in sorted({c.trace for c in cases}):  # before anything is written
        fits_engine(trace, backend.args())
    paths = {}
    with Runner(experiment, backend, out_dir, log) as runner:
        for number, case in enumerate(cases, start=1):
            log(f"[{number}/{len(cases)}] {case.trial_id}")
            paths[case.trial_id] = runner.run(case)
    pairs = sorted(_pair_cases(cases).items())
    for (stage, trace, index), sides in pairs:  # pinning first: it may change a candidate's verdict
        if set(sides) != {"vllm", "flame"}:
            raise ParityError(f"pair {stage}/{trace}/{index} lacks a side: {sorted(sides)}")
        if sides["flame"].pinned:
            reference = read_manifest(paths[sides["vllm"].trial_id])
            verdict = check_file(paths[sides["flame"].trial_id], pinning_of(reference))
            if verdict["status"] == "failed":
                log(f"{sides['flame'].trial_id}: failed the pinning check: {'; '.join(verdict['reasons'])}")
    docs = {trial_id: read_manifest(path) for trial_id, path in paths.items()}
    pair_refs = []
    for (stage, trace, index), sides in pairs:
        ref_id, cand_id = sides["vllm"].trial_id, sides["flame"].trial_id
        pair_path = out_dir / "pairs" / f"{stage}-{trace}-p{index}.json"
        write_pair(pair_path, index, (paths[ref_id], docs[ref_id]), (paths[cand_id], docs[cand_id]),
                   experiment=experiment, stage=stage)
        pair_refs.append(file_ref(pair_path, out_dir))
    entries = []
    for case in cases:
        doc = docs[case.trial_id]
        entries.append({"trial_id": case.trial_id, "system": case.system, "routing": case.routing,
                        "trace_name": doc["trace_name"], "stage": case.stage, "pair": case.pair,
                        "flame": case.flame.__dict__ | {"label": case.flame.label()} if case.system == "flame" else None,
                        "status": doc["verdict"]["status"], "requests_per_s": doc["timing"]["requests_per_s"],
                        "cached_share": cached_share(doc), "simulated": doc["simulated"],
                        "cluster": doc.get("flame_cluster"), "manifest": file_ref(paths[case.trial_id], out_dir)})
    simulated = any(e["simulated"] for e in entries)
    doc = header("experiment", simulated=simulated) | {
        "experiment": experiment, "settings": settings,
        "backend": {"engine": backend.engine, "cluster": backend.cluster, "gpus": runner.gpus,
                    "warmup_rounds": backend.warmup_rounds, "load_format": backend.load_format,
                    "sim_params_sha256": sim_params_sha256(backend)},
        "cases": entries, "pairs": pair_refs,
    }
    out = out_dir / "experiment.json"
    write_manifest(out, doc)
    failed = [e["trial_id"] for e in entries if e["status"] != "passed"]
    log(f"{experiment}: {len(entries) - len(failed)} of {len(entries)} trials passed"
        + (f"; failed (excluded from statistics): {', '.join(failed)}" if failed else ""))
    return out
