"""Runs: a trace on the engine alone, on the standalone path, on the Flame path, and the study's experiments;
and the simulator's calibration from real runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from parity import run_lock
from parity.cli import options
from parity.cli.app import echo, main, served
from parity.cli.errors import friendly_errors
from parity.engine import ENGINES, FAMILIES
from parity.errors import ParityError
from parity.backend import Backend
from parity.flame.settings import APIS, FlameSettings
from parity.routing import FLAME, SHARDED
from parity.workflow_config import experiment_names, experiment_settings


@main.group("engine")
def engine_group():
    """The engine alone: a trace handed straight to sim, vllm-sync or vllm-async."""


@engine_group.command("run")
@click.option("--engine", "kind", type=click.Choice(ENGINES), default="sim", show_default=True)
@options.traces("Trace manifest (repeat for several; one engine serves them all, in order).")
@click.option("--batch", "batches", type=click.IntRange(min=0, max=2**63 - 1), multiple=True, default=(0,), show_default=True,
              help="Hand prompts over in batches of N; 0 = all at once. Repeat to run each trace at each size.")
@options.warmup_rounds
@options.engine_options
@options.sim_params
@click.option("--sim-mode", type=click.Choice(APIS), default="sync", show_default=True)
@click.option("--clock", type=click.Choice(["virtual", "paced"]), default="virtual", show_default=True)
@options.backend("The engine's settings whole, as the experiments give them (JSON or a YAML file): model, load "
                 "format, engine args, simulator file, warmup rounds; recorded as what each trial ran with. "
                 "Replaces the options it covers.")
@options.experiment("engine", help="Recorded in each trial manifest.")
@options.out_dir()
@friendly_errors
def engine_run(kind, traces, batches, warmup_rounds, model, load_format, engine_args, sim_params, sim_mode,
               clock, backend_text, experiment, out_dir):
    """Warm up, then measure each trace on one engine; a trial manifest per run, a line in summary.jsonl."""
    from parity import trial
    from parity.routing import RouterSettings
    from parity.engine import make_engine
    from parity.gpus import visible_simulated
    from parity.paths.engine import EnginePath

    backend, args, warmup_rounds, sim_params = options.engine_settings(kind, backend_text, model, load_format,
                                                                       engine_args, warmup_rounds, sim_params)
    fits(traces, args, warmup_rounds)
    echo(f"starting engine {kind} ...")
    # no run lock here: the offline limit runs its shards as engine runs into one trials folder at once, each
    # writing only its own trial files (its experiment run holds the folder above)
    simulator = options.simulator(kind, sim_params, clock, sim_mode)
    if simulator:  # the simulated GPU this process was given, as vLLM's is (`parity.gpus.visible_simulated`)
        simulator["gpu_uuid"] = visible_simulated(os.environ)
    with make_engine(kind, args, **simulator) as engine:
        for trace in traces:
            for batch in batches:
                trial_id = f"{kind}-{trace.stem}" + (f"-b{batch}" if batch else "")
                echo(f"{trial_id}:")
                path = EnginePath(engine, batch or None)
                wanted = None if backend is None else trial.ran_with(backend, list(backend.gpus), trace,
                                                                     placement=RouterSettings().placement)
                doc = trial.run(path, trace, out_dir, trial_id=trial_id, experiment=experiment,
                                warmup_rounds=warmup_rounds, ran_with=wanted, log=echo)
                trial.log_summary(out_dir, trial.summary(doc, out_dir / f"{trial_id}.json"))


def fits(traces, args, warmup_rounds: int) -> None:
    """Each trace loaded and checked, and served whole by the engine's context, with a warm-up variant for each round,
    before anything starts: an edited token file, a prompt that with its new tokens outgrows max_model_len, or more
    warm-up rounds than variants, failed only after the engines had started and warmed up (outsiders', 2026-12-07)."""
    from parity.trial import check_warmups, fits_engine

    for trace in traces:
        fits_engine(trace, args)
        check_warmups(trace, warmup_rounds)


@main.group("sim")
def sim_group():
    """The simulator engine: calibration from real runs."""


@sim_group.command("calibrate")
@click.option("--measurements", type=click.Path(path_type=Path, exists=True), required=True,
              help="Measured runs (JSON) from real vLLM.")
@click.option("--traces", type=click.Path(path_type=Path, exists=True), required=True,
              help="Folder with the trace manifests the measurements used.")
@click.option("--base", type=click.Path(path_type=Path), default=None, help="Starting parameter file.")
@click.option("--out", type=click.Path(path_type=Path), required=True, callback=options.out_file,
              help="Fitted parameter file (YAML).")
@friendly_errors
def sim_calibrate(measurements, traces, base, out):
    """Fit the simulator's step-time model to measured runs; print each run's prediction error."""
    from parity.engine.calibrate import calibrate, write_params
    from parity.engine.sim import SimParams

    fitted, report = calibrate(measurements, traces, SimParams.load(base))
    write_params(out, fitted, report, measurements)
    for r in report:
        click.echo(f"{r['engine']:<11} {r['trace']:<10} batch={str(r['batch']):<5} measured {r['measured_rps']:7.3f} "
                   f"predicted {r['predicted_rps']:7.3f} req/s  error {r['error']:+.1%}"
                   f"{'  (fitted)' if r['fitted_on'] else ''}")
    click.echo(f"wrote {out}")


@main.group("standalone")
def standalone_group():
    """The standalone path: pinned replicas (`vllm serve`, or simulator servers) behind HTTP, a routing client."""


@standalone_group.command("run")
@click.option("--replicas", "kind", type=click.Choice(options.REPLICA_KINDS), default="sim", show_default=True,
              help="sim: simulator servers (CPU); vllm: `vllm serve` per GPU.")
@options.gpus("GPU UUID per replica (repeat); default sim-0, sim-1.")
@click.option("--placement", "placements", type=click.Choice(SHARDED), multiple=True,
              default=("alternating", "sticky"), show_default=True,
              help="Which router places requests (repeat for several): the base policy, the study's, or ours.")
@options.traces()
@options.repeats(1, help="Trials per placement and trace, interleaved.")
@options.warmup_rounds
@options.experiment("locality")
@options.engine_options
@options.sim_params
@click.option("--startup-timeout", default=Backend.startup_timeout_s, show_default=True,
              type=options.Finite(min=0, min_open=True), help="Seconds to wait for /health.")
@options.out_dir()
@friendly_errors
def standalone_run(kind, gpus, placements, traces, repeats, warmup_rounds, experiment, model, load_format,
                   engine_args, sim_params, startup_timeout, out_dir):
    """Start replicas once, run every placement x trace (x repeats, rotating the order), tear down with a receipt."""
    from parity.experiments.runner import run_trials
    from parity.paths.standalone import StandalonePath

    gpus = list(gpus) or (["sim-0", "sim-1"] if kind == "sim" else [])
    args = options.engine_args(model, load_format, engine_args)
    fits(traces, args, warmup_rounds)
    path = StandalonePath(kind, gpus, args, out_dir / "logs", startup_timeout_s=startup_timeout, sim_params=sim_params,
                          receipt_path=out_dir / "cleanup-replicas.json")
    with run_lock.holding(out_dir):
        echo(f"starting {len(gpus)} {kind} replicas on {', '.join(gpus)} ...")
        run_trials(path, placements, traces, repeats, experiment, warmup_rounds, out_dir, log=echo)


@standalone_group.command("sim-server")
@click.option("--port", type=click.IntRange(1, 65535), required=True)
@click.option("--gpu-uuid", default="sim-0", show_default=True)
@options.sim_params
@click.option("--kv-events", metavar="ENDPOINT", default=None,
              help="Publish KV cache events to this subscriber endpoint (tcp://127.0.0.1:PORT), as vLLM does.")
@friendly_errors
def standalone_sim_server(port, gpu_uuid, sim_params, kv_events):
    """One simulator replica speaking vLLM's /v1/completions subset on 127.0.0.1 (a replica set starts it)."""
    from parity.standalone.sim_server import serve

    served()
    if kv_events and not kv_events.startswith("tcp://127.0.0.1:"):
        raise click.BadParameter("a loopback endpoint, tcp://127.0.0.1:PORT", param_hint="--kv-events")
    serve(port, gpu_uuid, sim_params, kv_events=kv_events)


@main.group("flame")
def flame_group():
    """The Flame path: a Flame service embedding the engine, fed by a batching client."""


@flame_group.command("worker")
@friendly_errors
def flame_worker():
    """Serve the parity FlameService on $FLAME_INSTANCE_ENDPOINT (Flame's executor starts this)."""
    from parity.flame.service import main as serve

    served()
    serve()


@flame_group.command("run")
@options.cluster("standin", help="standin: the in-process stand-in (CPU tests, smoke); flame: real Flame v0.6.0 "
                                 "binaries.")
@options.flame_bin_dir
@options.gpus("GPU UUID per worker (repeat); default sim-0, sim-1.")
@click.option("--placement", "placements", type=click.Choice(FLAME), multiple=True,
              default=("sticky",), show_default=True)
@options.traces()
@options.flame_settings
@click.option("--engine", type=click.Choice(FAMILIES), default="sim", show_default=True,
              help="The engine the workers build: the simulator, or vLLM (through --api).")
@options.sim_params
@options.engine_options
@options.warmup_rounds
@options.repeats(1)
@options.experiment("locality")
@options.network("netns: run the whole job in a network namespace with only loopback (real Flame listens on "
                 "0.0.0.0, unauthenticated); host: do not; auto: netns for real Flame where the platform allows.")
@options.out_dir()
@friendly_errors
def flame_run(cluster, flame_bin_dir, gpus, placements, traces, batch_limit, window_ms, budget_mib, api, compress,
              gc_freeze, order, engine, sim_params, model, load_format, engine_args, warmup_rounds, repeats,
              experiment, network, out_dir):
    """Start a cluster, register one application per GPU, run each placement x trace, clean up."""
    from parity import netns
    from parity.experiments.runner import run_trials
    from parity.paths.flame import FlamePath, cluster as flame_cluster

    netns.contain(network, needed=cluster == "flame", log=echo)  # re-executes the command when it contains it
    settings = FlameSettings(batch_limit=batch_limit, window_ms=window_ms, budget_mib=budget_mib, api=api,
                             compress=compress, gc_freeze=gc_freeze, order=order)
    simulated = engine == "sim"
    gpus = list(gpus) or (["sim-0", "sim-1"] if simulated else [])
    if not gpus:
        raise ParityError("name the GPUs with --gpu UUID (one per worker)")
    args = options.engine_args(model, load_format, engine_args)
    fits(traces, args, warmup_rounds)
    with run_lock.holding(out_dir), flame_cluster(cluster, gpus, out_dir, simulated=simulated, bin_dir=flame_bin_dir,
                                                  receipt_path=out_dir / "cleanup-flame.json", log=echo) as running:
        path = FlamePath(running, gpus, settings, engine=engine,
                         engine_args=args,
                         sim_params=str(sim_params) if sim_params else None)
        run_trials(path, placements, traces, repeats, experiment, warmup_rounds, out_dir, log=echo)


@main.group("experiment")
def experiment_group():
    """The study's experiments (locality, admission, confirmation, gc, the offline limit) and ours (routing,
    sustained)."""


@experiment_group.command("run")
@click.argument("name", type=click.Choice(experiment_names()))
@options.traces("Trace manifest (repeat: no-reuse, reuse).")
@click.option("--backend", "backend_text", required=True,
              help="Where to run: JSON, or a YAML file (engine sim|vllm, gpus, cluster standin|flame, model, ...).")
@click.option("--settings", "settings_text", default="{}", show_default=True,
              help="The experiment's settings as JSON (the config's experiments.NAME).")
@click.option("--deadline", type=options.Finite(), default=None, envvar="PARITY_DEADLINE", show_envvar=True,
              help="Epoch seconds: begin no case predicted to end after it (a device call's time limit); the "
                   "trials finished before it are kept for the rerun.")
@options.out_dir()
@friendly_errors
def experiment_run(name, traces, backend_text, settings_text, deadline, out_dir):
    """Run one experiment on fresh engines per case; trial manifests, checks, pairs, OUT/experiment.json."""
    from parity import cpus, netns
    from parity.experiments.plan import runs_cases
    from parity.experiments.runner import run_named

    if deadline is not None and deadline <= time.time():  # no case could begin: refused before a folder is made
        raise click.BadParameter(f"{deadline:.0f} is already past (epoch seconds; now {time.time():.0f})",
                                 param_hint="'--deadline'")
    backend = Backend.parse(backend_text)
    # Real Flame listens on 0.0.0.0: contain the whole job first (this may re-execute the command).
    netns.contain(backend.network, needed=backend.cluster == "flame" and runs_cases(name), log=echo)
    settings = experiment_settings(name, settings_text)
    reserve = backend.reserved_engine_cpus
    if backend.engine_cpus and not reserve:
        echo(f"engine_cpus {backend.engine_cpus}: the simulator has no engine core process; nothing reserved")
    with run_lock.holding(out_dir), cpus.isolated(reserve, len(backend.gpu_uuids()) if reserve else 0, log=echo):
        written = run_named(name, list(traces), backend, out_dir, settings=settings, log=echo, deadline=deadline)
        click.echo(f"wrote {written}")
