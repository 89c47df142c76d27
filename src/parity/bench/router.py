"""Router cost: µs per request to route 8K-token prompts, against hashing their first 1,024 tokens once.

Both are timed in the same run on the same prompts (best of `repeats`, one thread), so the ratio
says how much the map, the load bookkeeping and the Python around the hashing add; the target is
20 µs/request.
"""

from __future__ import annotations

import hashlib
import platform
import time

import numpy as np

from parity.routing import MODEL_REVISION
from parity.routing.sticky import DEPTH_TOKENS, AffinityRouter, prefix_identities

TARGET_US = 20.0
VOCAB = 128_000
SUFFIX_TOKENS = 16


def _prompts(num_requests: int, prompt_tokens: int, documents: int, seed: int) -> list[np.ndarray]:
    """Shared document prefixes with distinct short suffixes, shuffled: the reuse trace's shape."""
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, VOCAB, size=(documents, prompt_tokens - SUFFIX_TOKENS), dtype=np.uint32)
    prompts = [np.concatenate([docs[i % documents], rng.integers(0, VOCAB, SUFFIX_TOKENS, dtype=np.uint32)])
               for i in range(num_requests)]
    return [prompts[i] for i in rng.permutation(num_requests)]


def _best_us(fn, items, repeats: int) -> float:
    """Best-of-`repeats` wall time of fn(items), in µs per item."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn(items)
        best = min(best, (time.perf_counter_ns() - start) / 1000 / len(items))
    return best


def run(num_requests: int = 512, prompt_tokens: int = 8000, num_shards: int = 2, documents: int | None = None,
        seed: int = 0, repeats: int = 5) -> dict:
    """Time routing and hashing on the same deterministic prompts; `documents` defaults to requests // 4."""
    if num_requests < 1 or repeats < 1:
        raise ValueError(f"need num_requests >= 1 and repeats >= 1, got {num_requests} and {repeats}")
    if prompt_tokens <= SUFFIX_TOKENS:
        raise ValueError(f"prompt_tokens must exceed the {SUFFIX_TOKENS}-token question, got {prompt_tokens}")
    documents = max(1, num_requests // 4) if documents is None else documents
    if documents < 1:
        raise ValueError(f"need at least one document, got {documents}")
    prompts = _prompts(num_requests, prompt_tokens, documents, seed)
    heads = [p[:DEPTH_TOKENS].tobytes() for p in prompts]

    def route_all(ps):
        router = AffinityRouter(num_shards, MODEL_REVISION, capacity=4 * len(ps) + 16)  # never evicts
        for p in ps:
            router.route(p)

    def hash_all(ps):
        for p in ps:
            prefix_identities(p, MODEL_REVISION)

    def sha_all(blobs):
        for blob in blobs:
            hashlib.sha256(blob).digest()

    route_us = _best_us(route_all, prompts, repeats)
    hash_us = _best_us(hash_all, prompts, repeats)
    sha_us = _best_us(sha_all, heads, repeats)
    return {"requests": num_requests, "prompt_tokens": prompt_tokens, "shards": num_shards,
            "documents": documents, "route_us_per_request": route_us, "hash_us_per_request": hash_us,
            "raw_sha256_us_per_request": sha_us, "ratio_route_to_hash": route_us / hash_us,
            "target_us_per_request": TARGET_US, "meets_target": route_us <= TARGET_US,
            "python": platform.python_version()}
