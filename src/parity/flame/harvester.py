"""The harvest mode's client side: one session, exactly one task outstanding while it has work (two, with express).

The counterpart of `parity.flame.harvest` (ours, FlameSettings `mode: harvest`), with the batcher's face
(`submit` a prompt, get a future of its `Result`; `close`), so `FlameSessions` and the Flame path use either.
While prompts are queued or requests are open on the session, one task is always outstanding; it carries
the prompts that arrived since the last one (up to `batch_limit`, and within the payload budget and Flame's
cap), possibly none. A task's result carries token events and completions:

- each token event adds its tokens to its request, stamped with the moment the client held the task's
  result: a request's `token_s` are the client's receipt times, so its client TTFT is its first token's
  arrival, as a streaming HTTP client sees it (the request spans many tasks, so it has no `batch_id`);
- a completion resolves its request, from the worker named in that task's result;
- a failed task fails every request open on the session, loudly (its events would come to nobody:
  dropped), and what is still queued goes with the next task.

Flame v0.6.0 keeps every task of a session, input and output, in its session manager's memory until the
session is deleted (`storage: none`; no RPC drops a task), and this mode sends a task per engine event or
hold: that memory grows with the run. With `rotate_tasks` (FlameSettings, ours, off by default) the
harvester bounds it: after that many tasks it carries no new prompt until the session's open requests are
done, then asks `rotate` for a fresh session (FlameSessions closes and deletes the old one; the new one has
a new worker and engine, so its prefix cache starts cold) and goes on there; prompts arriving meanwhile wait.

With `express` (FlameSettings, ours, off by default) a prompt that arrives while the session's task is out does
not wait for that task to come back: a second thread sends it at once in a task of its own, which Flame's session
manager queues behind the first (v0.6.0: one executor per sticky session, tasks taken in order), so the executor
starts it the moment the first completes, without the trip back to the client and out again. At most two tasks
are outstanding; the loop takes their results in the order they were sent, the second as its own next task.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from parity.errors import ParityError
from parity.flame import codec
from parity.flame.batcher import PromptQueue, Result
from parity.flame.settings import FlameSettings


CLOSE_WAIT_S = 10.0  # how long close() waits for tasks still out, both threads together
ROTATE = "rotate"  # what `_next` says when the session is due for rotation and drained
SENDING = "sending"  # an express task being encoded and sent


@dataclass
class _Open:
    tokens: np.ndarray
    submitted: float
    future: Future
    token_s: list[float] = field(default_factory=list)  # when the client received each output token


class Harvester(PromptQueue):
    """Keeps one harvest task outstanding on one session while prompts are queued or requests open (with `express`,
    a second behind it while prompts arrive)."""

    what = "harvester"

    def __init__(self, send: Callable[[bytes], Future], settings: FlameSettings, *, name: str = "session-0",
                 output_tokens: int = 16, rotate: Callable[[], Callable[[bytes], Future]] | None = None):
        """`send`: a task input in, a future of its output out (flamepy's `session.run`); `settings`: the Flame
        path's, whole; `rotate`: a fresh session's `send`, asked for after every `settings.rotate_tasks` tasks
        (0: never)."""
        if settings.rotate_tasks and rotate is None:
            raise ParityError(f"harvester {name}: rotate_tasks needs a way to open a fresh session")
        super().__init__(name)
        self.send, self.batch_limit = send, settings.batch_limit
        self.rotate_tasks, self.rotate, self._on_session, self.rotations = settings.rotate_tasks, rotate, 0, 0
        self.rotation_s: list[float] = []  # per rotation, how long its fresh session took (not the drain before)
        self.express = settings.express
        self._out = False  # the loop's task is outstanding (an express task may go behind it)
        self._express: tuple | str | None = None  # the task sent behind it (as `_send` returns it), or SENDING while
        # the express thread encodes and sends it
        self.budget, self.compress, self.output_tokens = settings.budget, settings.compress, output_tokens
        self._open: dict[str, _Open] = {}
        self._task_ids = itertools.count()
        self.batch_sizes: list[int] = []  # new prompts per task that carried any
        self.task_bytes: list[int] = []
        self.tasks: list[dict] = []  # per task: its id, executor, the service's timings, the round trip, and its
        # prompts' admission waits and tokens' event-to-client times (`_waits`); `express` when sent behind another
        self._thread = threading.Thread(target=self._loop, name=f"harvester-{name}", daemon=True)
        self._thread.start()
        self._express_thread = None
        if self.express:
            self._express_thread = threading.Thread(target=self._express_loop, name=f"express-{name}", daemon=True)
            self._express_thread.start()

    def idle(self) -> bool:
        """No prompt queued and no request open (so no task outstanding)."""
        with self._lock:
            return not self._queue and not self._open

    def _due(self) -> bool:
        return bool(self.rotate_tasks) and self._on_session >= self.rotate_tasks

    def _next(self) -> list | str | None:
        """The prompts of the next task (possibly none), once there is work; ROTATE once the session is due
        and drained (none open); None once closed."""
        with self._lock:
            while not self._queue and not self._open and not self._closed and not self._due():
                self._lock.wait()
            if self._closed:
                return None
            if self._due():  # draining: no new prompt on this session
                return [] if self._open else ROTATE
            return self._take_queued()

    def _take_queued(self) -> list:
        """Lock held: the prompts of the next task, oldest first."""
        return [self._queue.popleft() for _ in range(min(self.batch_limit, len(self._queue)))]

    def _rotate(self) -> None:
        """Go on with a fresh session; if none can be had, close, failing what is queued in one line."""
        started = time.monotonic()
        try:
            self.send = self.rotate()
        except BaseException as exc:  # noqa: BLE001 - loudly, to every request waiting for the new session
            with self._lock:
                self._closed = True
            self._fail_open(None, ParityError(f"harvester {self.name} could not move to a fresh session after "
                                              f"{self._on_session} tasks: {' '.join(str(exc).split())}"))
            return
        self._on_session = 0
        self.rotations += 1
        self.rotation_s.append(time.monotonic() - started)

    def _loop(self) -> None:
        while (taken := self._next()) is not None:
            if taken is ROTATE:
                self._rotate()
                continue
            task = self._send(taken)
            with self._lock:  # created in Flame: an express task may go behind it now, not before
                self._out = task is not None
                self._lock.notify_all()
            while task is not None:  # its result, then that of an express task sent behind it, in order
                self._result(*task)
                task = self._behind()
        self._fail_open(None, ParityError(f"harvester {self.name} closed with the request unanswered"))

    def _send(self, taken: list, behind: bool = False) -> tuple | None:
        """Send a task carrying what it can of `taken` (the rest goes first next time): (task_id, future of its
        output, when sent, their arrivals, whether it went behind another, as an express task); None if no task
        went (a prompt no task can carry fails alone)."""
        try:
            data, count = self._encode(taken)
        except BaseException as exc:  # noqa: BLE001 - a prompt no task can carry (too big, a bad length): it alone
            self._fail_alone(taken, exc)  # fails
            return None
        task_id = f"{self.name}/h{next(self._task_ids)}"
        with self._lock:  # what the budget left out goes first next time
            self._queue.extendleft(reversed(taken[count:]))
            self._open.update({rid: _Open(tokens, submitted, future)
                               for rid, tokens, submitted, _, future in taken[:count]})
        if count:
            self.batch_sizes.append(count)
        self.task_bytes.append(len(data))
        sent = time.monotonic()
        self._on_session += 1
        try:
            output = self.send(data)
        except BaseException as exc:  # noqa: BLE001 - the transport failed: its result is the failure
            output = Future()
            output.set_exception(exc)
        return task_id, output, sent, [submitted for _, _, submitted, _, _ in taken[:count]], behind

    def _fail_alone(self, taken: list, exc: BaseException) -> None:
        """`taken` could not be encoded (`exc`): each prompt that cannot alone fails with its reason, the others go
        first in the next task (if each can alone, they all fail with `exc`: never sent again and again)."""
        keep = []
        for entry in taken:
            try:
                self._encode([entry])
                keep.append(entry)
            except BaseException as own:  # noqa: BLE001 - its own reason, to its own caller
                if not entry[-1].done():
                    entry[-1].set_exception(own)
        if len(keep) == len(taken):
            for *_, future in taken:
                if not future.done():
                    future.set_exception(exc)
            return
        with self._lock:
            self._queue.extendleft(reversed(keep))

    def _result(self, task_id: str, output: Future, sent: float, arrived: list[float], behind: bool) -> None:
        try:
            doc = codec.decode_output(output.result())
            self._take(doc, task_id, sent, time.monotonic(), arrived, behind)
        except BaseException as exc:  # noqa: BLE001 - the transport or the task failed, or its result cannot be
            # read: loudly, to every request open on the session (the loop goes on)
            self._fail_open(task_id, exc)

    def _behind(self) -> tuple | None:
        """After the loop's task came back: the express task sent behind it (the loop's task now, so another may
        go behind it), else None (nothing outstanding)."""
        with self._lock:
            while self._express is SENDING:
                self._lock.wait()
            task, self._express = self._express, None
            self._out = task is not None
            self._lock.notify_all()
            return task

    def _express_loop(self) -> None:
        """Send what arrives while the loop's task is out, at once, in a task queued behind it (one at a time)."""
        while True:
            with self._lock:
                while not self._closed and not (self._out and self._express is None and self._queue
                                                and not self._due()):
                    self._lock.wait()
                if self._closed:
                    return
                self._express = SENDING
                taken = self._take_queued()
            task = None
            try:
                task = self._send(taken, behind=True)
            except BaseException as exc:  # noqa: BLE001 - never leave the loop waiting on a task that did not go
                for *_, future in taken:
                    if not future.done():
                        future.set_exception(exc)
            with self._lock:
                self._express = task
                self._lock.notify_all()

    def _encode(self, taken: list) -> tuple[bytes, int]:
        """The task input and how many of `taken` (the first ones) it carries."""
        if not taken:
            return codec.encode([], compress=self.compress), 0
        prompts = [codec.Prompt(rid, tokens, length) for rid, tokens, _, length, _ in taken]
        first = codec.split(prompts, compress=self.compress, budget=self.budget, output_tokens=self.output_tokens)[0]
        return first.data, first.count

    def _take(self, doc: dict, task_id: str, sent: float, received: float, arrived: list[float],
              behind: bool = False) -> None:
        """Record the task, apply its events, then its completions; a result that breaks the order fails the
        session's open requests (it cannot be trusted for any of them)."""
        self.tasks.append({"task_id": task_id, "executor_id": doc["worker"].get("executor_id"),
                           "round_trip_s": received - sent, **doc.get("timings", {}),
                           **self._waits(doc, received, arrived), **({"express": True} if behind else {})})
        finished: list[tuple[_Open, Result]] = []
        try:
            with self._lock:
                self._apply(doc, task_id, received, finished)
        except ParityError as exc:
            self._fail_open(task_id, exc, [entry for entry, _ in finished])
            return
        for entry, result in finished:
            if not entry.future.done():  # a caller may have cancelled it
                entry.future.set_result(result)

    @staticmethod
    def _waits(doc: dict, received: float, arrived: list[float]) -> dict:
        """Per prompt the task carried, its arrival (`submit`) to the service starting the task and to the
        prompt being in the engine; per token it returned, the engine producing it to the client holding it.
        Only for a worker on this host: its stamps and ours are then both CLOCK_MONOTONIC of one boot."""
        timings = doc.get("timings", {})
        if doc["worker"].get("host") != socket.gethostname() or "admitted_at" not in timings:
            return {}
        return {"arrival_to_seen_s": [timings["started_at"] - a for a in arrived],
                "arrival_to_admitted_s": [timings["admitted_at"] - a for a in arrived],
                "event_to_client_s": [received - t for e in doc.get("events", []) for t in e["token_s"]]}

    def _apply(self, doc: dict, task_id: str, received: float, finished: list) -> None:
        """Lock held. Check and apply the events, then the completions (into `finished`, with their results)."""
        for event in doc.get("events", []):
            entry = self._open.get(event["request_id"])
            if entry is None:
                continue  # a request this session already failed
            if event["from"] != len(entry.token_s):
                raise ParityError(f"it sent tokens of {event['request_id']} from {event['from']}, the client "
                                  f"holds {len(entry.token_s)}: events out of order")
            if not entry.token_s and event["token_s"] and self.on_first is not None:
                self.on_first(event["request_id"])
            entry.token_s += [received] * len(event["token_s"])
        for out in doc["outputs"]:
            rid = out["request_id"]
            entry = self._open.pop(rid, None)
            if entry is None:
                continue
            finished.append((entry, Result(
                request_id=rid, output_token_ids=out["output_token_ids"], prompt_tokens=int(out["prompt_tokens"]),
                cached_tokens=int(out["cached_tokens"]), submit_s=entry.submitted, complete_s=received, batch_id=None,
                worker=doc["worker"], input_sha256=out.get("input_sha256"), token_s=entry.token_s)))
            if len(entry.token_s) != len(out["output_token_ids"]):
                raise ParityError(f"it completed {rid} with {len(out['output_token_ids'])} tokens after "
                                  f"{len(entry.token_s)} token events")

    def _fail_open(self, task_id: str | None, exc: BaseException, also: list[_Open] = ()) -> None:
        """Fail every request open on the session (and `also`) with one line naming the task; on close
        (`task_id` None), the queued ones too."""
        with self._lock:
            failing, self._open = [*self._open.values(), *also], {}
            if task_id is None:
                failing += [_Open(tokens, submitted, future) for _, tokens, submitted, _, future in self._queue]
                self._queue.clear()
        if task_id is not None:
            exc = ParityError(f"harvest task {task_id} failed: {' '.join(str(exc).split())}")
        for entry in failing:
            if not entry.future.done():
                entry.future.set_exception(exc)

    def close(self) -> None:
        """Stop after the tasks outstanding (at most two holds away; tasks that never return are waited for 10 s
        in all, both threads together, their requests then failed when they do); requests still open fail, by name."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for thread in filter(None, (self._express_thread, self._thread)):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
