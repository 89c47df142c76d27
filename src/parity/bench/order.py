"""Admission order on the engine alone: each shard of a burst in arrival order and in prefix order.

The shards are the sticky router's, as both serving paths split the burst. Each shard is written as a
trace of its own twice (arrival order, prefix order; parity.flame.admission), and one engine runs
them interleaved, arrival then prefix, `repeats` times, each run warmed up on its shifted variants
and checked like any offline trial. The ratio per shard is the median arrival time over the median
prefix time: above 1 means prefix order finished the shard sooner on this engine. The simulator
also counts its scheduler steps per run (the measured burst and its warmups; with no warmup rounds,
the burst alone), which shows where the time went.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from parity import trial
from parity.routing import shard_positions
from parity.engine import Engine
from parity.errors import ParityError
from parity.flame.admission import admission_order
from parity.paths.engine import EnginePath
from parity.stats import cached_share
from parity.trace import Trace, load_trace, write_subset


def shard_traces(trace_path: Path, trace: Trace, shards: int, out_dir: Path,
                 only: set[int] | None = None) -> dict[int, dict[str, Path]]:
    """Per shard, its trace in each admission order (burst positions reordered, prompts unchanged)."""
    out = {}
    for shard, positions in enumerate(shard_positions(trace.prompts, shards)):
        if not positions or (only and shard not in only):
            continue
        order = admission_order([trace.prompts[i] for i in positions], "prefix")
        out[shard] = {name: write_subset(trace_path, ordered, f"{trace.name}-shard{shard}-{name}", out_dir)
                      for name, ordered in (("arrival", positions), ("prefix", [positions[i] for i in order]))}
    return out


def check(trace_paths, warmup_rounds: int, args) -> None:
    """What `run` would refuse only after writing, refused before anything is: two traces of one name (the second's
    shard files would be written over the first's, its trials too), a trace without as many warm-up variants as
    rounds, and one the engine (its EngineArgs `args`) cannot serve."""
    seen: dict[str, Path] = {}
    for path in trace_paths:
        name = trial.fits_engine(path, args).name
        if name in seen:
            raise ParityError(f"--trace {path}: named {name!r}, as --trace {seen[name]} is; their shards' files would "
                              f"be one another's (give traces of different names)")
        seen[name] = path
        trial.check_warmups(path, warmup_rounds)


def clear(out_dir: Path, names: list[str], log=print) -> None:
    """Remove an earlier run's files from `out_dir` (its order.json, and the shard traces and trials of the traces
    named `names`): an earlier run's trials of other shards or repeats, kept beside new shard traces of the same
    names, no longer matched the traces they link (outside pass Q's rerun failed validate). Only names `run`
    writes, `NAME-shardK-arrival...` and `-prefix...` (another command's `-shard` files are not its: pass R)."""
    ours = re.compile(rf"^({'|'.join(map(re.escape, names))})-shard\d+-(arrival|prefix)(\.|-r\d+\.json$)")
    earlier = [out_dir / "order.json", *(p for folder in ("traces", "trials") for p in (out_dir / folder).glob("*")
                                        if ours.match(p.name))]
    earlier = [p for p in earlier if p.is_file() and not p.is_symlink()]
    if earlier:
        log(f"bench order: removing an earlier run's {len(earlier)} file(s) from {out_dir}")
    for path in earlier:
        path.unlink()


def run(engine: Engine, trace_path: Path, out_dir: Path, *, shards: int = 2, only: set[int] | None = None,
        repeats: int = 2, warmup_rounds: int = 2, log=print) -> dict:
    """Each shard (those in `only`, default all) in both orders, interleaved, `repeats` times; a shard the router
    sends no request is listed under `empty`."""
    trace = load_trace(trace_path)
    rows = []
    traces = shard_traces(trace_path, trace, shards, out_dir / "traces", only)
    empty = sorted(s for s in (only or range(shards)) if s not in traces)
    for shard, paths in traces.items():
        seconds: dict[str, list[float]] = {"arrival": [], "prefix": []}
        steps: dict[str, list[int]] = {"arrival": [], "prefix": []}
        for repeat in range(repeats):
            for name, path in paths.items():
                before = engine.stats()["steps"] if engine.simulated else 0
                doc = trial.run(EnginePath(engine), path, out_dir / "trials", trial_id=f"{path.stem}-r{repeat}",
                                experiment="order", warmup_rounds=warmup_rounds, log=log)
                seconds[name].append(doc["timing"]["duration_s"])
                counted = ""
                if engine.simulated:
                    steps[name].append(engine.stats()["steps"] - before)
                    counted = f", {steps[name][-1]} engine steps"
                log(f"shard {shard} {name} r{repeat}: {seconds[name][-1]:.3f} s{counted}, "
                    f"cached {cached_share(doc):.2%} ({'simulated' if doc['simulated'] else 'measured'})")
        arrival, prefix = statistics.median(seconds["arrival"]), statistics.median(seconds["prefix"])
        rows.append({"shard": shard, "requests": len(doc["records"]), "seconds": seconds,
                     "steps": steps if engine.simulated else None,
                     "arrival_median_s": arrival, "prefix_median_s": prefix, "speedup": arrival / prefix})
    return {"trace": trace.name, "engine": engine.describe()["name"],
            "simulated": engine.simulated, "repeats": repeats, "shards": rows, "empty": empty}
