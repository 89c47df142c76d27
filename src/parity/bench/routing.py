"""Routing on traffic the study did not send, on the calibrated simulator (virtual clock): each workload
family placed by every router and by a hindsight placement, each shard's requests then run at once
on a fresh simulated engine, throughput = requests / slowest shard (the offline limit's measure).

Families (`FAMILIES`): the study's reuse burst; a shared system prompt of 0 to 4,096 tokens before
every document; Zipf-skewed questions per document; a working set from 25% to 150% of the shards'
KV cache; 2 to 64 shards. The hindsight placement knows the documents and their questions, and takes
the faster, as simulated, of two placements made with that knowledge: whole documents, largest first,
to the least-loaded shard, a document bigger than a shard's share spread over several; and
alternating (which wins when one document is most of the burst). A reference to compare with, not a
proven optimum (a router may beat it).
Everything here is simulated.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from parity.engine.sim import SimEngine, SimParams
from parity.routing import MODEL_REVISION, SHARDED, PrefixRouter, RouterSettings
from parity.routing.prefix import DECODE_WEIGHT
from parity.study import OUTPUT_TOKENS

PLACEMENTS = (*SHARDED, "hindsight")  # every router over a path's shards (parity.routing), and the reference
FAMILIES = ("study-reuse", "shared-head", "zipf", "working-set", "shards")
VOCAB = 128_000
QUESTION_TOKENS = 40


@dataclass
class Workload:
    """One burst with what the routers do not see: each request's document and the shared head."""

    family: str
    case: str
    prompts: list[np.ndarray]
    documents: list[int]
    shards: int
    head_tokens: int = 0
    cache_tokens: int | None = None  # per shard, when the family shrinks the simulated cache


def documents(family: str, case: str, *, docs: int, questions: int | list[int], prefix_tokens: int, shards: int = 2,
              head_tokens: int = 0, seed: int = 0, cache_tokens: int | None = None) -> Workload:
    """`docs` documents of `prefix_tokens` random tokens after a shared head, each asked its questions
    (a count for all, or one per document), in a shuffled burst order."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, VOCAB, head_tokens, dtype=np.uint32)
    counts = [questions] * docs if isinstance(questions, int) else list(questions)
    prompts, labels = [], []
    for doc, count in enumerate(counts):
        body = np.concatenate([head, rng.integers(0, VOCAB, prefix_tokens, dtype=np.uint32)])
        for _ in range(count):
            prompts.append(np.concatenate([body, rng.integers(0, VOCAB, QUESTION_TOKENS, dtype=np.uint32)]))
            labels.append(doc)
    order = rng.permutation(len(prompts))
    return Workload(family, case, [prompts[i] for i in order], [labels[i] for i in order], shards, head_tokens,
                    cache_tokens)


def zipf_counts(docs: int, requests: int, skew: float, seed: int) -> list[int]:
    """Questions per document with popularity ~ 1 / rank^skew, every document asked at least once."""
    weights = 1.0 / np.arange(1, docs + 1) ** skew
    rng = np.random.default_rng(seed)
    extra = rng.multinomial(requests - docs, weights / weights.sum())
    return [1 + int(n) for n in extra]


def families(quick: bool = False) -> list[Workload]:
    """Every family's cases; `quick`: shorter prompts and fewer cases (tests, smoke)."""
    prefix = 1000 if quick else 8000
    small = 500 if quick else 2000
    out = [documents("study-reuse", f"{16 if quick else 64} docs x 4 questions", docs=16 if quick else 64, questions=4,
                     prefix_tokens=prefix, seed=1)]
    for head in ((0, 1024) if quick else (0, 256, 1024, 4096)):
        out.append(documents("shared-head", f"head {head}", docs=16 if quick else 64, questions=4,
                             prefix_tokens=prefix, head_tokens=head, seed=2))
    for skew in ((1.0,) if quick else (0.6, 1.0, 1.4)):
        for seed in ((0,) if quick else (0, 1, 2)):
            docs = 16 if quick else 64
            out.append(documents("zipf", f"skew {skew} seed {seed}", docs=docs, prefix_tokens=prefix, seed=seed,
                                 questions=zipf_counts(docs, 4 * docs, skew, seed)))
    for hot in ((200,) if quick else (120, 300, 600)):  # one document most of the burst: only replication helps
        out.append(documents("zipf", f"one doc x {hot} + 10 x 2", docs=11, questions=[hot] + [2] * 10,
                             prefix_tokens=small, seed=3))
    cache = 16 * small  # per shard: 16 documents' prefixes
    for share in ((0.5, 1.5) if quick else (0.25, 0.5, 1.0, 1.5)):
        docs = max(2, int(round(share * 2 * cache / small)))
        out.append(documents("working-set", f"{share:.0%} of the cache", docs=docs, questions=4, prefix_tokens=small,
                             seed=3, cache_tokens=cache))
    for shards in ((2, 8) if quick else (2, 4, 8, 16, 64)):
        out.append(documents("shards", f"{shards} shards", docs=8 * shards, questions=4, prefix_tokens=small,
                             shards=shards, seed=4))
    return out


def hindsight(w: Workload, params: SimParams) -> list[int]:
    """The faster (simulated) of `whole_documents` and alternating."""
    options = [whole_documents(w), [k % w.shards for k in range(len(w.prompts))]]
    return max(options, key=lambda shard_of: simulate(w, shard_of, params)["requests_per_s"])


def whole_documents(w: Workload) -> list[int]:
    """Whole documents, largest first, each to the shard with the least work (longest-processing-time
    first); a document with more work than a shard's share is spread evenly over as many shards as it
    needs. Work: prompt tokens not already on the shard (the shared head once per shard), plus output
    tokens at the router's decode weight."""
    by_doc: dict[int, list[int]] = {}
    for index, doc in enumerate(w.documents):
        by_doc.setdefault(doc, []).append(index)
    body = {d: len(w.prompts[i[0]]) - QUESTION_TOKENS - w.head_tokens for d, i in by_doc.items()}
    total = {d: body[d] + len(i) * (QUESTION_TOKENS + OUTPUT_TOKENS * DECODE_WEIGHT) for d, i in by_doc.items()}
    share = (sum(total.values()) + w.shards * w.head_tokens) / w.shards
    loads, shard_of = [0.0] * w.shards, [0] * len(w.prompts)
    for doc in sorted(by_doc, key=lambda d: -total[d]):
        parts = min(w.shards, max(1, int(-(-total[doc] // share))))
        chosen = sorted(range(w.shards), key=lambda s: (loads[s], s))[:parts]
        for k, index in enumerate(by_doc[doc]):
            shard_of[index] = chosen[k % parts]
        for shard in chosen:
            loads[shard] += total[doc] / parts + body[doc] * (parts > 1) + (w.head_tokens if not loads[shard] else 0)
    return shard_of


def place(w: Workload, placement: str, params: SimParams) -> tuple[list[int], dict]:
    """The shard of each request under `placement` (a router's, or else the hindsight placement), and the router's
    stats. A router is made as a trial makes it, sized from the family's simulated cache."""
    if placement not in SHARDED:
        return hindsight(w, params), {"policy": "hindsight"}
    router = RouterSettings(placement, cache_tokens=w.cache_tokens or params.kv_cache_tokens).make(w.shards)
    return [router.route(p) for p in w.prompts], router.stats()


def simulate(w: Workload, shard_of: list[int], params: SimParams) -> dict:
    """Each shard's requests at once on a fresh simulated engine (virtual clock)."""
    params = dataclasses.replace(params, kv_cache_tokens=w.cache_tokens) if w.cache_tokens else params
    durations, cached, prompt = [], 0, 0
    for shard in range(w.shards):
        mine = [p for p, s in zip(w.prompts, shard_of) if s == shard]
        if not mine:
            durations.append(0.0)
            continue
        engine = SimEngine(params=params, gpu_uuid=f"sim-{shard}")
        start = engine.now()
        done = engine.generate(mine)
        durations.append(max(c.complete_s for c in done) - start)
        cached += sum(c.cached_tokens for c in done)
        prompt += sum(c.prompt_tokens for c in done)
    return {"requests_per_s": len(w.prompts) / max(durations), "shard_s": durations,
            "cached_share": cached / prompt if prompt else 0.0, "cached_tokens": cached}


def spread(values: list[float]) -> float:
    """max / min - 1 over the shards (0: even)."""
    return max(values) / min(values) - 1 if min(values) > 0 else float("inf")


def evaluate(w: Workload, params: SimParams) -> dict:
    """Every placement of one workload: throughput, requests and documents per shard, split documents."""
    row = {"family": w.family, "case": w.case, "shards": w.shards, "requests": len(w.prompts),
           "documents": len(set(w.documents)), "placements": {}}
    for placement in PLACEMENTS:
        shard_of, stats = place(w, placement, params)
        ran = simulate(w, shard_of, params)
        per_doc: dict[int, set] = {}
        for doc, shard in zip(w.documents, shard_of):
            per_doc.setdefault(doc, set()).add(shard)
        row["placements"][placement] = ran | {
            "requests_per_shard": [shard_of.count(s) for s in range(w.shards)],
            "documents_per_shard": [sum(s in shards for shards in per_doc.values()) for s in range(w.shards)],
            "split_documents": sum(len(shards) > 1 for shards in per_doc.values()),
            "work_spread": spread(ran["shard_s"]), "router": stats}
    rps = {p: row["placements"][p]["requests_per_s"] for p in PLACEMENTS}
    row["prefix_vs_hindsight"] = rps["prefix"] / rps["hindsight"]
    row["prefix_vs_alternating"] = rps["prefix"] / rps["alternating"]
    row["prefix_vs_sticky"] = rps["prefix"] / rps["sticky"]
    ours = row["placements"]["prefix"]
    row["expected_vs_realized_hits"] = (ours["router"]["expected_cached_tokens"] / ours["cached_tokens"]
                                        if ours["cached_tokens"] else None)
    return row


def router_cost(shards: int = 64, requests: int = 2048, prefix_tokens: int = 8000) -> dict:
    """The prefix router's time per request (µs, this process, one core) at `shards` shards."""
    w = documents("cost", f"{shards} shards", docs=requests // 4, questions=4, prefix_tokens=prefix_tokens,
                  shards=shards, seed=5)
    router = PrefixRouter(shards, MODEL_REVISION, cache_tokens=SimParams().kv_cache_tokens)
    times = []
    for prompt in w.prompts:
        start = time.perf_counter()
        router.route(prompt)
        times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return {"shards": shards, "requests": requests, "prompt_tokens": prefix_tokens + QUESTION_TOKENS,
            "p50_us": times[len(times) // 2], "p99_us": times[int(len(times) * 0.99)], "max_us": times[-1]}


def run(params: SimParams, *, quick: bool = False, only: set[str] | None = None, log=print) -> dict:
    rows = []
    for w in families(quick):
        if only and w.family not in only:
            continue
        rows.append(evaluate(w, params))
        r = rows[-1]
        log(f"{r['family']:<12} {r['case']:<22} prefix/hindsight {r['prefix_vs_hindsight']:.1%}, "
            f"prefix/alternating {r['prefix_vs_alternating']:.1%}, prefix/sticky {r['prefix_vs_sticky']:.1%}")
    return {"simulated": True, "params": params.source, "rows": rows,
            "router_cost": router_cost(64, 512 if quick else 2048, 1000 if quick else 8000)}


def summary_lines(result: dict) -> list[str]:
    """The result, readable: a row per family and case (requests/s per placement, the prefix router against
    each), then the router's cost."""
    lines = [f"{'family':<12} {'case':<22} {'req/s: alternating':>18} {'sticky':>8} {'prefix':>8} {'hindsight':>9}"
             f"  prefix vs: hindsight alternating sticky   split docs  expected/realized hits  (simulated)"]
    for r in result["rows"]:
        rps = {p: v["requests_per_s"] for p, v in r["placements"].items()}
        lines.append(f"{r['family']:<12} {r['case']:<22} {rps['alternating']:>18.2f} {rps['sticky']:>8.2f} "
                     f"{rps['prefix']:>8.2f} {rps['hindsight']:>9.2f}  {r['prefix_vs_hindsight']:>18.1%} "
                     f"{r['prefix_vs_alternating']:>11.1%} {r['prefix_vs_sticky']:>6.1%}   "
                     f"{r['placements']['prefix']['split_documents']:>10}  {r['expected_vs_realized_hits'] or 0:>21.1%}")
    c = result["router_cost"]
    lines.append(f"prefix router at {c['shards']} shards, {c['prompt_tokens']}-token prompts: p50 {c['p50_us']:.1f} us, "
                 f"p99 {c['p99_us']:.1f} us per request (this process, one core)")
    return lines
