"""One trial, the same way for every caller: warmups, the measured release, records, checks, manifest;
and the rule that decides whether a trial already on disk is kept or run again.

`run` takes a serving path that is already started (`parity.paths`), warms it up on the trace's
token-shifted variants (each round with a fresh router, so the measured prefixes are cold), releases
the measured burst under the arrival schedule, and writes the trial manifest once: records, what it
ran on and with (`ran_with`), the router's statistics, the schedule, and the verdict of the four
checks. Where the path's engines publish KV cache events, the measured burst's router follows them
and the manifest records them (`kv_events`: counts per shard, the blocks each engine reported holding
beside the router's map, and what could not be read); a path whose engines were to publish and sent
nothing the router could follow fails the trial.
Only a pinned candidate is checked again later, against its paired reference's pinning.

A rerun after an interruption redoes only what is missing: a trial on disk is kept only when
`must_run` finds nothing against it. It must be a finished, schema-valid trial; made with every
setting that can change a result as the trial would run now (`stale`, over `RESULT_SETTINGS`); byte
for byte what an earlier run's experiment.json and pair manifests recorded, where they exist; and
its timing and verdict must be what its records give when checked again. Anything else is run
again, and the log line says why, so an edited trial is never counted and a settings change never
passes old trials off as new ones. A trial that failed its checks is kept as failed (its records
still give that verdict), excluded from statistics; delete its manifest to run it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import time
from pathlib import Path

from parity import cpus, jit
from parity.checks import check_trial, gpus_unnamed, read_trial, trace_of, unsupported
from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.manifest import ManifestError, is_file_reference, read_manifest, sha256_file, write_manifest
from parity.record import cached_share, package_versions, refused_records, request_records, trial_manifest
from parity.routing import RouterSettings
from parity.schedule import Schedule
from parity.trace import Trace, check_context, load_trace


def run(path, trace_path: Path, folder: Path, *, trial_id: str, experiment: str,
        router: RouterSettings = RouterSettings(), schedule: Schedule = Schedule(), warmup_rounds: int = 2,
        ran_with: dict | None = None, restart=None, lengths=None, warmup_requests: int | None = None,
        sweep: int | None = None, admission=None, objective=None, log=print) -> dict:
    """One trial on `path` (entered); writes its checked manifest to FOLDER/TRIAL_ID.json (a trial's id is
    always its manifest's name) and returns it. `restart` (parity.restart.Restart): the measured burst
    kills one engine mid-run and the manifest records the outage (`restart`). `lengths`
    (parity.lengths.OutputLengths): each request asks for its own exact output length, in the warmups too,
    and the manifest records them (`output_lengths`, and each record's `max_tokens`). `warmup_requests`
    (ours): each warm-up round is the first that many requests of its variant, the first round all at once
    and every later one under the measured arrival schedule (the measured phase's mix of prefill and decode).
    Where the path's engines are vLLM, the manifest records the kernels its JIT monitor saw compiled in the
    warm-ups and inside the timed window (`jit`, parity.jit); one inside the window fails the trial.
    `sweep` (ours, once per engine start, or per case where the confirmation's `sweep` is set:
    parity.experiments.runner): before the warm-ups, groups of 1, 2, ...,
    `sweep` short requests, one group at a time, so the engine runs decode steps of exactly each batch size (a
    burst's tail skips sizes, and vLLM's attention kernels compile a variant per batch-size class); recorded
    as `warmup_sweep`. `admission` (ours: parity.admission.BoundedSettings, placement prefix, a path whose
    `release` takes it): the measured burst runs under bounded admission against `objective`
    (parity.latency.Objective); its manifest records the admitted requests alone in `records`, each refused one
    with its reason in `refused`, and the controller's counts and learned rates in `admission`. Warm-ups admit all."""
    out = folder / f"{trial_id}.json"
    if router.placement not in path.placements:
        raise ParityError(f"the {path.name} path places requests by {' or '.join(path.placements)}, "
                          f"not {router.placement!r}")
    if restart is not None and router.facts.follows_kv_events:
        raise ParityError("the restart fault runs with the sticky router: a new engine's KV cache events would "
                          "start over under a map that still holds the dead one's")
    started = time.monotonic()
    trace = load_trace(trace_path)
    ids = [r.id for r in trace.requests]
    wanted = None if lengths is None else lengths.draw(len(ids))
    own = {} if wanted is None else {"lengths": wanted}  # a path that predates lengths is called as before
    warm_count = len(ids) if warmup_requests is None else min(warmup_requests, len(ids))
    warm_own = {} if wanted is None else {"lengths": wanted[:warm_count]}
    paced = lambda round_index: warmup_requests is not None and round_index > 1  # noqa: E731 (the study's: all at once)
    since = began = time.time()  # the wall clock: the engines stamp their JIT records with it (parity.jit)
    with path.trial(trial_id, router):
        swept = decode_sweep(path, trace_path, ids, router, sweep, log) if sweep else None
        for round_index in range(1, warmup_rounds + 1):
            warm = load_trace(trace_path, f"warmup{round_index}")
            with client_heap_still():
                burst = path.release(list(warm.prompts[:warm_count]), ids[:warm_count], router.make(path.shards),
                                     schedule if paced(round_index) else Schedule(), **warm_own)
            log(f"  warmup {round_index}: {warm_count} requests in {burst.duration_s:.2f} s"
                + (f" (paced, {schedule.kind}" + (f" {schedule.rate:g}/s)" if schedule.rate else ")")
                   if paced(round_index) else ""))
        if router.facts.models_cache and path.cache_tokens:  # its map sized from the engine's cache
            router = dataclasses.replace(router, cache_tokens=path.cache_tokens)
        routed = router.make(path.shards)
        if admission is not None:  # over the router that books each shard's work (the Controller says so otherwise)
            from parity.admission import Controller
            from parity.latency import Objective

            own["admission"] = Controller(routed, admission, objective or Objective())
        events = path.events if routed.follows_kv_events else None
        if events is not None:  # the map follows the engines, from what the warmups left in them on
            events.settle()
            routed.follow(events.changes)
            routed.sync()
            counted = events.mark()  # the events so far: the trial's own are counted from here
        jit_logs = path.jit_logs()
        window_start = time.time()
        with client_heap_still():
            burst = path.release(list(trace.prompts), ids, routed, schedule, restart, **own)
        compiled = jit.window(jit_logs, since, window_start, time.time()) if jit_logs else None
        if compiled and compiled["measured"]:
            log(f"  {len(compiled['measured'])} kernel compilations inside the timed window: "
                f"{', '.join(sorted(set(compiled['measured'])))}")
        if routed.observes:  # the router's expected hits beside the engine's, in its stats
            routed.observe([c.cached_tokens for c in burst.completions])
        kv_events = None
        if events is not None:
            events.settle()
            events.check()  # expected events and none came (or only what could not be read): the trial fails
            if unreadable := events.unreadable():  # followed, but not all of it: said here, and in the manifest
                log(f"  KV events: {unreadable}")
            routed.sync()
            kv_events = events.stats(counted) | {"router_held_blocks": routed.stats()["held_blocks"]}
        if routed.models_cache and routed.overflowed:
            log(f"  the prefix router's map outgrew the engine's cache ({routed.cache_tokens:,} tokens): "
                f"{routed.stats()['evicted_blocks']} blocks forgotten")
        described = path.describe(burst)
    arrivals = None if schedule.kind == "burst" else [burst.release_s + t for t in schedule.offsets(len(ids))]
    records = request_records(trace, burst.completions, burst.placements, input_hashes=burst.input_hashes,
                              arrivals=arrivals, lengths=wanted, refused=burst.refused)
    config = {"path": path.name, "placement": router.placement, "revision_salt": router.revision,
              "warmup_rounds": warmup_rounds, **described.config}
    extra = {**burst.extra, **described.extra, "router": routed.stats(), "schedule": schedule.describe(len(ids))}
    if kv_events is not None:
        extra["kv_events"] = kv_events
    if admission is not None:
        extra["refused"] = refused_records(trace, burst.refused, arrivals)
    if compiled is not None:
        extra["jit"] = compiled
    if (reserved := cpus.record(began)) is not None:  # the engine cores this trial ran on, not earlier trials'
        extra["cpus"] = reserved
    if swept is not None:
        extra["warmup_sweep"] = swept
    if lengths is not None:
        extra["output_lengths"] = lengths.describe(len(ids))
    doc = trial_manifest(trial_id=trial_id, experiment=experiment, system=path.name, engine=described.engine,
                         trace=trace, config=config, records=records, release_s=burst.release_s, gpus=described.gpus,
                         manifest_path=out, extra=extra | ({"ran_with": ran_with} if ran_with is not None else {}))
    doc["verdict"] = check_trial(doc, trace)
    write_manifest(out, doc)  # schema-checked first: a path that describes its trial wrongly writes nothing
    verdict = doc["verdict"]
    log(f"{trial_id}: {doc['timing']['requests_per_s']:.3f} req/s ({'simulated' if doc['simulated'] else 'measured'}), "
        f"cached {cached_share(records):.2%}" + (f", {len(burst.refused)} refused" if admission is not None else "")
        + f", {verdict['status']}" + "".join(f"\n  {r}" for r in verdict["reasons"])
        + f"  [{time.monotonic() - started:.0f} s]")
    return doc


@contextlib.contextmanager
def client_heap_still():
    """No collection of this (the client's) heap inside a release: collected just before, paused during.

    A full collection of a client that holds a run's traces and records takes tens of milliseconds (82 ms
    on the smoke's last pair); inside a burst it stalls submission past Flame's batch window, splitting
    every shard's batch. The engines and Flame workers are other processes: their collection is untouched.
    """
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def summary(doc: dict, manifest: Path) -> dict:
    """One line of a run's summary.jsonl (a log to read at a glance, not evidence): the trial's config and outcome."""
    return {**doc["config"], "trial": doc["trial_id"], "experiment": doc["experiment"], "system": doc["system"],
            "engine": doc["engine"]["name"], "trace": doc["trace_name"], "trace_sha256": trace_of(manifest, doc).sha256,
            "gpus": [g["uuid"] for g in doc["gpus"]], "requests": len(doc["records"]),
            "duration_s": doc["timing"]["duration_s"], "requests_per_s": doc["timing"]["requests_per_s"],
            "cached_share": cached_share(doc["records"]), "simulated": doc["simulated"],
            "status": doc["verdict"]["status"], "versions": doc["versions"], "manifest": str(manifest)}


def log_summary(out_dir: Path, summary: dict) -> None:
    """One line per run in OUT/summary.jsonl: a log to read at a glance, not a manifest.

    A failed write (a full disk) is cut back off, so the log never ends in half a line.
    """
    path = out_dir / "summary.jsonl"
    line = memoryview((json.dumps(summary, sort_keys=True) + "\n").encode("utf-8"))
    with path.open("ab", buffering=0) as log:
        start = log.seek(0, os.SEEK_END)
        try:
            while line:
                line = line[log.write(line):]
        except OSError as exc:
            log.truncate(start)
            exc.filename = exc.filename or str(path)
            raise


def fits_engine(trace: Path, args: EngineArgs, lengths=None) -> Trace:
    """A trace the engine can serve, loaded: valid, and every prompt with its new tokens within max_model_len (with
    `lengths`, parity.lengths.OutputLengths: each prompt with its own answer's)."""
    loaded = load_trace(trace)
    new_tokens = args.max_tokens if lengths is None else lengths.draw(len(loaded.requests))
    check_context(loaded, args.max_model_len, new_tokens, "the engine's max_model_len")
    return loaded


def check_warmups(trace: Path, rounds: int) -> None:
    """Each warm-up variant the first `rounds` warm-ups replay, its token file loaded by hash: a missing or edited one
    failed only after the engines had started (outsiders', 2026-12-07); a missing variant is named with those there,
    the last round's first (too many rounds: the one asked for that the trace lacks)."""
    for round_index in range(rounds, 0, -1):
        load_trace(trace, f"warmup{round_index}")


# ---- what a trial ran with, and whether one on disk is kept ------------------------------------

# Everything that can change a trial's result; a kept trial ran with the same value of each. A trial
# records them as `ran_with`; the trace, engine arguments and versions are read from what the run
# itself recorded. The trace hash covers its tokens; engine_args holds the model, revision,
# load_format and max_model_len; sim_params is the simulator file's content, not its path.
RESULT_SETTINGS = ("trace", "engine", "engine_args", "sim_params", "warmup_rounds", "gpus", "cluster",
                   "flame_binaries", "placement", "flame", "load", "versions")
# Ours, recorded only where set, each with its value when unset (as the study ran, and as every trial made before it)
SET_ONLY = {"engine_cpus": 0}
STUDY_LOAD = {"schedule": {"kind": "burst"}, "stream": False}  # what a trial recorded before `load` was: a burst
_UNRECORDED = object()  # a setting the trial does not record: never equal to a wanted value


def sim_params_sha256(backend) -> str | None:
    """SHA-256 of the simulator parameter file the engine will load (the default one when none is named)."""
    if not backend.simulated:
        return None
    from parity.engine.sim import DEFAULT_PARAMS

    path = Path(backend.sim_params) if backend.sim_params else DEFAULT_PARAMS
    return sha256_file(path) if path.is_file() else None


def flame_binaries_sha256(backend) -> dict[str, str] | None:
    """SHA-256 of each real Flame binary the cluster will start; None for the stand-in or when they are missing."""
    if backend.cluster != "flame":
        return None
    from parity.flame.cluster import find_binaries

    try:
        return {name: sha256_file(path) for name, path in sorted(find_binaries(backend.flame_bin_dir).items())}
    except ParityError:
        return None  # the run itself says what is missing


def ran_with(backend, gpus: list[str], trace: Path, *, placement: str | None, flame=None,
             flame_binaries: dict | None = None, load: dict | None = None, args=None) -> dict:
    """RESULT_SETTINGS as a trial of `trace` on `backend` (parity.backend.Backend) would run now;
    `flame`: the Flame trial's FlameSettings, else None."""
    values = {"trace": sha256_file(trace), "engine": backend.engine, "engine_args": (args or backend.args()).to_dict(),
              "sim_params": sim_params_sha256(backend), "warmup_rounds": backend.warmup_rounds, "gpus": list(gpus),
              "cluster": backend.cluster if flame else None, "flame_binaries": flame_binaries if flame else None,
              "placement": placement, "flame": flame.to_dict() if flame else None,
              "load": recorded_load(load), "versions": package_versions(),
              "engine_cpus": backend.reserved_engine_cpus}
    return {name: values[name] for name in RESULT_SETTINGS} | \
        {name: values[name] for name, unset in SET_ONLY.items() if values[name] != unset}


def recorded_load(load: dict | None) -> dict:
    """A case's load (plan.Case.load) as its trial records it in ran_with: the burst's settings left out (as a study
    trial's); what `experiments.derive` holds a trial's recorded load to."""
    if load is None or load == {"schedule": Schedule().to_dict(), "stream": False}:
        return STUDY_LOAD
    return load


def stale(doc: dict, wanted: dict) -> str | None:
    """Which of RESULT_SETTINGS a finished trial ran with other values of than `wanted`, else None."""
    recorded = doc.get("ran_with")
    if not isinstance(recorded, dict):
        return "it does not record what it ran with (made before parity recorded it)"
    recorded = {"load": STUDY_LOAD} | SET_ONLY | recorded | {"trace": doc["trace"]["sha256"],
                                                             "engine_args": doc["engine"]["args"], "versions": doc["versions"]}
    wanted = SET_ONLY | wanted
    changed = []
    for name in (*RESULT_SETTINGS, *SET_ONLY):
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
    """Trial manifest or cleanup receipt (absolute path) -> (recording manifest, SHA-256) for every earlier record of it.

    An earlier run's OUT/experiment.json names each case's trial and each cleanup receipt by hash, and each
    OUT/pairs/*.json its two sides; a file that cannot be read records nothing.
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
            refs += doc.get("cleanup", []) if isinstance(doc.get("cleanup"), list) else []
        elif doc.get("kind") == "pair":
            refs = [doc.get(side, {}).get("manifest") for side in ("reference", "candidate")]
        else:
            continue
        for ref in refs:
            if is_file_reference(ref) and isinstance(ref["path"], str):
                trial = os.path.abspath(manifest.parent / ref["path"])
                out.setdefault(trial, []).append((manifest, ref["sha256"]))
    return out


def changed_receipts(recorded: dict[str, list[tuple[Path, str]]], cleanup_dir: Path) -> dict[str, str]:
    """Cleanup receipt name (its file's stem: a trial id, a shared start, `flame-cluster`) -> why it no longer is what
    an earlier run recorded (`recorded_hashes`: changed, or gone). A rerun linked whatever was on disk, so a forged
    or deleted receipt passed `parity validate` once the run had written its manifest again (an outsider's,
    2026-12-07): the cases whose teardown it speaks for run again, and their new receipts replace it."""
    changed = {}
    for receipt, records in recorded.items():
        path = Path(receipt)
        if path.parent != Path(os.path.abspath(cleanup_dir)):
            continue
        for manifest, sha256 in records:
            if not path.is_file():
                changed[path.stem] = f"its cleanup receipt {path} is gone since {manifest} recorded it"
            elif (actual := sha256_file(path)) != sha256:
                changed[path.stem] = (f"its cleanup receipt {path} changed after {manifest} recorded it (SHA-256 "
                                      f"{actual}, recorded {sha256})")
    return changed


SWEEP_PROMPT_TOKENS = 32  # short enough that a whole group prefills in one engine step


def decode_sweep(path, trace_path: Path, ids: list[str], router: RouterSettings, groups: int, log) -> dict:
    """Groups of 1..`groups` requests of the first SWEEP_PROMPT_TOKENS tokens of the first warm-up variant's
    prompts, one group at a time, all at once: each group prefills in one step, then decodes as exactly that many
    sequences; what it ran, for the manifest."""
    warm = load_trace(trace_path, "warmup1")
    prompts = [p[:SWEEP_PROMPT_TOKENS] for p in warm.prompts]
    groups = min(groups, len(prompts))
    began, group_s = time.monotonic(), []
    with client_heap_still():
        for size in range(1, groups + 1):
            burst = path.release(prompts[:size], ids[:size], router.make(path.shards), Schedule())
            group_s.append(round(burst.duration_s, 4))
    duration = time.monotonic() - began
    log(f"  decode sweep: groups of 1 to {groups} requests of {SWEEP_PROMPT_TOKENS} tokens in {duration:.2f} s "
        f"(the groups' own time {sum(group_s):.2f} s)")
    return {"groups": groups, "prompt_tokens": SWEEP_PROMPT_TOKENS, "duration_s": round(duration, 3), "group_s": group_s}


def must_run(path: Path, wanted: dict, recorded: dict[str, list[tuple[Path, str]]]) -> str | None:
    """Why the trial whose manifest is `path` must run (again), or None to keep it as it is."""
    if not path.exists():
        return "not run yet"
    try:
        doc = read_trial(path)
    except ParityError as exc:  # not JSON, not a trial, schema problems, a rate its records do not give
        return str(exc)
    if doc["verdict"]["status"] == "pending":
        return "the trial on disk was never checked"
    if doc.get("trial_id") != path.stem:  # a manifest copied under another case's name: one measurement, counted twice
        return f"the trial on disk is {doc.get('trial_id')!r}, not {path.stem!r}"
    if why := gpus_unnamed(doc):
        return f"the trial on disk is not what its records give: {why}"
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
