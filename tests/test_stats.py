"""Statistics: medians with ranges, paired ratios, the 1% and 99% criteria, and exclusion of failed trials."""

from __future__ import annotations

import pytest

from parity.manifest import sha256_file, validate_paths, write_manifest
from parity.stats import batch_histogram, compare, describe, summary, write_pair
from test_manifest import trial_doc  # tests/ is on sys.path (pytest's rootdir-relative import)


def trial(rps: float, *, status="passed", trial_id="t", system="standalone") -> dict:
    doc = trial_doc()
    doc["trial_id"], doc["system"] = trial_id, system
    doc["timing"]["requests_per_s"] = rps
    if status == "failed":
        doc["verdict"] = {"status": "failed", "checks": {"coverage": {"passed": False}}, "reasons": ["coverage: x"]}
    return doc


def test_summary_is_median_min_max():
    assert summary([3.0, 1.0, 2.0]) == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}


def test_failed_trials_contribute_no_number():
    docs = [trial(7.6, trial_id="a"), trial(1.0, status="failed", trial_id="b"), trial(7.7, trial_id="c")]
    out = describe(docs)
    assert out["excluded"] == ["b"] and out["requests_per_s"]["median"] == pytest.approx(7.65)


def test_study_final_reuse_pairs_reproduce_its_verdict():
    # made-up pairs consistent with the study's published reuse medians and min-max ranges
    # (reference 28.595 [28.570-28.624], Flame 28.350 [27.989-28.416]): median difference -0.86%
    refs = [28.570, 28.590, 28.595, 28.600, 28.624]
    cands = [27.989, 28.350, 28.416, 28.100, 28.400]
    pairs = [(trial(r), trial(c, system="flame")) for r, c in zip(refs, cands)]
    out = compare(pairs)
    assert out["pairs"] == 5 and out["every_pair_meets_99"] is False
    assert out["median_difference"] == pytest.approx(28.350 / 28.595 - 1)
    assert out["medians_within_1pct"] is True


def test_pairs_with_a_failed_side_are_excluded():
    out = compare([(trial(10), trial(10.1)), (trial(10), trial(0.1, status="failed"))])
    assert out["pairs"] == 1 and out["excluded_pairs"] == 1 and out["every_pair_meets_99"] is True


def test_batch_histogram():
    doc = trial(1)
    doc["batch_sizes"] = [128, 124, 4, 128]
    assert batch_histogram(doc) == {4: 1, 124: 1, 128: 2}


def test_pair_manifest_links_both_trials(tmp_path):
    ref, cand = trial(10.0), trial(9.95, system="flame")
    (tmp_path / "reuse.json").write_text("{}")
    for name, doc in (("ref.json", ref), ("cand.json", cand)):
        doc["trace"] = {"path": "reuse.json", "sha256": sha256_file(tmp_path / "reuse.json")}
        write_manifest(tmp_path / name, doc)
    pair = write_pair(tmp_path / "pair.json", 0, (tmp_path / "ref.json", ref), (tmp_path / "cand.json", cand))
    assert pair["ratio"] == pytest.approx(0.995) and pair["meets_99"] is True
    checked, problems = validate_paths([tmp_path / "pair.json"])
    assert problems == [] and checked == 3


def test_a_pair_with_its_sides_swapped_is_refused(tmp_path):
    """An outside tester's, 2026-12-06: a pair manifest with reference and candidate swapped (ratio and verdict
    recomputed, links re-hashed) passed validate and the report, turning a ratio r into 1/r."""
    from parity.errors import ParityError
    from parity.manifest import read_manifest, write_manifest as write
    from parity.stats import pair_problems

    ref, cand = trial(10.0), trial(9.95, system="flame")
    (tmp_path / "reuse.json").write_text("{}")
    for name, doc in (("ref.json", ref), ("cand.json", cand)):
        doc["trace"] = {"path": "reuse.json", "sha256": sha256_file(tmp_path / "reuse.json")}
        write_manifest(tmp_path / name, doc)
    with pytest.raises(ParityError, match="candidate is the path under test"):
        write_pair(tmp_path / "pair.json", 0, (tmp_path / "cand.json", cand), (tmp_path / "ref.json", ref))
    pair = write_pair(tmp_path / "pair.json", 0, (tmp_path / "ref.json", ref), (tmp_path / "cand.json", cand))
    pair["reference"], pair["candidate"] = pair["candidate"], pair["reference"]
    pair["ratio"] = 10.0 / 9.95
    write(tmp_path / "pair.json", pair)
    (problem,) = pair_problems(tmp_path / "pair.json", read_manifest(tmp_path / "pair.json"))
    assert "candidate is the path under test" in problem[1]
