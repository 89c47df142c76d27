"""Serving paths: how a trial's requests reach an engine, behind one interface, found by name.

A path is a context manager: entering starts what it owns (replicas; nothing for a path on a shared
Flame cluster or an engine its caller opened), leaving tears that down and leaves its cleanup receipt
at `receipt_path`. The trial lifecycle (`parity.trial`) then uses three calls:

    with path.trial(trial_id, router):         # cold prefix caches, or fresh Flame sessions
        burst = path.release(prompts, ids, router.make(path.shards), schedule)   # warmups, then the trial
        described = path.describe(burst)       # what ran: engine, GPUs, config, extras for the manifest

Under the prefix router a path's engines publish their KV cache events to `events` (a subscriber the
path opens before they start), which the trial's router follows.

`release` routes every request with the router it is given, sends it at its time in the arrival
schedule, and returns per request what happened (a `Burst`). Given a `restart` (parity.restart), it
kills that shard's engine mid-run, brings a new one up, sends it what the dead one had not answered,
and records the outage in the burst's `extra["restart"]`. Given `lengths` (parity.lengths), request k
asks for exactly `lengths[k]` new tokens, EOS ignored. The name a path is registered under is
the `system` its trial manifests name. Built in: `standalone` (replicas over HTTP), `flame` (Flame
sessions) and `engine` (the engine alone). A new path subclasses `ServingPath`, is decorated with
`@register("name")`, and gives `for_case` so the experiment runner can open it for a case.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterator

from parity.engine import Completion
from parity.errors import ParityError
from parity.record import Placement
from parity.routing import SHARDED

BUILT_IN = ("parity.paths.standalone", "parity.paths.flame", "parity.paths.engine")
_PATHS: dict[str, type["ServingPath"]] = {}


@dataclass
class Burst:
    """What one release gave, in burst order; times on the path's clock."""

    release_s: float
    completions: list[Completion]
    placements: list[Placement]
    input_hashes: list[str] | None = None  # of the token IDs the server or worker says it received
    extra: dict = field(default_factory=dict)  # facts of this burst for the manifest (Flame: batches, workers)
    refused: dict[str, str] = field(default_factory=dict)  # bounded admission: request id -> why it was refused
    # (never sent; completions, placements and input hashes are the admitted requests', in burst order)

    @property
    def duration_s(self) -> float:
        return max(c.complete_s for c in self.completions) - self.release_s


@dataclass
class Described:
    """What a trial ran on, for its manifest."""

    engine: dict  # name, version, args, simulated
    gpus: list[dict]  # {"uuid": ...} per GPU the trial names
    config: dict  # the path's settings, merged into the trial's config
    extra: dict = field(default_factory=dict)  # top-level manifest entries (Flame: cluster, binaries, network)


class ServingPath:
    """The serving-path interface; see the module docstring."""

    name: ClassVar[str] = ""  # set by `register`
    placements: ClassVar[tuple[str, ...]] = SHARDED  # the placements it takes (parity.routing.PLACEMENTS)
    receipt_path: Path | None = None
    receipt: dict | None = None
    events = None  # a parity.kv_events.Subscriber while the path's engines publish KV cache events (placement prefix)

    @classmethod
    def for_case(cls, case, runner) -> "ServingPath":
        """The path for one experiment case (`parity.experiments.plan.Case`), on the runner's backend and
        GPUs; `runner.shared(key, make)` holds what every case shares (the Flame cluster)."""
        raise ParityError(f"the {cls.name} path cannot run experiment cases")

    def __enter__(self) -> "ServingPath":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close(*exc)
        finally:
            self.write_receipt()

    def write_receipt(self) -> None:
        """The teardown's receipt at `receipt_path`, where both are set: on exit, and by a path whose start failed
        after it started something (it tore that down itself: `__exit__` never runs for a failed `__enter__`)."""
        if self.receipt_path is not None and self.receipt is not None:
            from parity.manifest import write_manifest

            write_manifest(self.receipt_path, self.receipt)

    def close(self, *exc) -> None:
        """Tear down what the path started (`exc`: how its block ended, as `__exit__` gets it); `receipt` says how."""

    @property
    def shards(self) -> int:
        """How many shards the router chooses among (inside `trial`)."""
        return 1

    @property
    def cache_tokens(self) -> int | None:
        """KV cache tokens of one shard's engine, where the path knows them (the prefix router is sized so)."""
        return None

    @contextlib.contextmanager
    def trial(self, trial_id: str, router) -> Iterator[None]:
        """Fresh state for one trial (warmups and the measured burst), closed after it."""
        yield

    def jit_logs(self) -> list[Path]:
        """Where the path's vLLM engines log each kernel they compile after their own warm-up (parity.jit);
        none for engines that compile nothing (the simulator)."""
        return []

    def release(self, prompts: list, request_ids: list[str], router, schedule, restart=None,
                lengths: list[int] | None = None) -> Burst:
        raise NotImplementedError

    def describe(self, burst: Burst) -> Described:
        raise NotImplementedError


def register(name: str):
    """Class decorator: make a ServingPath findable as `get(name)`; `name` is its trials' system."""

    def add(cls: type[ServingPath]) -> type[ServingPath]:
        if name in _PATHS and _PATHS[name] is not cls:
            raise ParityError(f"a serving path named {name!r} is already registered ({_PATHS[name].__qualname__})")
        cls.name = name
        _PATHS[name] = cls
        return cls

    return add


def get(name: str) -> type[ServingPath]:
    """The serving path registered as `name`; ParityError naming the known ones otherwise."""
    if name not in _PATHS:
        for module in BUILT_IN:  # imported on first use: the command line starts without flamepy or aiohttp
            importlib.import_module(module)
    if name not in _PATHS:
        raise ParityError(f"unknown serving path {name!r}: use one of {', '.join(sorted(_PATHS))}")
    return _PATHS[name]
