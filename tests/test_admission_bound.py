"""benchmarks/admission_bound.py: the bound no admission policy can pass on a trial's arrivals (a linear program),
a clairvoyant schedule under it, and the online rule below both; one-line refusals of what it cannot read."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("admission_bound", ROOT / "benchmarks" / "admission_bound.py")
admission_bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(admission_bound)


def _reqs(arrivals_docs):
    return [{"arrival_s": a, "prompt": 1000, "cached": 0, "document": (d, 0)} for a, d in arrivals_docs]


def test_foresight_beats_first_come_and_the_bound_is_above_both():
    """Document A's one request comes first, then document B's four: first come seeds A, and B's first no
    longer fits its deadline, so B is refused whole; with foresight A is refused and B's four are admitted."""
    reqs = _reqs([(0.0, 0), (0.1, 1), (0.5, 1), (0.6, 1), (0.7, 1)])
    seed, hit = np.full(5, 0.8), np.full(5, 0.01)
    assert admission_bound.online(reqs, seed, hit, ttft_s=1.0) == 1
    most, found = admission_bound.bound(reqs, seed, hit, ttft_s=1.0, integer_s=10)
    assert found == pytest.approx(4) and 4 - 1e-6 <= most <= 5
    # a deadline nobody misses: everything fits, and every rule admits it all
    assert admission_bound.online(reqs, seed, hit, ttft_s=100.0) == 5
    assert admission_bound.bound(reqs, seed, hit, ttft_s=100.0)[0] == pytest.approx(5)


def test_late_ones_only_loosen_the_bound_and_a_young_orphan_may_seed():
    reqs = _reqs([(0.0, 0), (0.05, 1), (0.1, 2), (1.5, 1), (1.6, 1), (1.7, 2)])
    seed, hit = np.full(6, 0.9), np.full(6, 0.01)
    strict = admission_bound.bound(reqs, seed, hit, ttft_s=1.0)[0]
    assert admission_bound.bound(reqs, seed, hit, ttft_s=1.0, late=0.5)[0] >= strict - 1e-9
    # documents 1 and 2 are refused at first; at 1.5 s the engine is busy with nothing: idle, so 1's second seeds
    assert admission_bound.online(reqs, seed, hit, ttft_s=1.0) <= admission_bound.online(reqs, seed, hit, 1.0, young=2)
    assert admission_bound.online(reqs, seed, hit, ttft_s=1.0, margin_s=0.5) == 0  # no seed fits 0.5 s early


def test_costs_charge_a_seed_its_prefill_and_a_hit_what_its_document_left_uncached():
    from parity.engine.sim import SimParams

    reqs = [{"arrival_s": 0.0, "prompt": 8032, "cached": 0, "document": (3, 1)},
            {"arrival_s": 0.1, "prompt": 8032, "cached": 8000, "document": (3, 1)}]
    seed, hit = admission_bound.costs(reqs, SimParams.load(admission_bound.DEFAULT_PARAMS))
    assert seed[0] == seed[1] and 0.3 < seed[0] < 0.6  # an 8,000-token prefill on the calibrated H200
    assert hit[0] == hit[1] and 0 < hit[0] < 0.01


def _trial(tmp_path, ids, saturated=True):
    records = []
    for k, rid in enumerate(ids):
        arrival = 0.1 * k
        done = arrival + (0.5 * k if saturated else 0.2)
        records.append({"request_id": rid, "arrival_s": arrival, "complete_s": done, "token_s": [done - 0.1, done],
                        "prompt_tokens": 2000, "cached_tokens": 0 if k % 4 == 0 else 1984})
    path = tmp_path / "trial.json"
    path.write_text(json.dumps({"trial_id": "t", "records": records}))
    return path


def test_it_reads_a_saturated_trial_of_blocks_and_prints_its_bounds(tmp_path, capsys):
    ids = [f"reuse-640-d{d:04d}-q{q}" + (f"-b{b}" if b else "") for b in range(2) for d in range(3) for q in range(4)]
    assert admission_bound.main([str(_trial(tmp_path, ids))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("t: 24 requests over 2.3 s") and "(saturated)" in out[0]
    assert out[1].startswith("  first token <= 2 s, all: bound ") and "; online " in out[1]
    assert out[2].startswith("  first token <= 2 s, 1% of the admitted late: bound ")
    assert len({r["document"] for r in admission_bound.requests(json.loads((tmp_path / "trial.json").read_text()))}) == 6


def test_online_demand_judges_a_hot_refused_document_again_once_asked_that_often():
    """A document refused at its first request and asked three more times at a busy engine: orphans all, unless
    `demand` (parity.admission's orphan_demand) judges it again from its third asking, which fits and seeds it."""
    reqs = [{"arrival_s": a, "document": d} for a, d in ((0.0, "a"), (0.1, "b"), (0.2, "b"), (0.3, "b"), (0.4, "b"))]
    seed, hit = np.array([1.5, 2.0, 0.5, 0.5, 0.5]), np.full(5, 0.01)
    assert admission_bound.online(reqs, seed, hit, 2.0) == 1
    assert admission_bound.online(reqs, seed, hit, 2.0, demand=3) == 3  # a, then b seeded at 0.3 and a hit at 0.4
    assert admission_bound.online(reqs, seed, hit, 2.0, demand=5) == 1  # asked only four times


def test_a_zipf_trace_asking_a_question_again_names_its_document():
    """hot-640's ids ask a question again (-nN) before the block (-bN): once refused as naming no document."""
    ids = ["hot-640-d0000-q2", "hot-640-d0000-q2-n2", "hot-640-d0003-q1-n1-b3", "hot-640-d0000-q2-b3"]
    doc = {"records": [{"request_id": rid, "arrival_s": k, "prompt_tokens": 10} for k, rid in enumerate(ids)]}
    assert [r["document"] for r in admission_bound.requests(doc)] == [(0, 0), (0, 0), (3, 3), (0, 3)]


@pytest.mark.parametrize("case, message", [
    ("missing", "not a saturated sustained trial (FileNotFoundError"),
    ("not json", "not a saturated sustained trial (JSONDecodeError"),
    ("no document", "names no document"),
    ("not saturated", "not saturated (its achieved rate says nothing"),
])
def test_what_it_cannot_read_is_refused_in_one_line(tmp_path, capsys, case, message):
    path = tmp_path / "trial.json"
    if case == "not json":
        path.write_text("{")
    elif case == "no document":
        path = _trial(tmp_path, ["r0", "r1"])
    elif case == "not saturated":
        path = _trial(tmp_path, [f"x-d{d:04d}-q0" for d in range(8)], saturated=False)
    assert admission_bound.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err
    assert admission_bound.main([str(path), "--late", "1.5"]) == 2
    assert "--late in [0, 1)" in capsys.readouterr().err
