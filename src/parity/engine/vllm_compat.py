"""Everything that differs between vLLM versions (0.26.0 on our H200 hosts, 0.28.0 in the image).

Kept in one place, and free of vLLM imports at module level, so the request/response mapping is
tested on machines without vLLM or a GPU.
"""

from __future__ import annotations

import json
import os
from typing import Any

from parity.engine import SAMPLING, Completion, EngineArgs, length_mismatch
from parity.errors import ParityError

SUPPORTED = ("0.26", "0.27", "0.28")
# Offline hygiene: no usage report, no hub, loopback only, reproducible block hashes.
# The engine core is spawned, as `vllm serve` spawns it, never forked from a client's heap.
ENVIRONMENT = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1",
               "PYTHONHASHSEED": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def check_version(version: str) -> str:
    """The minor series, or a clear error for a vLLM this artifact was not written against."""
    series = ".".join(version.split(".")[:2])
    if series not in SUPPORTED:
        raise ParityError(f"vLLM {version} is not supported (supported: {', '.join(SUPPORTED)})")
    return series


def engine_kwargs(args: EngineArgs, version: str) -> dict[str, Any]:
    """Keyword arguments for `LLM(...)` and `AsyncEngineArgs(...)` from the study's settings.

    Triton attention goes through `attention_config`: the VLLM_ATTENTION_BACKEND variable is
    silently ignored in 0.26 and 0.28. Prompts are token IDs, so no tokenizer is loaded.
    """
    check_version(version)
    kwargs = {
        "model": args.model,
        "dtype": args.dtype,
        "enforce_eager": args.enforce_eager,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": args.enable_prefix_caching,
        "block_size": args.block_size,
        "tensor_parallel_size": args.tensor_parallel_size,
        "load_format": args.load_format,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "seed": args.seed,
        "prefix_caching_hash_algo": args.prefix_caching_hash_algo,
        "skip_tokenizer_init": True,
        "attention_config": {"backend": args.attention_backend},
        "jit_monitor_verbose": True,  # every kernel compiled after vLLM's own warm-up is logged (parity.jit)
    }
    if args.revision and args.load_format != "dummy":
        kwargs["revision"] = args.revision
    if args.num_gpu_blocks_override is not None:
        kwargs["num_gpu_blocks_override"] = args.num_gpu_blocks_override
    return kwargs


def kv_events_kwargs(endpoint: str | None) -> dict[str, Any]:
    """`kv_events_config` for `LLM(...)` / `AsyncEngineArgs(...)`: publish KV cache events to `endpoint` (the
    same config `vllm serve --kv-events-config` takes; `KVEventsConfig` in 0.26-0.28)."""
    if not endpoint:
        return {}
    from vllm.config import KVEventsConfig

    from parity.kv_events import config_json

    return {"kv_events_config": KVEventsConfig(**json.loads(config_json(endpoint)))}


def sampling_kwargs(final_only: bool = False, sampling: dict = SAMPLING) -> dict[str, Any]:
    """Greedy, no detokenising (there is no tokenizer); by default exactly 16 tokens, EOS ignored."""
    kwargs = dict(sampling, detokenize=False)
    if final_only:
        from vllm.sampling_params import RequestOutputKind

        kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY
    return kwargs


def serve_arguments(args: EngineArgs, port: int) -> list[str]:
    """`vllm serve` flags for the same settings, bound to loopback with cached-token details."""
    import json

    flags = [
        args.model, "--host", "127.0.0.1", "--port", str(port), "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--block-size", str(args.block_size),
        "--tensor-parallel-size", str(args.tensor_parallel_size), "--load-format", args.load_format,
        "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--seed", str(args.seed),
        "--prefix-caching-hash-algo", args.prefix_caching_hash_algo,
        "--attention-config", json.dumps({"backend": args.attention_backend}),
        "--skip-tokenizer-init", "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
        "--jit-monitor-verbose",  # every kernel compiled after vLLM's own warm-up is logged (parity.jit)
    ]
    if args.enforce_eager:
        flags.append("--enforce-eager")
    flags.append("--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching")
    if args.revision and args.load_format != "dummy":
        flags += ["--revision", args.revision]
    if args.num_gpu_blocks_override is not None:
        flags += ["--num-gpu-blocks-override", str(args.num_gpu_blocks_override)]
    return flags


def to_completion(output: Any, submit_s: float, complete_s: float, sampling: dict = SAMPLING) -> Completion:
    """Map a vLLM `RequestOutput` to a Completion; a length outside the sampling's bounds is an error."""
    tokens = list(output.outputs[0].token_ids)
    if expected := length_mismatch(len(tokens), sampling):
        raise ParityError(f"request {output.request_id} returned {len(tokens)} tokens, expected {expected}")
    return Completion(output_token_ids=[int(t) for t in tokens],
                      prompt_tokens=len(output.prompt_token_ids or []),
                      cached_tokens=int(output.num_cached_tokens or 0),
                      submit_s=submit_s, complete_s=complete_s,
                      extra={"finish_reason": output.outputs[0].finish_reason})


def apply_environment() -> None:
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def visible_gpu() -> tuple[str, str]:
    """UUID and name of the GPU this process sees as device 0 (CUDA_VISIBLE_DEVICES pins it).

    Read through NVML when CUDA_VISIBLE_DEVICES names a UUID, as every parity launcher does, so this
    process opens no CUDA context beside its engine core's: `vllm serve`'s API server holds none, and a
    context here takes memory on the engine's GPU. Anything else is read through torch (opening one).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith("GPU-"):
        from vllm.third_party import pynvml

        try:
            pynvml.nvmlInit()
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
                return pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            raise ParityError(f"CUDA_VISIBLE_DEVICES names {visible}, which NVML cannot find: {exc}") from exc
    import torch

    if not torch.cuda.is_available():
        raise ParityError("no CUDA device visible: the vLLM engine needs a GPU (use the sim engine on CPU)")
    return f"GPU-{torch.cuda.get_device_properties(0).uuid}", torch.cuda.get_device_name(0)


def versions() -> dict[str, str | None]:
    import torch
    import vllm

    return {"vllm": vllm.__version__, "torch": torch.__version__}
