"""The standalone arm's SUT: each sample is one `/v1/completions` request to a replica.

Replicas are taken in turn. Offline issues the whole query at once; up to `max_in_flight` requests are
kept open (vLLM queues beyond its `max_num_seqs` anyway), through one shared, pre-warmed connection
pool on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from parity.mlperf.sut import Done, OfflineSUT
from parity.standalone.client import NativeClient


class StandaloneSUT(OfflineSUT):
    def __init__(self, prompts, urls: list[str], model: str, sampling: dict, *, max_in_flight: int = 512):
        super().__init__(prompts)
        self.urls = urls
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mlperf-standalone", daemon=True)
        self._thread.start()
        self._client = NativeClient(urls, model, sampling=sampling)
        self._slots = None
        self._call(self._open(max_in_flight))

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _open(self, max_in_flight: int) -> None:
        self._slots = asyncio.Semaphore(max_in_flight)
        await self._client.__aenter__()

    async def _one(self, index: int, shard: int, done: Done) -> None:
        async with self._slots:
            try:
                reply = await self._client.send(shard, self.prompts[index], f"sample-{index}")
            except Exception as exc:  # every sample is completed, failed or not
                done(None, exc)
                return
        done(reply.output_token_ids)

    def start(self, index: int, done: Done) -> None:
        shard = next(self._turn) % len(self.urls)
        asyncio.run_coroutine_threadsafe(self._one(index, shard, done), self._loop)

    def close(self) -> None:
        super().close()
        if self._thread.is_alive():
            self._call(self._client.__aexit__(None, None, None))
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
