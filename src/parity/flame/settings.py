"""The Flame path's settings: one object, in the workflow config's units, passed whole everywhere.

The workflow config, `parity flame run`'s options, each trial's config and each worker's session data
all carry this object as it is (milliseconds, MiB); the client and the service read the seconds and
bytes they need from its properties, so the units are converted here and nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from parity.errors import ParityError
from parity.flame.admission import check as check_order
from parity.settings import Settings

APIS = ("sync", "async")
MODES = ("burst", "harvest")  # parity.flame.harvest says what the second one is


@dataclass(frozen=True)
class FlameSettings(Settings):
    """The Flame adapter's knobs (the study's first configuration by default)."""

    what = "Flame setting"
    recorded_when_set = ("inflight", "rotate_tasks", "express")  # the study's configurations record what they did

    batch_limit: int = 32  # prompts per task at most
    window_ms: float = 2.0  # a batch closes this long after its first prompt
    budget_mib: float = 2.0  # decoded payload per task at most
    api: str = "sync"  # the engine API a worker drives: sync (LLM.generate) or async (AsyncLLM)
    compress: bool = False  # zlib level 1 task inputs
    gc_freeze: bool = False  # freeze the worker's startup heap (gc.freeze)
    order: str = "arrival"  # admission order of a batch in the engine: arrival | prefix
    inflight: int = 0  # ours: tasks a session has running at most, the next batch gathering meanwhile (0: no
    # limit, the study's: each batch is sent when its window closes, and queues behind the running one)
    mode: str = "burst"  # ours beside the study's: burst (one task = one batch's outputs, the study's) or harvest
    # (parity.flame.harvest: one task outstanding per session, admitting what arrived, returning engine events;
    # a task goes as the last one returns, so window_ms does not apply)
    hold_ms: float = 5.0  # harvest: how long a task waits at most for an engine event before it returns empty
    rotate_tasks: int = 0  # ours, harvest: after this many tasks on one session, drain it and go on with a fresh one
    # (a new worker and engine), so Flame v0.6.0's session manager, which keeps every task of a session in memory
    # until the session is deleted, stays bounded (parity.flame.harvester); 0: never, the default
    express: bool = False  # ours, harvest: a prompt arriving while the session's task is out goes at once in a second
    # task, queued behind it in Flame's session manager, instead of waiting for the first to come back (at most two
    # outstanding; parity.flame.harvester). Off: exactly one task outstanding, as the harvest arm ran

    def check(self):  # when the plan is made, not when a worker binds after earlier cases ran
        check_order(self.order)
        if self.api not in APIS:
            raise ParityError(f"Flame setting api {self.api!r}: use one of {', '.join(APIS)}")
        if self.inflight < 0:
            raise ParityError(f"Flame setting inflight must be 0 (no limit) or more, got {self.inflight}")
        self._check_mode()
        if self.batch_limit < 1 or self.window_ms < 0 or self.budget_mib <= 0:
            raise ParityError(f"Flame settings: batch_limit must be >= 1, window_ms >= 0 and budget_mib > 0, "
                              f"got {self.batch_limit}, {self.window_ms} and {self.budget_mib}")

    def _check_mode(self) -> None:
        """Harvest admits each prompt into a running engine (AsyncLLM's API) and keeps exactly one task per
        session outstanding, so it refuses the sync API and an inflight limit; a hold without harvest would
        be silently ignored, so it is refused too."""
        if self.mode not in MODES:
            raise ParityError(f"Flame setting mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.mode == "burst":
            if self.hold_ms != FlameSettings.hold_ms:
                raise ParityError(f"Flame setting hold_ms ({self.hold_ms:g}) applies only with mode harvest")
            if self.rotate_tasks:
                raise ParityError(f"Flame setting rotate_tasks ({self.rotate_tasks}) applies only with mode harvest")
            if self.express:
                raise ParityError("Flame setting express applies only with mode harvest")
            return
        if self.api != "async":
            raise ParityError("Flame setting mode harvest needs api async: it admits prompts into a running engine")
        if self.inflight:
            raise ParityError(f"Flame setting mode harvest keeps one task per session outstanding: "
                              f"leave inflight unset, got {self.inflight}")
        if self.hold_ms < 0:
            raise ParityError(f"Flame setting hold_ms must be 0 or more, got {self.hold_ms:g}")
        if self.rotate_tasks < 0:
            raise ParityError(f"Flame setting rotate_tasks must be 0 (never) or more, got {self.rotate_tasks}")

    @property
    def hold_s(self) -> float:
        return self.hold_ms / 1000

    @property
    def window_s(self) -> float:
        return self.window_ms / 1000

    @property
    def budget(self) -> int:
        """The payload budget in bytes."""
        return int(self.budget_mib * 1024 * 1024)

    def to_dict(self) -> dict:
        """As `from_dict` takes it; `inflight`, `mode`, `hold_ms`, `rotate_tasks` and `express` only when set, so the
        study's configurations (and the harvest arm as it ran) record what they did."""
        values = super().to_dict()  # inflight, rotate_tasks and express: `recorded_when_set`
        if self.mode == "burst":
            del values["mode"], values["hold_ms"]
        return values

    def label(self) -> str:
        return (f"b{self.batch_limit}-w{self.window_ms:g}ms-{self.api}-{'zlib' if self.compress else 'raw'}"
                + ("-freeze" if self.gc_freeze else "") + ("" if self.order == "arrival" else f"-{self.order}")
                + (f"-inflight{self.inflight}" if self.inflight else "")
                + (f"-harvest-h{self.hold_ms:g}ms" if self.mode == "harvest" else "")
                + (f"-rotate{self.rotate_tasks}" if self.rotate_tasks else "") + ("-express" if self.express else ""))


def running_arms(flame_arms: dict | None) -> dict:
    """The Flame arms (NAME: changes to the Flame settings) a confirmation runs, of those its settings name: null is
    an arm a profile switched off (read so by the plan, the workflow's stage check and the report alike)."""
    return {name: changes for name, changes in (flame_arms or {}).items() if changes is not None}


def session_data(settings: FlameSettings, engine: str, engine_args: dict, sim_params: str | None,
                 kv_events: str | None = None, token_times: bool = False) -> bytes:
    """What every worker of a session receives (Flame's common data): the engine family to build, its
    arguments and simulator file, the Flame settings whole, and where its engine publishes KV cache
    events (a subscriber's loopback endpoint, when the router follows them), and whether its engine times
    every output token (`token_times`: a streaming measurement)."""
    return json.dumps({"engine": engine, "engine_args": engine_args, "sim_params": sim_params,
                       "flame": settings.to_dict()} | ({"kv_events": kv_events} if kv_events else {})
                      | ({"token_times": True} if token_times else {}), sort_keys=True).encode()
