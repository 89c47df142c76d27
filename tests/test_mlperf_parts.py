"""The MLPerf control's pieces without LoadGen runs: log parsing, ROUGE and gates, sampling pass-through."""

from __future__ import annotations

import json

import pytest

from parity.engine import SAMPLING, EngineArgs
from parity.engine.sim import SimEngine, output_tokens
from parity.mlperf import accuracy
from parity.mlperf.logs import parse_detail, parse_summary

VALID = """================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Offline
Mode     : PerformanceOnly
Samples per second: 53.3812
Tokens per second: 6832.79
Result is : VALID
  Min duration satisfied : Yes
  Min queries satisfied : Yes
  Early stopping satisfied: Yes

================================================
Additional Stats
================================================
Min latency (ns)                : 4860147

No warnings encountered during test.

No errors encountered during test.
"""

INVALID = """================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Offline
Mode     : PerformanceOnly
Samples per second: 1622.09
Tokens per second: 6488.34
Result is : INVALID
  Min duration satisfied : NO
  Min queries satisfied : Yes
  Early stopping satisfied: Yes
Recommendations:
 * Increase expected QPS so the loadgen pre-generates a larger (coalesced) query.

================================================
Additional Stats
================================================
"""


def test_summary_valid():
    s = parse_summary(VALID)
    assert s["validity"] == "VALID" and s["min_duration_met"] and s["min_queries_met"] and s["early_stopping_met"]
    assert s["samples_per_second"] == 53.3812 and s["tokens_per_second"] == 6832.79
    assert s["recommendations"] == [] and s["no_errors"] and s["mode"] == "PerformanceOnly"


def test_summary_invalid_names_why():
    s = parse_summary(INVALID)
    assert s["validity"] == "INVALID" and s["min_duration_met"] is False and s["min_queries_met"] is True
    assert s["recommendations"] == ["Increase expected QPS so the loadgen pre-generates a larger (coalesced) query."]


def test_detail_values_and_errors():
    lines = [":::MLLOG " + json.dumps({"key": k, "value": v, "metadata": m}) for k, v, m in (
        ("result_validity", "VALID", {}), ("effective_min_duration_ms", 600000, {}),
        ("error_runtime", "QuerySamplesComplete with n_tokens 1", {"is_error": True}),
        ("generated_samples_per_query", 40104, {}))]
    d = parse_detail("\n".join(["noise", *lines]))
    assert d["values"]["generated_samples_per_query"] == 40104 and d["values"]["effective_min_duration_ms"] == 600000
    assert d["errors"] == ["error_runtime: QuerySamplesComplete with n_tokens 1"]


def test_rouge_known_values():
    scores = accuracy.rouge(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert scores == {"rouge1": 83.3333, "rouge2": 60.0, "rougeL": 83.3333, "rougeLsum": 83.3333,
                      "gen_len": 22, "gen_num": 1}


def test_rouge_lsum_uses_the_newline_split():
    """Two sentences in swapped order: rougeL sees one sequence (LCS 3 of 6), rougeLsum each line."""
    splitter = accuracy.untrained_punkt_splitter()
    pred = accuracy.postprocess([" Cats sit here. Dogs run there. "], splitter)
    ref = accuracy.postprocess(["Dogs run there. Cats sit here."], splitter)
    assert pred == ["Cats sit here.\nDogs run there."]
    scores = accuracy.rouge(pred, ref)
    assert scores["rougeL"] == 50.0 and scores["rougeLsum"] == 100.0 and scores["gen_len"] == 30


def test_gates_official_and_scaled():
    good = {"rouge1": 38.78, "rouge2": 15.91, "rougeL": 24.5, "rougeLsum": 35.79, "gen_len": 8_167_644}
    verdicts, basis = accuracy.gates(good, 13_368)
    assert basis == "official" and all(g["passed"] for g in verdicts.values())
    assert verdicts["gen_len"]["min"] == 7_350_880 and verdicts["gen_len"]["max"] == 8_984_408
    low = dict(good, rouge2=15.7, gen_len=610)  # 1,000 samples: the length bounds scale to 549.9-672.1 k chars
    verdicts, basis = accuracy.gates(low, 1000)
    assert basis == "scaled-subset" and not verdicts["rouge2"]["passed"] and not verdicts["gen_len"]["passed"]
    assert accuracy.gates(dict(good, gen_len=611_000), 1000)[0]["gen_len"]["passed"]


def test_accuracy_log_keeps_one_entry_per_sample(tmp_path):
    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text(json.dumps([{"seq_id": 0, "qsl_idx": 2, "data": "0500000006000000", "token_count": 2},
                               {"seq_id": 1, "qsl_idx": 2, "data": "07000000", "token_count": 1},
                               {"seq_id": 2, "qsl_idx": 0, "data": "ffffff7f", "token_count": 1}]))
    out = accuracy.read_accuracy_log(log)
    assert sorted(out) == [0, 2] and out[2].tolist() == [5, 6] and out[0].tolist() == [2**31 - 1]


def test_default_sampling_is_the_study_s():
    assert EngineArgs().sampling() == SAMPLING


def test_sim_emits_max_tokens_and_keeps_the_first_16():
    prompt = list(range(1, 300))
    long = output_tokens(prompt, 128_256, 128)
    assert len(long) == 128 and long[:16] == output_tokens(prompt, 128_256)
    assert output_tokens(prompt, 128_256, 40) == long[:40]
    engine = SimEngine(EngineArgs(max_tokens=128, ignore_eos=False, enable_prefix_caching=False))
    (completion,) = engine.generate([prompt])
    assert completion.output_token_ids == long


def test_vllm_mapping_accepts_mlperf_lengths():
    from types import SimpleNamespace

    from parity.engine import vllm_compat as compat
    from parity.errors import ParityError

    def output(n):
        return SimpleNamespace(request_id="r", prompt_token_ids=[1, 2], num_cached_tokens=0,
                               outputs=[SimpleNamespace(token_ids=list(range(n)), finish_reason="stop")])

    mlperf = EngineArgs(max_tokens=128, ignore_eos=False).sampling()
    assert len(compat.to_completion(output(37), 0, 1, mlperf).output_token_ids) == 37
    with pytest.raises(ParityError, match="1 to 128"):
        compat.to_completion(output(0), 0, 1, mlperf)
    with pytest.raises(ParityError, match="expected 16"):
        compat.to_completion(output(37), 0, 1)


def truncated_run(tmp_path, **fields):
    """A run manifest that says what it is but lacks the rest (tampered or cut short)."""
    from parity.manifest import header

    path = tmp_path / "mlperf-run.json"
    path.write_text(json.dumps(header("mlperf", simulated=True) | {"step": "run", "versions": {}} | fields))
    return path


def test_compare_refuses_a_truncated_run_in_one_line(tmp_path):
    from parity.errors import ParityError
    from parity.mlperf.compare import compare

    run = truncated_run(tmp_path, arm="standalone")
    with pytest.raises(ParityError) as err:
        compare(run, run, tmp_path / "compare.json")
    assert str(err.value).startswith(f"not a valid run manifest: {run}: ") and "\n" not in str(err.value)
    assert not (tmp_path / "compare.json").exists()


def test_accuracy_refuses_a_truncated_run_in_one_line(tmp_path):
    from parity.errors import ParityError

    run = truncated_run(tmp_path, mode="accuracy")
    with pytest.raises(ParityError) as err:
        accuracy.evaluate_run(run, tmp_path, tmp_path / "accuracy.json", accuracy.untrained_punkt_splitter())
    assert str(err.value).startswith(f"not a valid run manifest: {run}: ")
    assert not (tmp_path / "accuracy.json").exists()


@pytest.mark.parametrize("entries, says", [
    ({"qsl_idx": 0}, "is not a JSON list but dict"),
    ([{"qsl_idx": 0}], "entry 0 is not LoadGen's {qsl_idx, data} (KeyError"),
    ([{"qsl_idx": 0, "data": "zz"}], "entry 0 is not LoadGen's {qsl_idx, data} (ValueError"),
    ([{"qsl_idx": "first", "data": "01000000"}], "entry 0 is not LoadGen's {qsl_idx, data} (ValueError"),
    (["x"], "entry 0 is not LoadGen's {qsl_idx, data} (TypeError"),
])
def test_a_tampered_accuracy_log_is_one_line(tmp_path, entries, says):
    from parity.errors import ParityError

    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text(json.dumps(entries))
    with pytest.raises(ParityError) as err:
        accuracy.read_accuracy_log(log)
    assert says in str(err.value) and str(log) in str(err.value)


def test_accuracy_refuses_a_log_changed_since_the_run(tmp_path, monkeypatch):
    from parity.errors import ParityError

    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text('[{"qsl_idx": 0, "data": "01000000"}]')
    run = truncated_run(tmp_path, mode="accuracy",
                        logs={"mlperf_log_accuracy.json": {"path": log.name, "sha256": "0" * 64}})
    monkeypatch.setattr(accuracy, "validate_document", lambda doc, path: [])  # the rest of the run is not needed
    with pytest.raises(ParityError, match=f"^{log} changed since the run"):
        accuracy.evaluate_run(run, tmp_path, tmp_path / "accuracy.json", accuracy.untrained_punkt_splitter())


def test_a_run_spec_holds_a_backend_and_flame_settings_and_the_cli_reads_its_defaults():
    """RunSpec copies no field of Backend or FlameSettings; `parity mlperf run`'s defaults are read from its."""
    import dataclasses

    from click.testing import CliRunner

    from parity.backend import Backend
    from parity.cli import main
    from parity.flame.settings import FlameSettings
    from parity.mlperf.run import RunSpec, arm_backend, flame_settings

    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert {"backend", "flame"} <= fields
    copied = fields & ({f.name for f in dataclasses.fields(Backend)} | {f.name for f in dataclasses.fields(FlameSettings)})
    assert copied == {"mode"}  # LoadGen's mode (performance, accuracy), not Flame's
    spec = RunSpec(arm="flame", dataset="d.json", out="o")
    assert (spec.flame.batch_limit, spec.flame.window_ms, spec.flame.budget_mib) == (64, 2.0, 4)
    assert (spec.backend.engine, spec.backend.cluster, spec.backend.startup_timeout_s, spec.gpus) == (
        "sim", "standin", 600.0, ["sim-0"])
    help_text = " ".join(CliRunner().invoke(main, ["mlperf", "run", "--help"], terminal_width=200).output.split())
    for default in ("default: 64; x>=1", "default: 2.0; x>=0", "default: sim", "default: standin", "default: 600.0"):
        assert default in help_text
    # the API each worker drives follows the engine; the rest is the spec's
    for engine, api in (("sim", "sync"), ("vllm", "async"), ("vllm-sync", "sync"), ("vllm-async", "async")):
        flame = flame_settings(dataclasses.replace(spec, backend=Backend(engine=engine, gpus=("g",))))
        assert flame == dataclasses.replace(spec.flame, api=api)
    assert arm_backend(Backend(gpus=("sim-1", "sim-0"))).gpus == ("sim-1",)  # the first GPU serves


def test_compare_flags_arms_that_ran_on_different_cuts_of_one_dataset(tmp_path, monkeypatch):
    """An outsider's: one arm on 8 samples of the file, the other on all 64, compared with no flag but the labels."""
    from parity.mlperf import compare

    def doc(samples, tokens):
        return {"simulated": True, "mode": "performance", "engine": {"args": {"max_tokens": 16}},
                "dataset": {"file": {"sha256": "a" * 64}, "samples": samples, "prompt_tokens": tokens},
                "settings": {"mlperf_conf_sha256": "b" * 64, "user_conf_values": {"target_qps": 40.0}}}

    def summary():
        return {"manifest": {}, "vllm_version": None, "validity": "VALID", "compliant": True,
                "samples_per_second": 10.0, "tokens_per_second": 160.0, "duration_s": 1.0, "sample_count": 8}

    runs = {"standalone": (doc(8, 5534), summary()), "flame": (doc(64, 44896), summary())}
    monkeypatch.setattr(compare, "_run", lambda path, arm, out_dir: runs[arm])
    assert "sample sets differ: 8 samples of the dataset vs 64" in compare.compose(tmp_path, tmp_path, tmp_path)["flags"]
    runs["flame"] = (doc(8, 5534), summary())
    assert compare.compose(tmp_path, tmp_path, tmp_path)["flags"] == []
