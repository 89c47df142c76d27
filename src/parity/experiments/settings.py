"""Each experiment's settings (the workflow config's experiments.NAME) as one frozen dataclass, every key's
default declared once, here; `parity.experiments.plan.EXPERIMENTS` registers each class with its plan.

A section is built from the config's mapping whole: an unknown key, a missing required one or a mistyped
value is refused in one line naming the experiment and the key. Nested settings are the classes that
already own them (`FlameSettings`, `Restart`, `OutputLengths`, `Objective`); a Flame *change* (an arm,
admission's `selected`) stays the mapping it is, checked against `FlameSettings`' keys and types and
applied over a configuration with `dataclasses.replace`, so it records exactly what was written.
Ranges and enums are the config schema's: an experiment's section is checked against its node there when built.
`tests/test_experiment_settings.py` holds the config schema to these classes, key by key, and probes each bound
and enum on both sides through the classes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import ClassVar, NewType

from parity.admission import BoundedSettings
from parity.errors import ParityError
from parity.flame.settings import FlameSettings
from parity.latency import Objective
from parity.lengths import OutputLengths
from parity.restart import Restart
from parity.schedule import PACED, Schedule
from parity.settings import Settings, checked_fields, finite, within_64_bits
from parity.workflow_config import check_experiment_settings

# Flame setting changes, applied over a configuration (an arm: {inflight: 1}); a mapping, keys and types checked.
FlameChanges = NewType("FlameChanges", dict)


class Section(Settings):
    """Base of a settings class built field by field: nested settings through their own `from_dict`,
    tuples from lists, numbers kept as written (a rate of 4 stays 4, as the recorded settings say).

    An experiment's section (`experiment`: its name) is then held to its node in the config schema, the one home
    of every range and enum, so it refuses what the schema refuses by whichever route its values came."""

    experiment: ClassVar[str | None] = None
    typed_fields = False  # `from_dict` builds each field by its own type (`build`)

    @classmethod
    def from_dict(cls, values: dict | None):
        values = {} if values is None else values
        if not isinstance(values, dict):
            raise ParityError(f"{cls.what}: expected a mapping of KEY: VALUE, got {type(values).__name__} {values!r}")
        known = [f.name for f in dataclasses.fields(cls)]
        if unknown := sorted(map(str, set(values) - set(known))):
            raise ParityError(f"{cls.what}: unknown setting(s) {', '.join(unknown)}: known are {', '.join(known)}")
        if missing := [f.name for f in dataclasses.fields(cls) if f.name not in values and _required(f)]:
            raise ParityError(f"{cls.what}: {', '.join(missing)} must be given")
        hints = typing.get_type_hints(cls)
        built = cls(**{key: build(hints[key], value, f"{cls.what} {key}") for key, value in values.items()})
        if cls.experiment is not None:  # after the keys and types above, so those keep their own messages
            check_experiment_settings(cls.experiment, values)
        return built


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


def build(hint, value, where: str):
    """`value` as the type `hint` declares it, or ParityError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None  # unset: before a nested settings class reads None as its defaults
        errors = []
        for option in args:
            try:
                return build(option, value, where)
            except ParityError as exc:
                errors.append(exc)
        shaped = [e for option, e in zip(args, errors) if kind(option) == kind(type(value))]
        if len(shaped) == 1:  # the one option of the value's shape: its own, more exact, message
            raise shaped[0]
        raise ParityError(f"{where} must be {' or '.join(kind(a) for a in args)}, got {value!r}")
    if hint is FlameChanges:
        checked_fields(FlameSettings, value, f"{where}: Flame setting")  # refuses unknown keys and wrong types
        return dict(value)
    if isinstance(hint, type) and issubclass(hint, Settings):
        return hint.from_dict(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or (args[-1] is not Ellipsis and len(value) != len(args)):
            raise ParityError(f"{where} must be a list, got {value!r}")
        items = args[:1] * len(value) if args[-1] is Ellipsis else args
        return tuple(build(item, v, f"{where}[{i}]") for i, (item, v) in enumerate(zip(items, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ParityError(f"{where} must be a mapping, got {value!r}")
        return {k: build(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if hint is type(None) and value is None:
        return None
    fits = (isinstance(value, bool) if hint is bool
            else isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value) if hint is float
            else isinstance(value, hint) and not isinstance(value, bool) if hint is int
            else isinstance(value, hint))
    if not fits:
        raise ParityError(f"{where} must be {kind(hint)}, got {value!r}")
    if hint is int and not within_64_bits(value):
        raise ParityError(f"{where} must be an integer within 64 bits, got {value!r}")
    return value


def kind(hint) -> str:
    """How an error names a type (a value's type, or a hint)."""
    if hint in _NAMES:
        return _NAMES[hint]
    if hint in (list, tuple) or typing.get_origin(hint) is tuple:
        return "a list"
    return "a mapping"


@dataclass(frozen=True)
class Arrivals(Settings):
    """A ladder's arrivals without a rate: each rung's schedule is this one at the rung's rate, its seed
    moved by the repeat (`at`). The kind's default is the ladder's; the others are `Schedule`'s."""

    what = "sustained schedule setting"
    kind: str = "poisson"
    burstiness: float = Schedule.burstiness
    seed: int = Schedule.seed

    def check(self):
        if self.kind not in PACED:
            raise ParityError(f"sustained schedule kind {self.kind!r}: a ladder's rungs are poisson or gamma")

    def at(self, rate: float, repeat: int = 0) -> Schedule:
        return Schedule(kind=self.kind, rate=float(rate), burstiness=self.burstiness, seed=self.seed + repeat)


@dataclass(frozen=True)
class ExtraPair(Section):
    """One more pair per repeat at one rate (unset: the ladder's first), with one arm's Flame side (unset:
    the experiment's own), on one trace (unset: those whose ladder has the rate)."""

    what = "sustained extra pair"
    flattened: ClassVar[str | None] = None  # a field whose own settings sit beside rate, arm and trace in the config
    rate: float | None = None
    arm: str | None = None
    trace: str | None = None  # the workflow's name of the trace (its file stem): one pair per repeat, there alone

    @classmethod
    def from_dict(cls, values: dict | None):
        if cls.flattened is None or not isinstance(values, dict):
            return super().from_dict(values)
        own = {f.name for f in dataclasses.fields(ExtraPair)}
        inner = typing.get_type_hints(cls)[cls.flattened]
        known = [*own, *(f.name for f in dataclasses.fields(inner))]
        if unknown := sorted(map(str, set(values) - set(known))):
            raise ParityError(f"{cls.what}: unknown setting(s) {', '.join(unknown)}: known are {', '.join(known)}")
        pair = super().from_dict({k: v for k, v in values.items() if k in own})
        nested = inner.from_dict({k: v for k, v in values.items() if k not in own})
        return dataclasses.replace(pair, **{cls.flattened: nested})


@dataclass(frozen=True, kw_only=True)
class Evict(ExtraPair):
    what = "sustained evict"
    cache_blocks: int  # a KV cache of this many blocks per engine, smaller than the trace's working set


@dataclass(frozen=True, kw_only=True)
class Answers(ExtraPair):
    what = "sustained answers"
    tokens: int  # every answer exactly this long


@dataclass(frozen=True)
class RestartPair(ExtraPair):
    what = "sustained restart"
    flattened = "restart"
    restart: Restart = Restart()


@dataclass(frozen=True)
class LengthsPair(ExtraPair):
    what = "sustained lengths"
    flattened = "lengths"
    lengths: OutputLengths = OutputLengths()


@dataclass(frozen=True, kw_only=True)
class ReplayPair(Section):
    """Ours: one more pair per repeat on a recorded trace (`parity trace-mooncake`), its arrivals and each request's
    output length the trace's own, from NAME.replay.json beside it; that trace never runs the ladder."""

    what = "sustained replay"
    trace: str  # the workflow's name of the trace (its file stem)
    arm: str | None = None  # the arm whose Flame side it runs (unset: the experiment's own)


@dataclass(frozen=True)
class LocalitySettings(Section):
    what = experiment = "locality"
    repeats: int = 3
    flame: FlameSettings = FlameSettings()


@dataclass(frozen=True, kw_only=True)
class AdmissionSettings(Section):
    what = experiment = "admission"
    base: FlameSettings = FlameSettings()  # what the screening grid changes
    batch_windows: tuple[tuple[int, float], ...]  # the screening grid: (batch_limit, window_ms)
    screen_trace: str = "reuse"
    selected: FlameChanges  # over base: the selection the paired stages run
    stage_pairs: int = 0  # fresh pairs per paired stage (0: screening alone)


@dataclass(frozen=True)
class ConfirmationSettings(Section):
    what = experiment = "confirmation"
    pairs: int | dict[str, int] = 5  # per trace, or per trace name
    flame: FlameSettings = FlameSettings()
    arms: tuple[str, ...] = ()  # extra router arms (plan.confirmation)
    flame_arms: dict[str, FlameChanges | None] = field(default_factory=dict)  # extra Flame arms: NAME: changes (null:
    # none, a profile switching off an arm the shared config names)
    shards: int | None = None  # the runner's: sticky shards per side (unset: one per GPU, at most two)
    sweep: int | None = None  # ours: each fresh engine's decode sweep, groups of 1..N (plan.confirmation)
    stages: tuple[str, ...] = ()  # ours: only these stages' pairs (a device session's share; empty: every stage)


@dataclass(frozen=True)
class GcSettings(Section):
    what = experiment = "gc"
    trace: str = "reuse"
    repeats: int = 1
    flame: FlameSettings = FlameSettings()


@dataclass(frozen=True)
class OfflineLimitSettings(Section):
    what = experiment = "offline-limit"
    shards: int | None = None  # unset: one per GPU (parity.experiments.offline_limit.shard_count)


@dataclass(frozen=True)
class RoutingSettings(Section):
    what = experiment = "routing"
    traces: tuple[str, ...] | None = None  # the workflow's trace names (unset: the study's)
    repeats: int = 3
    placements: tuple[str, ...] = ("sticky", "prefix")
    flame: FlameSettings = FlameSettings()


@dataclass(frozen=True, kw_only=True)
class SustainedSettings(Section):
    what = experiment = "sustained"
    traces: tuple[str, ...] | None = None  # the workflow's trace names (unset: the study's)
    rates: tuple[float, ...] | dict[str, tuple[float, ...]]  # the ladder, or each trace's own
    shared_start: bool = False
    warmup_requests: int | None = None  # unset: whole bursts
    output_tokens: tuple[int, ...] = (16,)  # the study's 16
    repeats: int = 1
    schedule: Arrivals = Arrivals()
    objective: Objective = Objective()  # the report's
    flame: FlameSettings = FlameSettings()
    restart: RestartPair | None = None
    lengths: LengthsPair | None = None
    evict: Evict | None = None
    answers: Answers | None = None
    arms: dict[str, FlameChanges] = field(default_factory=dict)
    run_first: tuple[str, ...] = ()  # ours: these arms' pairs first at each start, in this order (plan.sustained)
    bounded: BoundedSettings | None = None  # ours: the bounded arm, standalone first (plan.sustained); unset: none
    bounded_rates: dict[str, tuple[float, ...]] | None = None  # ours: the bounded arm's own ladder (trace: rates),
    # each rung with an unbounded standalone case of its own on the same start; unset: the ladder's rungs
    replay: ReplayPair | None = None  # ours: a recorded trace's arrivals and lengths as one more pair; unset: none

    @property
    def highest_rate(self) -> float:
        """The ladder's top rung, over every trace's own rates where they differ, the extra pairs' rates and the bounded
        arm's own ladder (`bounded_rates`)."""
        ladders = self.rates.values() if isinstance(self.rates, dict) else [self.rates]
        extras = [x.rate for x in (self.restart, self.lengths, self.evict, self.answers) if x and x.rate]
        extras += [r for rates in (self.bounded_rates or {}).values() for r in rates]
        if not (every := [r for ladder in ladders for r in ladder] + extras):
            raise ParityError("sustained: no rate anywhere (every trace's rates empty, no extra pair with a rate)")
        return max(every)
