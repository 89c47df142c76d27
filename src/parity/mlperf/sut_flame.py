"""The Flame arm's SUT: samples go to the sessions' batchers, which send tasks of `batch_limit` prompts.

Sessions are taken in turn (one per GPU with sticky placement; one for all with global). Each sample
completes when the task holding it returns. A worker failure that Flame would hide (a failed bind is
retried silently) is turned into failed samples by a watchdog, so LoadGen is never left waiting.
"""

from __future__ import annotations

import itertools
import threading

from parity.mlperf.sut import Done, OfflineSUT


class FlameSUT(OfflineSUT):
    def __init__(self, prompts, sessions, *, watch_s: float = 1.0):
        super().__init__(prompts)
        self.sessions = sessions
        self._turn = itertools.count()
        self._pending: dict[int, Done] = {}
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, args=(watch_s,), name="mlperf-flame-watch", daemon=True)
        self._watchdog.start()

    def start(self, index: int, done: Done) -> None:
        key = next(self._turn)
        batcher = self.sessions.batchers[key % self.sessions.shards]
        with self._pending_lock:
            self._pending[key] = done
        future = batcher.submit(f"sample-{index}-{key}", self.prompts[index])
        future.add_done_callback(lambda f, k=key: self._finish(k, f))

    def _finish(self, key: int, future) -> None:
        with self._pending_lock:
            done = self._pending.pop(key, None)
        if done is None:  # already failed by the watchdog
            return
        error = future.exception()
        if error is not None:
            done(None, error)
        else:
            done(future.result().output_token_ids)

    def _watch(self, every_s: float) -> None:
        check = getattr(self.sessions, "check_failures", None)  # a worker's failure report, where supported
        while check is not None and not self._stop.wait(every_s):
            try:
                check()
            except Exception as exc:
                with self._pending_lock:
                    failed, self._pending = list(self._pending.values()), {}
                for done in failed:
                    done(None, exc)

    def close(self) -> None:
        self._stop.set()
        super().close()
