"""The harvest mode's service side: one session's engine requests, admitted and harvested across tasks.

Ours, beside the study's configurations (FlameSettings `mode: harvest`). Flame v0.6.0 runs one task at a
time per executor and returns a task's output only when it completes, so in the study's burst mode a
prompt that arrives while a task runs cannot join the engine's running batch, and no first token reaches
the client before its whole task ends. Here a task is no longer "one batch and its outputs" but one
admission-and-harvest step of the shard's engine (design (d) of shared/reference/flame-streaming.md):

- the task's prompts (those that arrived since the last task, possibly none) go to the engine's
  asynchronous API at once, and join its running batch as they would under `vllm serve`;
- the task returns as soon as any event exists (new output tokens, the first among them; completions
  with their token IDs and cached counts), or after `hold_s` without one;
- requests not finished keep running in the engine; their events go out with later tasks.

Every prompt and every event still crosses Flame's task path (CreateTask, LaunchTask, OnTaskInvoke,
CompleteTask, WatchTask). The client side is `parity.flame.harvester`.
"""

from __future__ import annotations

import threading
import time

from parity.errors import ParityError
from parity.flame import admission, codec
from parity.trace import token_sha256


class Harvest:
    """The requests one engine runs for one session, and the events not yet returned."""

    def __init__(self, engine, *, hold_s: float, order: str = "arrival"):
        self.engine, self.hold_s, self.order = engine, hold_s, order
        self._cond = threading.Condition()
        self._open: dict[str, codec.Prompt] = {}  # admitted, not yet returned complete
        self._tokens: dict[str, list[float]] = {}  # per open request: engine times of tokens not yet returned
        self._sent: dict[str, int] = {}  # per open request: tokens already returned
        self._done: list[dict] = []  # completions not yet returned
        self._error: BaseException | None = None  # a request the engine failed: the next task fails with it

    def task(self, prompts: list[codec.Prompt]) -> tuple[list[dict], list[dict], dict]:
        """Admit `prompts`, wait for events (at most `hold_s`), and take them: (token events, completions, timings).
        `timings` holds the durations of admitting and waiting and, as `started_at`/`admitted_at`, the moments
        the task began and its prompts were in the engine (CLOCK_MONOTONIC, one clock for every process of a
        host, so the client on the same host measures each prompt's admission wait against them).

        A token event is {request_id, from, token_s}: the engine's times of the request's tokens `from` on, so
        the client sees each one once and in order (`from` 0 carries the first token). A prompt the engine
        refuses, or a request it failed since the last task, fails this task (and so, at the client, every
        request outstanding on the session)."""
        started = time.monotonic()
        self._admit(prompts)
        admitted = time.monotonic()
        deadline = started + self.hold_s
        with self._cond:
            while self._open and not self._ready() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)  # nothing open: no event can come, return at once
            if self._error is not None:
                raise ParityError(f"the engine failed a request: {self._error}")
            events = [{"request_id": rid, "from": self._sent[rid], "token_s": times}
                      for rid, times in self._tokens.items() if times]
            for event in events:
                self._sent[event["request_id"]] += len(event["token_s"])
                self._tokens[event["request_id"]] = []
            done, self._done = self._done, []
            for out in done:
                rid = out["request_id"]
                del self._open[rid], self._tokens[rid], self._sent[rid]
            still = len(self._open)
        timings = {"admit_s": admitted - started, "wait_s": time.monotonic() - admitted, "prompts": len(prompts),
                   "events": len(events), "completions": len(done), "open": still,
                   "started_at": started, "admitted_at": admitted}  # the host's monotonic clock, as the client's
        return events, done, timings

    def running(self) -> int:
        """How many admitted requests have not been returned complete."""
        with self._cond:
            return len(self._open)

    def _ready(self) -> bool:
        return bool(self._done) or self._error is not None or any(self._tokens.values())

    def _admit(self, prompts: list[codec.Prompt]) -> None:
        with self._cond:
            again = [p.request_id for p in prompts if p.request_id in self._open]
            if again:
                raise ParityError(f"request {again[0]} is already running on this session")
        for index in admission.admission_order([p.tokens for p in prompts], self.order):
            prompt = prompts[index]
            rid = prompt.request_id
            with self._cond:
                self._open[rid], self._tokens[rid], self._sent[rid] = prompt, [], 0
            try:
                future = self.engine.submit(prompt.tokens, on_token=lambda _, at, rid=rid: self._token(rid, at),
                                            max_tokens=prompt.max_tokens)
            except BaseException:
                with self._cond:
                    del self._open[rid], self._tokens[rid], self._sent[rid]
                raise
            future.add_done_callback(lambda f, prompt=prompt: self._finished(prompt, f))

    def _token(self, rid: str, at: float) -> None:
        """The engine's thread: one more output token of `rid`."""
        with self._cond:
            self._tokens[rid].append(at)
            self._cond.notify_all()

    def _finished(self, prompt: codec.Prompt, future) -> None:
        """The engine's thread: `prompt` completed (its tokens were all reported before this) or failed."""
        with self._cond:
            if future.exception() is not None:
                self._error = self._error or future.exception()
            else:
                c = future.result()
                self._done.append({"request_id": prompt.request_id, "input_sha256": token_sha256(prompt.tokens),
                                   "output_token_ids": [int(t) for t in c.output_token_ids],
                                   "prompt_tokens": c.prompt_tokens, "cached_tokens": c.cached_tokens})
            self._cond.notify_all()
