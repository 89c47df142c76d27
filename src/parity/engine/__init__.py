"""One engine interface for both serving paths: real vLLM (sync or async) or the simulator.

Both serving paths (standalone and Flame) hand an engine token-ID prompts and get back, per prompt,
the output token IDs, the cached prompt tokens and timestamps. The study's sampling is fixed here:
exactly 16 new tokens, EOS ignored, greedy. Engines know nothing about HTTP or Flame.
"""

from __future__ import annotations

import abc
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

from parity.settings import checked_fields  # noqa: F401  (EngineArgs and SimParams check their keys with it)
from parity.study import MAX_MODEL_LEN, OUTPUT_TOKENS

SAMPLING = {"max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}
# The meta-llama/Llama-3.1-8B-Instruct commit the artifact fetches (manifests/pins/llama-3.1-8b-instruct.json,
# every file's SHA-256 public) and vLLM loads.
HUB_REVISION = "0e9e39f249a16976918f6564b8830bc894c89659"


@dataclass(frozen=True)
class EngineArgs:
    """Engine settings, defaulting to the study's table (same for both paths)."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    revision: str | None = HUB_REVISION
    dtype: str = "bfloat16"
    enforce_eager: bool = True
    attention_backend: str = "TRITON_ATTN"
    max_model_len: int = MAX_MODEL_LEN
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    block_size: int = 16
    tensor_parallel_size: int = 1
    load_format: str = "auto"  # "dummy": random weights from config.json, for shape-only runs
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    prefix_caching_hash_algo: str = "sha256_cbor"  # reproducible block hashes across processes
    max_tokens: int = OUTPUT_TOKENS  # new tokens per prompt (the study: 16; MLPerf: up to 128)
    ignore_eos: bool = True  # the study: exactly max_tokens; False: stop at EOS, at least 1 (MLPerf)
    num_gpu_blocks_override: int | None = None  # ours: a KV cache of this many blocks (the eviction case); None: as memory allows

    def sampling(self, tokens: int | None = None) -> dict:
        """Greedy sampling from these settings; the defaults give the study's SAMPLING. `tokens`: one
        request's own length (parity.lengths), in place of max_tokens."""
        tokens = self.max_tokens if tokens is None else tokens
        return {"max_tokens": tokens, "min_tokens": tokens if self.ignore_eos else 1,
                "ignore_eos": self.ignore_eos, "temperature": 0.0}

    def to_dict(self) -> dict:
        """Every setting; the cache override only when set, so the study's trials record what they did."""
        values = asdict(self)
        if values["num_gpu_blocks_override"] is None:
            del values["num_gpu_blocks_override"]
        return values

    @classmethod
    def from_dict(cls, values: dict | None) -> "EngineArgs":
        """From a mapping (KEY=VALUE options, a backend's engine_args); ParityError on a bad key or value."""
        values = checked_fields(cls, values, "engine argument")
        from parity.errors import ParityError

        for key in COUNTS & set(values):
            if values[key] is not None and values[key] < 1:
                raise ParityError(f"engine argument {key} must be at least 1, got {values[key]!r}")
        if not 0 < values.get("gpu_memory_utilization", 0.9) <= 1:
            raise ParityError(f"engine argument gpu_memory_utilization must be in (0, 1], "
                              f"got {values['gpu_memory_utilization']!r}")
        return cls(**values)


COUNTS = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size",
          "max_tokens", "num_gpu_blocks_override"}
def length_mismatch(count: int | None, sampling: dict) -> str | None:
    """What was expected, when `count` new tokens fall outside the sampling's bounds; else None."""
    low, high = sampling["min_tokens"], sampling["max_tokens"]
    if count is not None and low <= count <= high:
        return None
    return str(high) if low == high else f"{low} to {high}"


@dataclass
class Completion:
    """One prompt's result. Times are seconds on the engine's clock (wall or virtual)."""

    output_token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    submit_s: float
    complete_s: float
    extra: dict = field(default_factory=dict)
    token_s: list[float] | None = None  # when each output token was produced or, streamed, received (None: unknown)
    sent_s: float | None = None  # when the request actually left its client (its schedule said `submit_s`)
    due_s: float | None = None  # when its last try was due to leave, where a retry or a hold made that later than its
    # arrival (bounded admission): the send lag is measured from it, its latencies still from the arrival

    @property
    def first_token_s(self) -> float | None:
        return self.token_s[0] if self.token_s else None


class Engine(abc.ABC):
    """Generate for a list of token-ID prompts; outputs come back in input order."""

    name: str = "engine"
    simulated: bool = False

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int] | None = None) -> list[Completion]:
        """Run the prompts as one admission; block until all are complete. `lengths`: each prompt's exact
        output length (parity.lengths), at most max_tokens; None: max_tokens each."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """Engine name and version, arguments, device and GPU UUID, and whether simulated."""

    @abc.abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, so the next burst starts cold (between runs on one engine)."""

    def now(self) -> float:
        """The clock its Completion times use (wall by default; the simulator's may be virtual)."""
        return time.monotonic()

    def close(self) -> None:
        """Release the device. Safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


ENGINES = ("sim", "vllm-sync", "vllm-async")  # the engine kinds (a replica's `vllm serve` is a server, not one)
FAMILIES = ("sim", "vllm")  # what a backend names: the simulator or real vLLM


def engine_kind(family: str, api: str) -> tuple[str, str]:
    """(engine kind, simulator mode) of a family driven through the sync or async engine API."""
    return ("sim", api) if family == "sim" else (f"vllm-{api}", "sync")


def make_engine(kind: str, args: EngineArgs | None = None, *, kv_events: str | None = None, token_times: bool = False,
                **sim_options) -> Engine:
    """`sim` (the CPU default; `mode` sync or async), `vllm-sync` or `vllm-async` (real GPU). `kv_events`:
    a subscriber's endpoint the engine publishes its KV cache events to (`parity.kv_events`); `token_times`:
    time every output token (the simulator always does; `vllm-sync`'s LLM.generate cannot)."""
    args = args or EngineArgs()
    if kind == "sim":
        from parity.engine.sim import SimEngine

        return SimEngine(args, kv_events=kv_events, **sim_options)
    from parity.errors import ParityError

    if kind in ("vllm-sync", "vllm-async"):
        from parity.engine.vllm_engines import VllmAsyncEngine, VllmSyncEngine

        try:
            if kind == "vllm-sync":
                return VllmSyncEngine(args, kv_events=kv_events)
            return VllmAsyncEngine(args, kv_events=kv_events, token_times=token_times)
        except ImportError as exc:
            raise ParityError(f"{kind} needs vLLM and torch ({exc.name} is missing): install parity[gpu] "
                              f"on a GPU host, or use the sim engine on a CPU") from None

    raise ParityError(f"unknown engine {kind!r}: use one of {', '.join(ENGINES)}")
