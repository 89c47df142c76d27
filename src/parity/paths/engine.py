"""The engine alone: a burst handed straight to one engine, with no serving path around it.

All prompts at once (`batch=None`), as `LLM.generate` would take a shard's whole burst, or in fixed
batches, as a synchronous Flame adapter hands them over. The caller opens the engine (one engine may
serve many trials); each trial starts on a cold prefix cache. This is the offline limit's path, and
how the simulator is calibrated. With one shard, routing chooses nothing: prompts are routed before
the release, so the router's time is not counted as the engine's.
"""

from __future__ import annotations

import contextlib

from parity.engine import OUTPUT_TOKENS, Engine
from parity.errors import ParityError
from parity.paths import Burst, Described, ServingPath, register
from parity.record import Placement


@register("engine")
class EnginePath(ServingPath):
    def __init__(self, engine: Engine, batch: int | None = None):
        self.engine, self.batch = engine, batch

    @property
    def cache_tokens(self) -> int | None:
        params = getattr(self.engine, "params", None)  # the simulator's KV pool; vLLM's is not exposed here
        return getattr(params, "kv_cache_tokens", None)

    @contextlib.contextmanager
    def trial(self, trial_id: str, router):
        self.engine.reset_prefix_cache()  # earlier runs on this engine must not warm this one
        yield

    def release(self, prompts, request_ids, router, schedule, restart=None, lengths=None) -> Burst:
        if restart is not None:
            raise ParityError("the engine alone has no replica or worker to restart")
        if lengths is not None:
            raise ParityError("the engine alone runs the offline limit's fixed output length, not lengths per request")
        if any(schedule.offsets(len(prompts))):
            raise ParityError(f"the engine alone takes a whole burst at once, not a {schedule.kind} schedule")
        shards = [router.route(p) for p in prompts]
        size = self.batch or len(prompts)
        release = self.engine.now()
        completions = []
        for start in range(0, len(prompts), size):
            completions += self.engine.generate(prompts[start:start + size])
        bad = [c for c in completions if len(c.output_token_ids) != OUTPUT_TOKENS]
        if bad:
            raise ParityError(f"{len(bad)} request(s) did not return exactly {OUTPUT_TOKENS} tokens")
        described = self.engine.describe()
        gpu = described.get("gpu_uuid", "unknown")
        placements = [Placement(shard, described["name"], gpu, None if self.batch is None else f"b{i // self.batch}")
                      for i, shard in enumerate(shards)]
        return Burst(release, completions, placements)

    def describe(self, burst: Burst) -> Described:
        d = self.engine.describe()
        config = {"engine": d["name"], "batch": self.batch, "mode": d.get("mode"), "clock": d.get("clock")}
        return Described(d, [{"uuid": d.get("gpu_uuid", "unknown"), "name": str(d.get("device", ""))}], config,
                         {"engine_description": d})
