"""The standalone client: one shared HTTP connection pool, the whole burst released at once.

The pool is opened and warmed (a `/health` call per replica) before timing starts, since the study
excluded runs where client initialisation leaked into timing. At release, each request is routed and
sent at its offset in the arrival schedule (a burst: all at once); latency is measured from there;
requests/s = requests / (last completion − release). Idle keep-alive stays under the server's 5 s
so a pooled connection is never reused after the server closed it; a connection dropped before any
response byte is retried once, and a request whose replica was killed on purpose (`parity.restart`) is
sent again to its replacement. Any other failure (HTTP error, timeout, wrong output length) fails
the burst, naming the request: nothing is dropped.

Streaming (`stream=True`, server-sent events as vLLM 0.26-0.28 send them): each output token is timed
as it arrives (`token_s`), the prompt's token IDs come in the first chunk and the usage, with the
cached-token count, in the last (`stream_options.include_usage`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp
import numpy as np

from parity.engine import SAMPLING, Completion, length_mismatch
from parity.errors import ParityError
from parity.schedule import Quiet, wait_until_async

KEEPALIVE_S = 4.0  # below uvicorn's 5 s idle timeout in `vllm serve`


@dataclass(kw_only=True)
class Reply(Completion):
    """What one replica answered for one request, with the client's clock (`token_s`, streamed: when each output
    token arrived; `sent_s`: when the request left)."""

    prompt_token_ids: list[int] | None
    url: str | None = None  # the replica that answered


def request_body(model: str, prompt, sampling: dict = SAMPLING, stream: bool = False) -> dict:
    body = {"model": model, "prompt": [int(t) for t in prompt], "return_token_ids": True, **sampling}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def read_stream(response, request_id: str, on_first=None) -> tuple[dict, list[float]]:
    """A streamed /v1/completions response folded into the non-streamed shape, with each token's arrival;
    `on_first()` is called as the first token arrives (bounded admission's prefill is done then)."""
    tokens, times, prompt_ids, usage = [], [], None, None
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        payload = line[6:].strip()
        if payload == b"[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise ParityError(f"request {request_id}: a streamed chunk that is not JSON: {payload[:200]!r}") from None
        if "error" in chunk:
            raise ParityError(f"request {request_id}: the server failed mid-stream: {str(chunk['error'])[:300]}")
        now = time.monotonic()
        for choice in chunk.get("choices") or []:
            new = choice.get("token_ids") or []
            if new and not tokens and on_first is not None:
                on_first()
            tokens += new
            times += [now] * len(new)
            if choice.get("prompt_token_ids") is not None:
                prompt_ids = choice["prompt_token_ids"]
        usage = chunk.get("usage") or usage
    if usage is None:
        raise ParityError(f"request {request_id}: the stream ended without its usage chunk")
    return {"choices": [{"token_ids": tokens, "prompt_token_ids": prompt_ids}], "usage": usage}, times


def parse_reply(data: dict, request_id: str, submit_s: float, complete_s: float, sampling: dict = SAMPLING) -> Reply:
    """A /v1/completions response as a Reply; an output length outside the sampling's bounds
    (by default: anything but 16 tokens) is an error."""
    try:
        choice = data["choices"][0]
        tokens = choice["token_ids"]
        usage = data["usage"]
    except (KeyError, IndexError, TypeError):
        raise ParityError(f"request {request_id}: malformed response {str(data)[:200]}") from None
    if expected := length_mismatch(None if tokens is None else len(tokens), sampling):
        raise ParityError(f"request {request_id}: {0 if tokens is None else len(tokens)} output tokens, expected {expected}")
    details = usage.get("prompt_tokens_details") or {}
    if "cached_tokens" not in details:
        raise ParityError(f"request {request_id}: no cached-token count (start vLLM with --enable-prompt-tokens-details)")
    return Reply(output_token_ids=[int(t) for t in tokens], prompt_token_ids=choice.get("prompt_token_ids"),
                 prompt_tokens=int(usage["prompt_tokens"]), cached_tokens=int(details["cached_tokens"] or 0),
                 submit_s=submit_s, complete_s=complete_s)


class NativeClient:
    """A shared aiohttp session to the replicas; `burst` releases every request at once."""

    def __init__(self, urls: list[str], model: str, *, timeout_s: float = 1800, sampling: dict = SAMPLING,
                 stream: bool = False):
        self.urls, self.model, self.timeout_s, self.sampling, self.stream = urls, model, timeout_s, sampling, stream
        self._session: aiohttp.ClientSession | None = None
        self._inflight: set[asyncio.Task] = set()
        self.on_lost = None  # async (shard, request_id) -> whether to send again (parity.restart)
        self.refusals: dict[int, str] = {}  # the last burst's refused requests: burst index -> reason (admission)

    async def __aenter__(self) -> "NativeClient":
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await self.prepare()
        return self

    async def __aexit__(self, *exc) -> None:
        # A signal can land inside the loop's task creation: that request is scheduled but registered
        # nowhere (not in asyncio.all_tasks, not in burst's list). Each request registers itself here as
        # it starts, so every one still running is cancelled before the pool closes under it.
        # One that takes its first step only while others are being cancelled registers then: so again until,
        # after a turn of the loop, none is left running.
        while True:
            await asyncio.sleep(0)
            running = [task for task in self._inflight if not task.done()]
            if not running:
                break
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        await self._session.close()

    async def prepare(self) -> None:
        """Open the pool before timing: one health call per replica."""
        for url in self.urls:
            async with self._session.get(f"{url}/health") as response:
                if response.status != 200:
                    raise ParityError(f"replica {url} is not healthy (HTTP {response.status})")

    async def _post(self, shard: int, body: dict, request_id: str, release: float, sampling: dict,
                    on_first=None, due: float | None = None) -> Reply:
        """`due`: when a retried or held request's last try was due to leave (its reply's `due_s`)."""
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            reply = await self._attempts(shard, body, request_id, release, sampling, on_first)
            reply.due_s = due
            return reply
        finally:
            self._inflight.discard(task)

    async def _attempts(self, shard: int, body: dict, request_id: str, release: float, sampling: dict,
                        on_first=None) -> Reply:
        """Send until answered: once more at once after a dropped keep-alive connection, and again after
        `on_lost(shard, request_id)` (a path that restarts a killed replica) says its replacement is up."""
        disconnected = 0
        while True:
            url = self.urls[shard]  # a restarted replica has a new one
            try:
                sent, times = time.monotonic(), None
                async with self._session.post(f"{url}/v1/completions", json=body) as response:
                    if response.status != 200:
                        text = (await response.text())[:300]
                        raise ParityError(f"request {request_id} to {url}: HTTP {response.status}: {text}")
                    if body.get("stream"):
                        data, times = await read_stream(response, request_id, on_first)
                    else:
                        data = await response.json()
                reply = parse_reply(data, request_id, release, time.monotonic(), sampling)
                reply.token_s, reply.sent_s, reply.url = times, sent, url
                return reply
            except aiohttp.ServerDisconnectedError:
                disconnected += 1
                if disconnected < 2:
                    continue
                error = "server disconnected twice"
            except asyncio.TimeoutError:
                raise ParityError(f"request {request_id} to {url}: no answer within {self.timeout_s:.0f} s") from None
            except aiohttp.ClientError as exc:
                error = str(exc)
            if self.on_lost is not None and await self.on_lost(shard, request_id):
                disconnected = 0
                continue
            raise ParityError(f"request {request_id} to {url}: {error}")

    async def send(self, shard: int, prompt, request_id: str) -> Reply:
        """One request now, timed from its own submission (for callers that pace requests themselves)."""
        body = request_body(self.model, prompt, self.sampling, self.stream)
        return await self._post(shard, body, request_id, time.monotonic(), self.sampling)

    async def burst(self, prompts: list[np.ndarray], request_ids: list[str], router, offsets: list[float],
                    release: float | None = None, samplings: list[dict] | None = None,
                    admission=None) -> tuple[float, list[int | None], list[Reply | None]]:
        """Release the burst (at `release`, default now): route and send each request at its offset after the
        release (a burst: all now); return (release, shards, replies). Each reply is timed from its scheduled send.
        `samplings`: each request's own (its exact output length, parity.lengths); None: the client's for all.
        `admission` (a parity.admission.Controller over `router`): each request is admitted or refused as it is
        due, and tried again after its Retry-After as the client's policy allows (parity.admission.retry), or held
        by the controller (`queue_s`) and sent from its own task once admitted; one refused for good is never sent,
        and its shard and reply are None (`refusals` holds its reason)."""
        release = time.monotonic() if release is None else release
        samplings = [self.sampling] * len(prompts) if samplings is None else samplings
        shards, tasks, self.refusals = [None] * len(prompts), {}, {}
        loop, queue = asyncio.get_running_loop(), admission is not None and admission.queue_s

        async def held(index: int, until: float, fate: asyncio.Future):
            """A held request (`queue_s`): its fate when work drains, or the controller's at `until`; sent if
            admitted, timed from its scheduled send (its hold counts)."""
            while not fate.done():
                await asyncio.wait([fate], timeout=max(0.0, until - time.monotonic()))
                if not fate.done():
                    admission.expire(time.monotonic())
                    await asyncio.sleep(0)  # its wake's set_result runs first
            decision = fate.result()
            if not decision.admitted:
                self.refusals[index] = decision.reason
                return None
            return await admitted(index, decision, time.monotonic())

        def admitted(index: int, decision, due: float | None = None) -> asyncio.Future:
            """An admitted request sent: its first token and its completion reported to the controller. `due`: when
            a retry or a hold let it leave (None: at its arrival)."""
            shards[index] = decision.shard
            body = request_body(self.model, prompts[index], samplings[index], self.stream)
            task = asyncio.ensure_future(self._post(decision.shard, body, request_ids[index], release + offsets[index],
                                                    samplings[index],
                                                    lambda: admission.first_token(decision.index, time.monotonic()),
                                                    due))
            task.add_done_callback(lambda _: admission.complete(decision.index, time.monotonic()))
            return task

        attempts = admission.attempts(offsets) if admission is not None else \
            ((offset, index, 0) for index, offset in enumerate(offsets))
        for offset, index, attempt in attempts:
            prompt = prompts[index]
            if offset > 0:
                await wait_until_async(release + offset)
            if admission is not None:
                fate = loop.create_future() if queue else None
                wake = (lambda decision, fate=fate: loop.call_soon_threadsafe(fate.set_result, decision)) \
                    if queue else None  # under the controller's lock, perhaps another thread's
                decision = admission.decide(prompt, time.monotonic(), attempt, wake, arrived=release + offsets[index])
                if decision.held:  # its fate comes later: sent from its own task if admitted
                    tasks[index] = asyncio.ensure_future(held(index, decision.until, fate))
                    continue
                if not decision.admitted:
                    if not attempts.again(index, attempt, time.monotonic() - release + decision.retry_after_s):
                        self.refusals[index] = attempts.final(decision.reason, attempt)
                    continue
                tasks[index] = admitted(index, decision, release + offset if attempt else None)
                continue
            shards[index] = router.route(prompt)
            done = (lambda _, index=len(tasks): router.complete(index)) if router.released_on_completion else None
            body = request_body(self.model, prompt, samplings[index], self.stream)
            tasks[index] = asyncio.ensure_future(self._post(shards[index], body, request_ids[index],
                                                            release + offsets[index], samplings[index]))
            if done is not None:  # its load released as its answer comes back
                tasks[index].add_done_callback(done)
        watcher = asyncio.ensure_future(self._watch(list(tasks.values())))
        try:
            replies = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        except BaseException:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            raise
        finally:
            watcher.cancel()
        return release, shards, [replies.get(i) for i in range(len(prompts))]

    async def _watch(self, tasks: list[asyncio.Future]) -> None:
        """A line each minute with no answer (`parity.schedule.Quiet`): a frozen replica was silent for up to the
        client's timeout, half an hour (an outsider's, 2026-12-07)."""
        quiet = Quiet("standalone", len(tasks), len(tasks), time.monotonic() + self.timeout_s, time.monotonic())
        while True:
            await asyncio.sleep(1.0)
            quiet.note(sum(not t.done() for t in tasks), time.monotonic())
