"""The client-side batcher: one per session queue, turning submitted prompts into Flame tasks.

A batch closes when it holds `batch_limit` prompts or `window_s` after its first prompt arrived
(the study: 32 prompts / 2 ms at first, 128 / 10 ms tuned). It is then encoded (raw or zlib level 1)
and split so no task exceeds the decoded budget or Flame's 4 MiB cap, and each task is handed to
`send`, which returns a future of the task's output. Every prompt has its own future; its latency runs
from its own submission, so batch formation and queueing are inside it. A failed task fails every
prompt in it, loudly; none is dropped.

With `inflight` (ours, beyond the study), a session has at most that many tasks running: a Flame
executor runs one task at a time, so under sustained arrivals a batch sent when its window closes
only queues behind the running one; held back instead, it gathers everything that arrives meanwhile
and goes as one task the moment the running one returns (batches grow with the load).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from parity.engine import Completion
from parity.errors import ParityError
from parity.flame import codec
from parity.flame.settings import FlameSettings


@dataclass(kw_only=True)
class Result(Completion):
    """One prompt's answer from a Flame worker, with the client's clock (`token_s`: when the worker's engine
    produced each output token, on the host's clock)."""

    request_id: str
    batch_id: str | None  # the task that carried it (None: a harvest task's, which carries many requests' events)
    worker: dict = field(default_factory=dict)
    task_timings: dict = field(default_factory=dict)  # the service's per-batch timings and GC pauses
    input_sha256: str | None = None  # of the token IDs the worker decoded


class PromptQueue:
    """The prompts queued for one session's tasks, as its sender (a Batcher, or a Harvester) takes them."""

    what = "queue"  # the sender's kind, in messages

    def __init__(self, name: str):
        self.name = name
        self._queue: deque[tuple[str, np.ndarray, float, int | None, Future]] = deque()
        self._lock = threading.Condition()
        self._closed = False
        # called with a request's id as its first token reaches the client, where answers stream back token by token
        # (the harvester; a batched task returns whole answers, so a batcher never calls it): bounded admission
        self.on_first: Callable[[str], None] | None = None

    def submit(self, request_id: str, tokens, max_tokens: int | None = None) -> Future:
        """Queue one prompt; `max_tokens`: its exact output length (parity.lengths), else the engine's."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise ParityError(f"{self.what} {self.name} is closed")
            self._queue.append((request_id, np.asarray(tokens, dtype="<u4"), time.monotonic(), max_tokens, future))
            self._lock.notify_all()  # a harvester's loop and its express thread wait on it
        return future


class Batcher(PromptQueue):
    """Collects prompts for one session and sends them as batched tasks."""

    what = "batcher"

    def __init__(self, send: Callable[[bytes], Future], settings: FlameSettings, *, name: str = "session-0",
                 output_tokens: int = 16):
        """`settings`: the Flame path's, whole (their one home; checked when they were made);
        `output_tokens`: the worker engine's output length, for the room a task keeps for its outputs."""
        super().__init__(name)
        self.send = send
        self.batch_limit, self.window_s, self.budget = settings.batch_limit, settings.window_s, settings.budget
        self.compress, self.inflight, self._running = settings.compress, settings.inflight, 0
        self.output_tokens = output_tokens
        self._task_ids = itertools.count()
        self.batch_sizes: list[int] = []  # prompts per task sent, for the batch-size histogram
        self.task_bytes: list[int] = []
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    def _take_batch(self) -> list | None:
        with self._lock:
            while not self._queue and not self._closed:
                self._lock.wait()
            if not self._queue:
                return None
            deadline = self._queue[0][2] + self.window_s
            while len(self._queue) < self.batch_limit and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            while self.inflight and self._running >= self.inflight and not self._closed:
                self._lock.wait()  # a task returning wakes this: what gathered meanwhile goes next
            batch = [self._queue.popleft() for _ in range(min(self.batch_limit, len(self._queue)))]
            self._running += 1
            return batch

    def idle(self) -> bool:
        """No prompt queued and no task running."""
        with self._lock:
            return not self._queue and not self._running

    def _done(self) -> None:
        with self._lock:
            self._running -= 1
            self._lock.notify_all()

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            prompts = [codec.Prompt(rid, tokens, length) for rid, tokens, _, length, _ in batch]
            try:
                tasks = codec.split(prompts, compress=self.compress, budget=self.budget, output_tokens=self.output_tokens)
            except codec.PayloadError as exc:
                for *_, future in batch:
                    future.set_exception(exc)
                self._done()
                continue
            left = [len(tasks)]  # this batch's tasks still running; the batch is done with the last

            def returned(_=None, left=left) -> None:
                left[0] -= 1
                if not left[0]:
                    self._done()

            start = 0
            for task in tasks:
                members = batch[start:start + task.count]
                start += task.count
                batch_id = f"{self.name}/t{next(self._task_ids)}"
                self.batch_sizes.append(task.count)
                self.task_bytes.append(len(task.data))
                try:
                    sent = self.send(task.data)
                except Exception as exc:  # the transport refused: fail these prompts, keep serving
                    self._fail(members, batch_id, exc)
                    returned()
                    continue
                sent.add_done_callback(lambda f, m=members, b=batch_id: self._resolve(f, m, b))
                sent.add_done_callback(returned)

    @staticmethod
    def _fail(members, batch_id: str, exc: BaseException) -> None:
        error = exc if isinstance(exc, ParityError) else ParityError(f"task {batch_id} failed: {exc}")
        for *_, future in members:
            future.set_exception(error)

    def _resolve(self, sent: Future, members, batch_id: str) -> None:
        complete = time.monotonic()
        try:
            doc = codec.decode_output(sent.result())
            outputs = doc["outputs"]
            if len(outputs) != len(members):
                raise ParityError(f"task {batch_id} returned {len(outputs)} outputs for {len(members)} prompts")
        except BaseException as exc:
            self._fail(members, batch_id, exc)
            return
        for (rid, tokens, submitted, _, future), out in zip(members, outputs):
            if out.get("request_id") != rid:
                future.set_exception(ParityError(f"task {batch_id} answered {out.get('request_id')} in place of {rid}"))
                continue
            future.set_result(Result(
                request_id=rid, output_token_ids=out["output_token_ids"],
                prompt_tokens=int(out.get("prompt_tokens", tokens.size)), cached_tokens=int(out["cached_tokens"]),
                submit_s=submitted, complete_s=complete, batch_id=batch_id, worker=doc["worker"],
                task_timings=doc.get("timings", {}), input_sha256=out.get("input_sha256"), token_s=out.get("token_s")))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=10)
