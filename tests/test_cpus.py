"""backend.engine_cpus (parity.cpus): each vLLM engine core on CPUs of its own, the job on the rest (issue 28)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from parity import cpus
from parity.backend import Backend
from parity.errors import ParityError

# a stand-in engine core: a process named as vLLM names its engine core (prctl PR_SET_NAME), with a second thread
FAKE_ENGINE = ("import ctypes, threading, time; ctypes.CDLL(None).prctl(15, b'VLLM::EngineCore', 0, 0, 0); "
               "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)")

JOB = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from parity import cpus
    with cpus.isolated(1, 1, log=lambda line: None) as reservation:
        engine = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not reservation.placed:
            time.sleep(0.1)
        time.sleep(1.0)  # its second thread, moved on the next look
        threads = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{engine.pid}/task")}
        out = {"record": cpus.record(), "engine": engine.pid, "threads": threads,
               "other": sorted(os.sched_getaffinity(other.pid)), "job": sorted(os.sched_getaffinity(0))}
        engine.kill(); other.kill(); engine.wait(); other.wait()
    out["after"] = cpus.record()
    print(json.dumps(out))
""")


def test_cpu_lists_are_written_as_taskset_writes_them():
    assert cpus.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpus.ranges([3]) == "3"
    assert cpus.ranges([]) == ""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to reserve one")
def test_an_engine_core_gets_its_own_cpu_and_everything_else_the_rest():
    top = max(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", JOB, FAKE_ENGINE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["threads"]) == 2 and all(cpu == [top] for cpu in out["threads"].values())  # every thread of it
    assert top not in out["other"] and top not in out["job"]  # the job, and what it started, on the rest
    record = out["record"]
    assert record["engine_cpus"] == 1 and record["reserved"] == [str(top)]
    assert [e["pid"] for e in record["engine_cores"]] == [out["engine"]] and record["engine_cores"][0]["cpus"] == str(top)
    assert out["after"] is None  # only while the reservation holds


SUCCESSION = textwrap.dedent("""
    import json, subprocess, sys, time
    from parity import cpus

    def until(test):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not test():
            time.sleep(0.1)

    with cpus.isolated(1, 1, log=lambda line: None) as reservation:
        first = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
        until(lambda: reservation.placed)
        first.kill(); first.wait()
        until(lambda: "ended_s" in reservation.placed[0])
        began = time.time()  # the next trial's start
        second = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
        until(lambda: len(reservation.placed) == 2)
        out = {"first": first.pid, "second": second.pid, "trial": cpus.record(began), "all": cpus.record()}
        second.kill(); second.wait()
    print(json.dumps(out))
""")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to reserve one")
def test_a_trial_records_its_own_engine_cores_not_an_earlier_trials():
    """A reservation spans a whole experiment run: a fresh-engine trial after another (the confirmation pairs) once
    listed the earlier trial's stopped engine core as its own (2026-12-04, session 14)."""
    done = subprocess.run([sys.executable, "-c", SUCCESSION, FAKE_ENGINE], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [e["pid"] for e in out["trial"]["engine_cores"]] == [out["second"]]
    assert [e["pid"] for e in out["all"]["engine_cores"]] == [out["first"], out["second"]]
    assert "ended_s" in out["all"]["engine_cores"][0] and "ended_s" not in out["all"]["engine_cores"][1]


def test_a_reservation_that_leaves_the_job_no_cpu_is_refused_in_one_line():
    with pytest.raises(ParityError, match=r"leaves none of this job's \d+ CPUs"):
        cpus.EngineCpus(len(os.sched_getaffinity(0)), 1)


def test_nothing_is_reserved_by_default_as_the_study_ran():
    assert Backend().engine_cpus == 0
    with cpus.isolated(0, 2) as reservation:
        assert reservation is None and cpus.record() is None


@pytest.mark.parametrize("value", [-1, "2", 1.5])
def test_a_bad_engine_cpus_setting_is_refused_at_the_door(value):
    with pytest.raises(ParityError, match="engine_cpus"):
        Backend.from_dict({"engine_cpus": value})


def test_a_trial_that_reserved_cpus_is_not_kept_for_a_run_that_reserves_none():
    from parity import trial

    wanted = {name: None for name in trial.RESULT_SETTINGS}
    doc = {"ran_with": dict(wanted) | {"engine_cpus": 2}, "trace": {"sha256": None}, "engine": {"args": None},
           "versions": None}
    assert trial.stale(doc, wanted) == "it ran with other engine_cpus"
    assert trial.stale(doc, wanted | {"engine_cpus": 2}) is None
    doc["ran_with"].pop("engine_cpus")  # a trial made before the setting: none reserved
    assert trial.stale(doc, wanted) is None
