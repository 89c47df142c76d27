"""Startup cost: from process start to the first served request, each path, repeated.

Standalone: the clock starts before the replica set is spawned (`vllm serve` or a simulator server)
and stops when the first request's answer is back. Flame: the cluster is started once (its own time,
`cluster_s`), then each run opens a fresh session, whose worker starts and builds its engine on its
first task, and stops at that task's answer. Run 1 is `cold` (the first start in this process: the
engine's compile caches and the weights' page cache as the host left them), later runs `warm`; no
cache is dropped on purpose. One prompt, one GPU, the study's engine settings.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity.routing import RouterSettings
from parity.schedule import Schedule
from parity.stats import range_text

PROMPT = np.arange(1000, 1512, dtype=np.uint32)  # 512 tokens: a first request, not a workload


def _first_answer(path, trial_id: str) -> float:
    router = RouterSettings()
    with path.trial(trial_id, router):
        burst = path.release([PROMPT], [f"{trial_id}-r0"], router.make(path.shards), Schedule())
    return burst.completions[0].complete_s


def standalone(kind: str, gpu: str, args, out: Path, repeats: int, sim_params: Path | None = None, log=print) -> list[dict]:
    from parity.paths.standalone import StandalonePath

    runs = []
    for k in range(repeats):
        start = time.monotonic()
        with StandalonePath(kind, [gpu], args, out / f"standalone-{k}", sim_params=sim_params,
                            receipt_path=out / f"cleanup-standalone-{k}.json") as path:
            healthy = time.monotonic()
            answered = _first_answer(path, f"startup-standalone-{k}")
        runs.append({"run": k + 1, "cold": k == 0, "start_to_healthy_s": healthy - start,
                     "start_to_first_answer_s": answered - start})
        log(f"  standalone run {k + 1}: healthy after {healthy - start:.1f} s, first answer after {answered - start:.1f} s")
    return runs


def flame(cluster_kind: str, gpu: str, settings, engine: str, args, out: Path, repeats: int, *, simulated: bool,
          bin_dir=None, sim_params: str | None = None, log=print) -> dict:
    from parity.paths.flame import FlamePath, cluster

    start = time.monotonic()
    with cluster(cluster_kind, [gpu], out, simulated=simulated, bin_dir=bin_dir,
                 receipt_path=out / "cleanup-flame.json", log=log) as running:
        cluster_s = time.monotonic() - start
        path = FlamePath(running, [gpu], settings, engine=engine, engine_args=args, sim_params=sim_params)
        runs = []
        for k in range(repeats):
            opened = time.monotonic()
            answered = _first_answer(path, f"startup-flame-{k}")
            runs.append({"run": k + 1, "cold": k == 0, "session_to_first_answer_s": answered - opened})
            log(f"  Flame run {k + 1}: first answer {answered - opened:.1f} s after its session opened")
    return {"cluster_s": cluster_s, "runs": runs}


def run(engine: str, cluster_kind: str, gpu: str, final, args, out: Path, repeats: int, *, bin_dir=None,
        sim_params: Path | None = None, log=print) -> dict:
    """Both paths, standalone first, then Flame in its final configuration `final`; the result is written to
    OUT/startup.json and returned."""
    import json

    from parity.manifest import atomic_write_text

    simulated = engine == "sim"
    out.mkdir(parents=True, exist_ok=True)
    log(f"standalone ({'simulator server' if simulated else 'vllm serve'}), {repeats} runs")
    alone = standalone("sim" if simulated else "vllm", gpu, args, out, repeats, sim_params=sim_params, log=log)
    log(f"Flame ({cluster_kind}, final configuration {final.label()}), {repeats} runs")
    flamed = flame(cluster_kind, gpu, final, engine, args, out, repeats, simulated=simulated, bin_dir=bin_dir,
                   sim_params=str(sim_params) if sim_params else None, log=log)
    result = {"simulated": simulated, "engine": engine, "cluster": cluster_kind, "gpu": gpu, "repeats": repeats,
              "standalone": {"runs": alone, "start_to_first_answer": summary(
                  [r["start_to_first_answer_s"] for r in alone])},
              "flame": flamed | {"session_to_first_answer": summary(
                  [r["session_to_first_answer_s"] for r in flamed["runs"]])}}
    result["flame_over_standalone"] = ratios(result)
    atomic_write_text(out / "startup.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def ratios(result: dict) -> dict:
    """Flame over standalone, measured side by side in one run: cold, the cluster's start and the first session's
    first answer against the first process start's; warm, a later session's against a later process start's
    (medians; None with no warm run)."""
    a, f = result["standalone"]["start_to_first_answer"], result["flame"]["session_to_first_answer"]
    warm = None if a["warm_median_s"] is None else f["warm_median_s"] / a["warm_median_s"]
    return {"cold": (result["flame"]["cluster_s"] + f["cold_s"]) / a["cold_s"], "warm": warm}


def summary_line(result: dict) -> str:
    """The result in one line, labelled simulated or measured, with Flame / standalone, the runs and the warm runs'
    range; a start with no warm run says so (not 0.0 s)."""
    a, f = result["standalone"]["start_to_first_answer"], result["flame"]["session_to_first_answer"]
    label = "simulated" if result["simulated"] else "measured"

    def warm(s: dict) -> str:
        runs = s["runs_s"][1:]
        return "no warm run" if s["warm_median_s"] is None else \
            f"{s['warm_median_s']:.1f} s warm (median of {len(runs)}, {range_text(runs, 1)} s)"

    r = ratios(result)
    warm_ratio = "" if r["warm"] is None else f", warm {r['warm']:.2f}x (a session against a process start)"
    return (f"standalone: process start to first answer {a['cold_s']:.1f} s cold, {warm(a)}; Flame: cluster "
            f"{result['flame']['cluster_s']:.1f} s once, then session to first answer {f['cold_s']:.1f} s cold, "
            f"{warm(f)}; Flame / standalone: cold {r['cold']:.2f}x (cluster and first session against the first "
            f"process start){warm_ratio}; {result['repeats']} runs each ({label})")


def summary(values: list[float]) -> dict:
    return {"cold_s": values[0], "warm_median_s": float(np.median(values[1:])) if len(values) > 1 else None,
            "runs_s": values}
