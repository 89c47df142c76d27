"""The `parity` command: one thin click command per workflow step; the logic lives in the modules."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from pathlib import Path

import click

from parity import __version__
from parity.engine import ENGINES, FAMILIES, EngineArgs
from parity.errors import ParityError
from parity.affinity import POLICIES
from parity.experiments.backend import CLUSTERS, Backend
from parity.flame.admission import ORDERS
from parity.flame.settings import APIS, FlameSettings
from parity.netns import MODES as NETWORK_MODES
from parity.settings import key_values
from parity.workflow_config import check_experiment_settings, experiment_names, study_experiments

REPLICA_KINDS = ("sim", "vllm")  # parity.standalone.replicas.KINDS, without importing httpx to build the options
FLAME_PLACEMENTS = ("global", "sticky", "prefix")  # parity.paths.flame.FlamePath.placements
_echo = functools.partial(click.echo, err=True)  # progress goes to stderr; results to stdout


# OSErrors that are about the user's machine, not a bug in parity: a full disk, a read-only folder, a
# file where a folder belongs. Any other OSError still shows its traceback.
ENVIRONMENT_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.EEXIST: "exists and is not a folder",  # parity's mkdirs all pass exist_ok: a file is in the way
    errno.EISDIR: "is a folder, not a file",
    errno.ENAMETOOLONG: "file name too long",
}


def environment_error(exc: OSError) -> str | None:
    """The one-line message for an OSError of the user's environment, naming the path; else None."""
    reason = ENVIRONMENT_ERRORS.get(exc.errno)
    if reason is None:
        return None
    where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    return reason if where is None else f"{os.fsdecode(where)}: {reason}"


def writable_file(path: Path) -> None:
    """A file a command writes only at its end, checked at its start, so a long run is not refused after it
    ran: not a folder, and no file where a folder of its path belongs (missing folders are made later)."""
    if path.is_dir():
        raise ParityError(f"{path}: {ENVIRONMENT_ERRORS[errno.EISDIR]}")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ParityError(f"{folder}: {ENVIRONMENT_ERRORS[errno.ENOTDIR]}")


def friendly_errors(command):
    """Turn a ParityError, or an OSError of the environment, into a one-line `Error: ...`, exit 1.

    Everything else (a bug) keeps its traceback.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ParityError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            message = environment_error(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="parity")
def main():
    """Reproduce "Bringing Flame Serving Close to Standalone vLLM": traces, runs, checks, report."""


@main.command("smoke-inputs")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Directory for corpus.jsonl and tokenizer/.")
@click.option("--articles", default=1200, show_default=True, type=click.IntRange(min=1),
              help="Synthetic articles to generate.")
@click.option("--seed", default=0, show_default=True, help="Seed of the article generator.")
@click.option("--vocab-size", default=8192, show_default=True, help="BPE vocabulary size.")
@friendly_errors
def smoke_inputs_cmd(out_dir: Path, articles: int, seed: int, vocab_size: int):
    """Generate the offline smoke inputs: a synthetic news corpus and a BPE tokenizer trained on it."""
    from parity import smoke_inputs

    if vocab_size < smoke_inputs.MIN_VOCAB:  # checked before the corpus is written
        raise click.BadParameter(f"{vocab_size} is smaller than the {smoke_inputs.MIN_VOCAB} bytes and special tokens.",
                                 param_hint="'--vocab-size'")
    corpus = smoke_inputs.write_corpus(out_dir / "corpus.jsonl", articles=articles, seed=seed)
    tokenizer = smoke_inputs.train_tokenizer(corpus, out_dir / "tokenizer", vocab_size=vocab_size)
    click.echo(f"wrote {corpus} ({articles} synthetic articles) and {tokenizer}/tokenizer.json", err=True)


@main.command("trace")
@click.option("--corpus", type=click.Path(path_type=Path), required=True, help="JSONL of news articles.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path), required=True,
              help="Hugging Face tokenizer directory (with tokenizer.json).")
@click.option("--name", required=True, help="Trace name, e.g. no-reuse or reuse.")
@click.option("--documents", type=int, required=True, help="Distinct document prefixes.")
@click.option("--questions", type=int, required=True, help="Questions per document.")
@click.option("--prefix-tokens", default=8000, show_default=True, help="Exact document prefix length.")
@click.option("--seed", default=0, show_default=True, help="Seed of the burst order.")
@click.option("--head-tokens", default=0, show_default=True, type=click.IntRange(min=0),
              help="A head of this many tokens shared by every document (a system prompt), within the prefix.")
@click.option("--zipf", default=0.0, show_default=True, type=click.FloatRange(min=0, max=4),
              help="Hot documents: each request's document drawn from a Zipf law of this exponent (0: uniform).")
@click.option("--blocks", default=1, show_default=True, type=click.IntRange(min=1),
              help="This many blocks of the shape above, one after another, each block's prefixes its own "
                   "(the first block token-shifted): a long rung of the same shape.")
@click.option("--warmup-shift", "warmup_shifts", type=int, multiple=True, default=(1009, 2027),
              show_default=True, help="Token-ID shift of each warmup round (repeat the option).")
@click.option("--pack/--no-pack", "pack_articles", default=True, show_default=True,
              help="Join consecutive articles to fill a prefix, or take one article per document.")
@click.option("--text-field", default="article", show_default=True, help="JSONL field holding the text.")
@click.option("--corpus-origin", default="other", show_default=True,
              help="Recorded in the manifest: synthetic-news, cnn_dailymail, ...")
@click.option("--tokenizer-origin", default="other", show_default=True,
              help="Recorded in the manifest: smoke-bpe, llama-3.1-8b-instruct, ...")
@click.option("--context-tokens", type=click.IntRange(min=1), default=None,
              help="Build for an engine context (max_model_len) of this many tokens, recorded in the manifest "
                   "[default: the study's max_model_len, not recorded].")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Directory for NAME.json, NAME.tokens and NAME.warmupK.tokens.")
@friendly_errors
def trace_cmd(corpus, tokenizer_dir, name, documents, questions, prefix_tokens, seed, head_tokens, zipf, blocks, warmup_shifts,
              pack_articles, text_field, corpus_origin, tokenizer_origin, context_tokens, out_dir):
    """Build one burst (token IDs, shuffled) and its warmup variants, with a trace manifest."""
    from parity.trace import TraceSpec, build_trace, load_trace

    spec = TraceSpec(name=name, documents=documents, questions_per_document=questions,
                     prefix_tokens=prefix_tokens, seed=seed, warmup_shifts=tuple(warmup_shifts),
                     pack_articles=pack_articles, head_tokens=head_tokens, zipf=zipf, blocks=blocks)
    manifest = build_trace(spec, corpus, tokenizer_dir, out_dir, text_field=text_field,
                           corpus_origin=corpus_origin, tokenizer_origin=tokenizer_origin,
                           context_tokens=context_tokens)
    trace = load_trace(manifest)
    tokens = sum(r.tokens for r in trace.requests)
    click.echo(f"{manifest}: {len(trace.requests)} requests, {tokens} tokens, "
               f"{len(spec.warmup_shifts)} warmup variants, trace sha256 {trace.sha256}")


@main.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--bundle", "bundles", multiple=True, type=click.Path(path_type=Path),
              help="Also check an evidence bundle (parity bundle): its bag, file by file, and its RO-Crate.")
@click.option("--public-key", "public_key", default=None, metavar="KEY",
              help="A minisign public key (a .pub file or its base64 line) every sealed tree named, or in a "
                   "bundle, must be signed by (parity sign).")
@friendly_errors
def validate_cmd(paths, bundles, public_key):
    """Validate manifests (files, or directories searched for *.json) and the files they link by hash, each
    manifest's numbers derived again from what it cites; and, with --bundle, an evidence bundle: any changed,
    missing or added file is named.

    Exits 1 and prints FILE: JSON-POINTER: RULE: MESSAGE for each problem (a bundle's: FILE: WHAT).
    """
    from parity import signature
    from parity.seal import certify

    if not paths and not bundles:
        raise click.UsageError("name manifests or folders to validate, or --bundle BUNDLE")
    missing = [p for p in (*paths, *bundles) if not p.exists()]
    if missing:
        raise click.ClickException(f"no such file or directory: {missing[0]}")
    key = signature.public_key(public_key) if public_key else None
    if bundles:
        from parity import bundle

        problems = [problem for folder in bundles for problem in bundle.check(folder, key)]
        for problem in problems:
            click.echo(problem, err=True)
        if problems:
            raise click.ClickException(f"{len(problems)} problem(s) in {len(bundles)} bundle(s)")
        click.echo(f"{len(bundles)} bundle(s) valid: every file as the bag lists it, the crate as its profiles ask")
        if not paths:
            return
    checked, problems = certify(paths)
    sealed = [path for path in paths if (path / "run.json").is_file()]
    problems += [line for path in sealed for line in signature.problems(path, key)] if key else []
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise click.ClickException(f"{len(problems)} problem(s) in {checked} manifest(s)")
    if checked == 0:
        raise click.ClickException("no manifests found")
    for path in sealed if key is None else []:
        if key_id := signature.signed_by(path):
            click.echo(f"{path}/run.json carries a signature by key {key_id}, not checked: give --public-key")
    click.echo(f"{checked} manifest(s) valid" + (f", {len(sealed)} tree(s) signed by the key given" if key else ""))


@main.command("seal")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--input", "inputs", multiple=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="A manifest of the run's inputs from outside RESULTS (a fetch receipt); repeatable.")
@friendly_errors
def seal_cmd(results, inputs):
    """Validate every manifest of RESULTS, then write RESULTS/run.json linking every kept file no other manifest
    links (logs, side files) and the tree's top manifests: after it, `parity validate RESULTS` names any file
    changed, deleted or added. Exits 1 with each problem (and no run manifest) if the tree does not validate."""
    from parity.seal import SealError, seal

    summary, problems = seal(results, inputs, log=_echo)
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise SealError(f"not sealed: {len(problems)} problem(s) in the manifests of {results}")
    click.echo(f"sealed {results}: {summary['manifests']} manifest(s) valid; {summary['run_manifest']} links its "
               f"{summary['tops']} top manifest(s), {summary['files']} other file(s) and {summary['inputs']} input(s); "
               f"every one of the {summary['kept']} kept files is linked")


@main.command("sign")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--key", "secret_key", required=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="A minisign secret key (minisign -G); an encrypted one's password from PARITY_SIGNING_PASSWORD "
                   "or asked for.")
@friendly_errors
def sign_cmd(results, secret_key):
    """Sign RESULTS/run.json (minisign's format: RESULTS/run.json.minisig) after validating the tree, so a
    reviewer holding the public key knows who vouched for it: `parity validate RESULTS --public-key KEY.pub`,
    or `minisign -V -p KEY.pub -m RESULTS/run.json`."""
    from parity import signature
    from parity.seal import certify

    _checked, problems = certify([results])
    if problems:
        raise click.ClickException(f"not signed: {results} does not validate ({len(problems)} problem(s), "
                                   f"first: {problems[0]})")
    password = os.environ.get("PARITY_SIGNING_PASSWORD")
    if password is None and sys.stdin.isatty():
        password = click.prompt("password of the secret key (empty if none)", hide_input=True, default="",
                                show_default=False) or None
    out = signature.sign(results, secret_key, password)
    click.echo(f"signed {results}/run.json: {out}")


@main.command("bundle")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="The bundle folder (a BagIt bag); an earlier bundle there is replaced.")
@click.option("--workdir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=Path("."),
              show_default=True, help="Where the Snakefile and Snakemake's job records (.snakemake/metadata) are.")
@click.option("--image", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="The Apptainer image, hashed into the crate.")
@friendly_errors
def bundle_cmd(results, out, workdir, image):
    """One evidence bundle of a run: RESULTS (all but empty logs and lock files) and the workflow, an RO-Crate
    (Workflow Run Crate) of what ran, in a BagIt bag at OUT; check it with `parity validate --bundle OUT`."""
    from parity import bundle

    summary = bundle.make(results, out, workdir=workdir, image=image, log=_echo)
    click.echo(f"wrote {summary['bundle']}: {summary['files']} result files ({summary['bytes'] / 1e6:.1f} MB in all), "
               f"{summary['jobs']} job(s) in its RO-Crate")


@main.group("bench")
def bench():
    """Benchmarks that print a ratio measured side by side in one run."""


@bench.command("router")
@click.option("--requests", "num_requests", default=512, show_default=True, type=click.IntRange(min=1))
@click.option("--prompt-tokens", default=8000, show_default=True, type=click.IntRange(min=17),
              help="Tokens per prompt: a shared document and a 16-token question.")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@friendly_errors
def bench_router(num_requests, prompt_tokens, repeats, as_json):
    """Routing cost per request, and its ratio to hashing the first 1,024 tokens once."""
    from parity.bench import router

    result = router.run(num_requests=num_requests, prompt_tokens=prompt_tokens, repeats=repeats)
    if as_json:
        click.echo(json.dumps(result, indent=1, sort_keys=True))
        return
    verdict = "meets" if result["meets_target"] else "MISSES"
    click.echo(f"route: {result['route_us_per_request']:.2f} us/request; hash 1,024 tokens once: "
               f"{result['hash_us_per_request']:.2f} us; ratio {result['ratio_route_to_hash']:.2f}; "
               f"{verdict} the {result['target_us_per_request']:.0f} us target "
               f"({result['requests']} requests of {result['prompt_tokens']} tokens, one core)")


@bench.command("routing")
@click.option("--family", "only", multiple=True,
              type=click.Choice(["study-reuse", "shared-head", "zipf", "working-set", "shards"]),  # routing.FAMILIES
              help="Run only this workload family (repeat); default every one.")
@click.option("--quick", is_flag=True, help="Shorter prompts and fewer cases (seconds, for a first look).")
@click.option("--sim-params", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Simulator parameter file (default: the calibrated H200 one).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Also write the result as JSON here.")
@friendly_errors
def bench_routing(only, quick, sim_params, out):
    """Routers on traffic the study did not send (simulated): the prefix router against alternating, the
    study's sticky router and a hindsight placement, per workload family; and its cost per request."""
    from parity.bench import routing
    from parity.engine.sim import SimParams
    from parity.manifest import atomic_write_text

    if out:
        writable_file(out)
    result = routing.run(SimParams.load(sim_params), quick=quick, only=set(only) or None, log=_echo)
    for line in routing.summary_lines(result):
        click.echo(line)
    if out:
        atomic_write_text(out, json.dumps(result, indent=1, sort_keys=True) + "\n")


@bench.command("schedule")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Requests/s to pace (default: ten times the sustained ladder's highest rate in config/experiments.yaml).")
@click.option("--requests", type=click.IntRange(min=2), default=2000, show_default=True)
@click.option("--kind", type=click.Choice(["poisson", "gamma"]), default="poisson", show_default=True)
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Also write the result as JSON here.")
@friendly_errors
def bench_schedule(rate, requests, kind, burstiness, seed, out):
    """The load generator's own lag (actual minus scheduled send) with nothing behind it, for both senders,
    against the 1 ms p99 target; and the schedule's rate and burstiness as generated."""
    from parity.bench import schedule
    from parity.manifest import atomic_write_text

    if out:
        writable_file(out)
    if rate is None:
        rate = 10 * max(study_experiments()["sustained"]["rates"])
    result = schedule.run(rate, requests, kind, burstiness, seed)
    for line in schedule.summary_lines(result):
        click.echo(line)
    if out:
        atomic_write_text(out, json.dumps(result, indent=1, sort_keys=True) + "\n")


@bench.command("startup")
@click.option("--engine", type=click.Choice(FAMILIES), default="sim", show_default=True)
@click.option("--cluster", type=click.Choice(["standin", "flame"]), default="standin", show_default=True,
              help="The Flame path's cluster: the CPU stand-in or real Flame v0.6.0.")
@click.option("--flame-bin-dir", type=click.Path(path_type=Path), default=None,
              help="Flame v0.6.0 binaries (default: $FLAME_BIN_DIR).")
@click.option("--gpu", default="sim-0", show_default=True, help="The GPU UUID both paths start on.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--sim-params", type=click.Path(path_type=Path), default=None)
@click.option("--model", default=None)
@click.option("--load-format", default=None)
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--network", type=click.Choice(NETWORK_MODES), default="auto", show_default=True,
              help="netns: contain the run in a network namespace with only loopback (real Flame listens on 0.0.0.0).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def bench_startup(engine, cluster, flame_bin_dir, gpu, repeats, sim_params, model, load_format, engine_args,
                  network, out_dir):
    """Startup cost of each path: process start to the first served request, run 1 cold, later runs warm;
    written to OUT/startup.json."""
    from parity import netns
    from parity.bench import startup

    netns.contain(network, needed=cluster == "flame", log=_echo)
    args = _engine_args(model, load_format, engine_args)
    final = FlameSettings.from_dict(study_experiments()["confirmation"]["flame"])
    result = startup.run(engine, cluster, gpu, final, args, out_dir, repeats, bin_dir=flame_bin_dir,
                         sim_params=sim_params, log=_echo)
    click.echo(startup.summary_line(result))


@bench.command("harvest")
@click.option("--cluster", type=click.Choice(["flame", "standin"]), default="flame", show_default=True,
              help="Real Flame v0.6.0 (the point), or the CPU stand-in (said so in the output).")
@click.option("--flame-bin-dir", type=click.Path(path_type=Path), default=None,
              help="Flame v0.6.0 binaries (default: $FLAME_BIN_DIR).")
@click.option("--tasks", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="Harvest tasks on one session while the session manager's memory is sampled.")
@click.option("--rotate-tasks", default=0, show_default=True, type=click.IntRange(min=0),
              help="Also sample it with the harvester moving to a fresh session every this many tasks (0: not).")
@click.option("--hold-ms", "holds_ms", multiple=True, type=click.FloatRange(min=0),
              help="A hold time to measure the harvest cycle at (repeat); default 0, 1, 5 and 20 ms.")
@click.option("--round-trips", default=500, show_default=True, type=click.IntRange(min=1),
              help="Timed empty-task round trips.")
@click.option("--warmup", default=50, show_default=True, type=click.IntRange(min=0),
              help="Untimed empty tasks before each timed phase.")
@click.option("--rate", default=4.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="The light stream's Poisson rate, requests/s.")
@click.option("--requests", default=40, show_default=True, type=click.IntRange(min=1), help="Requests per run.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1),
              help="Runs (seeds) per hold time.")
@click.option("--samples", default=50, show_default=True, type=click.IntRange(min=1),
              help="Memory samples over the tasks.")
@click.option("--sim-params", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None)
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="The cluster's logs and receipt (default: a folder beside --out, else ./bench-harvest).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Also write the result as JSON here.")
@friendly_errors
def bench_harvest(cluster, flame_bin_dir, tasks, rotate_tasks, holds_ms, round_trips, warmup, rate, requests, repeats, samples,
                  sim_params, work_dir, out):
    """The harvest mode's costs on Flame's task path, on the CPU (simulated engine): the empty-task round trip,
    the harvest cycle at several hold times under a light stream (admission wait, event to client), and the
    session manager's memory over many tasks on one session."""
    from parity.bench import harvest
    from parity.manifest import atomic_write_text

    if out:
        writable_file(out)
    work_dir = work_dir or (out.with_name(out.stem + "-work") if out else Path("bench-harvest"))

    def save(result):
        if out:
            atomic_write_text(out, json.dumps(result, indent=1, sort_keys=True) + "\n")

    result = harvest.run(cluster, work_dir, bin_dir=flame_bin_dir, tasks=tasks, holds_ms=holds_ms or harvest.HOLDS_MS,
                         round_trip_count=round_trips, warmup=warmup, rate=rate, requests=requests, repeats=repeats,
                         samples=samples, rotate_tasks=rotate_tasks, sim_params=str(sim_params) if sim_params else None, save=save, log=_echo)
    for line in harvest.summary_lines(result):
        click.echo(line)


def _engine_args(model: str | None, load_format: str | None, extra: tuple[str, ...]):
    """EngineArgs from the study's defaults, the common options, and KEY=VALUE overrides."""
    values = {}
    if model:
        values["model"] = model
    if load_format:
        values["load_format"] = load_format
    return EngineArgs.from_dict(values | key_values(extra, "engine argument"))


def _backend_or_options(backend_text: str | None, *covered: str) -> Backend | None:
    """The --backend given (JSON or a YAML file), else None; one or the other with the options it covers."""
    if backend_text is None:
        return None
    ctx = click.get_current_context()
    given = [name for name in covered if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise ParityError(f"--backend sets {', '.join('--' + g.replace('_', '-') for g in given)} already; "
                          "give one or the other")
    return Backend.parse(backend_text)


def _engine_settings(kind: str, backend_text, model, load_format, engine_args, warmup_rounds, sim_params):
    """(backend or None, EngineArgs, warmup rounds, simulator file) for one engine: from --backend whole, or
    from the options it covers (giving both is an error)."""
    backend = _backend_or_options(backend_text, "model", "load_format", "engine_args", "sim_params", "warmup_rounds")
    if backend is None:
        return None, _engine_args(model, load_format, engine_args), warmup_rounds, sim_params
    if backend.simulated != (kind == "sim"):
        raise ParityError(f"--engine {kind} does not fit the backend's engine {backend.engine}")
    return backend, backend.args(), backend.warmup_rounds, Path(backend.sim_params) if backend.sim_params else None


@main.group("engine")
def engine_group():
    """The engine alone: a trace handed straight to sim, vllm-sync or vllm-async."""


@engine_group.command("run")
@click.option("--engine", "kind", type=click.Choice(ENGINES), default="sim", show_default=True)
@click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True, required=True,
              help="Trace manifest (repeat for several; one engine serves them all, in order).")
@click.option("--batch", "batches", type=click.IntRange(min=0), multiple=True, default=(0,), show_default=True,
              help="Hand prompts over in batches of N; 0 = all at once. Repeat to run each trace at each size.")
@click.option("--warmup-rounds", default=Backend.warmup_rounds, show_default=True, type=click.IntRange(min=0),
              help="Warmup rounds on token-shifted variants.")
@click.option("--model", default=None, help="Model id or directory (a config.json alone with --load-format dummy).")
@click.option("--load-format", default=None, help="auto, or dummy for random weights of the model's shape.")
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--sim-params", type=click.Path(path_type=Path), default=None, help="Simulator parameter file.")
@click.option("--sim-mode", type=click.Choice(APIS), default="sync", show_default=True)
@click.option("--clock", type=click.Choice(["virtual", "paced"]), default="virtual", show_default=True)
@click.option("--backend", "backend_text", default=None,
              help="The engine's settings whole, as the experiments give them (JSON or a YAML file): model, load "
                   "format, engine args, simulator file, warmup rounds; recorded as what each trial ran with. "
                   "Replaces the options it covers.")
@click.option("--experiment", default="engine", show_default=True, help="Recorded in each trial manifest.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def engine_run(kind, traces, batches, warmup_rounds, model, load_format, engine_args, sim_params, sim_mode,
               clock, backend_text, experiment, out_dir):
    """Warm up, then measure each trace on one engine; a trial manifest per run, a line in summary.jsonl."""
    from parity import trial
    from parity.affinity import RouterSettings
    from parity.engine import make_engine
    from parity.engine.sim import SimParams
    from parity.paths.engine import EnginePath

    backend, args, warmup_rounds, sim_params = _engine_settings(kind, backend_text, model, load_format, engine_args,
                                                                warmup_rounds, sim_params)
    options = {"params": SimParams.load(sim_params), "clock": clock, "mode": sim_mode} if kind == "sim" else {}
    echo = _echo
    echo(f"starting engine {kind} ...")
    with make_engine(kind, args, **options) as engine:
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


@main.group("sim")
def sim_group():
    """The simulator engine: calibration from real runs."""


@sim_group.command("calibrate")
@click.option("--measurements", type=click.Path(path_type=Path, exists=True), required=True,
              help="Measured runs (JSON) from real vLLM.")
@click.option("--traces", type=click.Path(path_type=Path, exists=True), required=True,
              help="Folder with the trace manifests the measurements used.")
@click.option("--base", type=click.Path(path_type=Path), default=None, help="Starting parameter file.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Fitted parameter file (YAML).")
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


@bench.command("sim")
@click.option("--trace", type=click.Path(path_type=Path, exists=True), required=True,
              help="Trace manifest, e.g. the 256-request reuse burst.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
@friendly_errors
def bench_sim(trace, repeats):
    """CPU time to simulate a burst in virtual time, beside the engine time it models (target < 2 s)."""
    from parity.bench import sim

    r = sim.run(trace, repeats=repeats)
    verdict = "meets" if r["meets_target"] else "MISSES"
    click.echo(f"{r['requests']} requests: {r['cpu_s']:.3f} s of CPU to simulate {r['modelled_s']:.2f} s of engine "
               f"time (x{r['speedup']:.0f}); {verdict} the {r['target_cpu_s']:.0f} s target")


@bench.command("order")
@click.option("--engine", "kind", type=click.Choice(ENGINES), default="sim", show_default=True)
@click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True, required=True)
@click.option("--shards", default=2, show_default=True, type=click.IntRange(min=1),
              help="Shards the sticky router splits each burst into.")
@click.option("--shard", "only", type=click.IntRange(min=0), multiple=True,
              help="Run only this shard (repeat); default every one.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1),
              help="Interleaved runs per shard and order.")
@click.option("--warmup-rounds", default=Backend.warmup_rounds, show_default=True, type=click.IntRange(min=0))
@click.option("--model", default=None)
@click.option("--load-format", default=None)
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--sim-params", type=click.Path(path_type=Path), default=None)
@click.option("--backend", "backend_text", default=None,
              help="The engine's settings whole (JSON or a YAML file), as the workflow gives them; replaces the "
                   "options it covers.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def bench_order(kind, traces, shards, only, repeats, warmup_rounds, model, load_format, engine_args, sim_params,
                backend_text, out_dir):
    """One engine runs each shard in arrival and in prefix order, interleaved: the admission-order speedup."""
    from parity.bench import order
    from parity.engine import make_engine
    from parity.engine.sim import SimParams
    from parity.manifest import atomic_write_text

    beyond = sorted(s for s in only if s >= shards)
    if beyond:
        raise ParityError(f"--shard {beyond[0]}: there are only shards 0 to {shards - 1} (--shards {shards})")
    args, warmup_rounds, sim_params = _engine_settings(kind, backend_text, model, load_format, engine_args,
                                                       warmup_rounds, sim_params)[1:]
    options = {"params": SimParams.load(sim_params), "clock": "virtual", "mode": "async"} if kind == "sim" else {}
    results = []
    with make_engine(kind, args, **options) as engine:
        for trace in traces:
            r = order.run(engine, trace, out_dir, shards=shards, only=set(only), repeats=repeats,
                          warmup_rounds=warmup_rounds, log=_echo)
            results.append(r)
            label = "simulated" if r["simulated"] else "measured"
            for row in r["shards"]:
                click.echo(f"{r['trace']} shard {row['shard']} ({row['requests']} requests, {r['engine']}): arrival "
                           f"{row['arrival_median_s']:.3f} s, prefix {row['prefix_median_s']:.3f} s, arrival/prefix "
                           f"{row['speedup']:.4f} ({label}, median of {repeats})")
    atomic_write_text(out_dir / "order.json", json.dumps(results, indent=2) + "\n")


@main.group("standalone")
def standalone_group():
    """The standalone path: pinned replicas (`vllm serve`, or simulator servers) behind HTTP, a routing client."""


@standalone_group.command("run")
@click.option("--replicas", "kind", type=click.Choice(REPLICA_KINDS), default="sim", show_default=True,
              help="sim: simulator servers (CPU); vllm: `vllm serve` per GPU.")
@click.option("--gpu", "gpus", multiple=True, help="GPU UUID per replica (repeat); default sim-0, sim-1.")
@click.option("--placement", "placements", type=click.Choice(POLICIES), multiple=True,
              default=("alternating", "sticky"), show_default=True,
              help="Which router places requests (repeat for several): the base policy, the study's, or ours.")
@click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True, required=True)
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
              help="Trials per placement and trace, interleaved.")
@click.option("--warmup-rounds", default=Backend.warmup_rounds, show_default=True, type=click.IntRange(min=0))
@click.option("--experiment", default="locality", show_default=True)
@click.option("--model", default=None, help="Model id or directory.")
@click.option("--load-format", default=None, help="auto, or dummy for random weights of the model's shape.")
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--sim-params", type=click.Path(path_type=Path), default=None, help="Simulator parameter file.")
@click.option("--startup-timeout", default=Backend.startup_timeout_s, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Seconds to wait for /health.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def standalone_run(kind, gpus, placements, traces, repeats, warmup_rounds, experiment, model, load_format,
                   engine_args, sim_params, startup_timeout, out_dir):
    """Start replicas once, run every placement x trace (x repeats, rotating the order), tear down with a receipt."""
    from parity.experiments.runner import run_trials
    from parity.paths.standalone import StandalonePath

    gpus = list(gpus) or (["sim-0", "sim-1"] if kind == "sim" else [])
    path = StandalonePath(kind, gpus, _engine_args(model, load_format, engine_args), out_dir / "logs",
                          startup_timeout_s=startup_timeout, sim_params=sim_params,
                          receipt_path=out_dir / "cleanup-replicas.json")
    _echo(f"starting {len(gpus)} {kind} replicas on {', '.join(gpus)} ...")
    run_trials(path, placements, traces, repeats, experiment, warmup_rounds, out_dir, log=_echo)


@standalone_group.command("sim-server")
@click.option("--port", type=click.IntRange(1, 65535), required=True)
@click.option("--gpu-uuid", default="sim-0", show_default=True)
@click.option("--sim-params", type=click.Path(path_type=Path), default=None)
@click.option("--kv-events", metavar="ENDPOINT", default=None,
              help="Publish KV cache events to this subscriber endpoint (tcp://127.0.0.1:PORT), as vLLM does.")
@friendly_errors
def standalone_sim_server(port, gpu_uuid, sim_params, kv_events):
    """One simulator replica speaking vLLM's /v1/completions subset on 127.0.0.1 (a replica set starts it)."""
    from parity.standalone.sim_server import serve

    if kv_events and not kv_events.startswith("tcp://127.0.0.1:"):
        raise click.BadParameter("a loopback endpoint, tcp://127.0.0.1:PORT", param_hint="--kv-events")
    serve(port, gpu_uuid, sim_params, kv_events=kv_events)


@bench.command("codec")
@click.option("--trace", type=click.Path(path_type=Path, exists=True), required=True,
              help="Trace manifest, e.g. the 256-request reuse burst.")
@click.option("--batch", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1))
@friendly_errors
def bench_codec(trace, batch, repeats):
    """Flame task inputs raw vs zlib level 1: burst bytes, and encode + decode time per batch."""
    from parity.bench import codec

    r = codec.run(trace, batch=batch, repeats=repeats)
    click.echo(f"{r['trace']} ({r['requests']} requests): raw {r['bytes']['raw']:,} bytes, zlib-1 "
               f"{r['bytes']['zlib']:,} bytes (ratio {r['ratio_zlib_to_raw']:.3f}; study: "
               f"{r['study_bytes']['raw']:,} -> {r['study_bytes']['zlib']:,})")
    for name, t in r["per_batch"].items():
        click.echo(f"  {name:<4} batch of {r['batch']}: {t['batch_bytes']:,} bytes, encode {t['encode_ms']:.2f} ms, "
                   f"decode {t['decode_ms']:.2f} ms")


@main.group("flame")
def flame_group():
    """The Flame path: a Flame service embedding the engine, fed by a batching client."""


@flame_group.command("worker")
@friendly_errors
def flame_worker():
    """Serve the parity FlameService on $FLAME_INSTANCE_ENDPOINT (Flame's executor starts this)."""
    from parity.flame.service import main as serve

    serve()


_FLAME = FlameSettings()  # the options' defaults: the study's first configuration


@flame_group.command("run")
@click.option("--cluster", type=click.Choice(CLUSTERS), default="standin", show_default=True,
              help="standin: the in-process stand-in (CPU tests, smoke); flame: real Flame v0.6.0 binaries.")
@click.option("--flame-bin-dir", type=click.Path(path_type=Path), default=None,
              help="Flame v0.6.0 binaries (default: $FLAME_BIN_DIR).")
@click.option("--gpu", "gpus", multiple=True, help="GPU UUID per worker (repeat); default sim-0, sim-1.")
@click.option("--placement", "placements", type=click.Choice(FLAME_PLACEMENTS), multiple=True,
              default=("sticky",), show_default=True)
@click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True, required=True)
@click.option("--batch-limit", default=_FLAME.batch_limit, show_default=True, type=click.IntRange(min=1))
@click.option("--window-ms", default=_FLAME.window_ms, show_default=True, type=click.FloatRange(min=0))
@click.option("--budget-mib", default=_FLAME.budget_mib, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Decoded payload budget per task.")
@click.option("--api", type=click.Choice(APIS), default=_FLAME.api, show_default=True,
              help="The engine API each worker drives: sync (LLM.generate) or async (AsyncLLM).")
@click.option("--compress/--raw", default=_FLAME.compress, show_default=True, help="zlib level 1 task inputs.")
@click.option("--gc-freeze/--no-gc-freeze", default=_FLAME.gc_freeze, show_default=True)
@click.option("--order", type=click.Choice(ORDERS), default=_FLAME.order, show_default=True,
              help="How each worker admits a batch into its engine (parity.flame.admission).")
@click.option("--engine", type=click.Choice(FAMILIES), default="sim", show_default=True,
              help="The engine the workers build: the simulator, or vLLM (through --api).")
@click.option("--sim-params", type=click.Path(path_type=Path), default=None)
@click.option("--model", default=None)
@click.option("--load-format", default=None)
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--warmup-rounds", default=Backend.warmup_rounds, show_default=True, type=click.IntRange(min=0))
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--experiment", default="locality", show_default=True)
@click.option("--network", type=click.Choice(NETWORK_MODES), default="auto", show_default=True,
              help="netns: run the whole job in a network namespace with only loopback (real Flame listens on "
                   "0.0.0.0, unauthenticated); host: do not; auto: netns for real Flame where the platform allows.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def flame_run(cluster, flame_bin_dir, gpus, placements, traces, batch_limit, window_ms, budget_mib, api, compress,
              gc_freeze, order, engine, sim_params, model, load_format, engine_args, warmup_rounds, repeats,
              experiment, network, out_dir):
    """Start a cluster, register one application per GPU, run each placement x trace, clean up."""
    from parity import netns
    from parity.experiments.runner import run_trials
    from parity.paths.flame import FlamePath, cluster as flame_cluster

    netns.contain(network, needed=cluster == "flame", log=_echo)  # re-executes the command when it contains it
    settings = FlameSettings(batch_limit=batch_limit, window_ms=window_ms, budget_mib=budget_mib, api=api,
                             compress=compress, gc_freeze=gc_freeze, order=order)
    simulated = engine == "sim"
    gpus = list(gpus) or (["sim-0", "sim-1"] if simulated else [])
    if not gpus:
        raise ParityError("name the GPUs with --gpu UUID (one per worker)")
    with flame_cluster(cluster, gpus, out_dir, simulated=simulated, bin_dir=flame_bin_dir,
                       receipt_path=out_dir / "cleanup-flame.json", log=_echo) as running:
        path = FlamePath(running, gpus, settings, engine=engine, engine_args=_engine_args(model, load_format, engine_args),
                         sim_params=str(sim_params) if sim_params else None)
        run_trials(path, placements, traces, repeats, experiment, warmup_rounds, out_dir, log=_echo)


@main.command("check")
@click.argument("trials", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--pinning-from", type=click.Path(path_type=Path, exists=True), default=None,
              help="A trial whose shard -> GPU UUID mapping the others must match (the paired standalone run).")
@friendly_errors
def check_cmd(trials, pinning_from):
    """Run the four per-request checks on trial manifests and write each one's verdict; exit 1 if any failed."""
    from parity.checks import check_file, pinning_of, read_trial

    pinning = pinning_of(read_trial(pinning_from)) if pinning_from else None
    for path in trials:  # every file a trial manifest whose timing is its records' before any verdict is written
        read_trial(path)
    failed = 0
    for path in trials:
        verdict = check_file(path, pinning)
        failed += verdict["status"] == "failed"
        click.echo(f"{path}: {verdict['status']}" + "".join(f"\n  {r}" for r in verdict["reasons"]))
    click.echo(f"{len(trials) - failed} passed, {failed} failed", err=True)
    if failed:
        raise SystemExit(1)


@main.group("experiment")
def experiment_group():
    """The study's experiments (locality, admission, confirmation, gc, the offline limit) and ours (routing)."""


@experiment_group.command("run")
@click.argument("name", type=click.Choice(experiment_names()))
@click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True, required=True,
              help="Trace manifest (repeat: no-reuse, reuse).")
@click.option("--backend", "backend_text", required=True,
              help="Where to run: JSON, or a YAML file (engine sim|vllm, gpus, cluster standin|flame, model, ...).")
@click.option("--settings", "settings_text", default="{}", show_default=True,
              help="The experiment's settings as JSON (the config's experiments.NAME).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@friendly_errors
def experiment_run(name, traces, backend_text, settings_text, out_dir):
    """Run one experiment on fresh engines per case; trial manifests, checks, pairs, OUT/experiment.json."""
    from parity import netns
    from parity.experiments import plan
    from parity.experiments.backend import Backend
    from parity.experiments.runner import run_experiment

    backend = Backend.parse(backend_text)
    log = functools.partial(click.echo, err=True)
    # Real Flame listens on 0.0.0.0: contain the whole job first (this may re-execute the command).
    netns.contain(backend.network, needed=backend.cluster == "flame" and name != "offline-limit", log=log)
    try:
        settings = json.loads(settings_text)
    except ValueError as exc:
        raise ParityError(f"--settings is not JSON: {exc}") from None
    if not isinstance(settings, dict):
        raise ParityError(f"--settings must be a JSON object, got {type(settings).__name__}")
    check_experiment_settings(name, settings)
    traces = list(traces)
    if name == "offline-limit":
        from parity.experiments import offline_limit

        out = offline_limit.run(traces, backend, out_dir, settings=settings, log=log)
    else:
        cases = plan.for_experiment(name, traces, settings)
        out = run_experiment(name, cases, backend, out_dir, settings=settings, log=log)
    click.echo(f"wrote {out}")


@main.group("mlperf")
def mlperf_group():
    """The MLPerf v5.1.1 Llama 3.1 8B Offline control (real LoadGen), one arm per process."""


@mlperf_group.command("run")
@click.option("--arm", type=click.Choice(["standalone", "flame"]), required=True)
@click.option("--dataset", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="cnn_eval.json (or a synthetic one from smoke-dataset / random-dataset).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Run folder: mlperf-run.json, user.conf, loadgen/ logs, replica/worker logs, cleanup receipt.")
@click.option("--mode", type=click.Choice(["performance", "accuracy"]), default="performance", show_default=True)
@click.option("--engine", type=click.Choice(["sim", "vllm", "vllm-sync", "vllm-async"]), default="sim",
              show_default=True, help="sim on a CPU; vllm: `vllm serve` (standalone) or vllm-async (Flame).")
@click.option("--gpu", "gpus", multiple=True, help="GPU UUID per replica or worker (repeat); default sim-0.")
@click.option("--model", default=None, help="Model id or directory (a config.json alone with --load-format dummy).")
@click.option("--load-format", default=None, help="auto, or dummy for random weights of the model's shape.")
@click.option("--engine-arg", "engine_args", multiple=True, help="Override an engine setting: KEY=VALUE.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="Up to this many new tokens (MLPerf: 128).")
@click.option("--sim-params", type=click.Path(path_type=Path), default=None, help="Simulator parameter file.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Use only the first N dataset entries (non-compliant).")
@click.option("--target-qps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Offline target_qps; default: estimate with a probe.")
@click.option("--probe-samples", default=256, show_default=True, type=click.IntRange(min=1),
              help="Samples the target_qps probe sends.")
@click.option("--warmup-samples", default=16, show_default=True, type=click.IntRange(min=0),
              help="Samples run untimed first (worker start-up, kernel JIT); 0: none.")
@click.option("--qps-margin", default=1.1, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="target_qps = probe samples/s x this.")
@click.option("--min-duration-ms", type=click.IntRange(min=0), default=None,
              help="Override min_duration (rules: 600000).")
@click.option("--min-query-count", type=click.IntRange(min=1), default=None,
              help="Override min_query_count (rules: 13368).")
@click.option("--performance-sample-count", type=click.IntRange(min=1), default=None,
              help="Override the performance pool.")
@click.option("--max-in-flight", default=512, show_default=True, type=click.IntRange(min=1),
              help="Standalone: open requests at most.")
@click.option("--batch-limit", default=64, show_default=True, type=click.IntRange(min=1),
              help="Flame: prompts per task (the study: 32, 64).")
@click.option("--window-ms", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Flame: batch window.")
@click.option("--placement", type=click.Choice(["global", "sticky"]), default="sticky", show_default=True)
@click.option("--cluster", type=click.Choice(["standin", "flame"]), default="standin", show_default=True)
@click.option("--flame-bin-dir", type=click.Path(path_type=Path), default=None)
@click.option("--startup-timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds to wait for replicas.")
@click.option("--backend", "backend_text", default=None,
              help="Where to run, as the experiments do (JSON or a YAML file): engine, GPUs (the first serves), "
                   "cluster, model, load format, engine args. Replaces the options it covers.")
@friendly_errors
def mlperf_run(arm, dataset, out_dir, mode, engine, gpus, model, load_format, engine_args, max_tokens, sim_params,
               samples, target_qps, probe_samples, warmup_samples, qps_margin, min_duration_ms, min_query_count,
               performance_sample_count, max_in_flight, batch_limit, window_ms, placement, cluster, flame_bin_dir,
               startup_timeout, backend_text):
    """One arm under LoadGen in this process (prefix caching off); writes OUT/mlperf-run.json."""
    from parity.mlperf.run import RunSpec, run_arm

    backend = _backend_or_options(backend_text, "engine", "gpus", "model", "load_format", "engine_args", "sim_params",
                                  "cluster", "flame_bin_dir", "startup_timeout")
    if backend is not None:
        engine, cluster, startup_timeout = backend.engine, backend.cluster, backend.startup_timeout_s
        gpus = tuple(backend.gpu_uuids()[:1])
        sim_params = Path(backend.sim_params) if backend.sim_params else None
        flame_bin_dir = Path(backend.flame_bin_dir) if backend.flame_bin_dir else None
        args = backend.args()
    else:
        args = _engine_args(model, load_format, engine_args)
    from parity import netns

    # Real Flame listens on 0.0.0.0: contain the whole arm first (this may re-execute the command).
    netns.contain(backend.network if backend is not None else "auto",
                  needed=arm == "flame" and cluster == "flame", log=functools.partial(click.echo, err=True))
    spec = RunSpec(arm=arm, dataset=dataset, out=out_dir, mode=mode, engine=engine, gpus=tuple(gpus),
                   engine_args=args, max_tokens=max_tokens,
                   sim_params=sim_params, samples=samples, target_qps=target_qps, probe_samples=probe_samples,
                   warmup_samples=warmup_samples, qps_margin=qps_margin, min_duration_ms=min_duration_ms,
                   min_query_count=min_query_count, performance_sample_count=performance_sample_count, max_in_flight=max_in_flight,
                   batch_limit=batch_limit, window_ms=window_ms, placement=placement, cluster=cluster,
                   flame_bin_dir=flame_bin_dir, startup_timeout_s=startup_timeout)
    summary = run_arm(spec, log=functools.partial(click.echo, err=True))
    click.echo(json.dumps(summary, sort_keys=True))


@mlperf_group.command("accuracy")
@click.argument("run_manifest", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              required=True, help="Tokenizer directory (tokenizer.json): Llama 3.1's, or the smoke one.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Accuracy manifest to write.")
@click.option("--nltk-data", type=click.Path(path_type=Path), default=None, help="Staged NLTK data (punkt_tab).")
@click.option("--stand-in-splitter", is_flag=True,
              help="Use punkt without its English data (labelled, never comparable) where punkt_tab is absent.")
@friendly_errors
def mlperf_accuracy(run_manifest, tokenizer_dir, out, nltk_data, stand_in_splitter):
    """ROUGE and generated-length gates of an accuracy-mode run; outputs kept with their hashes."""
    from parity.mlperf import accuracy

    splitter = accuracy.untrained_punkt_splitter() if stand_in_splitter else accuracy.punkt_splitter(nltk_data)
    doc = accuracy.evaluate_run(run_manifest, tokenizer_dir, out, splitter)
    s = doc["scores"]
    click.echo(f"rouge1 {s['rouge1']} rouge2 {s['rouge2']} rougeL {s['rougeL']} rougeLsum {s['rougeLsum']} "
               f"gen_len {s['gen_len']} gen_num {s['gen_num']}: gates {'passed' if doc['passed'] else 'FAILED'} "
               f"({doc['gates_basis']}){'' if doc['comparable'] else ' - not comparable: ' + '; '.join(doc['reasons'])}")


@mlperf_group.command("compare")
@click.option("--standalone", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--flame", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
@friendly_errors
def mlperf_compare(standalone, flame, out):
    """Both arms' run manifests side by side; flags a vLLM version mismatch and any other difference."""
    from parity.mlperf.compare import compare

    doc = compare(standalone, flame, out)
    click.echo(f"flame/standalone samples/s: {doc['flame_to_standalone_samples_per_second']}, tokens/s: "
               f"{doc['flame_to_standalone_tokens_per_second']}; "
               f"vLLM versions match: {doc['vllm_versions_match']}" +
               "".join(f"\n  flag: {f}" for f in doc["flags"]))


@mlperf_group.command("smoke-dataset")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              required=True, help="The smoke tokenizer (parity smoke-inputs).")
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--samples", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@friendly_errors
def mlperf_smoke_dataset(tokenizer_dir, out, samples, seed):
    """A synthetic cnn_eval.json (MLPerf prompt, smoke tokenizer), labelled synthetic-smoke."""
    from parity.mlperf.dataset import write_smoke_dataset

    write_smoke_dataset(tokenizer_dir, out, samples=samples, seed=seed)
    click.echo(f"wrote {out} ({samples} synthetic samples)")


@mlperf_group.command("random-dataset")
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@friendly_errors
def mlperf_random_dataset(out, samples, seed):
    """A cnn_eval-shaped file of random Llama 3 token IDs (no text), labelled synthetic-random."""
    from parity.mlperf.dataset import write_random_dataset

    write_random_dataset(out, samples=samples, seed=seed)
    click.echo(f"wrote {out} ({samples} random-token samples)")


# ---- fetch: pinned, checksum-verified inputs (parity.fetch) -------------------------------------

@main.group("fetch")
def fetch_group():
    """Download inputs, each verified against its SHA-256 pin in manifests/pins/, with a receipt."""


def _fetch_command(name: str, default_pins: str | None, summary: str):
    """One `parity fetch NAME` command: the pins file says what to fetch and from where."""

    @fetch_group.command(name, help=summary)
    @click.option("--pins", "pins_path", type=click.Path(path_type=Path, dir_okay=False), default=default_pins,
                  required=default_pins is None, show_default=True, help="Pins file (JSON) naming source and files.")
    @click.option("--dest", type=click.Path(path_type=Path, file_okay=False), required=True,
                  help="Destination folder; files already there and matching their pins are kept.")
    @click.option("--record-pins", is_flag=True,
                  help="Fill in missing (null) pins from this download: only on a trusted network. "
                       "Existing pins are never changed.")
    @click.option("--receipt", type=click.Path(path_type=Path, dir_okay=False), default=None,
                  help="Receipt manifest path [default: DEST/fetch-receipt.json].")
    @friendly_errors
    def command(pins_path, dest, record_pins, receipt):
        from parity.fetch import fetch_pinned

        out = fetch_pinned(pins_path, dest, record_pins=record_pins, receipt=receipt,
                           log=functools.partial(click.echo, err=True))
        click.echo(f"wrote {out}")

    return command


fetch_model_cmd = _fetch_command(
    "model", "manifests/pins/llama-3.1-8b-instruct.json",
    "The model at its pinned commit from the Hugging Face Hub (token from HF_TOKEN or `hf auth login`).")
fetch_dataset_cmd = _fetch_command(
    "dataset", "manifests/pins/cnn_dailymail.json",
    "The CNN/DailyMail news parquet at its pinned commit from the Hugging Face Hub.")
fetch_mlperf_cmd = _fetch_command(
    "mlperf-dataset", "manifests/pins/mlperf-cnn-eval.json",
    "MLPerf's cnn_eval.json from the MLCommons R2 bucket (MD5 from the bucket and the SHA-256 pin both checked).")
fetch_url_cmd = _fetch_command(
    "url", None, "Any files a pins file lists, from a Hugging Face repo or an http(s) base URL.")


@fetch_group.command("articles")
@click.option("--pins", "pins_path", type=click.Path(path_type=Path, dir_okay=False),
              default="manifests/pins/cnn_dailymail.json", show_default=True,
              help="Pins file with the parquet (files) and the converted output (derived).")
@click.option("--dest", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder holding the fetched parquet; the articles.jsonl is written there.")
@click.option("--record-pins", is_flag=True, help="Record the output's pin if it is still null.")
@click.option("--receipt", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Receipt manifest path [default: DEST/articles.receipt.json].")
@friendly_errors
def fetch_articles_cmd(pins_path, dest, record_pins, receipt):
    """Convert the verified parquet to articles.jsonl (deterministic; its SHA-256 is pinned too)."""
    from parity.fetch import Pins
    from parity.fetch.articles import derive

    out = derive(Pins.load(pins_path), dest, receipt=receipt, record_pins=record_pins,
                 log=functools.partial(click.echo, err=True))
    click.echo(f"wrote {out}")


@fetch_group.command("pins-status")
@click.argument("pins_files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@friendly_errors
def fetch_pins_status_cmd(pins_files):
    """Each pin: published (with its source), recorded on first download, or missing.

    PINS_FILES default to manifests/pins/*.json.
    """
    from parity.fetch import FetchError, Pins

    paths = pins_files or sorted(Path("manifests/pins").glob("*.json"))
    if not paths:
        raise FetchError("manifests/pins: no pins files (*.json) found; name the pins files to list")
    for path in paths:
        click.echo("\n".join(Pins.load(path).status_lines()))


@main.command("report")
@click.option("--experiment", "experiments", type=click.Path(path_type=Path), multiple=True,
              help="Experiment folder or experiment.json (repeat the option).")
@click.option("--results", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Results folder: uses every RESULTS/*/experiment.json.")
@click.option("--mlperf", "mlperf_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder of `parity mlperf run/compare` manifests (optional; absent: \"not run\").")
@click.option("--reference", type=click.Path(path_type=Path, dir_okay=False), default="config/study-reference.yaml",
              show_default=True, help="The study's published numbers.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Folder for report.md, *.png and report.json.")
@friendly_errors
def report_cmd(experiments, results, mlperf_dir, reference, out_dir):
    """Tables shaped like the study's with its numbers beside ours, PNG plots, and a report manifest."""
    from parity.report import write_report
    from parity.report.inputs import find_experiments

    paths = list(experiments)
    if results is not None:
        if not results.is_dir():
            raise ParityError(f"{results}: no such results folder")
        paths += [p for p in find_experiments(results) if p.resolve() not in {Path(x).resolve() for x in paths}]
    if not paths and mlperf_dir is None:
        raise ParityError("give --experiment DIR (repeatable), --results DIR or --mlperf DIR")
    made = write_report(paths, mlperf_dir, reference, out_dir)
    click.echo(f"evidence: {made['evidence'] or 'none'}")
    click.echo(made["final_table"], nl=False)
    click.echo(f"wrote {out_dir / 'report.md'} and {out_dir / 'report.json'}", err=True)
