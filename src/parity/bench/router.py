"""Router cost: µs per request to route 8K-token prompts, against hashing their first 1,024 tokens once.

Both are timed in the same run on the same prompts (best of `repeats`), so the ratio says how much
the map, the load bookkeeping and the Python around the hashing add; the target is 20 µs/request.
"""

from __future__ import annotations

import hashlib
import platform
import time

import numpy as np

from parity.affinity import DEPTH_TOKENS, AffinityRouter, prefix_identities

TARGET_US = 20.0
REVISION = "a2856192dd7c25b842431f39c179a6c2c2f627d1"


def _prompts(num_requests: int, prompt_tokens: int, seed: int) -> list[np.ndarray]:
    """Documents asked four questions each, shuffled: the reuse trace's shape, random token IDs."""
    rng = np.random.default_rng(seed)
    documents = max(1, num_requests // 4)
    docs = rng.integers(0, 128_000, size=(documents, prompt_tokens - 16), dtype=np.uint32)
    prompts = [np.concatenate([docs[i % documents], rng.integers(0, 128_000, 16, dtype=np.uint32)])
               for i in range(num_requests)]
    return [prompts[i] for i in rng.permutation(num_requests)]


def _best_us(fn, prompts, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn(prompts)
        best = min(best, (time.perf_counter_ns() - start) / 1000 / len(prompts))
    return best


def run(num_requests: int = 512, prompt_tokens: int = 8000, num_shards: int = 2, seed: int = 0,
        repeats: int = 5) -> dict:
    prompts = _prompts(num_requests, prompt_tokens, seed)

    def route_all(ps):
        router = AffinityRouter(num_shards, REVISION, capacity=4 * len(ps) + 16)
        for p in ps:
            router.route(p)

    def hash_all(ps):
        for p in ps:
            prefix_identities(p, REVISION)

    def sha_all(ps):
        for p in ps:
            hashlib.sha256(p[:DEPTH_TOKENS].tobytes()).digest()

    route_us = _best_us(route_all, prompts, repeats)
    hash_us = _best_us(hash_all, prompts, repeats)
    sha_us = _best_us(sha_all, prompts, repeats)
    return {"requests": num_requests, "prompt_tokens": prompt_tokens, "shards": num_shards,
            "route_us_per_request": route_us, "hash_us_per_request": hash_us,
            "raw_sha256_us_per_request": sha_us, "ratio_route_to_hash": route_us / hash_us,
            "target_us_per_request": TARGET_US, "meets_target": route_us <= TARGET_US,
            "python": platform.python_version()}
