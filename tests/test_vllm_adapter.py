"""The vLLM adapter's request/response mapping, tested without vLLM or a GPU."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from parity.engine import HUB_REVISION, SAMPLING, EngineArgs
from parity.engine import vllm_compat as compat
from parity.errors import ParityError


def test_study_settings_become_engine_kwargs():
    kwargs = compat.engine_kwargs(EngineArgs(), "0.26.0")
    assert kwargs["attention_config"] == {"backend": "TRITON_ATTN"}
    assert kwargs["enforce_eager"] is True and kwargs["dtype"] == "bfloat16"
    assert (kwargs["max_model_len"], kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (32768, 64, 8192)
    assert kwargs["enable_prefix_caching"] is True and kwargs["tensor_parallel_size"] == 1
    assert kwargs["skip_tokenizer_init"] is True  # token-ID prompts, no tokenizer
    assert kwargs["revision"] == HUB_REVISION
    assert "attention_backend" not in kwargs  # mutually exclusive with attention_config


def test_dummy_weights_need_no_revision():
    kwargs = compat.engine_kwargs(EngineArgs(model="/tmp/shape", load_format="dummy"), "0.28.0")
    assert kwargs["load_format"] == "dummy" and "revision" not in kwargs


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1", "0.28.0"])
def test_supported_versions(version):
    assert compat.check_version(version) == version.rsplit(".", 1)[0]


@pytest.mark.parametrize("version", ["0.25.2", "0.31.0", "1.0.0"])
def test_unsupported_versions_are_named(version):
    with pytest.raises(ParityError, match=f"vLLM {version} is not supported"):
        compat.engine_kwargs(EngineArgs(), version)


def test_sampling_is_exactly_sixteen_greedy_tokens():
    kwargs = compat.sampling_kwargs()
    assert kwargs == dict(SAMPLING, detokenize=False)
    assert kwargs["max_tokens"] == kwargs["min_tokens"] == 16 and kwargs["ignore_eos"] and kwargs["temperature"] == 0


def test_serve_arguments_bind_loopback_and_report_cached_tokens():
    flags = compat.serve_arguments(EngineArgs(model="/m", load_format="dummy"), 8123)
    assert flags[0] == "/m"
    assert flags[flags.index("--host") + 1] == "127.0.0.1" and flags[flags.index("--port") + 1] == "8123"
    assert "--enable-prompt-tokens-details" in flags and "--skip-tokenizer-init" in flags
    assert json.loads(flags[flags.index("--attention-config") + 1]) == {"backend": "TRITON_ATTN"}
    assert "--enforce-eager" in flags and "--enable-prefix-caching" in flags
    assert "--disable-log-requests" not in flags  # exits 2 in 0.26 and 0.28
    off = compat.serve_arguments(EngineArgs(enable_prefix_caching=False), 1)
    assert "--no-enable-prefix-caching" in off


def fake_output(tokens: int, cached: int | None = 8000):
    return SimpleNamespace(request_id="r1", prompt_token_ids=list(range(8004)), num_cached_tokens=cached,
                           outputs=[SimpleNamespace(token_ids=list(range(tokens)), finish_reason="length")])


def test_request_output_maps_to_completion():
    c = compat.to_completion(fake_output(16), 1.0, 2.5)
    assert c.output_token_ids == list(range(16)) and c.prompt_tokens == 8004 and c.cached_tokens == 8000
    assert (c.submit_s, c.complete_s) == (1.0, 2.5) and c.extra["finish_reason"] == "length"
    assert compat.to_completion(fake_output(16, cached=None), 0, 0).cached_tokens == 0


def test_wrong_output_length_is_an_error():
    with pytest.raises(ParityError, match="returned 15 tokens, expected 16"):
        compat.to_completion(fake_output(15), 0, 0)


def test_offline_environment_is_set(monkeypatch):
    for key in compat.ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    compat.apply_environment()
    import os

    assert os.environ["VLLM_NO_USAGE_STATS"] == "1" and os.environ["VLLM_HOST_IP"] == "127.0.0.1"


def test_vllm_engine_without_vllm_is_a_clear_error():
    import importlib.util

    from parity.engine import make_engine

    if importlib.util.find_spec("torch") and importlib.util.find_spec("vllm"):
        pytest.skip("vLLM is installed here")
    with pytest.raises(ParityError, match="needs vLLM and torch"):
        make_engine("vllm-sync")


class FakeNvml:
    """vLLM's vendored pynvml, for one GPU: what `visible_gpu` may ask of NVML."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuid: str):
        self.uuid, self.calls = uuid, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != self.uuid:
            raise self.NVMLError("Not Found")
        return "handle"

    def nvmlDeviceGetUUID(self, handle):
        return self.uuid

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"


def test_a_pinned_gpu_is_read_through_nvml_without_a_cuda_context(monkeypatch):
    import sys
    import types

    nvml = FakeNvml("GPU-1234")
    third_party = types.ModuleType("vllm.third_party")
    third_party.pynvml = nvml
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.third_party", third_party)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch (and opening CUDA) would fail the test
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert compat.visible_gpu() == ("GPU-1234", "NVIDIA H200")
    assert nvml.calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9999")
    with pytest.raises(ParityError, match="GPU-9999.*NVML cannot find"):
        compat.visible_gpu()
    assert compat.ENVIRONMENT["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # as `vllm serve` starts its core
