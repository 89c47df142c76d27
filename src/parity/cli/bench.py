"""`parity bench`: benchmarks that print a ratio measured side by side in one run. Each command parses its
options, calls its `parity.bench` module, and prints what it returns."""

from __future__ import annotations

import json
from pathlib import Path

import click

from parity import run_lock
from parity.cli import options
from parity.cli.app import echo, main
from parity.cli.errors import friendly_errors, writable_folder
from parity.engine import ENGINES, FAMILIES
from parity.errors import ParityError
from parity.schedule import MIN_BURSTINESS


def save(out: Path | None, result) -> None:
    """The result as strict JSON at --out, if one was given (a number that is not finite is a bench's bug, refused:
    an outsider's `bench schedule` wrote NaN and Infinity, which JSON has not)."""
    if out:
        from parity.manifest import atomic_write_text

        try:
            text = json.dumps(result, indent=1, sort_keys=True, allow_nan=False)
        except ValueError as exc:
            raise ParityError(f"--out {out}: the result holds a number that is not finite ({exc}): not written")
        atomic_write_text(out, text + "\n")


MAX_SHARDS = 4096  # far past any node's GPUs: a bench of more only measures its own lists (--shards 10**8 ran 99 s)


@main.group("bench")
def bench():
    """Benchmarks that print a ratio measured side by side in one run."""


@bench.command("schedule")
@click.option("--rate", type=options.Finite(min=0, min_open=True), default=None,
              help="Requests/s to pace (default: ten times the sustained ladder's highest rate in --config).")
@click.option("--requests", type=click.IntRange(min=2), default=2000, show_default=True)
@click.option("--kind", type=click.Choice(["poisson", "gamma"]), default="poisson", show_default=True)
@click.option("--burstiness", type=options.Finite(min=MIN_BURSTINESS), default=1.0, show_default=True,
              help="gamma: the shape of its gaps (1: Poisson; below: burstier; their CV is 1/sqrt of it).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True)
@options.workflow_config
@options.json_out
@friendly_errors
@options.out_apart_from("config_files")
def bench_schedule(rate, requests, kind, burstiness, seed, config_files, out):
    """The load generator's own lag (actual minus scheduled send) with nothing behind it, for both senders,
    against the 1 ms p99 target; and the schedule's rate and burstiness as generated."""
    from parity.bench import schedule
    from parity.experiments.plan import check_pace, settings_of
    from parity.workflow_config import experiment_section

    if rate is None:
        rate = 10 * settings_of("sustained", experiment_section(config_files, "sustained")).highest_rate
    check_pace("--rate", rate, requests)
    result = schedule.run(rate, requests, kind, burstiness, seed, log=echo)
    save(out, result)  # first: a closed stdout loses no result
    for line in schedule.summary_lines(result):
        click.echo(line)


@bench.command("startup")
@click.option("--engine", type=click.Choice(FAMILIES), default="sim", show_default=True)
@options.cluster("standin", help="The Flame path's cluster: the CPU stand-in or real Flame v0.6.0.")
@options.flame_bin_dir
@click.option("--gpu", default="sim-0", show_default=True, help="The GPU UUID both paths start on.")
@options.repeats(3)
@options.sim_params
@options.engine_options
@options.network("netns: contain the run in a network namespace with only loopback (real Flame listens on 0.0.0.0).")
@options.workflow_config
@options.out_dir()
@friendly_errors
@options.out_apart_from("sim_params", "config_files", out="out_dir", writes=lambda kw: [kw["out_dir"] / "startup.json"])
def bench_startup(engine, cluster, flame_bin_dir, gpu, repeats, sim_params, model, load_format, engine_args,
                  network, config_files, out_dir):
    """Startup cost of each path: process start to the first served request, run 1 cold, later runs warm;
    written to OUT/startup.json."""
    from parity import netns
    from parity.bench import startup
    from parity.experiments.plan import settings_of
    from parity.workflow_config import experiment_section

    if cluster == "flame":  # before the standalone runs, not after them (N cold vLLM starts: outside pass Q)
        from parity.flame.cluster import find_binaries

        find_binaries(flame_bin_dir)
    netns.contain(network, needed=cluster == "flame", log=echo)
    args = options.engine_args(model, load_format, engine_args)
    final = settings_of("confirmation", experiment_section(config_files, "confirmation")).flame  # the study's final
    with run_lock.holding(out_dir):
        result = startup.run(engine, cluster, gpu, final, args, out_dir, repeats, bin_dir=flame_bin_dir,
                             sim_params=sim_params, log=echo)
    click.echo(startup.summary_line(result))


MAX_TASKS = 1_000_000  # `bench harvest` keeps a record of each task and round trip, so an unbounded count (outside
# pass I's nit) ran until memory ran out; ten times the default's memory phase


@bench.command("harvest")
@options.cluster("flame", help="Real Flame v0.6.0 (the point), or the CPU stand-in (said so in the output).")
@options.flame_bin_dir
@click.option("--tasks", default=100_000, show_default=True, type=click.IntRange(min=1, max=MAX_TASKS),
              help="Harvest tasks on one session while the session manager's memory is sampled.")
@click.option("--rotate-tasks", default=0, show_default=True, type=click.IntRange(min=0),
              help="Also sample it with the harvester moving to a fresh session every this many tasks (0: not).")
@click.option("--hold-ms", "holds_ms", multiple=True, type=options.Finite(min=0),
              help="A hold time to measure the harvest cycle at (repeat); default 0, 1, 5 and 20 ms.")
@click.option("--round-trips", default=500, show_default=True, type=click.IntRange(min=1, max=MAX_TASKS),
              help="Timed empty-task round trips.")
@click.option("--express", is_flag=True,
              help="Run each hold twice, side by side: as the harvest arm ran, then with Flame setting express.")
@click.option("--warmup", default=50, show_default=True, type=click.IntRange(min=0, max=MAX_TASKS),
              help="Untimed empty tasks before each timed phase.")
@click.option("--rate", default=4.0, show_default=True, type=options.Finite(min=0, min_open=True),
              help="The light stream's Poisson rate, requests/s.")
@click.option("--requests", default=40, show_default=True, type=click.IntRange(min=1), help="Requests per run.")
@options.repeats(2, help="Runs (seeds) per hold time.")
@click.option("--samples", default=50, show_default=True, type=click.IntRange(min=1),
              help="Memory samples over the tasks.")
@options.sim_params
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="The cluster's logs and receipt (default: a folder beside --out, else ./bench-harvest).")
@options.network("netns: contain the run in a network namespace with only loopback (real Flame listens on 0.0.0.0).")
@options.json_out
@friendly_errors
@options.out_apart_from("sim_params")
def bench_harvest(cluster, flame_bin_dir, tasks, rotate_tasks, holds_ms, round_trips, express, warmup, rate, requests,
                  repeats, samples, sim_params, work_dir, network, out):
    """The harvest mode's costs on Flame's task path, on the CPU (simulated engine): the empty-task round trip,
    the harvest cycle at several hold times under a light stream (admission wait, event to client), and the
    session manager's memory over many tasks on one session."""
    from parity.bench import harvest
    from parity.experiments.plan import check_pace

    from parity import netns

    check_pace("--rate", rate, requests)
    work_dir = work_dir or (out.with_name(out.stem + "-work") if out else Path("bench-harvest"))
    writable_folder(work_dir)  # before the cluster starts: /proc/x was a traceback from the GPU lock's folder
    netns.contain(network, needed=cluster == "flame", log=echo)
    result = harvest.run(cluster, work_dir, bin_dir=flame_bin_dir, tasks=tasks, holds_ms=holds_ms or harvest.HOLDS_MS,
                         round_trip_count=round_trips, warmup=warmup, rate=rate, requests=requests, repeats=repeats,
                         samples=samples, rotate_tasks=rotate_tasks, sim_params=str(sim_params) if sim_params else None,
                         save=lambda result: save(out, result), express=express, log=echo)
    for line in harvest.summary_lines(result):
        click.echo(line)

@bench.command("sim")
@click.option("--trace", type=click.Path(path_type=Path, exists=True), required=True,
              help="Trace manifest, e.g. the 256-request reuse burst.")
@options.repeats(3)
@options.json_out
@friendly_errors
@options.out_apart_from("trace")
def bench_sim(trace, repeats, out):
    """CPU time to simulate a burst in virtual time, beside the engine time it models (target < 2 s)."""
    from parity.bench import sim

    result = sim.run(trace, repeats=repeats)
    save(out, result)
    click.echo(sim.summary_line(result))


@bench.command("order")
@click.option("--engine", "kind", type=click.Choice(ENGINES), default="sim", show_default=True)
@options.traces()
@click.option("--shards", default=2, show_default=True, type=click.IntRange(min=1, max=MAX_SHARDS),
              help="Shards the sticky router splits each burst into.")
@click.option("--shard", "only", type=click.IntRange(min=0), multiple=True,
              help="Run only this shard (repeat); default every one.")
@options.repeats(2, help="Interleaved runs per shard and order.")
@options.warmup_rounds
@options.engine_options
@options.sim_params
@options.backend("The engine's settings whole (JSON or a YAML file), as the workflow gives them; replaces the "
                 "options it covers.")
@options.out_dir()
@friendly_errors
@options.out_apart_from("traces", "sim_params", out="out_dir")
def bench_order(kind, traces, shards, only, repeats, warmup_rounds, model, load_format, engine_args, sim_params,
                backend_text, out_dir):
    """One engine runs each shard in arrival and in prefix order, interleaved: the admission-order speedup."""
    from parity.bench import order
    from parity.engine import make_engine
    from parity.manifest import atomic_write_text
    from parity.trace import load_trace

    beyond = sorted(s for s in only if s >= shards)
    if beyond:
        raise ParityError(f"--shard {beyond[0]}: there are only shards 0 to {shards - 1} (--shards {shards})")
    args, warmup_rounds, sim_params = options.engine_settings(kind, backend_text, model, load_format, engine_args,
                                                              warmup_rounds, sim_params)[1:]
    order.check(traces, warmup_rounds, args)
    results = []
    with run_lock.holding(out_dir), \
            make_engine(kind, args, **options.simulator(kind, sim_params, "virtual", "async")) as engine:
        order.clear(out_dir, [load_trace(trace).name for trace in traces], log=echo)
        for trace in traces:
            results.append(order.run(engine, trace, out_dir, shards=shards, only=set(only), repeats=repeats,
                                     warmup_rounds=warmup_rounds, log=echo))
        atomic_write_text(out_dir / "order.json", json.dumps(results, indent=2) + "\n")  # first: a closed stdout
    for r in results:  # loses nothing (outside pass R)
        label = "simulated" if r["simulated"] else "measured"
        for shard in r["empty"]:
            click.echo(f"{r['trace']} shard {shard}: the sticky router sends it no request (nothing to run)")
        for row in r["shards"]:
            click.echo(f"{r['trace']} shard {row['shard']} ({row['requests']} requests, {r['engine']}): arrival "
                       f"{row['arrival_median_s']:.3f} s, prefix {row['prefix_median_s']:.3f} s, arrival/prefix "
                       f"{row['speedup']:.4f} ({label}, median of {repeats})")


@bench.command("codec")
@click.option("--trace", type=click.Path(path_type=Path, exists=True), required=True,
              help="Trace manifest, e.g. the 256-request reuse burst.")
@click.option("--batch", default=128, show_default=True, type=click.IntRange(min=1))
@options.repeats(5)
@options.json_out
@friendly_errors
@options.out_apart_from("trace")
def bench_codec(trace, batch, repeats, out):
    """Flame task inputs raw vs zlib level 1: burst bytes, and encode + decode time per batch."""
    from parity.bench import codec

    result = codec.run(trace, batch=batch, repeats=repeats)
    save(out, result)
    for line in codec.summary_lines(result):
        click.echo(line)
