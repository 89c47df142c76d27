"""How many requests any admission policy could admit on one trial's arrivals with every first token in time
(issue 30: "admitted completions/s at 1.5x saturation >= 0.95x the unbounded arm's achieved rate").

A model, not a measurement. One engine, fluid: it works through what it admitted first come, first served, each
request's engine seconds a lower bound from the simulator's calibrated step model (`parity.engine.sim`: the
prefill's tokens and attention pairs, the step's fixed cost spread over full 8,192-token chunks, the answer's
decode attention), all scaled so that serving every request (each document's prefill once) runs at the unbounded
trial's achieved rate (`calibrated`, where the trial was saturated). A request is its document's seed (it pays the
document's prefill) or a hit on an admitted earlier seed; each admitted request's first token is due `ttft_s`
after its arrival. With one deadline for all, first come first served is earliest deadline first, so a schedule
exists exactly when, for every two arrivals i <= k, the admitted work arriving between them fits in
a_k + ttft_s - a_i. Three numbers per deadline, of all the trial's requests:
- `bound`: a linear program's optimum over that (admitted and seed in [0, 1]; `--late` lets that share of the
  admitted miss it, their work dropped): no policy, however clairvoyant, admits more on this model;
- `found` (with `--integer S`): the best whole schedule HiGHS finds in S seconds, clairvoyant (admits this many);
- `online`: first come, admit if it fits (the engine's backlog known exactly), a document's later requests
  refused once its first was (unless the engine is idle): parity.admission's rule with `orphan_s` and a perfect
  prediction; again with a margin of half a second (about one prefill step, so a first token that comes at its
  step's end is in time), with a refused document's second request taken as its seed when it fits, and with its
  requests judged again once it was asked 4 or 6 times since its first refusal (`orphan_demand`: a hot document).
Each is also given as a share of `capacity`: the requests the engine serves at the achieved rate from the first
arrival to the last arrival plus ttft_s (the bounded arm's admitted rate counts to its last answer, no later).

  python benchmarks/admission_bound.py TRIAL.json [--ttft-s 2] [--late 0.01] [--integer 120] [--sim-params FILE]

TRIAL.json: a saturated unbounded sustained trial (records with arrival_s, prompt_tokens, cached_tokens and a
request_id naming its document, `-dNNNN-qN` (`-nN`: a Zipf trace's Nth asking again), and its block, `-bN`, in a
trace of blocks). Needs scipy (its HiGHS
solver; `pip install 'parity[bound]'`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from parity.engine import EngineArgs
from parity.engine.sim import DEFAULT_PARAMS, SimParams
from parity.latency import summarize
from parity.study import OUTPUT_TOKENS

CHUNK_TOKENS = EngineArgs().max_num_batched_tokens  # the study's: a step's fixed cost spread over at most this many
DOCUMENT = re.compile(r"-d(\d+)-q\d+(?:-n\d+)?(?:-b(\d+))?$")  # a document (a Zipf trace asks a question again: -nN),
# and the block of a `blocks` trace it is in


def requests(doc: dict) -> list[dict]:
    """The trial's requests in arrival order: arrival, prompt and cached tokens, document."""
    out = []
    for r in sorted(doc["records"], key=lambda r: r["arrival_s"]):
        found = DOCUMENT.search(r["request_id"])
        if found is None:
            raise ValueError(f"request {r['request_id']!r} names no document (-dNNNN-qN, then -nN and -bN where given)")
        out.append({"arrival_s": r["arrival_s"], "prompt": r["prompt_tokens"], "cached": r.get("cached_tokens", 0),
                    "document": (int(found.group(1)), int(found.group(2) or 0))})
    if not out:
        raise ValueError("the trial has no records")
    return out


def costs(reqs: list[dict], params: SimParams) -> tuple[np.ndarray, np.ndarray]:
    """Per request, engine seconds as its document's seed (nothing cached) and as a hit (the most its document's
    requests found cached in the trial): a lower bound from the step model."""
    per_token = params.prefill_token_s + params.fixed_s / CHUNK_TOKENS

    def seconds(prompt: int, cached: int) -> float:
        new = prompt - cached
        return (new * per_token + params.attention_pair_s * new * (cached + (new + 1) / 2)
                + params.attention_pair_s * OUTPUT_TOKENS * prompt + params.decode_seq_s * OUTPUT_TOKENS)

    held: dict[tuple, int] = {}
    for r in reqs:
        held[r["document"]] = max(held.get(r["document"], 0), r["cached"])
    seed = np.array([seconds(r["prompt"], 0) for r in reqs])
    hit = np.array([seconds(r["prompt"], min(held[r["document"]], r["prompt"] - 1)) for r in reqs])
    return seed, hit


def work_all(reqs: list[dict], seed: np.ndarray, hit: np.ndarray) -> float:
    """Engine seconds to serve every request, each document's prefill once."""
    seen: set = set()
    total = 0.0
    for i, r in enumerate(reqs):
        total += hit[i] if r["document"] in seen else seed[i]
        seen.add(r["document"])
    return total


def online(reqs: list[dict], seed: np.ndarray, hit: np.ndarray, ttft_s: float, margin_s: float = 0.0,
           young: int = 1, demand: int = 0) -> int:
    """Admitted by first come, admit if it fits `margin_s` early (see the module docstring); a refused document's
    request is its seed only among its first `young` requests (else only at an idle engine), or (`demand`, as
    parity.admission's `orphan_demand`) once the document was asked that many times since its first refusal."""
    free, admitted, state, seen, asked = -np.inf, 0, {}, {}, {}
    for i, r in enumerate(reqs):
        d = r["document"]
        a, known = r["arrival_s"], state.get(d)
        seen[d] = seen.get(d, 0) + 1
        if known == "refused":
            asked[d] += 1
            if free > a and seen[d] > young and not (demand and asked[d] >= demand):  # an orphan, at a busy engine
                continue
        done = max(free, a) + (hit[i] if known == "seeded" else seed[i])
        if done <= a + ttft_s - margin_s:
            free, admitted, state[d] = done, admitted + 1, "seeded"
        elif known is None:
            state[d], asked[d] = "refused", 1
    return admitted


def bound(reqs: list[dict], seed: np.ndarray, hit: np.ndarray, ttft_s: float, late: float = 0.0,
          integer_s: float | None = None) -> tuple[float, float | None]:
    """The linear program's optimum (an upper bound on any policy), and with `integer_s` the most a whole
    schedule HiGHS finds in that many seconds admits (None without)."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp
    from scipy.sparse import coo_matrix

    n = len(reqs)
    a = np.array([r["arrival_s"] for r in reqs])
    X, S, G, W = 0, n, 2 * n, 3 * n  # admitted, seed, work dropped as late, cumulative work
    ub: tuple[list, list, list] = ([], [], [])
    rhs: list[float] = []
    eq: tuple[list, list, list] = ([], [], [])

    def put(into: tuple[list, list, list], k: int, entries: list[tuple[int, float]]) -> None:
        for c, v in entries:
            into[0].append(k)
            into[1].append(c)
            into[2].append(v)

    def row(entries: list[tuple[int, float]], limit: float) -> None:
        put(ub, len(rhs), entries)
        rhs.append(limit)

    docs: dict[tuple, list[int]] = {}
    for i, r in enumerate(reqs):
        row([(S + i, 1.0), (X + i, -1.0)], 0.0)  # a seed is admitted
        earlier = docs.setdefault(r["document"], [])
        earlier.append(i)
        row([(X + i, 1.0)] + [(S + j, -1.0) for j in earlier], 0.0)  # an admitted request has a seed by then
        work = [(X + i, -hit[i]), (S + i, -(seed[i] - hit[i]))]
        put(eq, i, [(W + i, 1.0), (G + i, 1.0), *work] + ([(W + i - 1, -1.0)] if i else []))  # W_i = W_i-1 + work - g
        row([(G + i, 1.0), *work], 0.0)  # no more dropped than its work
    if late:  # the late ones' dropped work, each at most a seed's, is at most `late` of the admitted
        row([(G + i, 1.0 / seed[i]) for i in range(n)] + [(X + i, -late) for i in range(n)], 0.0)
    for k in range(n):  # arrivals i..k are all due by a_k + ttft_s
        for i in range(k + 1):
            row([(W + k, 1.0)] + ([(W + i - 1, -1.0)] if i else []), a[k] + ttft_s - a[i])
    a_ub = coo_matrix((ub[2], (ub[0], ub[1])), shape=(len(rhs), 4 * n)).tocsr()
    a_eq = coo_matrix((eq[2], (eq[0], eq[1])), shape=(n, 4 * n)).tocsr()
    objective = np.zeros(4 * n)
    objective[X:X + n] = -1.0
    low = np.zeros(4 * n)
    high = np.concatenate([np.ones(2 * n), np.full(n, np.inf if late else 0.0), np.full(n, np.inf)])
    relaxed = linprog(objective, A_ub=a_ub, b_ub=rhs, A_eq=a_eq, b_eq=np.zeros(n), bounds=list(zip(low, high)),
                      method="highs")
    if relaxed.status != 0:
        raise RuntimeError(f"the linear program did not solve: {relaxed.message}")
    found = None
    if integer_s:
        whole = milp(objective, constraints=[LinearConstraint(a_ub, -np.inf, rhs), LinearConstraint(a_eq, 0, 0)],
                     integrality=np.concatenate([np.ones(2 * n), np.zeros(2 * n)]), bounds=Bounds(low, high),
                     options={"time_limit": integer_s, "mip_rel_gap": 0.005})
        found = None if whole.x is None else -whole.fun
    return -relaxed.fun, found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trial", type=Path)
    parser.add_argument("--ttft-s", type=float, default=2.0)
    parser.add_argument("--late", type=float, default=0.01, help="share of the admitted that may miss it")
    parser.add_argument("--integer", type=float, default=None, metavar="S", help="seek whole schedules for S s")
    parser.add_argument("--sim-params", type=Path, default=DEFAULT_PARAMS)
    args = parser.parse_args(argv)
    if args.ttft_s <= 0 or not 0 <= args.late < 1:
        print("admission_bound.py: --ttft-s must be > 0 and --late in [0, 1)", file=sys.stderr)
        return 2
    try:
        import scipy  # noqa: F401
    except ImportError:
        print("admission_bound.py: needs scipy (its HiGHS solver): pip install 'parity[bound]'", file=sys.stderr)
        return 2
    try:
        doc = json.loads(args.trial.read_text())
        reqs, s = requests(doc), summarize(doc)
        if s is None or not s["saturated"]:
            raise ValueError("not saturated (its achieved rate says nothing of the engine's throughput)")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"admission_bound.py: {args.trial}: not a saturated sustained trial ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    seed, hit = costs(reqs, SimParams.load(args.sim_params))
    achieved, n = s["achieved_per_s"], len(reqs)
    scale = n / achieved / work_all(reqs, seed, hit)  # every cost times this: serving all runs at the achieved rate
    seed, hit = seed * scale, hit * scale
    span = reqs[-1]["arrival_s"] - reqs[0]["arrival_s"]
    capacity = (span + args.ttft_s) * achieved
    print(f"{doc['trial_id']}: {n} requests over {span:.1f} s, achieved {achieved:.2f}/s (saturated); the step "
          f"model's costs x {scale:.2f} (seed {np.median(seed):.3f} s, hit {np.median(hit) * 1e3:.1f} ms, medians); "
          f"capacity {capacity:.0f} requests")
    for late in sorted({0.0, args.late}):
        most, found = bound(reqs, seed, hit, args.ttft_s, late, args.integer)
        line = (f"  first token <= {args.ttft_s:g} s, " + (f"{late:.0%} of the admitted late:" if late else "all:")
                + f" bound {most:.1f} ({most / capacity:.3f} of capacity)")
        if found is not None:
            line += f", found {found:.0f} ({found / capacity:.3f})"
        if not late:
            line += "; online " + ", ".join(
                f"{what} {k} ({k / capacity:.3f})" for what, k in (
                    ("", online(reqs, seed, hit, args.ttft_s)),
                    ("0.5 s early", online(reqs, seed, hit, args.ttft_s, margin_s=0.5)),
                    ("second request seeds", online(reqs, seed, hit, args.ttft_s, young=2)),
                    ("judged again when asked 4 times", online(reqs, seed, hit, args.ttft_s, demand=4)),
                    ("6 times", online(reqs, seed, hit, args.ttft_s, demand=6)))).lstrip()
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
