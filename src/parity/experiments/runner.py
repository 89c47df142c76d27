"""Run an experiment's cases on fresh engines; check every trial; write pairs and the experiment manifest.

Each case runs on the serving path its system names (`parity.paths`), through the one trial lifecycle
(`parity.trial`), which also decides whether a trial already on disk is kept. Each case starts fresh
engines: a new replica set for standalone vLLM, new sessions (so new worker processes and engines) for
Flame; the Flame cluster itself is started once per experiment (`Runner.shared`). The exception, ours:
consecutive cases naming one shared start (`Case.start`, a sustained ladder's rungs on one path) run on
one start of their path, opened by the first of them that runs and closed before anything else starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

from parity import paths, trial
from parity.checks import check_file, pinning_of
from parity.errors import ParityError
from parity.backend import Backend
from parity.experiments.deadline import Deadline
from parity.routing import RouterSettings
from parity.experiments.plan import (Case, about, for_experiment, paced_span_s, registered, repetition_id, rotate,
                                    runs_cases, settings_of)
from parity.manifest import file_ref, header, read_manifest, write_manifest
from parity.stats import trial_facts, write_pair
from parity.trace import check_context, load_trace


class Runner:
    """Holds the experiment's output folder, its backend and GPUs, and what its cases share."""

    def __init__(self, experiment: str, backend: Backend, out_dir: Path, log=print, shards: int | None = None,
                 deadline: Deadline | None = None, requests: dict[Path, int] | None = None):
        self.experiment, self.backend, self.out_dir, self.log = experiment, backend, out_dir, log
        # per trace, its measured requests (what a case's time is predicted by): those the caller counted already
        self.requests = dict(requests or {})
        self.deadline = deadline or Deadline(None)  # no case begun that would end after it
        self.trials_dir = out_dir / "trials"
        # A sustained pair's sides run one after the other, so one GPU serves it (a shard per path); the
        # study's experiments split each burst over two. `shards` (the confirmation's setting): exactly that
        # many sticky shards, one GPU each (1: each side's whole burst on one GPU, for a one-GPU host).
        needed = shards or (1 if experiment == "sustained" else 2)
        self.gpus = backend.gpu_uuids(needed=needed, what=f"the {experiment} experiment (paired runs on "
                                                          f"{'two GPUs' if needed == 2 else 'one GPU'})")
        if shards is not None:
            if len(self.gpus) < shards:
                raise ParityError(f"the {experiment} experiment runs {shards} shards, one GPU each; the backend "
                                  f"names {len(self.gpus)} ({', '.join(self.gpus)})")
            self.gpus = self.gpus[:shards]
        self.recorded = trial.recorded_hashes(out_dir)  # read before any trial is run again
        self.receipts = trial.changed_receipts(self.recorded, out_dir / "cleanup")  # the receipts it recorded
        if self.deadline.at is not None:  # a device call's next run on these GPUs predicts from what this one measured
            self.deadline.remember(out_dir / "logs" / "deadline.json", self.gpus)
        self._stack = contextlib.ExitStack()
        self._shared: dict = {}
        self._flame_binaries = None
        self._start: tuple[str, contextlib.ExitStack, object] | None = None  # (name, its stack, its open path)
        self._moved: dict[frozenset, list[str] | None] = {}  # a group's trial ids -> moved's answer for them all

    def __enter__(self) -> "Runner":
        for sub in ("trials", "cleanup", "logs", "pairs"):
            (self.out_dir / sub).mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._close_start(*exc)
        finally:
            self._stack.__exit__(*exc)

    def _close_start(self, *exc) -> None:
        if self._start is not None:
            _, stack, _ = self._start
            self._start = None
            stack.__exit__(*(exc or (None, None, None)))

    def _is_open(self, start: str | None) -> bool:
        """Whether shared start `start` is the one open now."""
        return self._start is not None and self._start[0] == start

    def started(self, case: Case) -> tuple[object, bool]:
        """The open path of `case.start`, and whether it was just opened: the one already open, or (the previous
        one closed) a new one."""
        if self._is_open(case.start):
            return self._start[2], False
        self._close_start()
        stack = contextlib.ExitStack()
        serving = stack.enter_context(paths.get(case.system).for_case(case, self))
        self._start = (case.start, stack, serving)
        self.log(f"  started {case.start} (its cases share this engine start)")
        return serving, True

    def shared(self, key: str, make):
        """The resource `make()` opens (a context manager), opened once, on first use, for every later
        case, and closed when the experiment ends."""
        if key not in self._shared:
            self._shared[key] = self._stack.enter_context(make())
        return self._shared[key]

    def args(self, case: Case):
        """The engine settings of one case: the backend's, with the case's answer length and KV cache size
        where it sets them."""
        args = self.backend.args()
        if case.max_tokens is not None:
            args = dataclasses.replace(args, max_tokens=case.max_tokens)
        elif case.lengths is not None:  # answers of their own, none set: the longest of them (a replayed trace's)
            args = dataclasses.replace(args, max_tokens=case.lengths.ceiling)
        if case.cache_blocks is not None:
            args = dataclasses.replace(args, num_gpu_blocks_override=case.cache_blocks)
        return args

    def _changed_receipt(self, case: Case) -> str | None:
        """Why a cleanup receipt that speaks for `case`'s teardown is not what the last experiment manifest recorded
        (its own, its shared start's, or for a Flame case the cluster's), or None."""
        names = [case.trial_id, case.start] + (["flame-cluster"] if case.system == "flame" else [])
        return next((self.receipts[n] for n in names if n in self.receipts), None)

    def trial_path(self, case: Case) -> Path:
        return self.trials_dir / f"{case.trial_id}.json"

    def run(self, case: Case, others: tuple[Case, ...] = ()) -> Path:
        """One fresh case: its trial manifest, checked (pinning is checked later, once its pair exists).
        `others`: the cases judged with it on another machine (`groups`: its pair's other side, its rung's arms)."""
        path = self.trial_path(case)
        wanted = self.wanted(case)
        if others and (gpus := self.moved(case, others)) is not None:
            wanted = wanted | {"gpus": gpus}
        receipt = self._changed_receipt(case)
        if receipt is not None and path.exists():
            self.log(f"{case.trial_id}: run again: {receipt}")
        elif trial.keep(path, case.trial_id, wanted, self.recorded, self.log):
            return path
        options = dict(trial_id=case.trial_id, experiment=case.experiment, router=case.router, schedule=case.schedule,
                       warmup_rounds=self.backend.warmup_rounds, ran_with=wanted, restart=case.restart,
                       lengths=case.lengths, warmup_requests=case.warmup_requests, log=self.log)
        if case.admission is not None:  # ours: a trial that predates it is called as before
            options |= {"admission": case.admission, "objective": case.objective}
        if case.trace not in self.requests:
            self.requests[case.trace] = len(load_trace(case.trace).requests)
        requests = self.requests[case.trace]
        opens = case.start is None or not self._is_open(case.start)
        self.deadline.check(case, requests, self.backend.warmup_rounds, opens)
        began = time.monotonic()
        if case.start is not None:  # the start's first trial to run sweeps its engine's decode batch sizes
            serving, opened = self.started(case)
            start_s = time.monotonic() - began if opened else None
            doc = trial.run(serving, case.trace, self.trials_dir, sweep=case.warmup_requests if opened else None,
                            **options)
        else:
            self._close_start()
            with paths.get(case.system).for_case(case, self) as serving:
                start_s = time.monotonic() - began
                doc = trial.run(serving, case.trace, self.trials_dir, sweep=case.sweep, **options)
        if start_s is not None:  # the engine start the deadline learns: its opening and its decode sweep
            start_s += (doc.get("warmup_sweep") or {}).get("duration_s", 0.0)
        self.deadline.ran(case, requests, self.backend.warmup_rounds, opens, time.monotonic() - began,
                          start_s=start_s)
        return path

    def moved(self, case: Case, others: tuple[Case, ...]) -> list[str] | None:
        """The GPUs a finished group (a pair, a bounded rung's arms: `groups`) ran on when it ran whole on others
        than this run's, as many as this run's (a shard each; a ladder spread over device sessions gets another
        machine each session): all its trials are then judged against those GPUs, so every group finished on one
        GPU is kept and none is ever split over two, nor kept for a run of another shard count (a group with a
        trial missing, or any stale otherwise, runs again here whole). Judged once per group, for all of it."""
        group = (case, *others)
        key = frozenset(c.trial_id for c in group)
        if key not in self._moved:
            self._moved[key] = self._judge_moved(group)
        return self._moved[key]

    def _judge_moved(self, group: tuple[Case, ...]) -> list[str] | None:
        what = "pair" if len(group) == 2 and group[0].pair is not None else "group"
        gpus = {}
        for c in group:
            try:
                gpus[c.trial_id] = read_manifest(self.trial_path(c))["ran_with"]["gpus"]
            except (OSError, KeyError, TypeError, ParityError):
                continue
        if not gpus or all(g == list(self.gpus) for g in gpus.values()):
            return None  # none on disk, or all on this machine: each trial judged as it is
        said = f"{group[0].trial_id}: its {what} runs again whole here"
        if len(gpus) < len(group):
            missing = next(c.trial_id for c in group if c.trial_id not in gpus)
            self.log(f"{said}: {missing} is not on disk (or not readable)")
            return None
        first = next(iter(gpus.values()))
        if any(g != first for g in gpus.values()) or first == list(self.gpus) or len(first) != len(self.gpus):
            self.log(f"{said}: it did not run whole on one earlier machine of this run's GPU count")
            return None  # a group of other shards (one GPU each) than this run's is never kept for it
        for c in group:
            if why := trial.must_run(self.trial_path(c), self.wanted(c) | {"gpus": first}, self.recorded):
                self.log(f"{said}: {c.trial_id}: {why}")
                return None
        self.log(f"{group[0].trial_id}: its {what} ran whole on {', '.join(first)} (an earlier machine), judged there")
        return first

    def wanted(self, case: Case) -> dict:
        """RESULT_SETTINGS as this case runs now."""
        flame = case.flame if case.system == "flame" else None
        if flame is not None and self._flame_binaries is None:
            self._flame_binaries = trial.flame_binaries_sha256(self.backend)  # hashed once per experiment
        return trial.ran_with(self.backend, self.gpus, case.trace, placement=case.placement, flame=flame,
                              flame_binaries=self._flame_binaries, load=case.load, args=self.args(case))


def _pair_cases(cases: list[Case]) -> dict[tuple, dict[str, Case]]:
    out: dict[tuple, dict[str, Case]] = {}
    for case in cases:
        if case.pair is not None:
            out.setdefault((case.stage, case.trace.stem, case.pair), {})[case.side] = case
    return out


def groups(cases: list[Case]) -> dict[str, tuple[Case, ...]]:
    """Trial id -> the other cases judged with it when a ladder moves machines (Runner.moved): a pair's other side;
    a bounded rung's other arms (its unbounded comparator, each path bounded: `Case.rung`), which compare on one GPU."""
    units = [list(sides.values()) for sides in _pair_cases(cases).values() if len(sides) == 2]
    rungs: dict[str, list[Case]] = {}
    for case in cases:
        if case.rung is not None:
            rungs.setdefault(case.rung, []).append(case)
    units += [unit for unit in rungs.values() if len(unit) > 1]
    return {case.trial_id: tuple(c for c in unit if c is not case) for unit in units for case in unit}


def ran(case: Case) -> dict:
    """What a case ran, as its experiment.json entry records it for the report to read back (its stage is a label):
    `rate`, the offered rate of a paced schedule (None: a burst, or a replay, which offers no one rate);
    `output_tokens`, the exact answer length every request asked for (None: the backend's engine setting, recorded
    in the trial's engine args, or each request its own length, `lengths`, recorded as the trial's output_lengths);
    `arm`, the arm of the settings it belongs to (None: the study's configuration)."""
    return {"rate": case.schedule.rate if case.schedule.paced else None,
            "output_tokens": case.max_tokens if case.lengths is None else None, "arm": case.arm}


def case_entry(case: Case) -> dict:
    """What experiment.json states of a case from its plan (beside its trial's facts): its placement, stage, pair,
    rate, answer length, arm and, on the Flame path, its settings with their label (`experiments.derive` plans the
    cases again and compares these)."""
    return {"placement": case.placement, "stage": case.stage, "pair": case.pair, **ran(case),
            "flame": case.flame.to_dict() | {"label": case.flame.label()} if case.system == "flame" else None}


def _ran_on(gpus: list[str], docs: dict[str, dict]) -> list[str]:
    """The experiment's GPUs: this run's, unless every trial was kept from an earlier machine (a ladder's later
    session: `Runner.moved`), then the ones its first trial ran on (`derive` finds them among its trials')."""
    ran = [d["ran_with"]["gpus"] for d in docs.values() if isinstance(d.get("ran_with"), dict)]
    return ran[0] if ran and list(gpus) not in ran else list(gpus)


def run_named(experiment: str, traces: list[Path], backend: Backend, out_dir: Path, *, settings: dict,
              log=print, deadline: float | None = None) -> Path:
    """Experiment `experiment` from its settings (the config's experiments.NAME, recorded as given): its cases
    planned and run, or, for one that runs no cases (the offline limit), its shards on the engine."""
    if not runs_cases(experiment):
        from parity.experiments import offline_limit

        return offline_limit.run(traces, backend, out_dir, settings=settings, log=log)
    return run_experiment(experiment, for_experiment(experiment, traces, settings), backend, out_dir,
                          settings=settings, log=log, deadline=deadline)


def run_experiment(experiment: str, cases: list[Case], backend: Backend, out_dir: Path, *, settings: dict,
                   log=print, deadline: float | None = None) -> Path:
    """Run every case in order, then pin-check and pair them; write OUT/experiment.json. `deadline` (epoch
    seconds): begin no case predicted to end after it (parity.experiments.deadline)."""
    if not cases:
        raise ParityError(f"experiment {experiment} has no cases")
    ids = [c.trial_id for c in cases]
    if len(set(ids)) != len(ids):
        raise ParityError(f"experiment {experiment} names a trial twice")
    for trace, tokens, blocks in sorted({(c.trace, c.max_tokens or 0, c.cache_blocks or 0) for c in cases}):  # before
        # anything is written; a KV cache smaller than a prompt stalled the engine after the trials before it ran
        args = backend.args()
        args = dataclasses.replace(args, max_tokens=tokens) if tokens else args
        loaded = trial.fits_engine(trace, args)
        if blocks:
            check_context(loaded, blocks * args.block_size, args.max_tokens,
                          f"the KV cache of cache_blocks {blocks} x {args.block_size} tokens =")
    for trace in dict.fromkeys(c.trace for c in cases):
        trial.check_warmups(trace, backend.warmup_rounds)
    for trace, lengths in dict.fromkeys((c.trace, c.lengths) for c in cases if c.lengths is not None):
        trial.fits_engine(trace, backend.args(), lengths)  # each prompt with its own answer
    requests = {t: len(load_trace(t).requests) for t in {c.trace for c in cases}}
    paced = paced_span_s(cases, requests)
    if paced:
        log(f"{experiment}: {len(cases)} cases; their arrival schedules take about {about(paced)} in all "
            "(requests / rate, case by case; engine starts and warmups come on top)")
    trials = {}
    paired = _pair_cases(cases)
    together = groups(cases)
    # per side, where the experiment's settings name them (read only there: the cases carry everything else)
    named = {f.name for f in dataclasses.fields(registered(experiment).settings)}
    shards = settings_of(experiment, settings).shards if "shards" in named else None
    with Runner(experiment, backend, out_dir, log, shards=shards, deadline=Deadline(deadline),
                requests=requests) as runner:
        for number, case in enumerate(cases, start=1):
            log(f"[{number}/{len(cases)}] {case.trial_id}")
            trials[case.trial_id] = runner.run(case, together.get(case.trial_id, ()))
    pairs = sorted(paired.items())
    for (stage, trace, index), sides in pairs:  # pinning first: it may change a candidate's verdict
        if set(sides) != {"reference", "candidate"}:
            raise ParityError(f"pair {stage}/{trace}/{index} lacks a side: {sorted(sides)}")
        if sides["candidate"].pinned:
            reference = read_manifest(trials[sides["reference"].trial_id])
            verdict = check_file(trials[sides["candidate"].trial_id], pinning_of(reference))
            if verdict["status"] == "failed":
                log(f"{sides['candidate'].trial_id}: failed the pinning check: {'; '.join(verdict['reasons'])}")
    docs = {trial_id: read_manifest(path) for trial_id, path in trials.items()}
    pair_refs = []
    for (stage, trace, index), sides in pairs:
        ref_id, cand_id = sides["reference"].trial_id, sides["candidate"].trial_id
        pair_path = out_dir / "pairs" / f"{stage}-{trace}-p{index}.json"
        write_pair(pair_path, index, (trials[ref_id], docs[ref_id]), (trials[cand_id], docs[cand_id]),
                   experiment=experiment, stage=stage)
        pair_refs.append(file_ref(pair_path, out_dir))
    entries = []
    for case in cases:
        doc = docs[case.trial_id]
        entries.append(case_entry(case) | {"manifest": file_ref(trials[case.trial_id], out_dir)} | trial_facts(doc))
    simulated = any(e["simulated"] for e in entries)
    # the cleanup receipts of its cases (a standalone case's replicas) and of its shared Flame cluster, by hash
    starts = list(dict.fromkeys(c.start for c in cases if c.start is not None))
    receipts = [out_dir / "cleanup" / f"{name}.json" for name in [*(c.trial_id for c in cases), *starts, "flame-cluster"]]
    doc = header("experiment", simulated=simulated) | {
        "experiment": experiment, "settings": settings,
        "backend": {"engine": backend.engine, "cluster": backend.cluster, "gpus": _ran_on(runner.gpus, docs),
                    "warmup_rounds": backend.warmup_rounds, "load_format": backend.load_format,
                    "sim_params_sha256": trial.sim_params_sha256(backend)},
        "cases": entries, "pairs": pair_refs,
        "cleanup": [file_ref(p, out_dir) for p in receipts if p.is_file()],
    }
    out = out_dir / "experiment.json"
    write_manifest(out, doc)
    failed = [e["trial_id"] for e in entries if e["status"] != "passed"]
    log(f"{experiment}: {len(entries) - len(failed)} of {len(entries)} trials passed"
        + (f"; failed (excluded from statistics): {', '.join(failed)}" if failed else ""))
    return out


def run_trials(path, placements, traces, repeats: int, experiment: str, warmup_rounds: int, out_dir: Path,
               log=print) -> None:
    """Every placement x trace on one started path, the order rotated each repeat (`parity standalone run`,
    `parity flame run`: no plan, no pairs); a line per trial in OUT/summary.jsonl; the path's teardown said
    at the end (its receipt is beside the trials)."""
    cases = [(placement, trace) for trace in traces for placement in placements]
    try:
        with path:
            for repeat in range(repeats):
                for placement, trace in rotate(cases, repeat):
                    trial_id = repetition_id(experiment, path.name, placement, trace, repeat)
                    log(f"{trial_id}:")
                    doc = trial.run(path, trace, out_dir, trial_id=trial_id, experiment=experiment,
                                    router=RouterSettings(placement), warmup_rounds=warmup_rounds, log=log)
                    trial.log_summary(out_dir, trial.summary(doc, out_dir / f"{trial_id}.json"))
    finally:
        if path.receipt is not None:
            log(f"teardown: {'clean' if path.receipt['clean'] else '; '.join(path.receipt['errors'])}")
