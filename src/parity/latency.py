"""Latency and goodput of one trial from its records, every time on the host's monotonic clock and
measured from each request's scheduled arrival (`arrival_s`), the same for both paths.

- TTFT: first output token minus arrival; E2E: the answer in the client's hands minus arrival;
  inter-token: the gaps between a request's tokens.
- Two views of the first token: `engine` (when the engine produced it: the Flame worker's own
  record, or for standalone vLLM the streamed token's arrival) and `client` (when the client held
  it: streamed on the standalone path; on the Flame path its whole answer, which comes back with its
  batch, so client TTFT is its E2E). `parity.report` prints both and says why they differ.
- The steady-state window: requests arriving in the middle `WINDOW` of the schedule's span (all of a
  burst); rates and goodput are counted there. Achieved rate below 90% of the offered marks the path
  saturated; a schedule the sender fell behind is flagged from `sent_s`.
- Goodput: requests per second of the window that met the objective (`Objective`: TTFT and each
  inter-token gap within bounds); a request that failed counts as a miss (a trial with failed
  requests is failed whole, so in a passed trial every request answered), and so does one bounded
  admission refused (the trial's `refused`: in the window by its arrival, never a completion; latencies
  and the achieved rate are the completions' alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parity.schedule import lag
from parity.settings import Settings

WINDOW = (0.1, 0.9)  # the steady-state window: this share of the schedule's span, by arrival
SATURATED = 0.9  # achieved below this share of the offered rate: requests queue faster than they are served
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Objective(Settings):
    """The latency objective goodput counts against (document QA: a first token within 2 s, then tokens
    no more than 100 ms apart)."""

    what = "latency objective"
    ttft_s: float = 2.0
    itl_s: float = 0.1


def percentiles(values) -> dict | None:
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if not data.size:
        return None
    return {f"p{q}": float(np.percentile(data, q)) for q in PERCENTILES} | {"mean": float(data.mean())}


def _first(record: dict, view: str) -> float | None:
    tokens = record.get("token_s")
    if view == "engine":
        return tokens[0] if tokens else None
    return record["complete_s"] if record.get("batch_id") is not None or not tokens else tokens[0]


def _window(records: list[dict], refused: list[dict]) -> tuple[list[dict], list[dict], float | None]:
    """The completions and refusals that arrived in the steady-state window (every completion where no request did;
    none where only refusals did: completions from outside it were counted as its goodput, an outsider's), and the
    window's length (None for a schedule of one instant)."""
    arrivals = np.asarray([r["arrival_s"] for r in records + refused])
    start, span = arrivals.min(), arrivals.max() - arrivals.min()
    low, high = start + WINDOW[0] * span, start + WINDOW[1] * span
    window = [r for r in records if low <= r["arrival_s"] <= high]
    turned = [r for r in refused if low <= r["arrival_s"] <= high]
    if not window and not turned:
        window = records
    return window, turned, (max(high - low, 1e-9) if span > 0 else None)


def paired_ttft_delta(candidate: dict, reference: dict, view: str = "client") -> dict | None:
    """Per request, the candidate's first token less the reference's (s), over the requests both answered in the
    candidate's steady-state window: two trials of one schedule compared request by request, where a difference of
    their p50s also holds how steeply the distribution rises at its median. None where they share no request."""
    theirs = {r["request_id"]: r for r in reference["records"] if "arrival_s" in r}
    ours = [r for r in candidate["records"] if "arrival_s" in r]
    if not ours:
        return None
    window, _, _ = _window(ours, [r for r in candidate.get("refused", []) if "arrival_s" in r])
    deltas = []
    for r in window:
        other = theirs.get(r["request_id"])
        if other is not None and _first(r, view) is not None and _first(other, view) is not None:
            deltas.append((_first(r, view) - r["arrival_s"]) - (_first(other, view) - other["arrival_s"]))
    return percentiles(deltas)


def summarize(doc: dict, objective: Objective = Objective()) -> dict | None:
    """A trial's latencies, rates and goodput in its steady-state window; None for a trial with no
    scheduled arrivals (a study burst records none)."""
    records = [r for r in doc["records"] if "arrival_s" in r]
    refused = [r for r in doc.get("refused", []) if "arrival_s" in r]
    if not records:
        return None
    window, turned, in_window_s = _window(records, refused)
    out: dict = {"requests": len(records) + len(refused), "window_requests": len(window) + len(turned),
                 "window_s": in_window_s}
    if "refused" in doc:  # bounded admission: what it let in and what it turned away, in the window
        out |= {"admitted": len(window), "refused": len(turned)}
    for view in ("engine", "client"):
        ttft = [None if _first(r, view) is None else _first(r, view) - r["arrival_s"] for r in window]
        out[f"ttft_{view}"] = percentiles(ttft)
    out["e2e"] = percentiles([r["complete_s"] - r["arrival_s"] for r in window])
    gaps = [g for r in window for g in np.diff(r.get("token_s") or []).tolist()]
    out["itl"] = percentiles(gaps)
    offered = (len(window) + len(turned) - 1) / in_window_s if in_window_s else None
    # the window's requests over the time from the first's arrival to the last's answer: its offered rate
    # when the path keeps up (less one request's latency over the span), less when requests queue
    if window:
        served_s = max(r["complete_s"] for r in window) - min(r["arrival_s"] for r in window + turned)
        achieved = len(window) / served_s if served_s > 0 else None
    else:  # every request of the window refused: none completed there
        served_s, achieved = None, 0.0
    out |= {"offered_per_s": offered, "achieved_per_s": achieved,
            "saturated": bool(offered and achieved is not None and achieved < SATURATED * offered)}
    sent = [r for r in records if "sent_s" in r]
    # from when each request was due to leave: a retried or held request's last try (`due_s`), not its arrival, so a
    # Retry-After the client honoured is not counted as the sender falling behind
    out["lag"] = lag([r.get("due_s", r["arrival_s"]) for r in sent], [r["sent_s"] for r in sent]) if sent else None
    for view in ("engine", "client"):
        # the first-token part alone (ttft_s) as well: past saturation every engine step carries a prefill chunk of
        # the study's max_num_batched_tokens (~400 ms on an H200), so no answer on any arm keeps tokens itl_s apart
        # and the whole objective's goodput is 0 everywhere; this part is what admission decides, so it is shown beside
        in_time = [r for r in window if _first_in_time(r, view, objective)]
        met = sum(1 for r in in_time if _gaps_meet(r, view, objective))
        share = met / (len(window) + len(turned))  # a refusal is a miss
        # completions that met it, per second: met / served_s, written as share x achieved where nothing was
        # refused (the two are equal then, and earlier trials' numbers stay what they were to the last bit)
        out[f"goodput_{view}_per_s"] = (met / served_s if turned else share * achieved) if achieved else (
            0.0 if not window else None)
        out[f"good_share_{view}"] = share
        out[f"goodput_ttft_{view}_per_s"] = len(in_time) / served_s if achieved else (0.0 if not window else None)
        out[f"good_ttft_share_{view}"] = len(in_time) / (len(window) + len(turned))
    out["objective"] = objective.to_dict()
    return out


def _first_in_time(record: dict, view: str, objective: Objective) -> bool:
    first = _first(record, view)
    return first is not None and first - record["arrival_s"] <= objective.ttft_s


def _gaps_meet(record: dict, view: str, objective: Objective) -> bool:
    """The objective's second part: no two tokens the client (or engine) sees more than itl_s apart."""
    tokens = record.get("token_s") or []
    if view == "client" and record.get("batch_id") is not None:
        return True  # the whole answer at once: no gap between tokens the client sees
    return all(b - a <= objective.itl_s for a, b in zip(tokens, tokens[1:]))
