"""The load generator's own cost: how late it sends, measured with nothing behind it.

Each sender paces a seeded schedule at `rate` requests/s the way its path does (the standalone
client on its event loop, `parity.schedule.wait_until_async`, with every request left in flight as
a task, as an HTTP request would be; the Flame path on a thread, `wait_until`), and records actual
minus scheduled send. The issue's target: p99 at most 1 ms at ten times the ladder's highest rate.
Also the schedule's own statistics: the rate and the gaps' coefficient of variation it produced
beside what its settings ask for (Poisson's CV is 1; gamma's 1/sqrt(burstiness)).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from parity.schedule import Schedule, lag, wait_until, wait_until_async

TARGET_S = 1e-3


def statistics(schedule: Schedule, count: int) -> dict:
    """The rate and gap CV the schedule's offsets give, beside those its settings ask for."""
    gaps = np.diff(schedule.offsets(count))
    expected_cv = 1.0 if schedule.kind == "poisson" else 1 / np.sqrt(schedule.burstiness)
    return {"rate_per_s": float(1 / gaps.mean()), "expected_rate_per_s": schedule.rate,
            "gap_cv": float(gaps.std() / gaps.mean()), "expected_gap_cv": float(expected_cv)}


def _async_sends(offsets: list[float], in_flight_s: float) -> list[float]:
    async def go() -> list[float]:
        release, sent, tasks = time.monotonic(), [], []
        for offset in offsets:
            await wait_until_async(release + offset)
            sent.append(time.monotonic() - release)
            tasks.append(asyncio.ensure_future(asyncio.sleep(in_flight_s)))  # the request, left in flight
        await asyncio.gather(*tasks)
        return sent

    return asyncio.run(go())


def _thread_sends(offsets: list[float]) -> list[float]:
    release, sent = time.monotonic(), []
    for offset in offsets:
        wait_until(release + offset)
        sent.append(time.monotonic() - release)
    return sent


def run(rate: float, requests: int = 2000, kind: str = "poisson", burstiness: float = 1.0, seed: int = 0,
        in_flight_s: float = 0.5, log=print) -> dict:
    """Both senders on the same schedule, one after the other; the lag of each against the target (`log`: each
    sender as it starts, with how long it takes)."""
    schedule = Schedule(kind=kind, rate=rate, burstiness=burstiness, seed=seed)
    offsets = schedule.offsets(requests)
    out = {"rate_per_s": rate, "requests": requests, "schedule": schedule.describe(requests),
           "statistics": statistics(schedule, requests), "target_p99_s": TARGET_S}
    senders = (("event loop (standalone client)", lambda: _async_sends(offsets, in_flight_s)),
               ("thread (Flame path)", lambda: _thread_sends(offsets)))
    for name, send in senders:
        log(f"{name}: {requests} sends over {offsets[-1]:.1f} s")
        result = lag(offsets, send())
        out.setdefault("senders", {})[name] = result | {"meets_target": result["p99_s"] <= TARGET_S,
                                                        "p99_vs_target": result["p99_s"] / TARGET_S}
    return out


def summary_lines(result: dict) -> list[str]:
    """The result, readable: the schedule as generated, then each sender's lag against the target."""
    st = result["statistics"]
    lines = [f"{result['schedule']['kind']} at {result['rate_per_s']:g} requests/s, {result['requests']} requests: "
             f"generated {st['rate_per_s']:.1f}/s (asked {st['expected_rate_per_s']:g}), gap CV {st['gap_cv']:.3f} "
             f"(asked {st['expected_gap_cv']:.3f}); offsets SHA-256 {result['schedule']['offsets_sha256'][:16]}..."]
    for name, r in result["senders"].items():
        lines.append(f"  {name:<32} lag p50 {r['p50_s'] * 1e6:8.1f} us, p99 {r['p99_s'] * 1e6:8.1f} us, "
                     f"max {r['max_s'] * 1e6:8.1f} us: p99 / 1 ms target {r['p99_vs_target']:.2f} "
                     f"({'meets' if r['meets_target'] else 'MISSES'})")
    return lines
