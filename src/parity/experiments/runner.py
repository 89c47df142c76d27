"""Run an experiment's cases on fresh engines; check every trial; write pairs and the experiment manifest.

Each case starts fresh engines: a new replica set for standalone vLLM, new sessions (so new worker
processes and engines) for Flame; the Flame session manager itself is started once per experiment.
A case whose trial manifest is already valid, checked and made from the same trace, engine settings
and configuration is kept, so a rerun after an interruption redoes only what is missing, invalid or
stale (a settings change never passes old trials off as new ones). A trial that fails a check stays
on disk with its reasons and is excluded from statistics, never dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from parity.checks import check_file, pinning_of
from parity.errors import ParityError
from parity.experiments.backend import Backend
from parity.experiments.plan import Case
from parity.flame.service import FAILURE_DIR_ENV
from parity.manifest import file_ref, header, read_manifest, sha256_file, validate_document, write_manifest
from parity.stats import cached_share, write_pair

# What a Flame worker must inherit to find the same Python packages and engine settings as this process.
PASSED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_NO_USAGE_STATS",
              "HF_HUB_OFFLINE", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "PARITY_GPU_LOCK_DIR", "PARITY_FAILURE_DIR")


def finished(path: Path) -> dict | None:
    """A trial manifest that exists, is schema-valid and carries a verdict (else None)."""
    if not path.exists():
        return None
    try:
        doc = read_manifest(path)
    except Exception:
        return None
    ok = not validate_document(doc, path=path) and doc.get("verdict", {}).get("status") in ("passed", "failed")
    return doc if ok else None


# Flame settings that trials made before the setting existed ran with, without recording it.
UNRECORDED_DEFAULTS = {"order": "arrival"}


def ran_elsewhere(doc: dict, trace: Path, backend: Backend) -> str | None:
    """Why a finished trial did not run this trace on these engine settings, else None."""
    if doc["trace"]["sha256"] != sha256_file(trace):
        return "it ran another trace"
    if doc["engine"]["args"] != backend.args().to_dict():
        return "it ran other engine settings"
    return None


def stale(doc: dict, case: Case, backend: Backend) -> str | None:
    """Why a finished trial does not belong to this case (another trace, engine or configuration), else None."""
    reason = ran_elsewhere(doc, case.trace, backend)
    if reason:
        return reason
    config = UNRECORDED_DEFAULTS | doc["config"]
    if case.system == "vllm":
        return None if config.get("routing") == case.routing else "it used another routing policy"
    wanted = dataclasses.asdict(_flame_settings(case, backend))  # what this case would run, as the trial records it
    changed = sorted(k for k, v in wanted.items() if k in config and config[k] != v)
    return f"its Flame configuration differs ({', '.join(changed)})" if changed else None


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
        self.gpus = backend.gpu_uuids()
        self._stack = contextlib.ExitStack()
        self._flame = None

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

            os.environ[FAILURE_DIR_ENV] = str((self.out_dir / "logs" / "worker-failures").resolve())
            if self.backend.simulated:  # simulated GPUs are this run's alone; real ones are the node's
                os.environ["PARITY_GPU_LOCK_DIR"] = str((self.out_dir / "logs" / "gpu-locks").resolve())
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
        doc = finished(path)
        if doc is not None:
            reason = stale(doc, case, self.backend)
            if reason is None:
                self.log(f"{case.trial_id}: kept (already run and checked)")
                return path
            self.log(f"{case.trial_id}: run again: the trial on disk is stale, {reason}")
        started = time.monotonic()
        summary = (self._run_vllm if case.system == "vllm" else self._run_flame)(case, path)
        verdict = check_file(path)
        label = "simulated" if summary["simulated"] else "measured"
        self.log(f"{case.trial_id}: {summary['requests_per_s']:.3f} req/s ({label}), cached "
                 f"{summary['cached_share']:.2%}, {verdict['status']}"
                 + "".join(f"\n  {r}" for r in verdict["reasons"]) + f"  [{time.monotonic() - started:.0f} s]")
        return path


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
                    "warmup_rounds": backend.warmup_rounds, "load_format": backend.load_format},
        "cases": entries, "pairs": pair_refs,
    }
    out = out_dir / "experiment.json"
    write_manifest(out, doc)
    failed = [e["trial_id"] for e in entries if e["status"] != "passed"]
    log(f"{experiment}: {len(entries) - len(failed)} of {len(entries)} trials passed"
        + (f"; failed (excluded from statistics): {', '.join(failed)}" if failed else ""))
    return out
