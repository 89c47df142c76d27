"""Ours (issue 28): rungs long enough for a steady state. Traces of many blocks, a ladder's rungs on one
engine start per path (each rung cold), warm-ups paced as the rung is, and vLLM's JIT monitor read so a
kernel compiled inside a timed window fails the trial."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import pytest

from parity import jit
from parity.errors import ParityError


@pytest.fixture(scope="module")
def block_trace(small_inputs, tmp_path_factory):
    """3 blocks of 3 documents x 2 questions, 300-token prefixes."""
    from parity.trace import TraceSpec, build_trace

    corpus, tok = small_inputs
    spec = TraceSpec("blocks", documents=3, questions_per_document=2, prefix_tokens=300, seed=1, blocks=3)
    return build_trace(spec, corpus, tok, tmp_path_factory.mktemp("block-traces"))


def test_a_trace_of_blocks_repeats_its_first_block_shape_with_prefixes_of_its_own(block_trace, small_inputs, tmp_path):
    from parity.trace import BLOCK_SHIFT, TraceSpec, build_trace, load_trace

    trace, doc = load_trace(block_trace), json.loads(block_trace.read_text())
    assert doc["spec"]["blocks"] == 3 and doc["spec"]["block_shift"] == BLOCK_SHIFT and len(trace.requests) == 18
    first, third = trace.requests[:6], trace.requests[12:]
    assert [r.id + "-b2" for r in first] == [r.id for r in third]  # the same order, block after block
    assert [r.tokens for r in first] == [r.tokens for r in third] and {r.document for r in third} == {6, 7, 8}
    heads = [bytes(p[:16].tobytes()) for p in trace.prompts]
    assert not set(heads[:6]) & set(heads[6:12]) and not set(heads[6:12]) & set(heads[12:])  # new prefixes
    assert heads[:6].count(heads[0]) == 2  # a document's questions still share its prefix inside a block
    one = build_trace(TraceSpec("blocks", documents=3, questions_per_document=2, prefix_tokens=300, seed=1),
                      *small_inputs, tmp_path)
    assert "blocks" not in json.loads(one.read_text())["spec"]  # one block: the trace as it always was
    assert [r.sha256 for r in load_trace(one).requests] == [r.sha256 for r in first]
    with pytest.raises(ParityError, match="blocks must be >= 1"):
        TraceSpec("x", documents=1, questions_per_document=1, blocks=0).check()


def test_a_shared_start_ladder_runs_each_path_in_blocks_newest_arm_first_repeats_together(tiny_reuse_trace):
    from parity.experiments import plan

    settings = {"rates": {"reuse": [2, 4]}, "repeats": 2, "shared_start": True, "warmup_requests": 4,
                "arms": {"gathered": {"inflight": 1}, "harvest": {"mode": "harvest", "api": "async"}}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    starts = list(dict.fromkeys(c.start for c in cases))
    assert starts == ["sustained-start-harvest-p0-flame", "sustained-start-harvest-p0-vllm",
                      "sustained-start-harvest-p1-vllm", "sustained-start-harvest-p1-flame",
                      "sustained-start-gathered-p0-flame", "sustained-start-gathered-p0-vllm",
                      "sustained-start-gathered-p1-vllm", "sustained-start-gathered-p1-flame",
                      "sustained-start-p0-flame", "sustained-start-p0-vllm",
                      "sustained-start-p1-vllm", "sustained-start-p1-flame"]
    assert [c.stage for c in cases[:2]] == ["rate-2-harvest", "rate-4-harvest"]  # a block is its rungs in order
    assert {c.warmup_requests for c in cases} == {4}
    assert cases[0].load["start"] == "sustained-start-harvest-p0-flame" and cases[0].load["warmup_requests"] == 4
    study = plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [2]})
    assert all(c.start is None and "start" not in c.load and "warmup_requests" not in c.load for c in study)
    with pytest.raises(ParityError, match="rates name trace 'hot'"):
        plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": {"hot": [2]}})


def test_run_first_puts_its_arms_first_whatever_order_the_arms_come_in(tiny_reuse_trace):
    """The workflow hands the arms over with their names sorted, so "the last named first" put express last on the
    GPU (2026-12-06); `run_first` orders what must go first, and names only arms, once each."""
    from parity.experiments import plan

    arms = {"express": {"mode": "harvest", "api": "async", "express": True}, "gathered": {"inflight": 1},
            "harvest": {"mode": "harvest", "api": "async"}}
    settings = {"rates": [2], "shared_start": True, "warmup_requests": 4, "arms": arms}
    order = lambda cases: list(dict.fromkeys(c.arm for c in cases))  # noqa: E731
    assert order(plan.for_experiment("sustained", [tiny_reuse_trace], settings)) == ["harvest", "gathered",
                                                                                      "express", None]
    first = plan.for_experiment("sustained", [tiny_reuse_trace], settings | {"run_first": ["express"]})
    assert order(first) == ["express", "harvest", "gathered", None]
    both = plan.for_experiment("sustained", [tiny_reuse_trace], settings | {"run_first": ["gathered", "express"]})
    assert order(both) == ["gathered", "express", "harvest", None]
    for run_first, says in ((["fast"], "run_first names arm 'fast'"), (["express", "express"], "non-unique elements")):
        with pytest.raises(ParityError, match=says):
            plan.for_experiment("sustained", [tiny_reuse_trace], settings | {"run_first": run_first})


def test_rungs_of_a_shared_start_run_on_one_start_each_cold_after_paced_warmups(tiny_reuse_trace, tmp_path):
    """Both paths, the Flame side in harvest mode: one replica set and one set of Flame sessions for the two rungs,
    each rung's first request of a document uncached (the caches were reset), the warm-ups logged."""
    from pathlib import Path as P

    from parity.experiments import plan
    from parity.backend import Backend
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    params = P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml"
    backend = Backend.from_dict({"engine": "sim", "sim_params": str(params), "warmup_rounds": 2})
    settings = {"rates": [20, 40], "shared_start": True, "warmup_requests": 3, "flame": {"mode": "harvest", "api": "async"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    lines: list[str] = []
    run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lines.append)
    assert sum("started sustained-start-p0-vllm" in line for line in lines) == 1
    assert sum("started sustained-start-p0-flame" in line for line in lines) == 1
    assert sum("decode sweep: groups of 1 to 3 requests" in line for line in lines) == 2  # once per start
    assert sum("warmup 1: 3 requests" in line and "paced" not in line for line in lines) == 4  # all at once
    assert sum("warmup 2: 3 requests" in line and "(paced, poisson" in line for line in lines) == 4  # as measured
    receipts = sorted(p.name for p in (tmp_path / "cleanup").glob("*.json"))
    assert "sustained-start-p0-vllm.json" in receipts and not any("rate-" in r for r in receipts)
    experiment = read_manifest(tmp_path / "experiment.json")
    # each case entry records what it ran: its offered rate, its answer length, its arm (none: the study's)
    assert sorted((c["rate"], c["output_tokens"], c["arm"]) for c in experiment["cases"]) == [
        (20.0, 16, None), (20.0, 16, None), (40.0, 16, None), (40.0, 16, None)]
    assert any("sustained-start-p0-vllm.json" in c["path"] for c in experiment["cleanup"])
    for case in cases:
        doc = read_manifest(tmp_path / "trials" / f"{case.trial_id}.json")
        assert doc["verdict"]["status"] == "passed", (case.trial_id, doc["verdict"]["reasons"])
        assert doc["ran_with"]["load"]["start"] == case.start and "jit" not in doc  # the simulator compiles nothing
        first = case is next(c for c in cases if c.start == case.start)
        assert ("warmup_sweep" in doc) == first and (not first or doc["warmup_sweep"]["groups"] == 3
                                                   and len(doc["warmup_sweep"]["group_s"]) == 3)
        seen, cold = set(), []
        for record in sorted(doc["records"], key=lambda r: r["submit_s"]):
            document = record["request_id"].rsplit("-q", 1)[0]
            if document not in seen:
                cold.append(record["cached_tokens"])
                seen.add(document)
        assert cold[0] == 0, case.trial_id  # the rung starts cold although its engine served the rung before


def test_a_harvest_session_refuses_a_cache_reset_while_requests_run():
    from concurrent.futures import Future

    from parity.flame import codec
    from parity.flame.harvest import Harvest

    class Slow:
        def submit(self, tokens, on_token=None, max_tokens=None):
            return Future()  # never completes

        def reset_prefix_cache(self):
            raise AssertionError("must not be reached")

    harvest = Harvest(Slow(), hold_s=0.0)
    harvest.task([codec.Prompt("r1", __import__("numpy").arange(4, dtype="<u4"))])
    assert harvest.running() == 1
    assert codec.control_of(codec.encode_control("reset_prefix_cache")) == "reset_prefix_cache"
    assert codec.control_of(codec.encode([], compress=False)) is None
    with pytest.raises(ParityError, match="unknown control operation 'format'"):
        codec.control_of(codec.CONTROL_MAGIC + b"format")


def test_vllm_jit_monitor_records_are_routed_to_a_file_and_split_at_the_timed_window(tmp_path):
    """The logging config vLLM loads (VLLM_LOGGING_CONFIG_PATH) in a process of its own: the monitor's records
    land in the file with the wall clock; the trial counts those inside its window."""
    log = tmp_path / "replica-0.jit"
    env = jit.environment(log)
    script = ("import json, logging.config, os, time, sys\n"
              "logging.config.dictConfig(json.load(open(os.environ['VLLM_LOGGING_CONFIG_PATH'])))\n"
              "m = logging.getLogger('vllm.utils.jit_monitor')\n"
              "m.warning('Triton kernel JIT compilation during inference: reduce_segments (constexprs={}). This causes a latency spike; consider extending warmup')\n"
              "print('SPLIT=' + repr(time.time()), flush=True); time.sleep(0.05)\n"
              "m.warning('Triton kernel JIT compilation during inference: kernel_unified_attention (key=1). This causes')\n"
              "logging.getLogger('vllm.engine').info('not a compilation')\n")
    out = subprocess.run([sys.executable, "-c", script], env={**__import__("os").environ, **env}, capture_output=True,
                         text=True, check=True).stdout
    split = float(out.split("SPLIT=", 1)[1].split()[0])
    assert "kernel_unified_attention" in out  # vLLM's own output still goes to stdout
    events = jit.read(log)
    assert len(events) == 2 and all(isinstance(at, float) for at, _ in events)
    got = jit.window([log], 0.0, split + 0.01, time.time())
    assert got == {"monitored": True, "warmup": 1,
                   "measured": ["Triton kernel JIT compilation during inference: kernel_unified_attention"]}
    assert jit.window([tmp_path / "none.jit"], 0, 0, 1) == {"monitored": True, "warmup": 0, "measured": []}
    # a Flame worker's engine also keeps its whole log in a file (its stdout goes with its executor), each line
    # naming the process (the worker's and its engine core's share the file)
    whole = tmp_path / "session-1.vllm.log"
    whole.write_text("an earlier engine's line\n")
    env = jit.environment(tmp_path / "session-1.jit", whole)
    done = subprocess.run([sys.executable, "-c", script + "print(os.getpid())"], env={**__import__("os").environ, **env},
                          capture_output=True, text=True, check=True)
    lines = whole.read_text().splitlines()
    pid = done.stdout.split()[-1]
    assert len(lines) == 3 and all(line.startswith(pid + " ") for line in lines)
    assert "INFO" in lines[-1] and lines[-1].endswith("not a compilation")
    assert "not a compilation" in done.stdout and len(jit.read(tmp_path / "session-1.jit")) == 2


def test_a_kernel_compiled_inside_the_timed_window_fails_the_trial_and_the_check_is_rederived(tiny_reuse_trace,
                                                                                             sim_backend, tmp_path):
    from parity import rederive
    from parity.checks import check_trial, trace_of
    from parity.experiments import plan
    from parity.experiments.runner import Runner
    from parity.manifest import read_manifest, write_manifest

    case = next(c for c in plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [20]}) if c.system == "standalone")
    with Runner("sustained", sim_backend, tmp_path, log=lambda m: None) as runner:
        path = runner.run(case)
    doc = read_manifest(path)
    assert "warm" not in doc["verdict"]["checks"]  # a trial without the record is judged as it always was
    doc["jit"] = {"monitored": True, "warmup": 3, "measured": []}
    assert check_trial(doc, trace_of(path, doc))["checks"]["warm"] == {"passed": True}
    doc["jit"]["measured"] = ["Triton kernel JIT compilation during inference: reduce_segments"]
    verdict = check_trial(doc, trace_of(path, doc))
    assert verdict["status"] == "failed" and "warm: 1 kernel compilations inside the timed window (Triton kernel JIT " \
        "compilation during inference: reduce_segments)" in verdict["reasons"][0]
    doc["verdict"] = verdict
    write_manifest(path, doc)
    assert rederive.validate([path], root=tmp_path.parent)[1] == []  # what its records give
    doc["verdict"] = {"status": "passed", "reasons": [], "checks": {k: {"passed": True} for k in verdict["checks"]}}
    write_manifest(path, doc)
    assert any("verdict" in str(p) for p in rederive.validate([path], root=tmp_path.parent)[1])


def test_a_rerun_on_another_gpu_keeps_each_pair_finished_whole_and_runs_a_split_one_again(tiny_reuse_trace, tmp_path):
    """A ladder spread over device sessions meets another GPU each session: every pair that ran whole on one
    GPU is kept; a pair with one side missing runs again whole on this GPU, never split over two."""
    from pathlib import Path as P

    from parity.experiments import plan
    from parity.backend import Backend
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    params = str(P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml")
    settings = {"rates": [20, 40], "flame": {"mode": "harvest", "api": "async"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    on = lambda gpu: Backend.from_dict({"engine": "sim", "sim_params": params, "gpus": [gpu]})  # noqa: E731
    run_experiment("sustained", cases, on("sim-0"), tmp_path, settings=settings, log=lambda _: None)
    (tmp_path / "trials" / "sustained-rate-40-reuse-p0-flame.json").unlink()
    lines: list[str] = []
    run_experiment("sustained", cases, on("sim-1"), tmp_path, settings=settings, log=lines.append)
    assert "sustained-rate-20-reuse-p0-vllm: kept (already run and checked)" in lines
    assert "sustained-rate-20-reuse-p0-flame: kept (already run and checked)" in lines
    assert any(line.startswith("sustained-rate-40-reuse-p0-vllm: run again: the trial on disk is stale: "
                               "it ran with other gpus") for line in lines)
    gpus = {c.trial_id: read_manifest(tmp_path / "trials" / f"{c.trial_id}.json")["ran_with"]["gpus"] for c in cases}
    assert gpus == {c.trial_id: ["sim-1" if c.stage == "rate-40" else "sim-0"] for c in cases}
    assert read_manifest(tmp_path / "experiment.json")["backend"]["gpus"] == ["sim-1"]


def test_extra_pairs_run_an_arms_flame_side_on_the_traces_whose_ladder_has_their_rate(tiny_reuse_trace, tmp_path):
    from parity.experiments import plan

    hot = tmp_path / "hot.json"
    hot.write_bytes(tiny_reuse_trace.read_bytes())  # only its name matters to the plan
    settings = {"rates": {"reuse": [2, 4], "hot": [4]}, "arms": {"harvest": {"mode": "harvest", "api": "async"}},
                "lengths": {"median": 8, "high": 32, "arm": "harvest"}, "answers": {"tokens": 512, "arm": "harvest"},
                "evict": {"cache_blocks": 100, "rate": 4}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace, hot], settings)
    rungs = {"rate-2", "rate-4", "rate-2-harvest", "rate-4-harvest"}
    extras = {(c.stage, c.trace.stem, c.system): c for c in cases if c.stage not in rungs}
    assert sorted({(stage, trace) for stage, trace, _ in extras}) == [
        ("evict-4", "hot"), ("evict-4", "reuse"), ("lengths-2-harvest", "reuse"), ("rate-2-out512-harvest", "reuse")]
    assert extras[("lengths-2-harvest", "reuse", "flame")].flame.mode == "harvest"
    assert extras[("rate-2-out512-harvest", "reuse", "flame")].max_tokens == 512
    assert extras[("evict-4", "hot", "flame")].flame.mode != "harvest"  # no arm: the experiment's own Flame settings
    # each case says which arm it is of as a field, not only in its stage label
    assert {c.stage: c.arm for c in cases} == {"rate-2": None, "rate-4": None, "rate-2-harvest": "harvest",
                                               "rate-4-harvest": "harvest", "evict-4": None,
                                               "lengths-2-harvest": "harvest", "rate-2-out512-harvest": "harvest"}
    ladder = plan.for_experiment("sustained", [tiny_reuse_trace, hot], settings | {"shared_start": True})
    order = list(dict.fromkeys(c.start or c.stage for c in ladder))
    assert order == ["sustained-start-harvest-p0-flame", "sustained-start-harvest-p0-vllm", "lengths-2-harvest",
                     "rate-2-out512-harvest", "sustained-start-p0-flame", "sustained-start-p0-vllm", "evict-4"]
    with pytest.raises(ParityError, match="names arm 'fast'; the arms are \\['harvest'\\]"):
        plan.for_experiment("sustained", [tiny_reuse_trace], {"rates": [2], "arms": settings["arms"],
                                                              "answers": {"tokens": 64, "arm": "fast"}})


def test_an_extra_pair_that_names_a_trace_runs_there_alone_and_a_trace_not_given_is_refused(tiny_reuse_trace,
                                                                                             tmp_path):
    """`trace: NAME` puts an extra pair on one trace at a rate no ladder has (512-token answers at 2 requests/s on
    reuse-640 alone, where the ladder's 4 requests/s is past one H200's capacity); a name not given: one line."""
    from parity.experiments import plan

    hot = tmp_path / "hot.json"
    hot.write_bytes(tiny_reuse_trace.read_bytes())
    settings = {"rates": {"reuse": [4], "hot": [4]}, "arms": {"harvest": {"mode": "harvest", "api": "async"}},
                "answers": {"tokens": 512, "arm": "harvest", "rate": 2, "trace": "reuse"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace, hot], settings)
    extras = sorted((c.stage, c.trace.stem, c.system, c.schedule.rate) for c in cases if "out512" in c.stage)
    assert extras == [("rate-2-out512-harvest", "reuse", "flame", 2.0),
                      ("rate-2-out512-harvest", "reuse", "standalone", 2.0)]
    with pytest.raises(ParityError, match="sustained answers names trace 'cold', which is not among the ladder's "
                                          "traces \\(reuse, hot\\)"):
        plan.for_experiment("sustained", [tiny_reuse_trace, hot], settings | {"answers": {"tokens": 8, "trace": "cold"}})


def test_a_trace_with_no_rungs_runs_only_the_extra_pairs_that_name_it(tiny_reuse_trace, tmp_path):
    """Every trace's rates empty: the plan is the extra pairs that name a trace and rate, exactly the cases the full
    config has under those ids (how a device session runs one stage of the host ladder); an extra pair with no
    rate, or nothing to run at all, is refused in one line; the schema takes an empty list per trace only."""
    from parity.experiments import plan
    from parity.experiments.settings import SustainedSettings
    from parity.workflow_config import check_experiment_settings

    hot = tmp_path / "hot.json"
    hot.write_bytes(tiny_reuse_trace.read_bytes())
    traces = [tiny_reuse_trace, hot]
    answers = {"tokens": 512, "arm": "harvest", "rate": 2, "trace": "reuse"}
    full = {"rates": {"reuse": [4], "hot": [4]}, "repeats": 2, "arms": {"harvest": {"mode": "harvest", "api": "async"}},
            "answers": answers}
    narrow = full | {"rates": {"reuse": [], "hot": []}}
    check_experiment_settings("sustained", narrow)
    cases = plan.for_experiment("sustained", traces, narrow)
    assert [c.trial_id for c in cases] == ["sustained-rate-2-out512-harvest-reuse-p0-vllm",
                                           "sustained-rate-2-out512-harvest-reuse-p0-flame",
                                           "sustained-rate-2-out512-harvest-reuse-p1-flame",
                                           "sustained-rate-2-out512-harvest-reuse-p1-vllm"]
    everything = {c.trial_id: c for c in plan.for_experiment("sustained", traces, full)}
    assert all(everything[c.trial_id] == c for c in cases)
    assert plan.settings_of("sustained", narrow).highest_rate == 2.0
    with pytest.raises(ParityError, match="sustained answers has no rate and the ladder none to lend it"):
        plan.for_experiment("sustained", traces, narrow | {"answers": {"tokens": 8, "trace": "reuse"}})
    with pytest.raises(ParityError, match="sustained: no case"):
        plan.for_experiment("sustained", traces, {"rates": {"reuse": [], "hot": []}})
    with pytest.raises(ParityError, match="no rate anywhere"):
        SustainedSettings(rates={"reuse": ()}).highest_rate
    with pytest.raises(ParityError):  # a plain ladder may not be empty
        check_experiment_settings("sustained", {"rates": []})


def _host_ladder_cases(tmp_path, trace):
    """The repo root, and the sustained cases a config folder (experiments.yaml under host.yaml) plans on the host
    ladder's two traces (only their names matter to the plan: each is `trace` copied)."""
    from pathlib import Path

    from parity.experiments import plan
    from parity.workflow_config import experiment_section

    traces = []
    for name in ("reuse-640", "hot-640"):
        traces.append(tmp_path / f"{name}.json")
        traces[-1].write_bytes(trace.read_bytes())

    def cases(config: Path) -> dict:
        section = experiment_section([config / "experiments.yaml", config / "host.yaml"], "sustained")
        return {c.trial_id: c for c in plan.for_experiment("sustained", traces, section)}

    return Path(__file__).resolve().parents[1], cases


def test_a_device_stage_of_the_host_ladder_plans_the_committed_configs_cases_for_that_stage(tiny_reuse_trace,
                                                                                          tmp_path):
    """benchmarks/ladder-stage.sh narrows config/host.yaml to one stage (how a device session runs it alone): the
    stage's cases are the committed config's own under the same ids, and nothing else; a bad stage is one line."""
    root, cases = _host_ladder_cases(tmp_path, tiny_reuse_trace)
    committed = cases(root / "config")
    seen = {}
    for stage in ("rungs", "answers", "lengths", "evict", "bounded"):
        copy = tmp_path / stage / "config"
        copy.mkdir(parents=True)
        for name in ("experiments.yaml", "host.yaml"):
            (copy / name).write_bytes((root / "config" / name).read_bytes())
        subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), stage, str(copy.parent)], check=True,
                       capture_output=True)
        narrowed = cases(copy)
        assert narrowed and all(committed[t] == c for t, c in narrowed.items()), stage
        seen[stage] = {c.stage for c in narrowed.values()}
    assert seen["answers"] == {"rate-2-out512-harvest"}
    assert seen["lengths"] == {"lengths-4-harvest"}
    assert seen["evict"] == {"evict-4-harvest"}
    assert seen["bounded"] == {f"rate-{r}-{arm}" for r in (4, 6, 14, 16, 18) for arm in ("bounded", "unbounded")}
    assert not seen["rungs"] & (seen["answers"] | seen["lengths"] | seen["evict"] | seen["bounded"])
    assert {c.stage for c in committed.values()} == set().union(*seen.values())  # every stage in one of them
    bad = subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), "warmup", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "must be rungs, answers" in bad.stderr
    half = tmp_path / "half" / "config"  # the host file alone: refused in one line before anything is changed
    half.mkdir(parents=True)
    (half / "host.yaml").write_bytes((root / "config" / "host.yaml").read_bytes())
    bad = subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), "answers", str(half.parent)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no config file to narrow" in bad.stderr
    assert (half / "host.yaml").read_bytes() == (root / "config" / "host.yaml").read_bytes()
    (half / "experiments.yaml").write_bytes((root / "config" / "experiments.yaml").read_bytes())
    unnamed = (root / "config" / "host.yaml").read_text().replace("arm: harvest, rate: 2, trace: reuse-640}",
                                                                   "arm: harvest}")
    (half / "host.yaml").write_text(unnamed)  # answers with no rate and trace of its own: nothing to run alone
    bad = subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), "answers", str(half.parent)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "names no rate and trace" in bad.stderr
    assert (half / "host.yaml").read_text() == unnamed
    unladdered = "".join(line for line in (root / "config" / "host.yaml").read_text().splitlines(keepends=True)
                         if not line.startswith("    bounded_rates: "))
    (half / "host.yaml").write_text(unladdered)  # a bounded arm without a ladder of its own: no stage to run alone
    bad = subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), "bounded", str(half.parent)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no bounded arm with a ladder" in bad.stderr
    assert (half / "host.yaml").read_text() == unladdered


def test_a_device_session_runs_chosen_rungs_of_the_bounded_ladder_under_their_committed_ids(tiny_reuse_trace,
                                                                                            tmp_path):
    """LADDER_RUNGS="hot-640:16" narrows the bounded stage to that rung (its comparator and both bounded arms, the
    committed cases under their ids: how session 25 ran a rung a call, by sed on the device); a rung the committed
    bounded_rates does not name, or the variable on another stage, is refused in one line with nothing changed."""
    from pathlib import Path

    root, cases = _host_ladder_cases(tmp_path, tiny_reuse_trace)

    def stage(name: str, rungs: str) -> tuple[subprocess.CompletedProcess, Path]:
        copy = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}" / "config"
        copy.mkdir(parents=True)
        for file in ("experiments.yaml", "host.yaml"):
            (copy / file).write_bytes((root / "config" / file).read_bytes())
        done = subprocess.run(["bash", str(root / "benchmarks/ladder-stage.sh"), name, str(copy.parent)],
                              capture_output=True, text=True, env=os.environ | {"LADDER_RUNGS": rungs})
        return done, copy

    committed = cases(root / "config")
    done, copy = stage("bounded", "hot-640:16 reuse-640:18")
    assert done.returncode == 0, done.stderr
    narrowed = cases(copy)
    assert narrowed and all(committed[t] == c for t, c in narrowed.items())
    assert {(c.stage, c.trace.stem) for c in narrowed.values()} == {
        ("rate-16-bounded", "hot-640"), ("rate-16-unbounded", "hot-640"),
        ("rate-18-bounded", "reuse-640"), ("rate-18-unbounded", "reuse-640")}
    done, copy = stage("rungs", "reuse-640:8")  # every arm's pair at that rung, run_first's arms (express3) first
    assert done.returncode == 0, done.stderr
    narrowed = cases(copy)
    assert narrowed and all(committed[t] == c for t, c in narrowed.items())
    assert {(c.stage, c.trace.stem) for c in narrowed.values()} == {
        (f"rate-8{arm}", "reuse-640") for arm in ("", "-gathered", "-harvest", "-express", "-express3")}
    assert [c.arm for c in narrowed.values()][:8] == ["express3"] * 4 + ["express"] * 4
    for name, rungs, message in (("bounded", "hot-640:17", "not a rung of the committed bounded_rates"),
                                 ("bounded", "reuse-64:14", "not a rung of the committed bounded_rates"),
                                 ("rungs", "reuse-640:14", "not a rung of the committed rates"),
                                 ("rungs", "reuse-640:8 reuse-640:8", "names 'reuse-640:8' twice"),
                                 ("bounded", "reuse-640:4 reuse-640:4", "names 'reuse-640:4' twice"),
                                 ("rungs", "  ", "names no rung"),
                                 ("answers", "hot-640:16", "narrows the rungs or bounded stage's rungs, not the answers")):
        bad, copy = stage(name, rungs)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, bad.stderr
        assert (copy / "host.yaml").read_bytes() == (root / "config" / "host.yaml").read_bytes()


def test_the_device_ladders_cutoff_stops_the_run_on_a_trial_written_past_it_even_over_a_stale_one(tmp_path):
    """benchmarks/cutoff.sh: on 2026-12-04 a rerun overwrote a stale trial of the same name, the count of trials
    never grew, and the run went on into a trial the call's limit killed; the cutoff now reads when a trial was
    written."""
    import os
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cutoff.sh"
    trials = tmp_path / "trials"
    trials.mkdir()
    stale = trials / "case-vllm.json"
    stale.write_text("{}")
    now = time.time()
    os.utime(stale, (now - 100, now - 100))  # from an earlier session
    before = trials / "case-flame.json"
    before.write_text("{}")
    os.utime(before, (now - 8, now - 8))  # written 2 s into the run: before the cutoff
    run = subprocess.Popen(["sleep", "60"])
    watch = subprocess.Popen([str(script), str(run.pid), str(trials), str(int(now) - 10), "5"],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "CUTOFF_POLL_S": "0.1"})
    try:
        time.sleep(1.0)
        assert run.poll() is None and watch.poll() is None  # nothing written past the cutoff yet
        stale.write_text('{"rerun": true}')  # the same name, written now
        assert watch.wait(timeout=30) == 0 and run.wait(timeout=30) != 0
        assert "past 5 s: no trial begun after it" in watch.stdout.read()
    finally:
        run.kill()
        watch.kill()
    bad = subprocess.run([str(script), "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "cutoff.sh: usage: cutoff.sh PID TRIALS START CUTOFF_S"


def test_the_device_ladder_on_a_fresh_machine_without_its_bundle_says_so_in_one_line(tmp_path):
    """2026-12-04: a warm machine went back between two calls and the next call met a fresh one without vLLM."""
    import shutil
    from pathlib import Path

    if Path("/tmp/site/vllm").is_dir():
        pytest.skip("this machine has the slim vLLM bundle set up in /tmp/site")
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "benchmarks" / "h200-ladder.sh", tmp_path / "benchmarks")
    done = subprocess.run(["bash", "benchmarks/h200-ladder.sh", str(tmp_path), "10"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("h200-ladder.sh: no vLLM on this machine and no .gpu/b carried")


def test_a_deadline_predicts_each_case_from_its_schedule_then_from_what_ran(tiny_reuse_trace):
    """parity.experiments.deadline: a 640-request rung at 4 requests/s with two paced warm-ups of 64 is predicted
    from its schedule (plus an engine start where it opens one) until one like it has run, then from that; a burst
    nothing has measured needs at least the engine start it opens (else nothing predicts it); a case that would end
    past the deadline is refused in one line."""
    import dataclasses

    from parity.experiments.deadline import AGAIN, MARGIN, SLACK_S, START_S, Deadline
    from parity.experiments.plan import Case
    from parity.flame.settings import FlameSettings
    from parity.schedule import Schedule

    rung = Case("sustained-rate-4-reuse-640-p0-vllm", "sustained", "standalone", "sticky", tiny_reuse_trace,
                FlameSettings(), schedule=Schedule(kind="poisson", rate=4.0), warmup_requests=64, start="s-vllm")
    now = [1000.0]
    deadline = Deadline(1000.0 + 300, clock=lambda: now[0])
    base = MARGIN * (2 * 64 + 640) / 4 + SLACK_S
    assert deadline.need_s(rung, 640, 2, opens=False) == pytest.approx(base)
    assert deadline.need_s(rung, 640, 2, opens=True) == pytest.approx(base + START_S)
    deadline.check(rung, 640, 2, opens=False)  # 241 s of 300
    with pytest.raises(ParityError, match=r"^deadline: sustained-rate-4-reuse-640-p0-vllm needs about 331 s and 300 "
                                          r"s are left, so it is not begun; the trials finished so far are kept"):
        deadline.check(rung, 640, 2, opens=True)
    deadline.ran(rung, 640, 2, opened=True, wall_s=400.0)  # its start in its time: teaches nothing
    assert deadline.need_s(rung, 640, 2, opens=False) == pytest.approx(base)
    deadline.ran(rung, 640, 2, opened=False, wall_s=195.0)
    assert deadline.need_s(rung, 640, 2, opens=True) == pytest.approx(AGAIN * 195.0 + START_S)
    slow = dataclasses.replace(rung, trial_id="sustained-rate-12-reuse-640-p0-flame",
                               schedule=Schedule(kind="poisson", rate=12.0))
    scheduled = MARGIN * (2 * 64 + 640) / 12 + SLACK_S
    assert deadline.need_s(slow, 640, 2, opens=False) == pytest.approx(scheduled)  # the 4/s rung kept to its schedule
    deadline.ran(slow, 640, 2, opened=False, wall_s=1.5 * scheduled)  # a path that keeps up less well
    faster = dataclasses.replace(rung, schedule=Schedule(kind="poisson", rate=8.0))
    assert deadline.need_s(faster, 640, 2, opens=False) == pytest.approx(1.5 * (MARGIN * 768 / 8 + SLACK_S))
    fresh = Case("confirmation-final-reuse-p0-vllm", "confirmation", "standalone", "sticky", tiny_reuse_trace,
                 FlameSettings())
    assert deadline.need_s(fresh, 256, 2, opens=True) == START_S + SLACK_S  # a burst: its engine start at least
    assert deadline.need_s(fresh, 256, 2, opens=False) is None  # on open engines nothing predicts it yet
    now[0] += 300.0 - (START_S + SLACK_S)
    deadline.check(fresh, 256, 2, opens=True)  # begun: its start fits
    now[0] += 1.0
    with pytest.raises(ParityError, match=r"^deadline: confirmation-final-reuse-p0-vllm needs about 120 s and 119 s"):
        deadline.check(fresh, 256, 2, opens=True)
    deadline.check(fresh, 256, 2, opens=False)  # nothing predicts it: begun
    deadline.ran(fresh, 256, 2, opened=True, wall_s=190.0)
    assert deadline.need_s(fresh, 256, 2, opens=True) == pytest.approx(AGAIN * 190.0)  # its start is in its time
    Deadline(None).check(rung, 640, 2, opens=True)  # no deadline: everything is begun


def test_a_deadline_learns_each_paths_engine_start_from_the_starts_it_measured(tiny_reuse_trace):
    """parity.experiments.deadline: a case that opens engines is predicted with START_S until a start on its path
    was measured, then with the longest measured there plus START_SPREAD_S (2026-12-05: a bounded case not begun
    for 90 s of start where the standalone start just measured took about 45); the other path keeps START_S."""
    import dataclasses

    from parity.experiments.deadline import MARGIN, SLACK_S, START_S, START_SPREAD_S, Deadline
    from parity.experiments.plan import Case
    from parity.flame.settings import FlameSettings
    from parity.schedule import Schedule

    unbounded = Case("sustained-rate-14-unbounded-reuse-640-p0-vllm", "sustained", "standalone", "sticky",
                     tiny_reuse_trace, FlameSettings(), schedule=Schedule(kind="poisson", rate=14.0),
                     warmup_requests=64, start="start-unbounded-vllm")
    bounded = dataclasses.replace(unbounded, trial_id="sustained-rate-14-bounded-reuse-640-p0-vllm",
                                  start="start-bounded-vllm", placement="prefix")
    flame = dataclasses.replace(bounded, trial_id="sustained-rate-14-bounded-reuse-640-p0-flame", system="flame",
                                start="start-bounded-flame")
    run_s = MARGIN * (2 * 64 + 640) / 14 + SLACK_S
    deadline = Deadline(None)
    assert deadline.need_s(bounded, 640, 2, opens=True) == pytest.approx(run_s + START_S)  # 180 s, as on the H200
    deadline.ran(unbounded, 640, 2, opened=True, wall_s=112.0, start_s=50.0)
    assert deadline.need_s(bounded, 640, 2, opens=True) == pytest.approx(run_s + 50.0 + START_SPREAD_S)
    assert deadline.need_s(bounded, 640, 2, opens=False) == pytest.approx(run_s)
    assert deadline.need_s(flame, 640, 2, opens=True) == pytest.approx(run_s + START_S)  # its path not measured
    deadline.ran(unbounded, 640, 2, opened=True, wall_s=90.0, start_s=30.0)  # the longest start is kept
    assert deadline.need_s(bounded, 640, 2, opens=True) == pytest.approx(run_s + 50.0 + START_SPREAD_S)
    deadline.ran(flame, 640, 2, opened=True, wall_s=400.0, start_s=150.0)  # longer than START_S: learned too
    assert deadline.need_s(flame, 640, 2, opens=True) == pytest.approx(run_s + 150.0 + START_SPREAD_S)


def test_the_runner_gives_the_deadline_each_start_it_opened_with_its_decode_sweep(tiny_reuse_trace, tmp_path,
                                                                                  monkeypatch):
    """parity.experiments.runner: the case that opens a shared start tells the deadline how long the opening and its
    decode sweep took; the rungs after it on that start tell it none."""
    from pathlib import Path as P

    from parity.backend import Backend
    from parity.experiments import plan, runner
    from parity.experiments.deadline import Deadline

    seen = []

    class Recording(Deadline):
        def ran(self, case, requests, warmup_rounds, opened, wall_s, start_s=None):
            seen.append((case.trial_id, opened, start_s, wall_s))
            super().ran(case, requests, warmup_rounds, opened, wall_s, start_s)

    monkeypatch.setattr(runner, "Deadline", Recording)
    params = str(P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml")
    settings = {"rates": [20, 40], "shared_start": True, "warmup_requests": 4,
                "flame": {"mode": "harvest", "api": "async"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    backend = Backend.from_dict({"engine": "sim", "sim_params": params})
    runner.run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lambda _: None)
    assert [trial for trial, *_ in seen] == [c.trial_id for c in cases]
    starts = {c.start for c in cases}
    assert sum(opened for _, opened, _, _ in seen) == len(starts) == 2
    for trial_id, opened, start_s, wall_s in seen:
        assert (start_s is not None) == opened
        if opened:
            swept = json.loads((tmp_path / "trials" / f"{trial_id}.json").read_text())["warmup_sweep"]["duration_s"]
            assert swept <= start_s <= wall_s


def test_a_rerun_under_a_deadline_keeps_finished_trials_and_begins_no_case_that_would_end_past_it(tiny_reuse_trace,
                                                                                                  tmp_path):
    """A device call's deadline (--deadline, PARITY_DEADLINE): the kept trials are kept, and the case that would
    end past it is not begun, in one line, rather than killed inside its trial by the call's limit."""
    from pathlib import Path as P

    from parity.backend import Backend
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment

    params = str(P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml")
    settings = {"rates": [20, 40], "flame": {"mode": "harvest", "api": "async"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    backend = Backend.from_dict({"engine": "sim", "sim_params": params})
    run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lambda _: None)
    last = tmp_path / "trials" / f"{cases[-1].trial_id}.json"
    last.unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").glob("*.json")}
    lines: list[str] = []
    with pytest.raises(ParityError, match=rf"^deadline: {cases[-1].trial_id} needs about .* so it is not begun"):
        run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lines.append,
                       deadline=time.time() + 5)
    assert sum(": kept (already run and checked)" in line for line in lines) == len(cases) - 1
    assert not last.exists() and kept == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").glob("*.json")}


def test_a_trial_copied_under_another_name_or_relabelled_for_another_gpu_runs_again(tiny_reuse_trace, tmp_path):
    """Found by an outsider: a manifest copied over another case's file (the same settings) was kept, so one
    measurement counted twice; a trial whose ran_with named another GPU than its records ran on was kept for that GPU.
    Each now runs again, saying why (simulated)."""
    import json as _json
    from pathlib import Path as P

    from parity.backend import Backend
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment

    params = str(P(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml")
    settings = {"rates": [20, 40], "flame": {"mode": "harvest", "api": "async"}}
    cases = plan.for_experiment("sustained", [tiny_reuse_trace], settings)
    backend = Backend.from_dict({"engine": "sim", "sim_params": params, "gpus": ["sim-0"]})
    run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lambda _: None)
    trials = tmp_path / "trials"
    (tmp_path / "experiment.json").unlink()  # no record of the hashes: the trial itself must tell
    cases = [c for c in cases if c.system == "standalone"]  # one side of each rung's pair
    first, second = (trials / f"{c.trial_id}.json" for c in cases)
    second.write_bytes(first.read_bytes())
    doc = _json.loads(first.read_text())
    doc["ran_with"]["gpus"] = ["sim-9"]
    first.write_text(_json.dumps(doc))
    lines: list[str] = []
    run_experiment("sustained", plan.for_experiment("sustained", [tiny_reuse_trace], settings), backend, tmp_path,
                   settings=settings, log=lines.append)
    assert f"{cases[1].trial_id}: run again: the trial on disk is {cases[0].trial_id!r}, not {cases[1].trial_id!r}" \
        in lines
    assert any(line.startswith(f"{cases[0].trial_id}: run again: ") and "its records ran on sim-0, which its ran_with "
               "gpus do not name" in line for line in lines), lines


def _device_ladder_stand_in(tmp_path, workflow: str):
    """A repo with benchmarks/h200-ladder.sh and stand-ins for the bundle, the Flame binaries, nvidia-smi and the
    workflow (`workflow`: benchmarks/host.sh's body); (the repo, OUTDIR, the environment to run it in)."""
    import shutil
    from pathlib import Path

    root, out, bin_dir = tmp_path / "repo", tmp_path / "out", tmp_path / "bin"
    for d in (root / "benchmarks", root / ".gpu" / "b", out, bin_dir):
        d.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "benchmarks" / "h200-ladder.sh", root / "benchmarks")
    (root / ".gpu" / "b" / "setup.sh").write_text(":\n")
    (root / "benchmarks" / "flame-bins.sh").write_text(":\n")
    (root / "benchmarks" / "host.sh").write_text("#!/usr/bin/env bash\n" + workflow)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'GPU-stand-in'\n"
                                        "case \" $* \" in *' -l '*) exec sleep 60 ;; esac\n")
    for f in (root / "benchmarks" / "host.sh", bin_dir / "nvidia-smi"):
        f.chmod(0o755)
    return root, out, {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}


@pytest.mark.parametrize("carried", ["whole", "truncated", "absent"])
def test_the_device_ladder_leaves_at_most_eight_files_to_bring_back(tmp_path, carried):
    """2026-12-05 (session 26): the device brings back at most 8 files from OUTDIR, and the ninth, workflow.txt,
    was left out; the samples and logs travel as one facts.tgz beside gpu.txt and the archives. Run here with
    stand-ins for the bundle, nvidia-smi and the workflow. A Triton cache an earlier session brought back
    (.gl/triton-cache.tgz) is loaded into ~/.triton before the run and goes back out with its kernels; a truncated
    one is said in one line and loaded not at all (no part of it in ~/.triton), and the run goes on; none carried is
    said too (2026-12-06: .gl, carried a call before the script's, was not loaded, and nothing said so)."""
    import shutil
    import tarfile
    from pathlib import Path

    if Path("/tmp/site/vllm").is_dir():
        pytest.skip("this machine has the slim vLLM bundle set up in /tmp/site")
    root, out, env = _device_ladder_stand_in(
        tmp_path, "echo 'the workflow ran'\nmkdir -p results/host/sustained/trials results/host/logs\n"
        "echo '{}' > results/host/sustained/trials/t.json\necho '1.0 req/s' > results/host/logs/experiment_sustained.log\n")
    kernel = tmp_path / "earlier" / "cache" / "K1" / "kernel.json"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(os.urandom(200_000))  # incompressible: cut in half, the archive stops inside this file
    (root / ".gl").mkdir()
    carry = root / ".gl" / "triton-cache.tgz"
    with tarfile.open(carry, "w:gz") as cache:
        cache.add(tmp_path / "earlier" / "cache", arcname="cache")
    if carried == "truncated":
        carry.write_bytes(carry.read_bytes()[:100_000])
    elif carried == "absent":
        shutil.rmtree(root / ".gl")
    done = subprocess.run(["bash", "benchmarks/h200-ladder.sh", str(out), "60"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "rc=0" in done.stdout, done.stdout + done.stderr
    files = sorted(p.name for p in out.iterdir())
    if carried == "absent":
        assert "Triton cache: none carried (carry .gl with the call that runs this script)" in done.stdout, done.stdout
        assert files == ["facts.tgz", "gpu.txt", "ladder.tgz"], files
    elif carried == "truncated":
        said = [line for line in done.stderr.splitlines() if "triton-cache.tgz" in line]
        assert said == ["h200-ladder.sh: .gl/triton-cache.tgz is not a whole Triton cache (cache/...): not loaded, "
                        "the first trial compiles its kernels"], done.stderr
        assert not (tmp_path / ".triton").exists() or not any((tmp_path / ".triton").iterdir())
        assert files == ["facts.tgz", "gpu.txt", "ladder.tgz"], files
    else:
        assert (tmp_path / ".triton" / "cache" / "K1" / "kernel.json").is_file()
        assert files == ["facts.tgz", "gpu.txt", "ladder.tgz", "triton-cache.tgz"], files
        with tarfile.open(out / "triton-cache.tgz") as back:
            assert "cache/K1/kernel.json" in back.getnames()
    with tarfile.open(out / "facts.tgz") as facts:
        names = set(facts.getnames())
        assert {"workflow.txt", "cpu.txt", "cpu-load.txt", "gpu-clocks.txt"} <= names
        assert "the workflow ran" in facts.extractfile("workflow.txt").read().decode()


def test_the_device_ladder_runs_the_confirmations_named_stages_alone_and_refuses_them_for_the_ladder(tmp_path):
    """CONFIRMATION_STAGES (session 33): the committed host profile's confirmation narrowed on the device to the
    stages named (settings stages), so the earlier stages' pairs, made on other Flame binaries, do not all run again;
    named for the sustained ladder, refused in one line before anything runs. Stand-ins for the bundle and workflow."""
    import shutil
    from pathlib import Path

    import yaml

    if Path("/tmp/site/vllm").is_dir():
        pytest.skip("this machine has the slim vLLM bundle set up in /tmp/site")
    here = Path(__file__).resolve().parents[1]
    root, out, env = _device_ladder_stand_in(
        tmp_path, "echo \"the workflow ran $1\"\nmkdir -p results/host/confirmation/trials results/host/logs\n"
        "touch results/host/logs/experiment_confirmation.log\n")
    (root / "config").mkdir()
    shutil.copy(here / "config" / "host.yaml", root / "config")
    env["CONFIRMATION_STAGES"] = "final-express3"
    refused = subprocess.run(["bash", "benchmarks/h200-ladder.sh", str(out), "60"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr == "h200-ladder.sh: CONFIRMATION_STAGES narrows the confirmation\n"
    assert (root / "config" / "host.yaml").read_text() == (here / "config" / "host.yaml").read_text()
    done = subprocess.run(["bash", "benchmarks/h200-ladder.sh", str(out), "60", "confirmation"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "rc=0" in done.stdout and "the confirmation's stages final-express3 alone" in done.stdout, done.stdout
    narrowed = yaml.safe_load((root / "config" / "host.yaml").read_text())["experiments"]["confirmation"]
    committed = yaml.safe_load((here / "config" / "host.yaml").read_text())["experiments"]["confirmation"]
    assert narrowed == committed | {"stages": ["final-express3"]}


def test_a_deadline_tells_the_paths_apart_and_remembers_for_the_next_call_on_the_same_gpus(tiny_reuse_trace,
                                                                                          tmp_path):
    """2026-12-06 (one H100, session 33): a no-reuse burst took 180 s on the Flame side and 121 s standalone, and
    each device call's process began with nothing measured, so one case was predicted at 202 s (the other path's
    time) and a Flame burst of about 200 s at 120. Now a path's times predict only its own cases, an unmeasured
    burst on fresh engines takes the longest its path took, and what a run measured is kept for the next run on
    the same GPUs (a memory of other GPUs, or one that cannot be read, predicts nothing)."""
    import dataclasses
    import json

    from parity.experiments.deadline import AGAIN, SLACK_S, START_S, Deadline
    from parity.experiments.plan import Case
    from parity.flame.settings import FlameSettings

    flame = Case("confirmation-final-express3-no-reuse-p1-flame", "confirmation", "flame", "sticky", tiny_reuse_trace,
                 FlameSettings())
    vllm = dataclasses.replace(flame, trial_id="confirmation-final-express3-no-reuse-p1-vllm", system="standalone")
    memory = tmp_path / "logs" / "deadline.json"
    first = Deadline(2000.0, clock=lambda: 1000.0)
    first.remember(memory, ["GPU-a"])
    assert not memory.exists()  # nothing measured yet
    first.ran(flame, 64, 2, opened=True, wall_s=180.0)
    assert first.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S  # not the Flame side's 180 s
    assert first.need_s(flame, 256, 2, opens=True) == pytest.approx(AGAIN * 180.0)  # its path's longest burst
    first.ran(vllm, 64, 2, opened=True, wall_s=121.0)
    second = Deadline(2000.0, clock=lambda: 1000.0)
    second.remember(memory, ["GPU-a"])
    assert second.need_s(vllm, 64, 2, opens=True) == pytest.approx(AGAIN * 121.0)
    assert second.need_s(flame, 64, 2, opens=True) == pytest.approx(AGAIN * 180.0)
    other = Deadline(2000.0, clock=lambda: 1000.0)
    other.remember(memory, ["GPU-b"])  # another machine's times
    assert other.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S
    for bad in ("{not json", json.dumps({"gpus": ["GPU-a"], "took": [[1, 2]], "starts": {}, "slower": 1}), "[]"):
        memory.write_text(bad)
        broken = Deadline(2000.0, clock=lambda: 1000.0)
        broken.remember(memory, ["GPU-a"])
        assert broken.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S
    broken.ran(vllm, 64, 2, opened=True, wall_s=100.0)  # written whole again, from this run's measurements
    assert json.loads(memory.read_text())["took"] == [[None, 64, "None", True, "standalone", 100.0]]
    assert not list(memory.parent.glob("*.part"))
    (tmp_path / "file").write_text("")
    unwritable = Deadline(2000.0, clock=lambda: 1000.0)
    unwritable.remember(tmp_path / "file" / "deadline.json", ["GPU-a"])  # its folder cannot be made
    unwritable.ran(vllm, 64, 2, opened=True, wall_s=100.0)  # the run goes on, without a memory
    assert unwritable.need_s(vllm, 64, 2, opens=True) == pytest.approx(AGAIN * 100.0)


def test_a_deadline_memory_with_a_value_that_is_not_a_time_predicts_nothing(tiny_reuse_trace, tmp_path):
    """An outsider's break test (2026-12-06): a memory whose times were negative or NaN made a trial look as if it
    fit (need 0 or NaN, so it was begun with 39 s left where it needed 120), one of deeply nested brackets crashed
    the run with a RecursionError, and a FIFO at its path blocked the run for ever. Each is now a memory not used."""
    import json
    import math
    import os

    from parity.experiments.deadline import SLACK_S, START_S, Deadline
    from parity.experiments.plan import Case
    from parity.flame.settings import FlameSettings

    vllm = Case("confirmation-final-no-reuse-p0-vllm", "confirmation", "standalone", "sticky", tiny_reuse_trace,
                FlameSettings())
    memory = tmp_path / "deadline.json"
    row = [None, 64, "None", True, "standalone"]
    good = {"gpus": ["GPU-a"], "took": [row + [100.0]], "starts": {"standalone": 30.0}, "slower": 1.0}
    bad = [good | {"took": [row + [wall]]} for wall in (-500.0, math.nan, -math.inf, "nan", "-1e9")]
    bad += [good | {"starts": {"standalone": s}} for s in (math.nan, -1e9)]
    bad += [good | {"took": [[math.nan, *row[1:], 100.0]]}, good | {"slower": math.nan}]
    # a second outsider: float() and int() read false as 0 s, true as 1 s, "5" as 5 s, 64.9 requests as 64, and
    # int(Infinity) raised an OverflowError past the guard
    bad += [good | {"took": [row + [wall]]} for wall in (False, True, "5", " 5e0 ")]
    bad += [good | {"starts": {"standalone": True}}]
    bad += [good | {"took": [[None, n, *row[2:], 100.0]]} for n in (math.inf, 64.9, -5, True, "64")]
    bad += [good | {"took": [[None, 64, "None", "false", "standalone", 100.0]]}]
    for doc in bad:
        memory.write_text(json.dumps(doc))  # json writes NaN and -Infinity as Python reads them back
        deadline = Deadline(1060.0, clock=lambda: 1000.0)
        deadline.remember(memory, ["GPU-a"])
        assert deadline.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S, doc
    memory.write_text("[" * 100_000)
    deep = Deadline(1060.0, clock=lambda: 1000.0)
    deep.remember(memory, ["GPU-a"])
    assert deep.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S
    memory.unlink()
    os.mkfifo(memory)  # a read would wait for a writer that never comes
    piped = Deadline(1060.0, clock=lambda: 1000.0)
    piped.remember(memory, ["GPU-a"])
    assert piped.need_s(vllm, 64, 2, opens=True) == START_S + SLACK_S
    memory.unlink()
    memory.write_text(json.dumps(good))
    kept = Deadline(1060.0, clock=lambda: 1000.0)
    kept.remember(memory, ["GPU-a"])
    assert kept.need_s(vllm, 64, 2, opens=True) > 100.0  # a good memory is still used
