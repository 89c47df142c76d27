"""The simulator's prefix cache: vLLM's block pool at its granularity, so cache hits are modelled, not assumed.

As in vLLM v1 (`vllm/v1/core/block_pool.py`, `kv_cache_manager.py`): KV memory is a fixed pool of
16-token blocks; a full block is identified by a hash chained to its parent block; blocks of running
requests are referenced; a block whose last reference goes is kept, still hashed, at the tail of an
LRU free queue, and is evicted only when an allocation takes it from the head; a hit counts whole
blocks and at most prompt − 1 tokens. With `events` set to a list, evictions are appended to it as
vLLM's BlockRemoved events (the scheduler adds BlockStored; the engine publishes them per step).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

ROOT_HASH = hashlib.blake2b(b"parity-sim-none-hash", digest_size=16).digest()


def block_hashes(prompt: np.ndarray, block_size: int) -> list[bytes]:
    """Chained identities of the prompt's full blocks (the partial tail block has none)."""
    data = np.asarray(prompt, dtype="<u4").tobytes()
    step = 4 * block_size
    hashes, parent = [], ROOT_HASH
    for start in range(0, (len(data) // step) * step, step):
        parent = hashlib.blake2b(parent + data[start:start + step], digest_size=16).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """A pool of `num_blocks` KV blocks with prefix caching and LRU eviction."""

    def __init__(self, num_blocks: int, block_size: int = 16, enabled: bool = True):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enabled = enabled
        self._refs = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.evictions = 0
        self.events: list | None = None  # KV cache events since the engine last published, when it publishes

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def cached_blocks(self) -> int:
        return len(self._by_hash)

    def hit_blocks(self, hashes: list[bytes], prompt_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix, at most prompt − 1 tokens (vLLM's cap)."""
        if not self.enabled:
            return []
        limit = (prompt_tokens - 1) // self.block_size
        hits = []
        for h in hashes[:limit]:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_allocate(self, count: int, reuse: list[int] = ()) -> bool:
        """Whether `count` new blocks fit, counting reused free blocks that stop being free."""
        reclaimed = sum(1 for b in reuse if self._refs[b] == 0)
        return count <= len(self._free) - reclaimed

    def take(self, blocks: list[int]) -> None:
        """Reference cached blocks for a request (removing them from the free queue)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, count: int) -> list[int]:
        """New blocks from the head of the free queue, evicting their cached identity."""
        out = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of[block]
            if old is not None:
                if self._by_hash.get(old) == block:
                    del self._by_hash[old]
                self._hash_of[block] = None
                self.evictions += 1
                if self.events is not None:
                    from parity.kv_events import removed_event

                    self.events.append(removed_event([old]))
            self._refs[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: bytes) -> bool:
        """Make a full, computed block findable by its hash (first writer wins, as in vLLM); whether it was."""
        if self.enabled and self._hash_of[block] is None and block_hash not in self._by_hash:
            self._hash_of[block] = block_hash
            self._by_hash[block_hash] = block
            return True
        return False

    def release(self, blocks: list[int]) -> None:
        """Drop a request's references; tail blocks go first into the LRU queue, so they go first."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None
