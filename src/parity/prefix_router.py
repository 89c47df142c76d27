"""The prefix-aware router (placement `prefix`): a policy of our own beside the study's (`sticky`,
`parity.affinity`), which stays as the study ran it and the default of the study's tables.

- Identity: the chain of hashes over every full block of the whole prompt (`block_tokens` each),
  salted with the model revision, so a shared head of any length is matched as far as it goes.
- Matching: per shard, the deepest block of the chain it holds; an index maps each block to the
  shards holding it, and each shard's blocks are kept in LRU order within its cache.
- Decision: the shard with the least cost once this request is added: the work it already has,
  plus this prompt's work there (the prompt minus what that shard holds, plus the output tokens),
  plus, where it would recompute a prefix another shard holds, that recompute once more (capacity
  taken from later requests). "Any match" never decides, so a shared system prompt held by every
  shard does not pull every request to one of them; and a document whose shard is busier than
  another by more than twice its prefix is replicated there (the hot-prefix guard, which works for
  two shards, where SGLang's 64-request / 1.5x thresholds never fire).
- Load: booked as the engine's work (uncached prefill plus decode) and released by `complete`.
- Capacity: blocks per shard from the engine's KV cache (`cache_tokens`); the oldest blocks of a
  full shard are forgotten as the engine would evict them, and the stats say when the live prefixes
  outgrew it (`overflowed`).
- Feedback: `observe` takes each request's cached tokens as the engine reported them, so a trial
  records the router's expected hits beside the realized ones.
The router sees token IDs only; an assignment is not proof of a hit (the engines' counts are).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

Tokens = Sequence[int] | np.ndarray
BLOCK_TOKENS = 256
OUTPUT_TOKENS = 16


def block_chain(tokens: Tokens, salt: int, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Hash k covers tokens [0, (k + 1) * block_tokens): two prompts share hash k exactly when they share
    that prefix (up to 64-bit collisions). Only full blocks: the engine caches nothing shorter."""
    data = np.asarray(tokens)
    if data.size == 0:
        raise ValueError("cannot route an empty prompt")
    if data.dtype.kind not in "iu":
        raise ValueError(f"token IDs must be integers, got dtype {data.dtype}")
    full = data.size // block_tokens * block_tokens
    raw = data[:full].astype("<u4", copy=False).tobytes()
    step, parent, chain = 4 * block_tokens, salt, []
    for start in range(0, len(raw), step):
        parent = hash((parent, raw[start:start + step]))
        chain.append(parent)
    return chain


class PrefixRouter:
    """Longest-prefix, least-work routing over `num_shards` shards; see the module docstring."""

    def __init__(self, num_shards: int, revision: str, *, cache_tokens: int, block_tokens: int = BLOCK_TOKENS,
                 output_tokens: int = OUTPUT_TOKENS, margin: float = 4.0):
        if num_shards < 1:
            raise ValueError(f"need at least one shard, got num_shards={num_shards}")
        if cache_tokens < block_tokens:
            raise ValueError(f"cache_tokens ({cache_tokens}) must hold at least one block of {block_tokens}")
        self.num_shards, self.block_tokens, self.output_tokens = num_shards, block_tokens, output_tokens
        self.margin = margin  # a held prefix recomputed elsewhere counts (1 + margin) times
        self.capacity_blocks = cache_tokens // block_tokens
        self._salt = hash(("parity-prefix-v1", revision))
        self._holders: dict[int, int] = {}  # block hash -> bit mask of the shards holding it
        self._forks: dict[int, set[int]] = {}  # block hash -> the blocks seen after it that go on further
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_shards)]  # LRU per shard
        self._loads = [0] * num_shards
        self._requests = self._replicated = self._evicted = 0
        self._expected: list[int] = []  # cached tokens the router expects, per request in routing order
        self._booked: list[tuple[int, int]] = []  # (shard, work) per request, until `complete`
        self._realized: list[int] | None = None
        self.overflowed = False

    def _depths(self, chain: list[int]) -> dict[int, int]:
        """The shards holding the first block of `chain`, each with how many leading blocks it holds."""
        depths: dict[int, int] = {}
        still = (1 << self.num_shards) - 1  # shards holding every block so far
        for depth, block in enumerate(chain, start=1):
            still &= self._holders.get(block, 0)
            if not still:
                break
            mask = still
            while mask:
                low = mask & -mask
                depths[low.bit_length() - 1] = depth
                mask ^= low
        return depths

    def route(self, tokens: Tokens) -> int:
        """The shard for this prompt; books its work there and remembers its blocks on that shard."""
        chain = block_chain(tokens, self._salt, self.block_tokens)
        depths = self._depths(chain)
        length, loads, block = len(tokens), self._loads, self.block_tokens
        deepest = max(depths.values(), default=0)
        shared = self._shared_depth(chain, deepest)
        # A shard that would recompute a prefix another holds pays that recompute (1 + margin) times in the
        # comparison: once as its own work, `margin` times as capacity taken from later requests. So a
        # burst's later questions stay with their document's shard, and a document is replicated only
        # when its holder is busier than another shard by more than (1 + margin) times its prefix (the
        # hot-prefix guard). Of the shards holding nothing, only the least loaded can be cheapest.
        candidates = set(depths)
        candidates.add(min(range(self.num_shards), key=loads.__getitem__))

        def cost(s: int) -> tuple:
            held = depths.get(s, 0)
            again = max(0, deepest - max(held, shared))  # blocks of a held prefix recomputed, shared heads aside
            return (loads[s] + length - held * block + self.output_tokens + self.margin * again * block, loads[s], s)

        shard = min(candidates, key=cost)
        held = depths.get(shard, 0)
        work = length - held * block + self.output_tokens
        if held < deepest:
            self._replicated += 1  # a held prefix recomputed elsewhere: its holder was the busier
        loads[shard] += work
        self._remember(shard, chain)
        self._expected.append(held * block)
        self._booked.append((shard, work))
        self._requests += 1
        return shard

    def _shared_depth(self, chain: list[int], deepest: int) -> int:
        """Blocks of `chain` that are a head shared by several continuations (a system prompt before many
        documents): its deepest block after which two or more different blocks went on. Recomputing such a
        head on another shard is not replication: every shard needs it once."""
        for depth in range(deepest, 0, -1):
            if len(self._forks.get(chain[depth - 1], ())) >= 2:
                return depth
        return 0

    def _remember(self, shard: int, chain: list[int]) -> None:
        for parent, child in zip(chain, chain[1:-1]):  # a child that goes on (a question's tail does not)
            self._forks.setdefault(parent, set()).add(child)
        held, bit = self._held[shard], 1 << shard
        for block in chain:
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
                self._holders[block] = self._holders.get(block, 0) | bit
        while len(held) > self.capacity_blocks:  # the engine evicts its least recently used blocks
            block, _ = held.popitem(last=False)
            left = self._holders[block] & ~bit
            if left:
                self._holders[block] = left
            else:
                del self._holders[block]
                self._forks.pop(block, None)
            self._evicted += 1
            self.overflowed = True

    def complete(self, index: int) -> None:
        """Release the work booked for the `index`-th routed request (it finished on its shard)."""
        shard, work = self._booked[index]
        if work:
            self._loads[shard] -= work
            self._booked[index] = (shard, 0)

    def observe(self, cached_tokens: list[int]) -> None:
        """The engine's cached prompt tokens per request, in routing order: the hits that happened."""
        if len(cached_tokens) != len(self._expected):
            raise ValueError(f"observed {len(cached_tokens)} requests, routed {len(self._expected)}")
        self._realized = list(cached_tokens)

    @property
    def loads(self) -> list[int]:
        """Work booked on each shard and not yet released (uncached prompt tokens plus output tokens)."""
        return list(self._loads)

    def stats(self) -> dict:
        expected = sum(self._expected)
        realized = None if self._realized is None else sum(self._realized)
        return {"policy": "prefix", "requests": self._requests, "loads": self.loads,
                "replicated": self._replicated, "block_tokens": self.block_tokens,
                "capacity_blocks": self.capacity_blocks, "held_blocks": [len(h) for h in self._held],
                "evicted_blocks": self._evicted, "overflowed": self.overflowed,
                "expected_cached_tokens": expected, "realized_cached_tokens": realized,
                "expected_vs_realized": None if not realized else expected / realized}
