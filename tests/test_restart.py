"""The worker-restart fault (parity.restart) on the simulator: one engine killed mid-run on each path, a
new one in its place, every request answered once, the time to recover measured; and bad settings refused."""

from __future__ import annotations

import pytest

from parity.errors import ParityError
from parity.restart import Restart
from real_flame import real_flame  # tests/ is on sys.path


def test_each_path_loses_no_request_when_its_engine_is_killed_mid_run(small_reuse_trace, sim_backend, tmp_path):
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest, validate_paths
    from parity.report.inputs import load_experiment
    from parity.report.tables import restarts

    settings = {"rates": [40], "restart": {"at": 0.3}, "flame": {"batch_limit": 64, "window_ms": 5, "inflight": 1}}
    cases = [c for c in plan.for_experiment("sustained", [small_reuse_trace], settings) if c.restart]
    assert {c.stage for c in cases} == {"restart-40"} and {c.system for c in cases} == {"standalone", "flame"}
    run_experiment("sustained", cases, sim_backend, tmp_path, settings=settings, log=lambda m: None)
    ids = None
    for case in cases:
        path = tmp_path / "trials" / f"{case.trial_id}.json"
        validate_paths([path])
        doc = read_manifest(path)
        fault = doc["restart"]
        assert doc["verdict"]["status"] == "passed", (case.system, doc["verdict"])
        assert doc["ran_with"]["load"]["restart"] == {"shard": 0, "at": 0.3, "timeout_s": 600.0}
        # every request answered exactly once, the ones the dead engine held among them
        assert sorted(r["request_id"] for r in doc["records"]) == sorted(ids or [r["request_id"] for r in doc["records"]])
        ids = [r["request_id"] for r in doc["records"]]
        assert fault["lost"] == 0 and fault["requests"] == len(ids) == 64
        assert fault["resent"] and set(fault["resent"]) <= set(ids), case.system
        span = doc["schedule"]["span_s"]
        assert fault["scheduled_s"] == pytest.approx(0.3 * span)
        assert fault["scheduled_s"] <= fault["killed_s"] < fault["first_answer_s"], case.system
        assert fault["recovery_s"] == pytest.approx(fault["first_answer_s"] - fault["killed_s"], abs=1e-5)
        release = doc["timing"]["release_s"]
        resent = [r for r in doc["records"] if r["request_id"] in fault["resent"]]
        assert all(r["complete_s"] - release >= fault["first_answer_s"] - 1e-6 for r in resent), case.system
        if case.system == "standalone":  # a new replica on a new port answered what the dead one had not
            assert fault["killed_s"] < fault["ready_s"] <= fault["first_answer_s"]
            assert len({r["worker_id"] for r in doc["records"]}) == 2
            receipt = read_manifest(tmp_path / "cleanup" / f"{case.trial_id}.json")
            assert receipt["clean"] and "(1 replaced)" in receipt["what"]
        else:  # the session's next executor did
            assert fault["ready_s"] is None and fault["killed_executor"]
            assert {r["worker_id"] for r in resent} - {fault["killed_executor"]} == {r["worker_id"] for r in resent}
    rows = restarts(load_experiment(tmp_path)).rows
    assert len(rows) == 2 and {r[8] for r in rows} == {"0"} and all(float(r[6]) > 0 for r in rows)


@pytest.mark.parametrize("values, message", [
    ({"at": 1.0}, "above 0 and below 1"),
    ({"at": 0}, "above 0 and below 1"),
    ({"shard": -1}, "0 or more"),
    ({"when": 0.5}, "unknown restart setting"),
    ({"at": "half"}, "restart setting at must be a number"),
])
def test_bad_restart_settings_are_refused_by_name(values, message):
    with pytest.raises(ParityError, match=message):
        Restart.from_dict(values)


def test_a_restart_needs_spread_arrivals_and_an_existing_shard():
    with pytest.raises(ParityError, match="arrivals spread in time"):
        Restart().delay_s([0.0] * 8, 1)
    with pytest.raises(ParityError, match="shard 2 does not exist: the path has 2 shard"):
        Restart(shard=2).delay_s([0.0, 1.0], 2)
    assert Restart(at=0.25).delay_s([0.0, 2.0, 4.0], 1) == 1.0


def test_the_workflow_config_refuses_a_bad_restart_in_one_line():
    from parity.workflow_config import check_experiment_settings

    with pytest.raises(ParityError, match="restart"):
        check_experiment_settings("sustained", {"rates": [4], "restart": {"at": 2}})


@real_flame
def test_real_flame_gives_a_killed_workers_shard_no_new_executor_and_says_so_in_one_line(small_reuse_trace, sim_backend,
                                                                                         tmp_path):
    """What the stand-in does not copy: Flame v0.6.0 keeps the executor of a killed service (bound while idle,
    unbinding for ever once a task finds no service), and the shard's new session gets no executor; the trial
    fails after the restart's timeout, naming the executors, and the cluster is still torn down clean."""
    import dataclasses
    import os

    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    backend = dataclasses.replace(sim_backend, cluster="flame", flame_bin_dir=os.environ["FLAME_BIN_DIR"])
    settings = {"rates": [40], "restart": {"at": 0.3, "timeout_s": 10}, "flame": {"batch_limit": 64, "window_ms": 5}}
    cases = [c for c in plan.for_experiment("sustained", [small_reuse_trace], settings)
             if c.restart and c.system == "flame"]
    with pytest.raises(ParityError, match=r"session after the restart, .*-r1, answered nothing within 10 s after "
                                          r"its worker was killed; the cluster's executors: .*Executor(Unbinding|Bound)"):
        run_experiment("sustained", cases, backend, tmp_path, settings=settings, log=lambda m: None)
    assert read_manifest(tmp_path / "cleanup" / "flame-cluster.json")["clean"]


def test_a_new_engine_slower_than_the_timeout_fails_the_restart_record():
    from parity.restart import Outage

    outage = Outage(Restart(timeout_s=1.0), release_s=100.0, delay_s=0.5)
    outage.killed_s, outage.pids = 100.5, [1234]
    outage.answered(102.0)
    with pytest.raises(ParityError, match=r"answered first 1.5 s after the kill, beyond the restart's timeout_s \(1 s\)"):
        outage.record(8, 8)
    outage.answered(101.2)  # an earlier answer: within it
    assert outage.record(8, 8)["recovery_s"] == pytest.approx(0.7)
