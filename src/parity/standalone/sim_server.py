"""A simulator replica behind the subset of vLLM's OpenAI server that the standalone client uses.

`POST /v1/completions` with a token-ID prompt and an exact length (the study's 16, or any up to the
replica's max_tokens: min_tokens = max_tokens, EOS ignored) returns `choices[0].token_ids`,
`choices[0].prompt_token_ids` and `usage.prompt_tokens_details.cached_tokens`, as `vllm serve
--enable-prompt-tokens-details` does; with `"stream": true`, the same as server-sent events, one
chunk per token as the engine samples it (`token_ids` in each, `prompt_token_ids` in the first,
usage last when `stream_options.include_usage`), as vLLM 0.26-0.28 streams. A request the engine
refuses (a token ID outside the vocabulary, a prompt beyond max_model_len) is answered 400 with vLLM's
error body, never a completion. `GET /health` answers 200 once ready. The engine runs on the
paced clock, so requests arriving over HTTP are batched continuously as in a real replica.
`GET /parity/identity` reports the simulated GPU UUID, as a real replica's GPU is read from NVML.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys

import numpy as np
from aiohttp import web

from parity.engine import EngineArgs
from parity.engine.sim import SimEngine, SimParams, output_tokens
from parity.errors import ParityError

ENGINE_ARGS_VARIABLE = "PARITY_ENGINE_ARGS"  # how ReplicaSet hands its EngineArgs to a simulator replica


def _bad(message: str, status: int = 400, kind: str = "BadRequestError") -> web.Response:
    """HTTP 400 with the body vLLM's OpenAI server gives a request it refuses (its ErrorResponse); another status
    and type in the same body where the fault is not the request's."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)


def _refused(engine: SimEngine, message: str) -> web.Response:
    """A request the engine refused: the client's fault (400), unless the engine was closed under it (the replica
    shutting down, 503: a 400 blamed the request, outside pass K)."""
    return _bad(message, 503, "ServiceUnavailableError") if engine.closed else _bad(message)


def make_app(engine: SimEngine, model: str) -> web.Application:
    ids = itertools.count()

    async def completions(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad("body is not JSON")
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) and t >= 0 for t in prompt):
            return _bad("prompt must be a non-empty list of token IDs (one prompt per request)")
        length = body.get("max_tokens")
        ceiling = engine.args.max_tokens
        if not (isinstance(length, int) and 1 <= length <= ceiling) or isinstance(length, bool):
            return _bad(f"max_tokens must be an integer in 1..{ceiling} (this replica's max_tokens), got {length!r}")
        wanted = engine.args.sampling(length)
        asked = {"max_tokens": length, "min_tokens": body.get("min_tokens"), "ignore_eos": bool(body.get("ignore_eos"))}
        if any(asked[key] != wanted[key] for key in asked):
            return _bad(f"this replica gives exact lengths only (no EOS in the model): min_tokens = max_tokens, "
                        f"ignore_eos = {wanted['ignore_eos']}")
        if body.get("stream"):
            return await stream(request, body, prompt, length)
        try:
            completion = await asyncio.wrap_future(engine.submit(prompt, max_tokens=length))
        except ParityError as exc:
            return _refused(engine, str(exc))
        choice = {"index": 0, "text": "", "token_ids": completion.output_token_ids, "finish_reason": "length",
                  "logprobs": None}
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt
        return web.json_response({
            "id": f"cmpl-sim-{next(ids)}", "object": "text_completion", "model": model, "choices": [choice],
            "usage": {"prompt_tokens": completion.prompt_tokens, "completion_tokens": len(completion.output_token_ids),
                      "total_tokens": completion.prompt_tokens + len(completion.output_token_ids),
                      "prompt_tokens_details": {"cached_tokens": completion.cached_tokens}},
        })

    async def stream(request: web.Request, body: dict, prompt: list[int], length: int) -> web.StreamResponse:
        loop, sampled = asyncio.get_running_loop(), asyncio.Queue()
        try:
            future = engine.submit(prompt, on_token=lambda position, _: loop.call_soon_threadsafe(sampled.put_nowait,
                                                                                                 position),
                                   max_tokens=length)
        except ParityError as exc:
            return _refused(engine, str(exc))
        tokens = output_tokens(np.asarray(prompt, dtype="<u4"), engine.params.vocab_size, length)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        name = f"cmpl-sim-{next(ids)}"

        async def send(choices: list, **more) -> None:
            chunk = {"id": name, "object": "text_completion", "model": model, "choices": choices, **more}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        finished = asyncio.wrap_future(future)
        for count in range(len(tokens)):
            token = asyncio.ensure_future(sampled.get())
            await asyncio.wait({token, finished}, return_when=asyncio.FIRST_COMPLETED)
            if not token.done() and finished.exception() is None:
                await token  # finished with its last tokens still queued
            if not token.done():  # the engine failed before this token: say so in the stream, as vLLM does
                token.cancel()
                await send([], error={"message": str(finished.exception()), "type": "InternalServerError"})
                await response.write(b"data: [DONE]\n\n")
                return response
            position = token.result()
            choice = {"index": 0, "text": "", "token_ids": [tokens[position]],
                      "finish_reason": "length" if count == len(tokens) - 1 else None}
            if count == 0 and body.get("return_token_ids"):
                choice["prompt_token_ids"] = prompt
            await send([choice])
        completion = await finished
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage={"prompt_tokens": completion.prompt_tokens, "completion_tokens": len(tokens),
                                  "total_tokens": completion.prompt_tokens + len(tokens),
                                  "prompt_tokens_details": {"cached_tokens": completion.cached_tokens}})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def identity(request: web.Request) -> web.Response:
        return web.json_response({"gpu_uuid": engine.gpu_uuid, "pid": os.getpid(), "simulated": True})

    async def reset_prefix_cache(request: web.Request) -> web.Response:
        try:
            engine.reset_prefix_cache()
        except ParityError as exc:
            return _bad(str(exc))
        return web.Response(status=200)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/parity/identity", identity), web.get("/v1/models", models),
                    web.post("/reset_prefix_cache", reset_prefix_cache)])
    # closed as the server shuts down, before it waits for its handlers: each one waiting on the engine then answers
    # at once (on cleanup, after that wait, a SIGTERM's replica served its whole queue, then was killed)
    app.on_shutdown.append(lambda app: asyncio.to_thread(engine.close))
    return app


def serve(port: int, gpu_uuid: str, params_path=None, args: EngineArgs | None = None, kv_events: str | None = None) -> None:
    """Run one simulator replica on 127.0.0.1:port until terminated (`kv_events`: where it publishes its KV
    cache events, as `vllm serve --kv-events-config` does).

    Without `args`, the engine settings come from $PARITY_ENGINE_ARGS (JSON; ReplicaSet sets it), else
    the study's defaults.
    """
    args = args or EngineArgs.from_dict(json.loads(os.environ.get(ENGINE_ARGS_VARIABLE) or "{}"))
    engine = SimEngine(args, SimParams.load(params_path), clock="paced", gpu_uuid=gpu_uuid, mode="async",
                       kv_events=kv_events)
    try:
        web.run_app(make_app(engine, args.model), host="127.0.0.1", port=port, print=None,
                    handle_signals=True, access_log=None)
    except OSError as exc:  # the port was taken after the replica set picked it: one line for its log
        engine.close()
        sys.exit(f"sim-server: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
