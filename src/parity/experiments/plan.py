"""The cases of each experiment, in the order they run. Pure: no engine, no file is touched here.

A case is one fresh start of one system on one trace. Orders are interleaved so that drift over an
experiment (thermals, a noisy neighbour) spreads over every configuration instead of landing on one:
locality rotates its four configurations each repetition, and pairs alternate which system goes first.
Screening pilots carry their own ids and are never paired; only the `pairs` cases feed paired scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple

from parity.admission import BoundedSettings
from parity.backend import Backend
from parity.routing import RouterSettings
from parity.errors import ParityError
from parity.experiments.settings import (AdmissionSettings, Answers, Arrivals, ConfirmationSettings, Evict, ExtraPair,
                                         GcSettings, LengthsPair, LocalitySettings, OfflineLimitSettings, ReplayPair,
                                         RestartPair, RoutingSettings, Section, SustainedSettings)
from parity.flame.admission import ORDERS
from parity.flame.settings import FlameSettings, running_arms
from parity.latency import Objective
from parity.lengths import OutputLengths
from parity.restart import Restart
from parity.schedule import Schedule
from parity.settings import known_keys


@dataclass(frozen=True)
class Case:
    trial_id: str  # also its manifest's file name
    experiment: str
    system: str  # the serving path (parity.paths): "standalone" or "flame"
    placement: str  # standalone: alternating | sticky | prefix; flame: global | sticky | prefix
    trace: Path
    flame: FlameSettings = field(default_factory=FlameSettings)
    stage: str | None = None  # which stage of an experiment, e.g. a screening grid or "final"
    pair: int | None = None  # pair index, for cases that are half of a pair
    side: str | None = None  # which half: "reference" (standalone, fixed) or "candidate" (the path under test)
    pinned: bool = False  # must match the paired reference's shard → GPU UUID mapping
    schedule: Schedule = field(default_factory=Schedule)  # when its requests arrive (the study's: all at once)
    stream: bool = False  # time every output token (standalone: streamed; Flame: in the worker's engine)
    max_tokens: int | None = None  # output tokens per request, exact (None: the backend's, the study's 16)
    restart: Restart | None = None  # kill one engine mid-run (parity.restart)
    cache_blocks: int | None = None  # a KV cache of this many blocks per engine (the eviction case)
    lengths: OutputLengths | None = None  # each request's own exact output length (parity.lengths; max_tokens its high)
    start: str | None = None  # ours: the engine start it shares with the other cases of that name (None: its own)
    warmup_requests: int | None = None  # ours: warm-ups of this many requests, paced as measured (None: whole bursts)
    arm: str | None = None  # ours: the arm it belongs to, as the settings name it (None: the study's configuration)
    admission: BoundedSettings | None = None  # ours: bounded admission against `objective` (parity.admission)
    objective: Objective | None = None  # what bounded admission holds each request to (None: no admission)
    sweep: int | None = None  # ours: a fresh engine's decode sweep of groups 1..N before its warm-ups (parity.trial)
    rung: str | None = None  # ours: a bounded rung's arms share it: judged together on another GPU (runner.groups)

    @property
    def load(self) -> dict:
        """How its requests arrive and are timed (any engine it kills, any lengths of their own; a shared engine
        start, paced warm-ups), as a trial's `ran_with` records it."""
        return ({"schedule": self.schedule.to_dict(), "stream": self.stream}
                | ({"restart": self.restart.to_dict()} if self.restart else {})
                | ({"lengths": self.lengths.to_dict()} if self.lengths else {})
                | ({"start": self.start} if self.start else {})
                | ({"warmup_requests": self.warmup_requests} if self.warmup_requests is not None else {})
                | ({"sweep": self.sweep} if self.sweep else {})
                | ({"admission": self.admission.to_dict() | {"objective": self.objective.to_dict()}}
                   if self.admission else {}))

    @property
    def router(self) -> RouterSettings:
        """The router its placement names, with the settings every case shares."""
        return RouterSettings(self.placement)


# The longest a paced case's arrivals may take (its requests / rate). The study's ladder takes minutes
# per rung (hundreds of requests at 4 to 24 per second); a rung beyond an hour is a rate mistyped (0.001
# for 1), which would otherwise hold two engines for hours without a word.
MAX_RUNG_S = 3600.0
# The fastest a paced case may offer requests. At 1,000 per second the mean gap between two sends is
# 1 ms, the lag the load generator itself is allowed (its p99 target: parity.schedule.lag, parity bench
# schedule); faster, its own delays are as long as the gaps, so what it offers could not be told from a
# burst, and a rung recorded at that rate would not be one.
MAX_RATE_PER_S = 1000.0


LOCALITY_CONFIGS = (("standalone", "alternating"), ("flame", "global"), ("standalone", "sticky"), ("flame", "sticky"))


def configuration(system: str, placement: str) -> str:
    """The study's name of a system with a placement (its reference table's key): vllm-sticky, flame-global, ..."""
    return f"{'vllm' if system == 'standalone' else system}-{placement}"


def repetition_id(experiment: str, system: str, placement: str, trace: Path, repeat: int) -> str:
    """The trial id of one repetition of a configuration on a trace: locality-vllm-sticky-reuse-r0."""
    return f"{experiment}-{configuration(system, placement)}-{trace.stem}-r{repeat}"


def rotate(items: list, by: int) -> list:
    by %= len(items) or 1
    return items[by:] + items[:by]


def repetitions(experiment: str, configs: list[tuple[str, str]], traces: list[Path], repeats: int,
                flame: FlameSettings) -> list[Case]:
    """(system, placement) configurations x traces x repeats, the configuration order rotated every repetition."""
    return [Case(repetition_id(experiment, system, placement, trace, repeat), experiment, system, placement, trace,
                 flame, stage=configuration(system, placement))
            for repeat in range(repeats) for trace in traces for system, placement in rotate(list(configs), repeat)]


def locality(traces: list[Path], repeats: int, flame: FlameSettings) -> list[Case]:
    """The study's four configurations: vLLM alternating / Flame global / vLLM sticky / Flame sticky."""
    return repetitions("locality", list(LOCALITY_CONFIGS), traces, repeats, flame)


def screening(experiment: str, group: str, trace: Path, configs: list[FlameSettings], repeats: int = 1) -> list[Case]:
    """Pilot trials of Flame sticky sessions, one per configuration: for choosing, never for confirming."""
    return [Case(f"{experiment}-{group}-{config.label()}-{trace.stem}-r{repeat}", experiment, "flame", "sticky", trace,
                 config, stage=f"{group}-{config.label()}")
            for repeat in range(repeats) for config in rotate(list(configs), repeat)]


def pairs(experiment: str, stage: str, traces: list[Path], count: int | dict[str, int], flame: FlameSettings,
          pinned: bool = False, placement: str = "sticky") -> list[Case]:
    """Fresh pairs: sticky standalone vLLM (the fixed reference) and Flame sticky sessions (the candidate).

    `count` is pairs per trace, or a count per trace name (a trace may gather more pairs across
    sessions than another). Pair k runs the reference first when k is even, the candidate first when odd.
    """
    if isinstance(count, dict):  # a misspelt name ran nothing for it, without a word (an outsider's, 2026-12-07)
        for name in count:
            pick_trace(traces, name, f"{experiment}: pairs names trace")
    counts = {t.stem: count.get(t.stem, 0) if isinstance(count, dict) else count for t in traces}
    cases = []
    for index in range(max(counts.values(), default=0)):
        for trace in (t for t in traces if index < counts[t.stem]):
            reference = Case(f"{experiment}-{stage}-{trace.stem}-p{index}-vllm", experiment, "standalone", placement,
                             trace, flame, stage=stage, pair=index, side="reference")
            candidate = replace(reference, trial_id=f"{experiment}-{stage}-{trace.stem}-p{index}-flame",
                                system="flame", side="candidate", pinned=pinned)
            cases += [reference, candidate] if index % 2 == 0 else [candidate, reference]
    return cases


def pick_trace(traces: list[Path], name: str, setting: str) -> Path:
    """The trace called `name` (its manifest's stem), which `setting` names. None given of that name is refused: the
    last one given stood in for it, and the manifest named one trace while the numbers were another's (an outsider's,
    2026-12-07)."""
    found = next((t for t in traces if t.stem == name), None)
    if found is None:
        raise ParityError(f"{setting} {name!r} is none of the traces given ({', '.join(t.stem for t in traces) or 'none'})")
    return found


def admission(traces: list[Path], settings: AdmissionSettings) -> list[Case]:
    """Screen batch x window, API x codec, then admission order; then paired stages of the selections.

    The selections are fixed in the configuration before any pair runs (the study's: 128 prompts and
    10 ms, then async + zlib), so no pair is chosen from its own scores.
    """
    base = settings.base
    screen_trace = pick_trace(traces, settings.screen_trace, "admission.screen_trace")
    grid = [replace(base, batch_limit=b, window_ms=w) for b, w in settings.batch_windows]
    selected = with_arm(base, "selected", settings.selected)
    try:  # the study's screens: each engine API and codec over the selection, then each order
        engines = [replace(selected, api=api, compress=compress) for api in ("sync", "async")
                   for compress in (False, True)]
        orders = [replace(selected, api="async", compress=True, order=order) for order in ORDERS]
    except ParityError as exc:
        raise ParityError(f"admission: selected {settings.selected} cannot run the API screen, which runs it with api "
                          f"sync and async: {exc}") from None
    cases = (screening("admission", "screen-batch", screen_trace, grid)
             + screening("admission", "screen-api", screen_trace, engines)
             + screening("admission", "screen-order", screen_trace, orders))
    stage_pairs = settings.stage_pairs
    if stage_pairs:
        cases += pairs("admission", "batch-window", traces, stage_pairs, selected)
        cases += pairs("admission", "async-zlib", traces, stage_pairs, replace(selected, api="async", compress=True))
    return cases


def confirmation(traces: list[Path], count: int | dict[str, int], flame: FlameSettings,
                 arms: tuple[str, ...] = (), flame_arms: dict[str, dict] | None = None,
                 sweep: int | None = None, stages: tuple[str, ...] = ()) -> list[Case]:
    """The final configuration against the fixed sticky vLLM reference, shards pinned to the same GPUs; then,
    for each extra arm (ours: `prefix`), the same pairs with both sides placed by that router (stage
    `final-<arm>`), which the study's table never counts. For each Flame arm (ours; NAME: Flame setting changes,
    e.g. `harvest: {mode: harvest}`), the same pairs again with only the Flame side changed (stage `final-NAME`,
    sticky, pinned); with Flame arms, pair k of every stage runs before pair k+1 of any, so a run cut short
    (device time) holds as many pairs of each arm. `sweep` (ours, unset: the study's warm-ups alone): every
    case's fresh engines first decode groups of 1..sweep short requests (parity.trial.decode_sweep), since two
    whole-burst warm-ups may skip a batch size whose attention kernel then compiles inside the timed window.
    `stages` (ours, empty: every stage): only those stages' pairs, so a device session runs one arm's share alone
    (an earlier session's pairs of the other stages, on other Flame binaries, would otherwise all run again)."""
    if stages:
        planned = confirmation_stages(arms, flame_arms)
        if unknown := [stage for stage in stages if stage not in planned]:
            raise ParityError(f"confirmation: stages names {unknown[0]!r}, not a stage of this plan "
                              f"({', '.join(planned)})")
        return [case for case in confirmation(traces, count, flame, arms, flame_arms, sweep) if case.stage in stages]
    if sweep:
        return [replace(case, sweep=sweep) for case in confirmation(traces, count, flame, arms, flame_arms)]
    cases = pairs("confirmation", "final", traces, count, flame, pinned=True)
    for arm in arms:
        cases += [replace(case, arm=arm) for case in
                  pairs("confirmation", f"final-{arm}", traces, count, flame, pinned=True, placement=arm)]
    confirmation_stages(arms, flame_arms)  # no stage named twice
    flame_arms = running_arms(flame_arms)  # null: an arm the profile switched off
    if not flame_arms:
        return cases  # the study's order, untouched
    for name, changes in flame_arms.items():
        cases += [replace(case, arm=name) for case in
                  pairs("confirmation", f"final-{name}", traces, count, with_arm(flame, name, changes), pinned=True)]
    return sorted(cases, key=lambda case: case.pair)  # stable: each stage's pair keeps its order and first side


def confirmation_stages(arms: tuple[str, ...] = (), flame_arms: dict[str, dict] | None = None) -> list[str]:
    """The confirmation's stages in the plan's order: the study's `final`, then `final-<arm>` for each router arm and
    each Flame arm that runs (null: switched off). Their one home: the plan names its cases so, and the workflow checks
    a profile's `stages` against them before any job starts. An arm named in both would be one stage twice."""
    flame_arms = running_arms(flame_arms)
    if clash := sorted(set(flame_arms) & set(arms)):
        raise ParityError(f"confirmation: flame_arms and arms both name {clash[0]!r} (stage final-{clash[0]} twice)")
    return ["final", *(f"final-{name}" for name in [*arms, *flame_arms])]


def with_arm(flame: FlameSettings, name: str, changes: dict) -> FlameSettings:
    """`flame` with an arm's changes over it; a combination the Flame settings refuse names the arm it came from."""
    try:
        return replace(flame, **known_keys(type(flame), changes, flame.what))
    except ParityError as exc:
        raise ParityError(f"Flame arm {name!r}: {exc}") from None


def gc_diagnostics(trace: Path, flame: FlameSettings, repeats: int = 1) -> list[Case]:
    """Normal collection vs startup-heap freeze in the Flame workers, single trials (diagnostics only)."""
    cases = []
    for repeat in range(repeats):
        for freeze in (False, True) if repeat % 2 == 0 else (True, False):
            config = replace(flame, gc_freeze=freeze)
            name = "freeze" if freeze else "normal"
            cases.append(Case(f"gc-{name}-{trace.stem}-r{repeat}", "gc", "flame", "sticky", trace, config, stage=name))
    return cases


def routing(traces: list[Path], repeats: int, flame: FlameSettings,
            placements: tuple[str, ...] = RoutingSettings.placements) -> list[Case]:
    """Ours, beyond the study: each path with the study's router and with ours, interleaved and rotated."""
    return repetitions("routing", [(system, p) for system in ("standalone", "flame") for p in placements],
                       traces, repeats, flame)


def sustained(traces: list[Path], rates: list[float] | dict[str, list[float]], flame: FlameSettings,
              schedule: Arrivals = Arrivals(), repeats: int = 1, arms: dict[str, dict] | None = None,
              output_tokens: list[int] = (16,), restart: RestartPair | None = None, evict: Evict | None = None,
              lengths: LengthsPair | None = None, shared_start: bool = False, warmup_requests: int | None = None,
              answers: Answers | None = None, bounded: BoundedSettings | None = None,
              objective: Objective = Objective(), replay: ReplayPair | None = None,
              bounded_rates: dict[str, tuple[float, ...]] | None = None,
              run_first: tuple[str, ...] = ()) -> list[Case]:
    """Ours, the study's named next step: a rate ladder, each rate a pair (sticky standalone vLLM, the
    Flame configuration) under the same seeded arrivals, streamed, fresh engines per case; then, for each
    extra arm (name: Flame setting changes, e.g. `gathered: {inflight: 1}`), the same pair again with the
    Flame side changed (stage `rate-R-NAME`); and the whole ladder again for each answer length beyond
    the study's 16 (exact, EOS ignored; stage `rate-R-outN`). With `restart` ({rate, shard, at}), one more
    pair per repeat at that rate kills one engine mid-run on each side (stage `restart-R`; parity.restart).
    With `evict` ({rate, cache_blocks}), one more pair per repeat at that rate runs each engine with a KV
    cache of that many blocks, smaller than the trace's working set, so prefixes are evicted and prefilled
    again (stage `evict-R`). With `lengths` ({rate, median, sigma, low, high, seed}), one more pair per repeat at
    that rate asks each request for its own exact output length, drawn seeded (stage `lengths-R`;
    parity.lengths). The side that goes first alternates. `rates` may name each trace's own (trace stem: rates).

    Ours, to fit long rungs in device time: with `shared_start`, the ladder's rungs of one path and configuration
    (one answer length, one repeat) run on one engine start, each rung cold (prefix caches reset) after its own
    warm-ups; the rungs of a start run together, its standalone and Flame blocks side by side, the side that goes
    first alternating with the repeat (Flame's first in the first repeat: the new path meets the engine first),
    the arms, those `run_first` names first in its order, then the others newest (the last the settings name) first,
    before the study's configuration, measured in its own experiments, so a session that runs out of device time has
    the newest arm (name it in `run_first`: the workflow hands the arms over with their names sorted, so only that
    order survives it). `warmup_requests`: each warm-up
    round is that many requests paced as the rung is (parity.trial). With `answers` ({tokens, rate}), one more
    pair per repeat at that rate with every answer exactly that long (stage `rate-R-outN`: a rung of that
    length's ladder). Each extra pair (`evict`, `lengths`, `answers`, `restart`) runs on the traces whose ladder
    has its rate (with `trace: NAME`, on that trace alone), starts fresh engines, and with `arm: NAME` runs that arm's
    Flame side (stage suffix `-NAME`).

    Ours, with `bounded` (parity.admission.BoundedSettings): at every rung, after its pairs, one more case per path
    on fresh engines, unpaired (each refuses its own requests): the prefix router with bounded admission against
    `objective`, standalone streamed and Flame in the harvest mode over the experiment's Flame settings (arm
    `bounded`, stage `rate-R-bounded`). With `shared_start`, each path's bounded rungs share one start of their
    own instead (`sustained-start-bounded-pK-vllm`/`-flame`), after every arm's blocks: a device session runs
    the bounded ladder on two engine starts, not one per rung and path. With `bounded_rates` (trace: rates), the
    bounded arm runs at those rates instead, each rung with an unbounded sticky standalone case of its own (arm
    `unbounded`, stage `rate-R-unbounded`; with `shared_start`, its rungs on a start of their own just before the
    bounded arm's): the arms then compare within one block of the ladder on one GPU, and the bounded ladder reaches
    past saturation without every arm's pairs there.

    Ours, with `replay` ({trace, arm}): one more pair per repeat on that trace, a recorded one (`parity
    trace-mooncake`), fresh engines, its arrivals replayed and each request asking for its own recorded output
    length, both from the trace's NAME.replay.json (stage `replay`, `replay-ARM` with an arm); the ladder never
    runs on that trace."""
    if bounded is not None and (taken := {"bounded", "unbounded"} & set(arms or {})):
        raise ParityError(f"sustained: an arm is named {sorted(taken)[0]!r}, a name of the bounded-admission arms")
    if bounded_rates is not None and bounded is None:
        raise ParityError("sustained: bounded_rates is the bounded arm's ladder: set bounded too")
    if bounded is not None and bounded.queue_s:
        raise ParityError("sustained: admission setting queue_s (the deadline-aware queue) runs on the standalone "
                          "client only; the Flame client does not hold requests yet")
    if bounded is not None:  # the Flame side streams (harvest mode), so a first token can release its prefill
        if flame.api != "async":
            raise ParityError("sustained: bounded admission's Flame side runs the harvest mode, which needs the "
                              f"async engine API; the experiment's Flame settings say api {flame.api!r}")
        streaming = replace(flame, mode="harvest", inflight=0)
    variants = [(None, flame)] + [(name, with_arm(flame, name, changes)) for name, changes in (arms or {}).items()]
    if unknown := [name for name in run_first if name not in (arms or {})]:
        raise ParityError(f"sustained: run_first names arm {unknown[0]!r}; the arms are {sorted(arms or {}) or 'none'}")
    if shared_start:  # run_first's arms, then the newest (the last named) first, the study's configuration last
        rest = [v for v in variants[1:][::-1] if v[0] not in run_first]
        variants = [v for name in run_first for v in variants if v[0] == name] + rest + variants[:1]
    names = [name for name, _ in variants]  # an arm's place among the blocks (None: the study's configuration)
    replayed = None if replay is None else next((t for t in traces if t.stem == replay.trace), None)
    if replay is not None and replayed is None:
        raise ParityError(f"sustained: replay names trace {replay.trace!r}, which is not among the traces given")
    if replay is not None and replay.arm is not None and replay.arm not in (arms or {}):
        raise ParityError(f"sustained: replay names arm {replay.arm!r}; the arms are {sorted(arms or {}) or 'none'}")
    traces = [t for t in traces if t != replayed]  # the ladder's
    per_trace = rates if isinstance(rates, dict) else {trace.stem: rates for trace in traces}
    cases, turn, blocks = [], [0], {}  # blocks: a start (or a fresh case's trial id) -> its place (by_start)
    ladder = list(dict.fromkeys(r for trace in traces for r in per_trace.get(trace.stem, [])))

    def extra(spec: ExtraPair) -> tuple[float, str | None, FlameSettings, list[Path]]:
        """An extra pair's rate (default: the ladder's first), arm and Flame side (`arm`: that arm's), and the
        traces it runs on: the one it names, else those whose ladder has its rate (every trace, where one ladder
        serves all, or where none has it)."""
        if spec.rate is None and not ladder:
            raise ParityError(f"sustained: {spec.what} has no rate and the ladder none to lend it (every trace's "
                              "rates are empty): give it a rate")
        rate, name = float(ladder[0] if spec.rate is None else spec.rate), spec.arm
        if name is not None and name not in (arms or {}):
            raise ParityError(f"sustained: an extra pair names arm {name!r}; the arms are {sorted(arms or {}) or 'none'}")
        settings = flame if name is None else with_arm(flame, name, arms[name])
        if spec.trace is None:
            return rate, name, settings, [t for t in traces if rate in per_trace.get(t.stem, [])] or list(traces)
        if not (named := [t for t in traces if t.stem == spec.trace]):
            raise ParityError(f"sustained: {spec.what} names trace {spec.trace!r}, which is not among the ladder's "
                              f"traces ({', '.join(t.stem for t in traces)})")
        return rate, name, settings, named

    def pair(kind: str, trace: Path, settings: FlameSettings, repeat: int, arrivals: Schedule, arm: str | None,
             start: str | None = None, **fields) -> None:
        """One pair of stage KIND, or KIND-ARM for an arm's; with `start`, both sides on their path's shared start."""
        stage = kind + (f"-{arm}" if arm else "")
        reference = Case(f"sustained-{stage}-{trace.stem}-p{repeat}-vllm", "sustained", "standalone", "sticky", trace,
                         settings, stage=stage, pair=repeat, side="reference", schedule=arrivals, stream=True,
                         warmup_requests=warmup_requests, arm=arm, **fields)
        candidate = replace(reference, trial_id=f"sustained-{stage}-{trace.stem}-p{repeat}-flame", system="flame",
                            side="candidate")
        if start is not None:  # blocks (by_start): an arm's repeats together; whose block goes first alternates
            reference = replace(reference, start=f"sustained-start{start}-vllm")
            candidate = replace(candidate, start=f"sustained-start{start}-flame")
            place = (names.index(arm), repeat, output_tokens.index(fields["max_tokens"]))
            blocks.setdefault(reference.start, (*place, 1 - repeat % 2))
            blocks.setdefault(candidate.start, (*place, repeat % 2))  # Flame's first: the new path
        cases.extend([reference, candidate] if turn[0] % 2 == 0 else [candidate, reference])
        turn[0] += 1

    def limited(rate: float, trace: Path, repeat: int, tokens: int, length: str, arrivals: Schedule,
                comparator: bool = False) -> None:
        """The bounded arm at one rung, each path unpaired (with `comparator`, after an unbounded sticky standalone
        case of its own); with `shared_start`, each path's on one start of its own, after the arms' blocks."""
        stage = f"rate-{rate:g}{length}-bounded"
        lone = Case(f"sustained-{stage}-{trace.stem}-p{repeat}-vllm", "sustained", "standalone", "prefix", trace,
                    flame, stage=stage, schedule=arrivals, stream=True, max_tokens=tokens,
                    warmup_requests=warmup_requests, arm="bounded", admission=bounded, objective=objective,
                    rung=f"{stage}-{trace.stem}-p{repeat}")
        other = replace(lone, trial_id=lone.trial_id.removesuffix("-vllm") + "-flame", system="flame", flame=streaming)
        free = [replace(lone, trial_id=lone.trial_id.replace("-bounded-", "-unbounded-"), placement="sticky",
                        stage=f"rate-{rate:g}{length}-unbounded", arm="unbounded", admission=None,
                        objective=None)] if comparator else []
        if shared_start:  # the comparator on a start of its own: a start's engines are opened for its first case's
            # router (the prefix router's follow their KV cache events), whichever case a rerun begins with
            lone = replace(lone, start=f"sustained-start-bounded{length}-p{repeat}-vllm")
            other = replace(other, start=f"sustained-start-bounded{length}-p{repeat}-flame")
            free = [replace(c, start=f"sustained-start-unbounded{length}-p{repeat}-vllm") for c in free]
            place = (len(names), repeat, output_tokens.index(tokens))
            for side, case in [(-1, c) for c in free] + [(0, lone), (1, other)]:
                blocks.setdefault(case.start, (*place, side))
        cases.extend(free + [lone, other])

    if bounded_rates is not None and (unknown := set(bounded_rates) - {t.stem for t in traces}):
        raise ParityError(f"sustained: bounded_rates name trace {sorted(unknown)[0]!r}, which is not among the "
                          f"ladder's traces ({', '.join(t.stem for t in traces)})")
    bounded_ladder = sorted({r for rates in (bounded_rates or {}).values() for r in rates})
    for repeat in range(repeats):
        at = lambda rate: schedule.at(rate, repeat)  # noqa: E731
        for tokens in output_tokens:
            length = "" if tokens == 16 else f"-out{tokens}"
            for rate in ladder:
                for arm, settings in variants:
                    for trace in traces:
                        if rate in per_trace.get(trace.stem, []):
                            pair(f"rate-{rate:g}{length}", trace, settings, repeat, at(rate), arm, max_tokens=tokens,
                                 start=f"{'-' + arm if arm else ''}{length}-p{repeat}" if shared_start else None)
                if bounded is not None and bounded_rates is None:
                    for trace in (t for t in traces if rate in per_trace.get(t.stem, [])):
                        limited(rate, trace, repeat, tokens, length, at(rate))
            for rate in bounded_ladder:
                for trace in (t for t in traces if rate in bounded_rates.get(t.stem, ())):
                    limited(rate, trace, repeat, tokens, length, at(rate), comparator=True)
        if evict is not None:
            rate, arm, settings, on = extra(evict)
            for trace in on:
                pair(f"evict-{rate:g}", trace, settings, repeat, at(rate), arm, cache_blocks=evict.cache_blocks)
        if lengths is not None:
            rate, arm, settings, on = extra(lengths)
            drawn = lengths.lengths
            for trace in on:
                pair(f"lengths-{rate:g}", trace, settings, repeat, at(rate), arm, lengths=drawn, max_tokens=drawn.high)
        if answers is not None:
            rate, arm, settings, on = extra(answers)
            for trace in on:
                pair(f"rate-{rate:g}-out{answers.tokens}", trace, settings, repeat, at(rate), arm,
                     max_tokens=answers.tokens)
        if restart is not None:
            rate, arm, settings, on = extra(restart)
            for trace in on:
                pair(f"restart-{rate:g}", trace, settings, repeat, at(rate), arm, restart=restart.restart)
        if replay is not None:
            settings = flame if replay.arm is None else with_arm(flame, replay.arm, arms[replay.arm])
            recorded = str(replay_file(replayed))
            pair("replay", replayed, settings, repeat, Schedule(kind="replay", replay=recorded), replay.arm,
                 lengths=OutputLengths(replay=recorded))
    if not cases:
        raise ParityError("sustained: no case (every trace's rates are empty and no extra pair names a trace)")
    if not shared_start:
        return cases
    for number, case in enumerate(c for c in cases if c.start is None):  # an arm's extra pairs right after its blocks
        blocks[case.trial_id] = (names.index(case.arm), repeats, number) if case.arm in names[:-1] else (len(names),)
    return by_start(cases, blocks)


def replay_file(trace: Path) -> Path:
    """A recorded trace's arrivals and output lengths: NAME.replay.json beside its manifest NAME.json
    (parity.trace_mooncake writes both)."""
    return trace.with_name(f"{trace.stem}.replay.json")


def by_start(cases: list[Case], place: dict[str, tuple]) -> list[Case]:
    """The cases in blocks, one per shared start, each block's cases in their order, and fresh cases, ordered by
    `place` (a start or a fresh case's trial id -> a sort key); fresh cases without one after everything, in their
    order. A start is opened once, so its cases run together."""
    units: dict[str, list[Case]] = {}
    for case in cases:
        units.setdefault(case.start if case.start is not None else case.trial_id, []).append(case)
    last = (float("inf"),)
    ordered = sorted(units, key=lambda name: place.get(name, last))  # stable: unplaced fresh cases keep their order
    return [case for name in ordered for case in units[name]]


def paced_span_s(cases: list[Case], requests: dict[Path, int]) -> float:
    """How long the paced cases' arrivals take in all (each one's requests / rate; `requests`: per trace);
    ParityError, in one line, for a case faster than MAX_RATE_PER_S or longer than MAX_RUNG_S."""
    total = 0.0
    for case in cases:
        if case.schedule.paced:
            total += check_pace(case.trial_id, case.schedule.rate, requests[case.trace])
    return total


def check_pace(what: str, rate: float, count: int) -> float:
    """How long `count` requests paced at `rate` take; ParityError, in one line, past what a sender can hold
    (MAX_RATE_PER_S) or a rung may take (MAX_RUNG_S). The experiments' cases and the benches' streams both."""
    if rate > MAX_RATE_PER_S:
        raise ParityError(f"{what}: {rate:g} requests/s is more than a sender can hold (at most "
                          f"{MAX_RATE_PER_S:g}: faster, the gaps between sends are shorter than its own 1 ms lag)")
    if count / rate > MAX_RUNG_S:
        raise ParityError(f"{what}: {count} requests at {rate:g} requests/s take about {about(count / rate)}, "
                          f"longer than the {about(MAX_RUNG_S)} a rung may take; raise the rate")
    return count / rate


def about(seconds: float) -> str:
    """A duration as a person reads it: 0.5 s, 40 s, 12 min, 1 h, 2.2 h."""
    if seconds < 60:
        return f"{round(seconds, 1):g} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{round(seconds / 3600, 1):g} h"


def named_traces(name: str, traces: list[Path], names: tuple[str, ...] | None) -> None:
    """The traces an experiment's settings name (`traces`: routing, sustained) are among those it is given
    (by file stem): the settings are recorded as what ran."""
    given = [t.stem for t in traces]
    if unknown := [n for n in names or () if n not in given]:
        raise ParityError(f"{name}: the settings name trace {unknown[0]!r}, which is not among the traces given "
                          f"({', '.join(given)})")


def _routing(traces: list[Path], s: RoutingSettings) -> list[Case]:
    named_traces("routing", traces, s.traces)
    return routing(traces, s.repeats, s.flame, s.placements)


def _sustained(traces: list[Path], s: SustainedSettings) -> list[Case]:
    named_traces("sustained", traces, s.traces)
    if isinstance(s.rates, dict) and (unknown := set(s.rates) - {t.stem for t in traces}):
        raise ParityError(f"sustained: rates name trace {sorted(unknown)[0]!r}, which is not among the traces given")
    return sustained(traces, s.rates, s.flame, s.schedule, s.repeats, s.arms, s.output_tokens, s.restart, s.evict,
                     s.lengths, s.shared_start, s.warmup_requests, s.answers, s.bounded, s.objective,
                     s.replay, s.bounded_rates, s.run_first)


class Experiment(NamedTuple):
    settings: type[Section]  # the experiments.NAME section of the workflow config, typed
    plan: Callable[[list[Path], Section], list[Case]] | None  # its cases (None: it runs no cases)


# Every experiment: its settings and its plan. A new one is one entry here, one class in
# parity.experiments.settings and its section in the config schema (tests/test_experiment_settings.py).
EXPERIMENTS: dict[str, Experiment] = {
    "locality": Experiment(LocalitySettings, lambda traces, s: locality(traces, s.repeats, s.flame)),
    "admission": Experiment(AdmissionSettings, admission),
    "confirmation": Experiment(ConfirmationSettings,
                               lambda traces, s: confirmation(traces, s.pairs, s.flame, s.arms, s.flame_arms,
                                                                            s.sweep, s.stages)),
    "gc": Experiment(GcSettings, lambda traces, s: gc_diagnostics(pick_trace(traces, s.trace, "gc.trace"), s.flame, s.repeats)),
    "offline-limit": Experiment(OfflineLimitSettings, None),  # shards on the engine (experiments.offline_limit)
    "routing": Experiment(RoutingSettings, _routing),
    "sustained": Experiment(SustainedSettings, _sustained),
}


def registered(name: str) -> Experiment:
    """Experiment `name`'s entry in the registry; an unknown name is one line naming the known ones."""
    if name not in EXPERIMENTS:
        raise ParityError(f"unknown experiment {name!r}: use one of {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def settings_of(name: str, values: dict | None) -> Section:
    """Experiment `name`'s typed settings from the workflow config's experiments.NAME."""
    return registered(name).settings.from_dict(values)


def runs_cases(name: str) -> bool:
    """Whether experiment `name` runs cases on the serving paths (Flame's among them); one that runs none, the
    offline limit, hands its shards to the engine alone (parity.experiments.offline_limit)."""
    return registered(name).plan is not None


def for_experiment(name: str, traces: list[Path], settings: dict) -> list[Case]:
    """The cases of experiment `name` from its settings (the workflow config's experiments.NAME)."""
    typed = settings_of(name, settings)
    if EXPERIMENTS[name].plan is None:
        raise ParityError(f"{name} has no cases: it runs each shard on the engine "
                          "(parity.experiments.offline_limit.run)")
    cases = EXPERIMENTS[name].plan(traces, typed)
    seen: set[str] = set()
    for case in cases:  # e.g. a Flame arm "no": stage final-no on trace reuse is stage final on no-reuse (outside pass M)
        if case.trial_id in seen:
            raise ParityError(f"{name}: its plan names trial {case.trial_id} twice: an arm's name joined to a trace's "
                              "reads as another stage's (rename the arm)")
        seen.add(case.trial_id)
    return cases


def check_experiment(name: str, settings: dict, requests: dict[str, int], engine: Backend) -> None:
    """What experiment `name`'s job would refuse of its settings, said before any job runs (the job says it hours
    into a GPU run, some of it after trials ran; an outside tester, 2026-12-06): its typed settings, its plan on
    its traces' names alone (their files are made by jobs), each paced case's rate and span (`requests`: each trace's
    requests, or a count it has at least), a restart's shard among a path's shards and each case's answers within
    the engine's context (`engine`: the backend, read once for every experiment). ParityError, one line."""
    typed = settings_of(name, settings)
    if not runs_cases(name):
        return
    counts = {Path(f"{trace}.json"): count for trace, count in requests.items()}  # the plan knows a trace by its stem
    cases = for_experiment(name, list(counts), settings)
    if not cases:  # the job refuses it (`run_experiment`), after the experiments before it ran
        raise ParityError(f"{name}: its settings and traces make no cases to run")
    paced_span_s(cases, counts)
    gpus = 2 if list(engine.gpus) == ["auto"] else len(engine.gpus)  # auto: at most two (Backend.gpu_uuids)
    shards = min(getattr(typed, "shards", None) or gpus, gpus)  # a path's: one per GPU (the runner's)
    context = engine.args().max_model_len
    for case in cases:
        if case.restart is not None:
            case.restart.delay_s([1.0], shards)  # its shard alone: the arrivals are drawn by the job
        tokens = case.lengths.high if case.lengths is not None and not case.lengths.replay else case.max_tokens
        if tokens is not None and tokens >= context:  # a prompt has a token at least
            raise ParityError(f"{case.trial_id}: {tokens} output tokens leave no room for a prompt within the "
                              f"engine's max_model_len {context}")
