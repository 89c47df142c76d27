"""KV cache events from a real `vllm serve` keeping the prefix router's map in step, on one GPU.

From the repo root after `source .gpu/b/setup.sh` (benchmarks/h200-env.sh makes the dummy model):
    python3 benchmarks/h200_kv_events.py OUT [--docs 12] [--cache-docs 8] [--prefix-tokens 8000]
One replica with a KV cache of `cache-docs` documents' prefixes (--num-gpu-blocks-override) is sent
`docs` documents (a working set of docs / cache-docs of the cache), one request each, then asked
again, one question per document, in another order. Two routers watch the same requests: one fed by
the replica's KV cache events (`PrefixRouter.follow`), one with only its own LRU model of the cache.
For each second-round request both say how many cached tokens they expect; the replica says how many
it had. Writes OUT/kv-events.json: the events counted by kind, gaps, and expected vs realized for
both routers. Not a throughput number.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from parity.engine import EngineArgs  # noqa: E402
from parity.kv_events import Subscriber  # noqa: E402
from parity.routing import MODEL_REVISION, PrefixRouter  # noqa: E402
from parity.standalone.client import parse_reply, request_body  # noqa: E402
from parity.standalone.replicas import ReplicaSet  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="/tmp/llama31-8b-dummy")
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("--cache-docs", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=8000)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.split()[0]
    blocks = a.cache_docs * (a.prefix_tokens + 64) // 16
    args = EngineArgs(model=a.model, load_format="dummy", max_model_len=16384)
    rng = np.random.default_rng(0)
    docs = [rng.integers(10, 128_000, a.prefix_tokens, dtype=np.uint32) for _ in range(a.docs)]

    def prompt(doc: int, question: int) -> np.ndarray:
        return np.concatenate([docs[doc], np.random.default_rng(1000 * doc + question).integers(
            10, 128_000, 40, dtype=np.uint32)])

    followed = PrefixRouter(1, MODEL_REVISION, cache_tokens=blocks * 16)
    modelled = PrefixRouter(1, MODEL_REVISION, cache_tokens=blocks * 16)
    events = Subscriber(1, followed.salt)  # bound first: the engine connects to it
    followed.follow(events.changes)
    with ReplicaSet("vllm", [gpu], args, a.out / "logs", kv_events=events.endpoints,
                    serve_flags=("--num-gpu-blocks-override", str(blocks))) as replicas:
        replica = replicas.replicas[0]
        time.sleep(1.0)  # the engine's PUB socket has connected
        rows = []
        with httpx.Client(timeout=300) as http:
            def send(tokens: np.ndarray):
                r = http.post(f"{replica.url}/v1/completions", json=request_body(args.model, tokens, args.sampling()))
                r.raise_for_status()
                return parse_reply(r.json(), "kv-events", 0.0, 0.0, args.sampling())

            for doc in range(a.docs):  # round 1: fills the cache past its size
                p = prompt(doc, 0)
                followed.route(p), modelled.route(p)
                send(p)
            time.sleep(1.0)  # the last events arrive
            for doc in reversed(range(a.docs)):  # round 2: what survived, asked again
                p = prompt(doc, 1)
                time.sleep(0.2)
                followed.route(p), modelled.route(p)
                reply = send(p)
                rows.append({"doc": doc, "prompt_tokens": len(p), "cached_tokens": reply.cached_tokens})
        time.sleep(1.0)
        events.close()
        stats = events.stats()
    exp_f, exp_m = followed.expected[a.docs:], modelled.expected[a.docs:]  # the second round's requests
    realized = [r["cached_tokens"] for r in rows]
    for row, ef, em in zip(rows, exp_f, exp_m):
        row["expected_followed"], row["expected_modelled"] = ef, em
    result = {
        "gpu": gpu, "vllm_blocks": blocks, "cache_tokens": blocks * 16, "docs": a.docs, "cache_docs": a.cache_docs,
        "prefix_tokens": a.prefix_tokens, "events": stats,
        "second_round": {"realized_cached_tokens": sum(realized),
                         "expected_by_the_router_following_events": sum(exp_f),
                         "expected_by_the_router_modelling_lru_alone": sum(exp_m),
                         "requests_hit": sum(1 for r in realized if r > 0)},
        "rows": rows,
    }
    (a.out / "kv-events.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    events.check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
