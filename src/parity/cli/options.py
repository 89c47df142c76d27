"""Options more than one command takes, declared once: their defaults and choices are read from the
settings classes and registries (`FlameSettings`, `Backend`, `CLUSTERS`, `NETWORK_MODES`), so a command
line cannot drift from what a run does by default. And the one adapter they share: engine settings from
--backend whole, or from the options it covers."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import click

from parity.cli import errors
from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.backend import CLUSTERS, Backend
from parity.flame.admission import ORDERS
from parity.flame.settings import APIS, FlameSettings
from parity.netns import MODES as NETWORK_MODES
from parity.settings import key_values

class Finite(click.FloatRange):
    """A number within its range, and a number: click's FloatRange lets NaN through (no comparison fails for it),
    and inf where a side is open."""

    name = "finite float"

    def _describe_range(self) -> str:
        """Nothing where neither side is bounded (click would print `x<=None` in --help)."""
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


REPLICA_KINDS = ("sim", "vllm")  # parity.standalone.replicas.KINDS, without importing httpx to build the options


def stack(*options):
    """Several option decorators as one, listed in --help in the order given."""

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


# ---- the engine: its settings one by one, or --backend whole ------------------------------------

model = click.option("--model", default=None,
                     help="Model id or directory (a config.json alone with --load-format dummy).")
load_format = click.option("--load-format", default=None,
                           help="auto, or dummy for random weights of the model's shape.")
engine_arg = click.option("--engine-arg", "engine_args", multiple=True,
                          help="Override an engine setting: KEY=VALUE.")
engine_options = stack(model, load_format, engine_arg)


def _sim_params_read(ctx, param, path: Path | None) -> Path | None:
    """--sim-params read as the command line is (SimParams.load): a bad file is one Error line before the command
    starts anything (an outside evaluator's, 2026-12-05: `bench harvest` started its cluster, then failed in a worker)."""
    if path is not None:
        from parity.engine.sim import SimParams

        errors.friendly_errors(SimParams.load)(path)
    return path


sim_params = click.option("--sim-params", type=click.Path(path_type=Path), default=None, callback=_sim_params_read,
                          help="Simulator parameter file.")
warmup_rounds = click.option("--warmup-rounds", default=Backend.warmup_rounds, show_default=True,
                             type=click.IntRange(min=0), help="Warmup rounds on token-shifted variants.")


def backend(help: str):
    return click.option("--backend", "backend_text", default=None, help=help)


def engine_values(model: str | None, load_format: str | None, extra: tuple[str, ...]) -> dict:
    """The engine settings the common options and KEY=VALUE overrides give (the rest: the study's defaults)."""
    values = {"model": model} if model else {}
    if load_format:
        values["load_format"] = load_format
    return values | key_values(extra, "engine argument")


def engine_args(model: str | None, load_format: str | None, extra: tuple[str, ...]) -> EngineArgs:
    """EngineArgs from the study's defaults, the common options, and KEY=VALUE overrides."""
    return EngineArgs.from_dict(engine_values(model, load_format, extra))


def backend_or_options(backend_text: str | None, *covered: str) -> Backend | None:
    """The --backend given (JSON or a YAML file), else None; one or the other with the options it covers."""
    if backend_text is None:
        return None
    ctx = click.get_current_context()
    given = [name for name in covered if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise ParityError(f"--backend sets {', '.join('--' + g.replace('_', '-') for g in given)} already; "
                          "give one or the other")
    return Backend.parse(backend_text)


def engine_settings(kind: str, backend_text, model, load_format, extra, warmup_rounds, sim_params):
    """(backend or None, EngineArgs, warmup rounds, simulator file) for one engine: from --backend whole, or
    from the options it covers (giving both is an error)."""
    backend = backend_or_options(backend_text, "model", "load_format", "engine_args", "sim_params", "warmup_rounds")
    if backend is None:
        return None, engine_args(model, load_format, extra), warmup_rounds, sim_params
    if backend.simulated != (kind == "sim"):
        raise ParityError(f"--engine {kind} does not fit the backend's engine {backend.engine}")
    return backend, backend.args(), backend.warmup_rounds, Path(backend.sim_params) if backend.sim_params else None


def simulator(kind: str, sim_params: Path | None, clock: str, mode: str) -> dict:
    """make_engine's simulator settings for an engine of `kind` (none for vLLM)."""
    from parity.engine.sim import SimParams

    return {"params": SimParams.load(sim_params), "clock": clock, "mode": mode} if kind == "sim" else {}


# ---- where it runs -------------------------------------------------------------------------------

def cluster(default: str, help: str | None = None):
    return click.option("--cluster", type=click.Choice(CLUSTERS), default=default, show_default=True, help=help)


def _named_folder(ctx, param, text: str | None) -> Path | None:
    """A folder option's text as a Path; empty text is refused, not read as the current folder (`Path('')` is `.`: an
    outsider's `--flame-bin-dir ''` was said to lack the binaries in `.`)."""
    if text is None:
        return None
    if not text.strip():
        raise click.BadParameter("is empty: name a folder")
    return Path(text)


flame_bin_dir = click.option("--flame-bin-dir", type=click.Path(), default=None, callback=_named_folder,
                             help="Flame v0.6.0 binaries (default: $FLAME_BIN_DIR).")


def network(help: str):
    return click.option("--network", type=click.Choice(NETWORK_MODES), default=Backend.network, show_default=True,
                        help=help)


def gpus(help: str):
    return click.option("--gpu", "gpus", multiple=True, help=help)


# ---- Flame's settings, defaults the study's first configuration ---------------------------------

_FLAME = FlameSettings()
flame_settings = stack(
    click.option("--batch-limit", default=_FLAME.batch_limit, show_default=True, type=click.IntRange(min=1)),
    click.option("--window-ms", default=_FLAME.window_ms, show_default=True, type=Finite(min=0)),
    click.option("--budget-mib", default=_FLAME.budget_mib, show_default=True,
                 type=Finite(min=0, min_open=True), help="Decoded payload budget per task."),
    click.option("--api", type=click.Choice(APIS), default=_FLAME.api, show_default=True,
                 help="The engine API each worker drives: sync (LLM.generate) or async (AsyncLLM)."),
    click.option("--compress/--raw", default=_FLAME.compress, show_default=True, help="zlib level 1 task inputs."),
    click.option("--gc-freeze/--no-gc-freeze", default=_FLAME.gc_freeze, show_default=True),
    click.option("--order", type=click.Choice(ORDERS), default=_FLAME.order, show_default=True,
                 help="How each worker admits a batch into its engine (parity.flame.admission)."),
)


# ---- what it reads and writes ------------------------------------------------------------------

def traces(help: str | None = None):
    return click.option("--trace", "traces", type=click.Path(path_type=Path, exists=True), multiple=True,
                        required=True, help=help)


CONTEXT_TOKENS = click.IntRange(1, 2**31 - 1)  # an engine context, in tokens (any larger one was recorded as given)
MAX_REPEATS = 1000  # a typo's billion repeats ran until killed (an outsider's, 2026-12-07)


def repeats(default: int, help: str | None = None):
    return click.option("--repeats", default=default, show_default=True, type=click.IntRange(1, MAX_REPEATS),
                        help=help)


def experiment(default: str, help: str | None = None):
    return click.option("--experiment", default=default, show_default=True, help=help)


def out_dir(help: str | None = None):
    return click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=out_folder,
                        help=help)


workflow_config = click.option(
    "--config", "config_files", multiple=True, show_default=True, default=("config/experiments.yaml",),
    type=click.Path(dir_okay=False, path_type=Path),  # read only where a setting is needed (workflow_config.load)
    help="The workflow config the study's settings come from (run from the repo root); repeat to merge a "
         "profile's file over it as Snakemake does, e.g. --config config/experiments.yaml --config config/host.yaml.")


def _out_checked(check):
    """An --out callback: `check` (parity.cli.errors.writable_file or writable_folder) run as the command line is
    read, so a long command is not refused after it ran, and a path nothing can be written to is one Error line
    (friendly_errors, as the command's own failures are), not a traceback at the end."""
    check = errors.friendly_errors(check)

    def callback(ctx, param, path: Path | None) -> Path | None:
        if path is not None:
            if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):  # a newline split the bundle's bagit lines
                raise click.BadParameter(f"{str(path)!r} holds a control character (a newline?), which breaks the "
                                         "line-based files that name outputs (logs, bagit manifests)", ctx, param)
            check(path)
        return path

    return callback


out_file = _out_checked(errors.writable_file)  # the callback of an --out file
out_folder = _out_checked(errors.writable_folder)  # the callback of an --out folder


def out_apart_from(*names: str, out: str = "out", writes=None):
    """A command decorator (under `friendly_errors`): its `out` (the parameter of that name; none given, nothing to
    check) must not be, or lie in, the inputs its parameters `names` give, nor hold one where it is a folder the
    command writes into (`errors.not_an_input`), checked before the command reads or writes anything. `writes`: for
    a folder out whose files are named from the command line (a --name, an input's stem), a function of the
    command's keyword arguments giving those files: they are checked instead, so a folder may hold its inputs
    under other names."""

    def apply(command):
        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            if kwargs[out] is not None:
                params = {p.name: p for p in click.get_current_context().command.params}
                inputs = {}
                for n in names:  # an option given several times (--config) is each of its paths
                    name = params[n].opts[0] if isinstance(params[n], click.Option) else n.upper()
                    given = kwargs[n] if isinstance(kwargs[n], (tuple, list)) else [kwargs[n]]
                    inputs |= {(name if len(given) == 1 else f"{name} #{at}"): (None if g is None else Path(g))
                               for at, g in enumerate(given, start=1)}
                errors.not_an_input(kwargs[out], inputs, option=params[out].opts[0],
                                    folder=writes is None and params[out].callback is out_folder,
                                    writes=writes(kwargs) if writes is not None else ())
            return command(*args, **kwargs)

        return wrapper

    return apply


json_out = click.option("--out", type=click.Path(path_type=Path), default=None, callback=out_file,
                        help="Also write the result as JSON here.")
