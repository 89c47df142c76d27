"""The serving-path registry, and a new path added in a few lines that the runner, checks and report accept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parity import paths
from parity.errors import ParityError
from parity.manifest import read_manifest, validate_paths
from parity.paths import Burst, Described, ServingPath, register

ROOT = Path(__file__).resolve().parents[1]


@register("toy")
class ToyPath(ServingPath):
    """The smallest serving path: one simulator engine takes the whole burst; shard k reports GPU k."""

    @classmethod
    def for_case(cls, case, runner):
        return cls(runner.gpus)

    def __init__(self, gpus):
        from parity.engine.sim import SimEngine

        self.gpus, self.engine = gpus, SimEngine()

    @property
    def shards(self) -> int:
        return len(self.gpus)

    def release(self, prompts, request_ids, router, schedule, restart=None) -> Burst:
        from parity.record import Placement

        release, shards = self.engine.now(), [router.route(p) for p in prompts]
        return Burst(release, self.engine.generate(prompts), [Placement(s, f"toy-{s}", self.gpus[s]) for s in shards])

    def describe(self, burst: Burst) -> Described:
        return Described({"name": "toy", "version": None, "args": {}, "simulated": True},
                         [{"uuid": g} for g in self.gpus], {"engines": 1})


def test_a_path_is_found_by_name_and_an_unknown_one_is_named():
    assert paths.get("toy") is ToyPath and paths.get("standalone").name == "standalone"
    with pytest.raises(ParityError, match=r"unknown serving path 'tgi': use one of .*engine, flame, standalone, toy"):
        paths.get("tgi")
    with pytest.raises(ParityError, match="already registered"):
        register("toy")(type("Other", (ServingPath,), {}))


def test_the_command_lines_placements_are_the_paths():
    from parity.cli import main

    for system in ("flame", "standalone"):
        (option,) = [p for p in main.commands[system].commands["run"].params if p.name == "placements"]
        assert tuple(option.type.choices) == paths.get(system).placements
    from parity.cli.options import REPLICA_KINDS
    from parity.standalone.replicas import KINDS

    assert REPLICA_KINDS == KINDS


def test_a_new_path_runs_as_a_pairs_candidate_and_the_report_takes_it(tiny_reuse_trace, sim_backend, tmp_path):
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.flame.settings import FlameSettings
    from parity.report import write_report

    traces, backend = [tiny_reuse_trace], dataclasses.replace(sim_backend, warmup_rounds=1)
    cases = [dataclasses.replace(c, system="toy") if c.side == "candidate" else c
             for c in plan.confirmation(traces, 1, FlameSettings())]
    run_experiment("confirmation", cases, backend, tmp_path / "confirmation", settings={"pairs": 1}, log=lambda m: None)
    toy = read_manifest(tmp_path / "confirmation" / "trials" / "confirmation-final-reuse-p0-flame.json")
    assert toy["system"] == "toy" and toy["config"]["path"] == "toy" and toy["config"]["engines"] == 1
    assert toy["verdict"]["status"] == "passed"  # all four checks, and pinned to the reference's GPUs
    assert toy["schedule"] == {"kind": "burst"} and toy["router"]["policy"] == "sticky"
    made = write_report([tmp_path / "confirmation"], None, ROOT / "config/study-reference.yaml", tmp_path / "r")
    assert made["manifest"]["headline"]["reuse"]["pairs"] == 1
    assert not validate_paths([tmp_path / "confirmation", tmp_path / "r"])[1]


def test_the_client_never_collects_its_heap_inside_a_release(tiny_reuse_trace, sim_backend, tmp_path):
    """A full collection inside a burst would stall submission past Flame's batch window (82 ms, splitting
    each shard's batch, on the smoke's last pair): a release runs with collection paused, restored after."""
    import gc

    from parity import trial

    states = []

    class Watched(ToyPath):
        def release(self, *args):
            states.append(gc.isenabled())
            return super().release(*args)

    assert gc.isenabled()
    trial.run(Watched(["sim-0", "sim-1"]), tiny_reuse_trace, tmp_path, trial_id="t", experiment="engine",
              warmup_rounds=1, log=lambda m: None)
    assert states == [False, False] and gc.isenabled()
