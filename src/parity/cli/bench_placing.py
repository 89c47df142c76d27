"""`parity bench` on placing requests: the router's and the admission controller's cost per request, and the
routers compared on traffic the study did not send (the commands join the `bench` group of cli.bench)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from parity.cli import options
from parity.cli.app import echo
from parity.cli.bench import MAX_SHARDS, bench, save
from parity.cli.errors import friendly_errors
from parity.errors import ParityError


MAX_TOKENS = 2**26  # the router bench's prompts, all requests together: 256 MiB of token IDs
MAX_ADMISSION_REQUESTS = 2**14  # the admission bench's requests (an outsider's 100,000 ran out of memory)


@bench.command("router")
@click.option("--requests", "num_requests", default=512, show_default=True, type=click.IntRange(min=1, max=MAX_TOKENS))
@click.option("--prompt-tokens", default=8000, show_default=True, type=click.IntRange(min=17, max=MAX_TOKENS),
              help="Tokens per prompt: a shared document and a 16-token question.")
@click.option("--shards", default=2, show_default=True, type=click.IntRange(min=1, max=MAX_SHARDS),
              help="Shards to route over.")
@options.repeats(5)
@click.option("--gc", "collect", is_flag=True, help="Leave Python's garbage collector running while timing "
              "(default: paused, as timeit does).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@friendly_errors
def bench_router(num_requests, prompt_tokens, shards, repeats, collect, as_json):
    """Each router's cost per request (p50, p99, mean), and its ratio to hashing the first 1,024 tokens once."""
    from parity.bench import router

    if num_requests * prompt_tokens > MAX_TOKENS:
        raise ParityError(f"--requests {num_requests} of --prompt-tokens {prompt_tokens} are more than the "
                          f"{MAX_TOKENS:,} tokens the bench holds at once")
    result = router.run(num_requests=num_requests, prompt_tokens=prompt_tokens, num_shards=shards, repeats=repeats,
                        collect=collect)
    if as_json:
        click.echo(json.dumps(result, indent=1, sort_keys=True))
        return
    for line in router.summary_lines(result):
        click.echo(line)


@bench.command("admission")
@click.option("--requests", "num_requests", default=2048, show_default=True,
              type=click.IntRange(min=4, max=MAX_ADMISSION_REQUESTS),  # ~37 KB each: 16,384 hold about 600 MB
              help="Requests routed and admitted (each an 8,000-token prompt held in memory).")
@click.option("--load", default=1.5, show_default=True, type=options.Finite(min=0.01, max=100),
              help="Offered work over what the simulated engines serve (above 1: some requests are refused; "
                   "far outside 0.01-100 the simulated clock's gaps lose the prefill times to rounding).")
@options.repeats(3)
@options.json_out
@friendly_errors
def bench_admission(num_requests, load, repeats, out):
    """Bounded admission's cost per request (CPU, the controller itself), as a ratio to the prefix router's,
    timed side by side in one run, with reroute off and on."""
    from parity.bench import admission

    result = admission.run(num_requests=num_requests, load=load, repeats=repeats, log=echo)
    save(out, result)
    for line in admission.summary_lines(result):
        click.echo(line)  # the result, on stdout (progress goes to stderr)


@bench.command("routing")
@click.option("--family", "only", multiple=True,
              type=click.Choice(["study-reuse", "shared-head", "zipf", "working-set", "shards", "conversation",
                                 "tenants", "hot-doc"]),  # routing.FAMILIES
              help="Run only this workload family (repeat); default every one.")
@click.option("--quick", is_flag=True, help="Shorter prompts and fewer cases (seconds, for a first look).")
@click.option("--case", "cases", multiple=True, metavar="TEXT",
              help="Run only the cases whose name contains this (repeat; with --family, within it), "
                   "e.g. --case '8 sh'; with --explain, each selected family's first such case.")
@click.option("--sim-params", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Simulator parameter file (default: the calibrated H200 one).")
@click.option("--trace-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Instead of the families: a Mooncake request trace (JSONL, parity trace-mooncake's input).")
@click.option("--trace-limit", type=click.IntRange(min=1), default=None,
              help="With --trace-file: its first this many requests that fit the context.")
@click.option("--shards", type=click.IntRange(min=1, max=MAX_SHARDS), default=2, show_default=True,
              help="With --trace-file: shards to place it over.")
@click.option("--explain", type=click.IntRange(min=1), default=None,
              help="Instead of the bench: the prefix router's first this many decisions on each selected family's "
                   "first case, one line each.")
@options.json_out
@friendly_errors
@options.out_apart_from("sim_params", "trace_file")
def bench_routing(only, quick, cases, sim_params, trace_file, trace_limit, shards, explain, out):
    """Routers on traffic the study did not send (simulated): the prefix router against alternating, the
    study's sticky router and a hindsight placement, per workload family; and its cost per request."""
    from parity.bench import routing
    from parity.engine.sim import SimParams

    _refuse_unused_options(trace_file, explain)
    if explain:
        params = SimParams.load(sim_params)
        firsts: dict = {}  # each family's first chosen case
        for w in routing.select(quick, set(only) or None, cases):
            firsts.setdefault(w.family, w)
        for w in firsts.values():
            for line in routing.explain(w, params, explain):
                click.echo(line)
        return
    if trace_file:
        from parity.bench import mooncake

        result = mooncake.run(SimParams.load(sim_params), trace_file, shards=shards, limit=trace_limit,
                              progress=lambda line: click.echo(line, err=True))  # stdout keeps the summary alone
        for line in mooncake.summary_lines(result):
            click.echo(line)
        save(out, result)
        return
    result = routing.run(SimParams.load(sim_params), quick=quick, only=set(only) or None, cases=cases,
                         log=echo)
    for line in routing.summary_lines(result):
        click.echo(line)
    save(out, result)


def _refuse_unused_options(trace_file, explain) -> None:
    """`bench routing` runs one of three things (the families, a Mooncake trace, --explain): an option the chosen
    one would ignore is a usage error, not dropped without a word."""
    ctx = click.get_current_context()
    passed = {name for name in _FLAGS if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}
    if trace_file is not None:
        unused, mode = passed & {"only", "quick", "cases", "explain"}, "--trace-file"
    elif explain:
        unused, mode = passed & {"trace_limit", "shards", "out"}, "--explain"
    else:
        unused, mode = passed & {"trace_limit", "shards"}, "the families' bench"
    if unused:
        raise click.UsageError(f"{', '.join(sorted(_FLAGS[name] for name in unused))}: not used with {mode} "
                               "(--trace-file takes --trace-limit and --shards; the families and --explain take "
                               "--family, --quick and --case; --explain writes no --out)")


_FLAGS = {"only": "--family", "quick": "--quick", "cases": "--case", "trace_limit": "--trace-limit",
          "shards": "--shards", "out": "--out", "explain": "--explain"}
