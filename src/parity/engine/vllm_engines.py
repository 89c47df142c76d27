"""Real vLLM behind the engine interface: synchronous `LLM.generate` and one long-lived `AsyncLLM`.

The synchronous engine hands a whole batch to `LLM.generate`, as the study's original Flame adapter
did. The asynchronous engine keeps one event loop in one thread and admits every prompt of a batch
concurrently, returning final outputs in input order, as the tuned adapter does. Both always release
the GPU: on close, on exit from a `with` block, at interpreter exit, and on SIGTERM.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import itertools
import signal
import threading
import time
from concurrent.futures import Future
from typing import Sequence

from parity.engine import Completion, Engine, EngineArgs
from parity.engine import vllm_compat as compat


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _raise_on_sigterm() -> None:
    """Make SIGTERM unwind the stack (finally blocks, context managers) instead of killing outright."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


class _VllmBase(Engine):
    simulated = False

    def __init__(self, args: EngineArgs, kv_events: str | None = None):
        compat.apply_environment()
        _raise_on_sigterm()
        self.args = args
        self.sampling = args.sampling()
        self.versions = compat.versions()
        self.kwargs = compat.engine_kwargs(args, self.versions["vllm"])
        self.kv_events = kv_events  # a subscriber's endpoint (parity.kv_events); not an engine setting to record
        self.gpu_uuid, self.gpu_name = compat.visible_gpu()
        self._closed = False
        atexit.register(self.close)

    def describe(self) -> dict:
        return {"name": self.name, "version": self.versions["vllm"], "torch": self.versions["torch"],
                "simulated": False, "args": self.args.to_dict(), "engine_kwargs": self.kwargs,
                "device": self.gpu_name, "gpu_uuid": self.gpu_uuid}


class VllmSyncEngine(_VllmBase):
    """`LLM.generate` on a batch: the engine sees the batch only once every input is processed."""

    name = "vllm-sync"

    def __init__(self, args: EngineArgs, kv_events: str | None = None):
        super().__init__(args, kv_events)
        from vllm import LLM, SamplingParams

        self._llm = LLM(**self.kwargs, **compat.kv_events_kwargs(kv_events))
        self._params = SamplingParams(**compat.sampling_kwargs(sampling=self.sampling))

    def generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int] | None = None) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        samplings = [self.sampling] * len(prompts) if lengths is None else [self.args.sampling(n) for n in lengths]
        params = self._params if lengths is None else [SamplingParams(**compat.sampling_kwargs(sampling=s))
                                                        for s in samplings]
        submit = time.monotonic()
        outputs = self._llm.generate(inputs, params, use_tqdm=False)
        complete = time.monotonic()  # LLM.generate returns the batch together
        return [compat.to_completion(o, submit, complete, s) for o, s in zip(outputs, samplings)]

    def reset_prefix_cache(self) -> None:
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # 0.26/0.28 have no LLM.shutdown(); the engine-core process goes with its last reference.
        llm = self.__dict__.pop("_llm", None)
        shutdown = getattr(llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        gc.collect()


class VllmAsyncEngine(_VllmBase):
    """One `AsyncLLM` on one event loop; every prompt of a batch is admitted concurrently."""

    name = "vllm-async"

    def __init__(self, args: EngineArgs, kv_events: str | None = None, token_times: bool = False):
        """`token_times`: take each output as the engine yields it, to time every token (a streaming
        client's view from inside the worker), rather than the final output only."""
        super().__init__(args, kv_events)
        self.token_times = token_times
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async-loop", daemon=True)
        self._thread.start()
        self._engine = self._call(self._start())
        self._params = self._sampling(self.sampling)

    def _sampling(self, sampling: dict):
        from vllm import SamplingParams

        return SamplingParams(**compat.sampling_kwargs(final_only=not self.token_times, sampling=sampling))

    async def _start(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.kwargs, **compat.kv_events_kwargs(self.kv_events),
                                                         disable_log_stats=True))

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _one(self, prompt: Sequence[int], length: int | None = None, on_token=None) -> Completion:
        from vllm.inputs import TokensPrompt

        request_id = f"parity-{next(self._ids)}"
        sampling = self.sampling if length is None else self.args.sampling(length)
        params = self._params if length is None else self._sampling(sampling)
        submit = time.monotonic()
        final, times = None, []
        async for output in self._engine.generate(
                TokensPrompt(prompt_token_ids=[int(t) for t in prompt]), params, request_id):
            final = output
            if self.token_times:  # cumulative outputs: the tokens new since the last one arrived now
                now, known = time.monotonic(), len(times)
                times += [now] * (len(output.outputs[0].token_ids) - known)
                for position in range(known, len(times)) if on_token is not None else ():
                    on_token(position, now)
        completion = compat.to_completion(final, submit, time.monotonic(), sampling)
        completion.token_s = times or None
        return completion

    async def _all(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int | None]) -> list[Completion]:
        return list(await asyncio.gather(*(self._one(p, n) for p, n in zip(prompts, lengths, strict=True))))

    def generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int] | None = None) -> list[Completion]:
        return self._call(self._all(prompts, [None] * len(prompts) if lengths is None else lengths))

    def submit(self, prompt: Sequence[int], on_token=None, max_tokens: int | None = None) -> Future:
        """Admit one prompt now, as SimEngine.submit: `on_token(position, time)` as each output token arrives
        (only with `token_times`, when the engine streams its outputs; from the engine's event loop)."""
        return asyncio.run_coroutine_threadsafe(self._one(prompt, max_tokens, on_token), self._loop)

    def reset_prefix_cache(self) -> None:
        if not self._call(self._engine.reset_prefix_cache()):
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        engine = self.__dict__.pop("_engine", None)
        if engine is not None:
            engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        gc.collect()

