"""The harvest mode's costs on Flame's own task path (ours; parity.flame.harvest), on the CPU.

Real Flame v0.6.0 binaries (or, said so, the stand-in) and the paced simulator in the worker, one GPU
name (`sim-0`), one sticky session at a time, in three phases:

1. **Empty-task round trip**: the client sends a task carrying no prompt to a session with nothing open
   (the service returns at once, whatever its hold) and holds its result: `round_trips` sequential
   tasks after `warmup` untimed ones. The floor under every harvest cycle.
2. **Harvest cycle** at each hold in `holds_ms`, a fresh session each: a light Poisson stream (`rate`,
   `requests`, `repeats` seeds) through the Harvester, after a short untimed paced pass. Tasks/s over
   the window (first arrival to last answer), and while busy (1 / mean round trip); per prompt its
   admission wait (its `submit` to the service starting the task, and to its being in the engine); per
   token, engine to client (the worker's engine produced it, the client held the task carrying it); per
   process (the client, the worker, Flame's two services), its CPU per task and share of a core.
3. **Session-manager memory**: `tasks` harvest tasks on one fresh session at hold 0 (a task per round
   trip while one request at a time runs, closed loop; nearly every task carries no prompt and no event),
   VmRSS of the flame-session-manager (and executor manager) process about every `tasks / samples` tasks,
   and its growth per task (a least-squares slope). Flame v0.6.0 keeps every task of a session, input and
   output, in memory with `storage: none` until the session is deleted, and has no RPC that drops one while
   it lives. With `rotate_tasks` the phase runs again with the harvester moving to a fresh session every
   that many tasks (FlameSettings `rotate_tasks`, ours, off by default): before and after.

With `express`, phase 2 runs each hold twice, side by side on fresh sessions: as the harvest arm ran (one task
outstanding), then with FlameSettings `express` (what arrives while a task is out goes at once in a second task
queued behind it), and prints the second's admission wait, event-to-client time and task rate against the first's.

Clock: CLOCK_MONOTONIC (Python's time.monotonic) on both sides. Flame runs its executor on this host
(one loopback node), and CLOCK_MONOTONIC is one clock for every process of a host since its boot, so the
worker's stamps and the client's subtract directly; it does not step with NTP as time.time() can. The
Harvester computes the cross-process waits only for a worker reporting this host's name.

On the CPU nothing compiles: the simulator's steps are modelled times slept in wall time (labelled
simulated); Flame's task path (gRPC, the session manager, the executor manager, flamepy, the service's
decode and encode) is real and is what is measured.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np

from parity import procs
from parity.flame import codec
from parity.schedule import Schedule, wait_until

GPU = "sim-0"
HOLDS_MS = (0.0, 1.0, 5.0, 20.0)
VOCAB = 128_256  # the simulator's (Llama 3's) vocabulary
CLOCK = ("CLOCK_MONOTONIC (time.monotonic) in the client and in the worker: one host, one clock since boot, "
         "not stepped by NTP")
EMPTY = codec.encode([], compress=False)
MAX_TOKENS = 512  # the worker engine's default output length; every request here gives its own


def spread(values) -> dict | None:
    """n, p50/p90/p99, min, max and mean of `values`; None when there are none."""
    data = np.asarray(list(values), dtype=float)
    if not data.size:
        return None
    return {"n": int(data.size), **{f"p{q}": float(np.percentile(data, q)) for q in (50, 90, 99)},
            "min": float(data.min()), "max": float(data.max()), "mean": float(data.mean())}


def _session(running, name: str, sim_params: str | None, **flame):
    """One sticky harvest session on `GPU` (a FlameSessions, to enter) with these Flame settings."""
    from parity.flame.client import FlameSessions
    from parity.flame.settings import FlameSettings, session_data

    settings = FlameSettings(api="async", mode="harvest", **flame)
    data = session_data(settings, "sim", {"max_tokens": MAX_TOKENS}, sim_params)
    return FlameSessions(running, 1, settings, data, placement="sticky", name=name, output_tokens=MAX_TOKENS)


def _result(future, timeout_s: float, watch=None):
    """`future`'s result, looking every second at what `watch` checks (the cluster's processes: with its executor
    manager dead a task stays pending, and the bench waited minutes in silence; an outsider's, 2026-12-07)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=1.0)
        except TimeoutError:
            if watch is not None:
                watch()
            if time.monotonic() > deadline:
                raise


def _round_trip(session, watch=None) -> float:
    start = time.monotonic()
    codec.decode_output(_result(session.run(EMPTY), 120, watch))
    return time.monotonic() - start


def round_trips(session, count: int, warmup: int, watch=None) -> dict:
    """Sequential empty tasks: `warmup` untimed, then `count` timed (seconds, client send to result held)."""
    for _ in range(warmup):
        _round_trip(session, watch)
    return {"warmup": warmup, "round_trip_s": spread(_round_trip(session, watch) for _ in range(count))}


def _prompts(count: int, seed: int, tokens: int = 256) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, tokens, dtype=np.uint32) for _ in range(count)]


def _stream(harvester, tag: str, rate: float, requests: int, seed: int, output_tokens: int, watch=None) -> tuple:
    """Send `requests` prompts on a seeded Poisson schedule; (results, release, last answer)."""
    offsets = Schedule(kind="poisson", rate=rate, seed=seed).offsets(requests)
    prompts = _prompts(requests, seed)
    release, futures = time.monotonic(), []
    for index, offset in enumerate(offsets):
        wait_until(release + offset)
        futures.append(harvester.submit(f"{tag}-r{index}", prompts[index], max_tokens=output_tokens))
    results = [_result(f, 120, watch) for f in futures]
    return results, release, max(r.complete_s for r in results)


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: procs.cpu_s(pid) for name, pid in pids.items()}


def cpu_per_task(runs: list[dict]) -> dict[str, dict]:
    """Per process, over the runs: CPU milliseconds per task and the share of a core over the windows (a process
    gone during a run, or not on this host, is left out)."""
    tasks, window = sum(r["tasks"] for r in runs), sum(r["window_s"] for r in runs)
    if not tasks or not window:
        return {}
    used = {name: [r["cpu_s"].get(name) for r in runs] for name in runs[0]["cpu_s"]}
    return {name: {"ms_per_task": 1e3 * sum(each) / tasks, "cores": sum(each) / window}
            for name, each in used.items() if None not in each}


def cycle(harvester, hold_ms: float, *, rate: float, requests: int, repeats: int, output_tokens: int,
          warmup_requests: int, pids: dict[str, int] | None = None, watch=None) -> dict:
    """The harvest cycle under a light stream, `repeats` seeded runs after an untimed paced pass; with `pids`
    (name -> process), each one's CPU over each run, and the worker's too (named by the pass's answers): what the
    path's own processes spend per task, beside an engine that needs its CPU (issue 28's 512-token gap)."""
    warm, _, _ = _stream(harvester, f"h{hold_ms:g}-warm", rate, warmup_requests, 1000, output_tokens, watch)
    pids = dict(pids or {})
    worker = warm[0].worker if warm else {}
    if pids and worker.get("pid") and worker.get("host") == socket.gethostname():
        pids["worker (service and simulated engine)"] = int(worker["pid"])
    runs, tasks, results = [], [], []
    for seed in range(repeats):
        before, cpu = len(harvester.tasks), _cpu(pids)
        answered, release, last = _stream(harvester, f"h{hold_ms:g}-s{seed}", rate, requests, seed, output_tokens,
                                          watch)
        used = {name: (after - cpu[name] if after is not None and cpu[name] is not None else None)
                for name, after in _cpu(pids).items()}
        done = harvester.tasks[before:]
        busy = sum(t["round_trip_s"] for t in done)
        runs.append({"seed": seed, "tasks": len(done), "window_s": last - release,
                     "tasks_per_s": len(done) / (last - release), "busy_tasks_per_s": len(done) / busy,
                     "empty_tasks": sum(1 for t in done if not t.get("prompts")), "cpu_s": used})
        tasks += done
        results += answered
    return {"hold_ms": hold_ms, "rate_per_s": rate, "requests": requests, "repeats": repeats,
            "warmup_requests": warmup_requests, "output_tokens": output_tokens, "runs": runs,
            "cpu": cpu_per_task(runs),
            "tasks_per_s": spread(r["tasks_per_s"] for r in runs),
            "busy_tasks_per_s": spread(r["busy_tasks_per_s"] for r in runs),
            "round_trip_s": spread(t["round_trip_s"] for t in tasks),
            "service_wait_s": spread(t["wait_s"] for t in tasks),
            "arrival_to_seen_s": spread(w for t in tasks for w in t.get("arrival_to_seen_s", [])),
            "arrival_to_admitted_s": spread(w for t in tasks for w in t.get("arrival_to_admitted_s", [])),
            "event_to_client_s": spread(w for t in tasks for w in t.get("event_to_client_s", [])),
            "ttft_client_s": spread(r.token_s[0] - r.submit_s for r in results),
            "e2e_s": spread(r.complete_s - r.submit_s for r in results)}


STANDIN = "stand-in (this process, with the client)"
CLIENT = "client (this process)"


def _manager_pids(running) -> dict[str, int]:
    """The processes whose memory phase 3 follows: Flame's two services, or this process for the stand-in
    (which serves in it, beside the client)."""
    from parity.flame.cluster import BINARIES, FlameCluster

    if isinstance(running, FlameCluster):
        return {binary: running.pid(binary) for binary in BINARIES}
    return {STANDIN: os.getpid()}


def _path_pids(running) -> dict[str, int]:
    """The processes whose CPU phase 2 follows, beside the worker: the client (this process) and Flame's two
    services; for the stand-in, this process alone (it serves and is the client)."""
    from parity.flame.cluster import FlameCluster

    return {CLIENT: os.getpid(), **_manager_pids(running)} if isinstance(running, FlameCluster) else \
        _manager_pids(running)


MIN_FIT = 3  # samples a growth line is fitted to at least: two only join their ends (outside pass Q's --tasks 200,
# where each request's hundred-odd tasks passed several sampling points at once)


def memory(harvester, pids: dict[str, int], tasks: int, samples: int, output_tokens: int = 64, log=print,
           watch=None) -> dict:
    """Harvest tasks through `harvester` (hold 0: a task per round trip, nearly all carrying no prompt and no
    event) while one `output_tokens`-token request at a time runs, closed loop, until `tasks` tasks; the RSS of
    `pids` about every `tasks / samples` tasks (checked between requests). One untimed request first."""
    rng = np.random.default_rng(7)

    def prompt() -> np.ndarray:
        return rng.integers(1, VOCAB, 64, dtype=np.uint32)

    _result(harvester.submit("mem-warm", prompt(), max_tokens=output_tokens), 120, watch)
    base, every = len(harvester.tasks), max(1, tasks // samples)
    points, start, requests = [], time.monotonic(), 0

    def sample(done: int) -> None:
        points.append({"tasks": done, "elapsed_s": time.monotonic() - start, "rotations": harvester.rotations,
                       "rss_kib": {name: procs.rss_kib(pid) for name, pid in pids.items()}})
        if len(points) % 10 == 1 or done >= tasks:
            rss = ", ".join(f"{name} {kib / 1024:.1f} MiB" for name, kib in points[-1]["rss_kib"].items() if kib)
            log(f"  {done} tasks, {points[-1]['elapsed_s']:.0f} s, {harvester.rotations} rotations: {rss}")

    sample(0)
    while (done := len(harvester.tasks) - base) < tasks:
        _result(harvester.submit(f"mem-r{requests}", prompt(), max_tokens=output_tokens), 300, watch)
        requests += 1
        done = len(harvester.tasks) - base
        if done >= (points[-1]["tasks"] // every + 1) * every or done >= tasks:
            sample(done)
    x = np.array([p["tasks"] for p in points], dtype=float)
    growth = {}
    for name in pids:
        y = np.array([(p["rss_kib"][name] or 0) * 1024 for p in points], dtype=float)
        growth[name] = {"start_mib": y[0] / 2**20, "end_mib": y[-1] / 2**20, "max_mib": y.max() / 2**20,
                        "bytes_per_task": float(np.polyfit(x, y, 1)[0]) if len(x) >= MIN_FIT else None}
    rates = [(b["tasks"] - a["tasks"]) / (b["elapsed_s"] - a["elapsed_s"]) for a, b in zip(points, points[1:])]
    return {"tasks": points[-1]["tasks"], "requests": requests, "output_tokens": output_tokens, "every": every,
            "rotate_tasks": harvester.rotate_tasks, "rotations": harvester.rotations, "points": points,
            "growth": growth, "tasks_per_s": spread(rates),
            "round_trip_s": spread(t["round_trip_s"] for t in harvester.tasks[base:])}


def _delete(running, session_id: str) -> None:
    import flamepy

    from parity.flame.client import delete_session

    connection = flamepy.connect(running.endpoint)
    try:
        delete_session(connection, session_id)
    finally:
        connection.close()


def run(kind: str, out_dir: Path, *, bin_dir=None, tasks: int = 100_000, holds_ms=HOLDS_MS, round_trip_count: int = 500,
        warmup: int = 50, rate: float = 4.0, requests: int = 40, repeats: int = 2, warmup_requests: int = 4,
        output_tokens: int = 16, samples: int = 50, rotate_tasks: int = 0, sim_params: str | None = None, save=None,
        express: bool = False, log=print) -> dict:
    """All three phases on one cluster (`kind`: flame or standin); `save(result)` after each phase, `complete`
    false until the last (a run that stopped midway leaves what it measured, said to be partial). With
    `rotate_tasks`, phase 3 runs again with the harvester rotating sessions every that many tasks (after)."""
    from parity.paths.flame import cluster

    save = save or (lambda result: None)
    result = {"complete": False, "simulated_engine": True, "cluster_kind": kind, "clock": CLOCK, "gpu": GPU,
              "compiled_in_timed_window": "nothing: a CPU run (the simulator compiles nothing)"}
    with cluster(kind, [GPU], out_dir, simulated=True, bin_dir=bin_dir, receipt_path=out_dir / "cleanup-flame.json",
                 log=log) as running:
        result["cluster"] = running.describe()
        for index, hold_ms in enumerate(holds_ms):
            for sent_behind in (False, True) if express else (False,):
                name = f"hv-h{index}" + ("-express" if sent_behind else "")
                with _session(running, name, sim_params, hold_ms=hold_ms, express=sent_behind) as sessions:
                    if "round_trip" not in result:
                        log(f"empty-task round trip: {warmup} untimed, {round_trip_count} timed")
                        result["round_trip"] = round_trips(sessions.sessions[0], round_trip_count, warmup,
                                                           sessions.check_failures)
                        save(result)
                    log(f"harvest cycle, hold {hold_ms:g} ms{', express' if sent_behind else ''}: {repeats} x "
                        f"{requests} requests at {rate:g}/s")
                    result.setdefault("cycles", []).append(cycle(
                        sessions.batchers[0], hold_ms, rate=rate, requests=requests, repeats=repeats,
                        output_tokens=output_tokens, warmup_requests=warmup_requests, pids=_path_pids(running),
                        watch=sessions.check_failures)
                        | {"express": sent_behind})
                    save(result)
        for key, rotate in (("memory", 0), ("memory_rotating", rotate_tasks)):
            if key == "memory_rotating" and not rotate:
                continue
            log(f"session-manager memory over {tasks} harvest tasks (hold 0 ms), "
                + (f"rotating sessions every {rotate} tasks" if rotate else "on one session"))
            pids = _manager_pids(running)
            with _session(running, f"hv-{key.replace('_', '-')}", sim_params, hold_ms=0.0,
                          rotate_tasks=rotate) as sessions:
                result[key] = memory(sessions.batchers[0], pids, tasks, samples, log=log,
                                     watch=sessions.check_failures)
                result[key]["rotation_s"] = spread(sessions.batchers[0].rotation_s)
            _delete(running, sessions.sessions[0].id)  # so the next phase starts from no tasks
            time.sleep(1.0)
            result[key]["rss_kib_after_delete"] = {name: procs.rss_kib(pid) for name, pid in pids.items()}
            save(result)
    result["cleanup_clean"] = running.receipt["clean"] if running.receipt else None
    result["complete"] = True
    save(result)
    return result


def _ms(s: dict | None, key: str) -> str:
    return "-" if s is None else f"{s[key] * 1e3:.2f}"


def _row(name: str, s: dict | None) -> str:
    if s is None:
        return f"  {name:<34} (none)"
    return (f"  {name:<34} n {s['n']:>6}  p50 {_ms(s, 'p50'):>8}  p90 {_ms(s, 'p90'):>8}  p99 {_ms(s, 'p99'):>8}"
            f"  min {_ms(s, 'min'):>8}  max {_ms(s, 'max'):>8} ms")


def express_line(plain: dict, express: dict) -> str:
    """The express cycle against the plain one at the same hold: p99s and their ratios, and the task rate."""
    parts = []
    for key, name in (("arrival_to_seen_s", "admission wait"), ("event_to_client_s", "event -> client"),
                      ("ttft_client_s", "client TTFT")):
        a, b = plain.get(key), express.get(key)
        if a and b:
            parts.append(f"{name} p99 {a['p99'] * 1e3:.2f} -> {b['p99'] * 1e3:.2f} ms ({b['p99'] / a['p99']:.2f}x)")
    a, b = plain["tasks_per_s"], express["tasks_per_s"]
    parts.append(f"tasks/s over the window p50 {a['p50']:.1f} -> {b['p50']:.1f}")
    return "express / as the arm ran, side by side: " + "; ".join(parts)


def summary_lines(result: dict) -> list[str]:
    """The result, readable: one block per phase."""
    where = ("real Flame v0.6.0" if result["cluster_kind"] == "flame"
             else "the Flame STAND-IN (in-process, not Flame)")
    lines = [f"parity bench harvest on {where}; engine: the paced simulator (simulated); clock: {result['clock']}"]
    if "round_trip" in result:
        rt = result["round_trip"]
        lines += [f"empty-task round trip ({rt['warmup']} warmup tasks untimed):", _row("client send -> result held",
                                                                                       rt["round_trip_s"])]
    plain: dict[float, dict] = {}
    for c in result.get("cycles", []):
        tps, busy = c["tasks_per_s"], c["busy_tasks_per_s"]
        tasks, empty = sum(r["tasks"] for r in c["runs"]), sum(r["empty_tasks"] for r in c["runs"])
        lines += [f"hold {c['hold_ms']:g} ms{', EXPRESS' if c.get('express') else ''}: {c['repeats']} runs x "
                  f"{c['requests']} requests, Poisson "
                  f"{c['rate_per_s']:g}/s, {c['output_tokens']} tokens each ({c['warmup_requests']} warmup requests "
                  f"untimed): {tps['min']:.1f}-{tps['max']:.1f} tasks/s over the window, {busy['min']:.1f}-"
                  f"{busy['max']:.1f} while busy (min-max of runs); {empty} of {tasks} tasks carried no prompt",
                  _row("task round trip", c["round_trip_s"]), _row("service wait (hold)", c["service_wait_s"]),
                  _row("admission: arrival -> service sees", c["arrival_to_seen_s"]),
                  _row("admission: arrival -> in engine", c["arrival_to_admitted_s"]),
                  _row("event -> client (per token)", c["event_to_client_s"]),
                  _row("client TTFT (simulated engine)", c["ttft_client_s"])]
        if c.get("cpu"):
            lines.append("  CPU per task (share of a core over the window): " + "; ".join(
                f"{name} {u['ms_per_task']:.2f} ms ({u['cores']:.0%})" for name, u in c["cpu"].items()))
        if not c.get("express"):
            plain[c["hold_ms"]] = c
        elif c["hold_ms"] in plain:
            lines.append("  " + express_line(plain[c["hold_ms"]], c))
    for key in ("memory", "memory_rotating"):
        if key not in result:
            continue
        m, rate = result[key], result[key]["tasks_per_s"] or {"p50": 0, "min": 0, "max": 0}
        how = f"rotating every {m['rotate_tasks']} tasks ({m['rotations']} rotations)" if m["rotate_tasks"] else \
            "on one session"
        lines.append(f"memory over {m['tasks']} harvest tasks (hold 0 ms, {m['requests']} request(s) of "
                     f"{m['output_tokens']} tokens one at a time, 1 warmup request) {how}, {len(m['points'])} "
                     f"samples, aimed every ~{m['every']} tasks (taken between requests); "
                     f"task rate p50 {rate['p50']:.0f}/s (min {rate['min']:.0f}, max {rate['max']:.0f}) per interval:")
        for name, g in m["growth"].items():
            slope = f"not fitted to {len(m['points'])} samples (give more --tasks)" if g["bytes_per_task"] is None \
                else f"{round(g['bytes_per_task'])} bytes/task (least squares)"  # 0, not -0
            deleted = (m.get("rss_kib_after_delete") or {}).get(name)
            lines.append(f"  {name:<{max(34, *map(len, m['growth']))}} RSS {g['start_mib']:.1f} -> {g['end_mib']:.1f} MiB (max {g['max_mib']:.1f}); "
                         f"growth {slope}"
                         + (f"; {deleted / 1024:.1f} MiB once its last session was deleted" if deleted else ""))
        if m.get("rotation_s"):
            r = m["rotation_s"]
            lines.append(f"  a rotation (close, delete, the old worker gone, a new session): p50 {r['p50']:.2f} s, "
                         f"max {r['max']:.2f} s over {r['n']}; then the fresh worker starts on its first task: task "
                         f"round trip max {m['round_trip_s']['max']:.2f} s (the simulator's; a vLLM engine loads for "
                         f"minutes and its prefix cache starts cold)")
    if result.get("cleanup_clean") is not None:
        lines.append(f"teardown: {'clean' if result['cleanup_clean'] else 'NOT clean (see cleanup-flame.json)'}")
    return lines
