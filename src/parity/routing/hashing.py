"""The prefix router's block hashes, shared with the engines' KV cache events (`parity.kv_events`), which turn
the blocks an engine stored back into the same hashes so the router's map follows what the engine holds.

A prompt is hashed as a chain over its full blocks (`BLOCK_TOKENS` each), salted with the model revision
(`salt_of`): hash k covers tokens [0, (k + 1) * block_tokens). Past a prompt's deepest held block, what two
prompts share of the next block is hashed in the engine's own blocks (`FINE_TOKENS`, `fine_chain`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from parity.routing.base import Tokens

BLOCK_TOKENS = 256
FINE_TOKENS = 16  # the engine's KV block: the grain of what a shard is counted as holding past its deepest block
_WEIGHTS: dict[int, np.ndarray] = {}
_MIXED: dict[int, np.ndarray] = {}  # weights times the mixer
_U32, _U64 = np.dtype(np.uint32), np.dtype(np.uint64)
DEPTHS = 4096  # per-depth multipliers, cycled beyond (a million tokens at 256 per block)


def _odd_words(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**63, count, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def weights(count: int) -> np.ndarray:
    """Fixed odd 64-bit weights: a block's fingerprint is their dot product with its words (mod 2**64)."""
    if count not in _WEIGHTS:
        _WEIGHTS[count] = _odd_words(count, 0x9A817 + count)
    return _WEIGHTS[count]


def salt_of(revision: str) -> int:
    """What a router for the model at `revision` salts its block hashes with (a cache another revision built
    matches nothing); the same in every process, so a KV event subscriber made first agrees."""
    return int.from_bytes(hashlib.blake2b(f"parity-prefix-v1:{revision}".encode(), digest_size=8).digest(), "little")


def token_words(tokens: Tokens) -> np.ndarray:
    """The prompt's token IDs as 64-bit words, two per word (a trailing odd token dropped: no block has it)."""
    data = np.asarray(tokens)
    if data.size == 0:
        raise ValueError("cannot route an empty prompt")
    if data.dtype.kind not in "iu":
        raise ValueError(f"token IDs must be integers, got dtype {data.dtype}")
    head = data[:-1] if data.size % 2 else data
    if head.dtype != _U32 or not head.flags.c_contiguous:
        head = np.ascontiguousarray(head, dtype=np.uint32)
    return head.view(_U64)


def _mixed(count: int) -> np.ndarray:
    """weights(count) times fine_chain's odd mixer, mod 2**64 (cached)."""
    if count not in _MIXED:
        _MIXED[count] = weights(count) * np.uint64(0x9E3779B97F4A7C15)
    return _MIXED[count]


def word_chain(words: np.ndarray, salt: int, block_tokens: int) -> list[int]:
    half = block_tokens // 2
    blocks = words.size // half
    depth = weights(DEPTHS)
    fingerprints = words[: blocks * half].reshape(blocks, half).dot(weights(half))  # .dot: less overhead than @
    fingerprints *= depth[:blocks] if blocks <= DEPTHS else np.resize(depth, blocks)
    np.add.accumulate(fingerprints, out=fingerprints)  # the running sum in place, mod 2**64 (cumsum's core)
    fingerprints += np.uint64(salt)
    return fingerprints.tolist()


def block_chain(tokens: Tokens, salt: int, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Hash k covers tokens [0, (k + 1) * block_tokens): two prompts share hash k exactly when they share
    that prefix (up to 64-bit collisions). Only full blocks: the engine caches nothing shorter.

    Vectorized: each block's fingerprint is a dot product of its token IDs (two per 64-bit word) with
    fixed odd weights, and hash k is the salt plus the running sum of fingerprints times per-depth odd
    multipliers, all mod 2**64, so equal hashes mean equal fingerprints at every depth up to k."""
    if block_tokens % FINE_TOKENS:
        raise ValueError(f"block_tokens ({block_tokens}) must be whole engine blocks of {FINE_TOKENS} tokens")
    return word_chain(token_words(tokens), salt, block_tokens)


def fine_chain(words: np.ndarray, block: int, block_tokens: int) -> list[int]:
    """Hash j covers the first j + 1 engine blocks (FINE_TOKENS tokens each) of router block `block`; never the whole
    block (its chain hash says that). Not chained to the prefix before the block: the router keeps these hashes under
    that prefix's chain hash (`PrefixRouter._tails`), so adding it here would only cost a numpy call per chain."""
    half, per = FINE_TOKENS // 2, block_tokens // FINE_TOKENS
    start = block * (block_tokens // 2)
    count = min((words.size - start) // half, per - 1)
    if count <= 0:
        return []
    # a running sum of the block's words times its weights (times the mixer, folded in: mod 2**64 it distributes),
    # read at each engine block's end
    parts = np.add.accumulate(words[start: start + count * half] * _mixed(block_tokens // 2)[: count * half])
    return parts[half - 1::half].tolist()
