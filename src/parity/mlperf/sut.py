"""The SUT half LoadGen sees: every issued sample is started on a serving path and completed with its
output token IDs (int32, as the reference SUT returns them), so accuracy mode can read them back.

A path only implements `start(index, done)`; it calls `done(token_ids)` or `done(None, error)` from any
thread. A failed sample is still completed (empty), so LoadGen never waits forever, and the failure is
counted: a run with failures is an error, whatever LoadGen reports. `probe` sends samples outside
LoadGen, to estimate the samples/s that `target_qps` should be set to.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import Callable

import numpy as np

from parity.errors import ParityError
from parity.mlperf.settings import loadgen

Done = Callable[..., None]


class OfflineSUT(abc.ABC):
    def __init__(self, prompts: list[np.ndarray]):
        self.prompts = prompts
        self.issued = self.completed = self.failed = self.tokens = 0
        self.first_error: str | None = None
        self._lock = threading.Lock()
        self._outstanding: set[int] = set()  # LoadGen sample ids issued and not yet completed
        self._aborted: str | None = None
        self.handle = None

    @abc.abstractmethod
    def start(self, index: int, done: Done) -> None:
        """Send prompt `index` on the path; call done(token_ids) or done(None, error) when it ends."""

    def construct(self):
        self.handle = loadgen().ConstructSUT(self._issue, self._flush)
        return self.handle

    def _issue(self, samples) -> None:
        with self._lock:
            self.issued += len(samples)
            aborted = self._aborted
            if aborted is None:
                self._outstanding.update(sample.id for sample in samples)
        if aborted is not None:  # issued after a stop: completed at once, failed
            self._fail([sample.id for sample in samples], aborted)
            return
        for sample in samples:
            self.start(sample.index, lambda tokens, error=None, sid=sample.id: self._complete(sid, tokens, error))

    def abort(self, reason: str) -> None:
        """Complete every outstanding sample now, failed with `reason` (a stop signal), so LoadGen's test returns
        and the run tears down in order: a SIGTERM raised while LoadGen ran left its threads calling into a
        process being torn down (an outsider's segfault, 2026-12-07). The path's later answers are dropped."""
        with self._lock:
            if self._aborted is not None:
                return
            self._aborted = reason
            pending = sorted(self._outstanding)
            self._outstanding.clear()
        self._fail(pending, reason)

    @property
    def stopped(self) -> str | None:
        """Why the run was stopped (`abort`), else None."""
        return self._aborted

    def _fail(self, sample_ids: list[int], reason: str) -> None:
        """Complete these (no longer outstanding) samples failed, in one LoadGen call."""
        if not sample_ids:
            return
        with self._lock:
            self.failed += len(sample_ids)
            self.first_error = self.first_error or reason
        lg, empty = loadgen(), np.zeros(0, dtype=np.int32)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sid, empty.ctypes.data, 0, 0) for sid in sample_ids])

    def _flush(self) -> None:
        pass

    def _record(self, tokens, error) -> np.ndarray:
        data = np.asarray(tokens if error is None and tokens is not None else [], dtype=np.int32)
        with self._lock:
            if error is not None or tokens is None:
                self.failed += 1
                self.first_error = self.first_error or str(error or "no output")
            else:
                self.completed += 1
                self.tokens += int(data.size)
        return data

    def _complete(self, sample_id: int, tokens, error=None) -> None:
        lg = loadgen()
        with self._lock:  # each sample completed once: by its answer, or by `abort`, whichever comes first
            if sample_id not in self._outstanding:
                return
            self._outstanding.discard(sample_id)
        data = self._record(tokens, error)  # kept alive until QuerySamplesComplete returns
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, data.ctypes.data, data.nbytes, int(data.size))])

    def probe(self, indices: list[int], timeout_s: float = 1800) -> dict:
        """Run these samples at once, outside LoadGen; their samples/s and tokens/s."""
        finished = threading.Event()
        state = {"left": len(indices), "tokens": 0, "error": None}
        lock = threading.Lock()

        def done(tokens, error=None):
            with lock:
                state["left"] -= 1
                if error is not None or tokens is None:
                    state["error"] = state["error"] or str(error or "no output")
                else:
                    state["tokens"] += len(tokens)
                if state["left"] == 0:
                    finished.set()

        begin = time.monotonic()
        for index in indices:
            self.start(index, done)
        if not finished.wait(timeout_s):
            raise ParityError(f"probe: {state['left']} of {len(indices)} samples unanswered after {timeout_s:.0f} s")
        seconds = time.monotonic() - begin
        if state["error"]:
            raise ParityError(f"probe failed: {state['error']}")
        return {"samples": len(indices), "seconds": seconds, "samples_per_s": len(indices) / seconds,
                "tokens_per_s": state["tokens"] / seconds}

    def progress(self) -> str:
        with self._lock:
            return f"{self.completed + self.failed}/{self.issued} samples done ({self.failed} failed)"

    def close(self) -> None:
        if self.handle is not None:
            loadgen().DestroySUT(self.handle)
            self.handle = None
