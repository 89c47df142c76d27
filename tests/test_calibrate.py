"""Calibration: the least-squares fit recovers known parameters, and the committed fit is within 10%."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import yaml

from parity import smoke_inputs
from parity.engine import EngineArgs
from parity.engine.calibrate import calibrate, nnls, predicted_duration, work_totals
from parity.engine.sim import DEFAULT_PARAMS, SimParams
from parity.errors import ParityError
from parity.trace import TraceSpec, build_trace, load_trace


def test_nnls_keeps_coefficients_non_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # the unconstrained slope is negative
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0.0 and x[0] == pytest.approx(2.0)


def test_fit_recovers_known_parameters(tmp_path):
    corpus = smoke_inputs.write_corpus(tmp_path / "c.jsonl", articles=300)
    tok = smoke_inputs.train_tokenizer(corpus, tmp_path / "tok", vocab_size=2048)
    specs = [("a", 16, 1, 2000), ("b", 16, 4, 2000), ("c", 16, 1, 600), ("d", 64, 1, 64), ("e", 8, 1, 4000)]
    truth = dataclasses.replace(SimParams.load(), fixed_s=0.02, prefill_token_s=2e-5, decode_seq_s=1e-4,
                                attention_pair_s=6e-9, frontend_request_s=8e-4)
    runs = []
    for name, docs, q, prefix in specs:
        path = build_trace(TraceSpec(name, docs, q, prefix), corpus, tok, tmp_path / "traces")
        trace = load_trace(path)
        for engine in ("vllm-sync", "vllm-async"):
            totals = work_totals(list(trace.prompts), None, truth, EngineArgs(), sync=engine == "vllm-sync")
            runs.append({"trace": name, "trace_sha256": trace.sha256, "engine": engine, "batch": None,
                         "requests": len(trace.prompts), "duration_s": predicted_duration(totals, truth)})
    measurements = tmp_path / "m.json"
    measurements.write_text(json.dumps({"runs": runs, "kv_cache_tokens": truth.kv_cache_tokens}))
    fitted, report = calibrate(measurements, tmp_path / "traces", SimParams.load())
    assert all(abs(r["error"]) < 1e-6 for r in report)
    assert fitted.prefill_token_s == pytest.approx(2e-5, rel=1e-3)
    assert fitted.frontend_request_s == pytest.approx(8e-4, rel=1e-3)


def test_committed_calibration_is_within_ten_percent_on_both_study_traces():
    doc = yaml.safe_load(DEFAULT_PARAMS.read_text())
    study = [r for r in doc["fit_report"] if r["trace"] in ("no-reuse", "reuse")]
    assert {(r["trace"], r["engine"]) for r in study} >= {("no-reuse", "vllm-sync"), ("reuse", "vllm-sync"),
                                                          ("no-reuse", "vllm-async"), ("reuse", "vllm-async")}
    assert all(abs(r["error"]) <= 0.10 for r in study)
    assert all(r["measured_cached"] == pytest.approx(r["predicted_cached"], abs=0.005) for r in study)


GOOD_RUN = {"trace": "reuse", "trace_sha256": "0" * 64, "engine": "vllm-sync", "batch": None, "requests": 4,
            "duration_s": 1.5}


@pytest.mark.parametrize("doc, says", [
    ([1, 2], "not a JSON object but list"),
    ({"what": "no runs"}, "expected a `runs` list, got NoneType"),
    ({"runs": "x"}, "expected a `runs` list, got str"),
    ({"runs": ["x"]}, "runs[0]: expected an object, got str"),
    ({"runs": [{"trace": "reuse"}]}, "runs[0]: missing trace_sha256"),
    ({"runs": [GOOD_RUN | {"duration_s": "slow"}]}, "runs[0]: duration_s must be a positive number, got 'slow'"),
    ({"runs": [GOOD_RUN | {"requests": 0}]}, "runs[0]: requests must be a positive number, got 0"),
    ({"runs": [GOOD_RUN | {"engine": 7}]}, "runs[0]: engine must be a string, got 7"),
    ({"runs": [GOOD_RUN | {"batch": "all"}]}, "runs[0]: batch must be a positive integer or null, got 'all'"),
    ({"runs": [GOOD_RUN], "kv_cache_tokens": "lots"}, "kv_cache_tokens must be an integer from 1 to"),
    # an outsider's (2026-12-07): each was accepted, fitted and written, or a traceback
    ({"runs": [GOOD_RUN], "kv_cache_tokens": 10**30}, "kv_cache_tokens must be an integer from 1 to 2,147,483,647"),
    ({"runs": [GOOD_RUN | {"engine": "banana"}]}, "runs[0]: engine must be one of vllm-sync, vllm-async"),
    ({"runs": [GOOD_RUN | {"duration_s": 1e-300}]}, "runs[0]: duration_s must be from 0.001 to 1,000,000 seconds"),
    ({"runs": [GOOD_RUN | {"cached_share": "x"}]}, "runs[0]: cached_share must be a number from 0 to 1"),
    ({"runs": [GOOD_RUN | {"cached_share": 7.5}]}, "runs[0]: cached_share must be a number from 0 to 1"),
    ({"runs": [GOOD_RUN | {"trace": "../tr/t1"}]}, "runs[0]: trace must name a trace in --traces"),
])
def test_bad_measurements_are_one_line_naming_run_and_key(tmp_path, doc, says):
    measurements = tmp_path / "m.json"
    measurements.write_text(json.dumps(doc))
    with pytest.raises(ParityError) as err:
        calibrate(measurements, tmp_path, SimParams.load())
    assert str(err.value).startswith(f"{measurements}: ") and says in str(err.value)


def test_measurements_that_are_not_json_are_one_line(tmp_path):
    measurements = tmp_path / "m.json"
    measurements.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ParityError, match="not valid JSON"):
        calibrate(measurements, tmp_path, SimParams.load())


def test_a_fit_past_a_sane_bound_writes_nothing(tmp_path):
    """`sim calibrate` checked its fit against nothing while reading a file checks PARAM_BOUNDS: a fit it wrote
    could not be read back. Now nothing is written and the one line says which value and why."""
    from parity.engine.calibrate import write_params

    out = tmp_path / "fitted.yaml"
    fitted = dataclasses.replace(SimParams.load(), fixed_s=1e6)
    with pytest.raises(ParityError, match=r"the fit is unusable, .*fitted.yaml not written: simulator parameter "
                                          r"fixed_s must be at most 3600.0 s a step"):
        write_params(out, fitted, [], tmp_path / "m.json")
    assert not out.exists()
    write_params(out, SimParams.load(), [], tmp_path / "m.json")
    assert SimParams.load(out).fixed_s == SimParams.load().fixed_s


def test_a_run_stating_more_requests_than_its_trace_holds_is_refused(tmp_path, small_reuse_trace):
    """100,000 requests stated of a 4-request trace were reported as measured requests/s (an outsider's)."""
    from parity.trace import load_trace

    trace = load_trace(small_reuse_trace)
    run = GOOD_RUN | {"trace": small_reuse_trace.stem, "trace_sha256": trace.sha256,
                      "requests": len(trace.prompts) + 1}
    measurements = tmp_path / "m.json"
    measurements.write_text(json.dumps({"runs": [run]}))
    with pytest.raises(ParityError, match=f"states {len(trace.prompts) + 1} requests, the trace holds "
                                          f"{len(trace.prompts)}"):
        calibrate(measurements, small_reuse_trace.parent, SimParams.load())
