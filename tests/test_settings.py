"""One route for settings: the JSON an experiment or an MLPerf arm receives is checked against the same
schema as the workflow config, and an unknown key, a wrong type or a range error is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from parity.cli import main
from parity.errors import ParityError
from parity.backend import Backend
from parity.flame.settings import FlameSettings
from parity.experiments.settings import SustainedSettings
from parity.workflow_config import check_experiment_settings, experiment_names, schema

SIM = json.dumps({"engine": "sim", "gpus": ["sim-0", "sim-1"], "cluster": "standin"})


def test_experiment_names_come_from_the_schema():
    assert experiment_names() == ["confirmation", "locality", "admission", "gc", "offline-limit", "routing",
                                  "sustained"]  # the report's order
    assert set(schema()["properties"]["experiments"]["required"]) == set(experiment_names())


@pytest.mark.parametrize("name, settings, named", [
    ("gc", {"flame": {"batch_limt": 64}}, "batch_limt"),
    ("gc", {"repeats": "3"}, "repeats"),
    ("gc", {"repeats": 0}, "repeats"),
    ("confirmation", {"pairs": "five"}, "pairs"),
    ("confirmation", {"flame": {"order": "random"}}, "flame.order"),
    ("confirmation", {"shards": 3}, "shards"),
    ("confirmation", {"flame_arms": {"harvest": {"mode": "stream"}}}, "flame_arms.harvest.mode"),
    ("confirmation", {"flame_arms": {"Harvest-1": {"mode": "harvest"}}}, "flame_arms"),
    ("admission", {"batch_windows": [[32, 2]], "selected": {}, "stage_pair": 3}, "stage_pair"),
    ("admission", {"batch_windows": [["32", 2]], "selected": {}}, "batch_windows.0.0"),
    ("offline-limit", {"shards": True}, "shards"),
    ("locality", [], "locality: [] is not of type 'object'"),
])
def test_bad_settings_are_refused_by_name(name, settings, named):
    with pytest.raises(ParityError) as error:
        check_experiment_settings(name, settings)
    assert named in str(error.value) and "\n" not in str(error.value)


def test_the_study_settings_pass():
    import yaml

    study = yaml.safe_load(open("config/experiments.yaml"))["experiments"]
    for name, settings in study.items():
        check_experiment_settings(name, settings)


def test_an_unknown_flame_setting_is_refused():
    with pytest.raises(ParityError, match="batch_limt"):
        FlameSettings.from_dict({"batch_limt": 64})
    assert FlameSettings.from_dict({"batch_limit": 64}).batch_limit == 64


def test_from_dict_checks_each_value_once(monkeypatch):
    """A config's values are type-checked once, where the object is built (__post_init__), not again by from_dict."""
    import parity.settings as base

    seen = []
    real = base._fits
    monkeypatch.setattr(base, "_fits", lambda value, allowed: seen.append(value) or real(value, allowed))
    FlameSettings.from_dict({"batch_limit": 77})
    assert seen.count(77) == 1
    with pytest.raises(ParityError, match="Flame setting batch_limit must be an integer, got 'x'"):
        FlameSettings.from_dict({"batch_limit": "x"})


@pytest.mark.parametrize("build, named", [
    (lambda: FlameSettings(express="yes"), "Flame setting express must be true or false, got 'yes'"),
    (lambda: FlameSettings(batch_limit=32.5), "Flame setting batch_limit must be an integer"),
    (lambda: FlameSettings(window_ms=float("nan")), "Flame setting window_ms must be a number"),
    (lambda: FlameSettings(window_ms=10**400), "Flame setting window_ms must be a number"),  # past every float
])
def test_settings_built_directly_are_checked_as_from_dict_checks_them(build, named):
    """An adapter or a test that builds a settings object by hand gets the same one-line refusal as a config."""
    with pytest.raises(ParityError, match=named.replace("(", r"\(")):
        build()
    assert FlameSettings(window_ms=2).window_ms == 2.0 and isinstance(FlameSettings(window_ms=2).window_ms, float)


@pytest.mark.parametrize("values, named", [
    ({"gpus": "sim-0"}, "gpus"), ({"engine": "vllm-sync"}, "engine"), ({"warmup_rounds": -1}, "warmup_rounds"),
    ({"gpu": ["sim-0"]}, "gpu"), ({"engine_args": []}, "engine_args"),
    ({"startup_timeout_s": float("nan")}, "startup_timeout_s: must be a finite number"),  # an outside tester's:
    ({"startup_timeout_s": float("inf")}, "startup_timeout_s: must be a finite number"),  # a NaN waited for ever
    # JSON Schema counts 2.0 as an integer: it passed, then range() failed inside the trial (an outsider's, 2026-12-07)
    ({"warmup_rounds": 2.0}, "backend warmup_rounds: 2.0 is not of type 'integer'"),
    ({"engine_cpus": 2.0}, "backend engine_cpus: 2.0 is not of type 'integer'"),
])
def test_a_bad_backend_is_refused_by_name(values, named):
    with pytest.raises(ParityError) as error:
        Backend.from_dict(values)
    assert named in str(error.value)


@pytest.mark.parametrize("settings, named", [
    ({"rates": [4], "bounded": {"orphan_s": float("nan")}}, "sustained bounded.orphan_s: must be a finite number, got nan"),
    ({"rates": {"reuse-640": [4.0, float("inf")]}}, "sustained rates.reuse-640[1]: must be a finite number, got inf"),
])
def test_a_non_finite_experiment_setting_is_refused_by_its_path(settings, named):
    """The schema passes NaN and infinity (no minimum fails for NaN); the one check every route shares says the key."""
    with pytest.raises(ParityError) as error:
        check_experiment_settings("sustained", settings)
    assert str(error.value) == named


@pytest.mark.parametrize("bounded, named", [
    ({"headroom": 1e308}, "bounded.headroom: 1e+308 is greater than the maximum of 1000"),
    ({"headroom": 1e-308}, "bounded.headroom: 1e-308 is less than the minimum of 0.001"),
    ({"seed_tokens_per_s": 1e308}, "bounded.seed_tokens_per_s: 1e+308 is greater than the maximum of 1000000000.0"),
    ({"alpha": 1e-308}, "bounded.alpha: 1e-308 is less than the minimum of 1e-06"),
    ({"cold_sd_s": 1e160}, "bounded.cold_sd_s: 1e+160 is greater than the maximum of 3600"),
])
def test_bounded_settings_past_what_the_fit_holds_are_refused(bounded, named):
    """An outsider's, 2026-12-07: each of these passed the schema and crashed after two trials (NaN in a manifest, a
    ZeroDivisionError or an OverflowError in the fit); the schema and the settings class both bound them now."""
    from parity.admission import BoundedSettings

    with pytest.raises(ParityError) as error:
        check_experiment_settings("sustained", {"rates": [4], "bounded": bounded})
    assert str(error.value) == f"sustained {named}"
    with pytest.raises(ParityError, match=f"admission setting {next(iter(bounded))} must be"):
        BoundedSettings(**bounded)


@pytest.mark.parametrize("settings", ['{"flame": {"batch_limt": 64}}', '{"repeats": "x"}', '[1]', 'not json'])
def test_experiment_run_refuses_bad_settings_before_anything_runs(tmp_path, small_reuse_trace, settings):
    out = tmp_path / "gc"
    result = CliRunner().invoke(main, ["experiment", "run", "gc", "--trace", str(small_reuse_trace),
                                       "--backend", SIM, "--settings", settings, "--out", str(out)])
    assert result.exit_code == 1 and result.output.startswith("Error: ")
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("content", ["", "# nothing\n", "null\n"])
def test_an_empty_backend_file_is_refused_not_read_as_every_default(tmp_path, content):
    """An outside tester's, 2026-12-06: an empty (or `null`) --backend file ran on the simulator's defaults with
    rc 0, so a backend file cut short on a GPU host would run simulated without a word; `{}` stays every default."""
    path = tmp_path / "backend.yaml"
    path.write_text(content)
    with pytest.raises(ParityError, match="backend: .*backend.yaml: empty"):
        Backend.parse(str(path))
    assert Backend.parse("{}") == Backend()


def test_a_backend_file_that_is_a_named_pipe_is_refused_never_waited_on(tmp_path):
    """An outside tester's, 2026-12-06: `experiment run --backend FIFO` hung for ever."""
    import os

    os.mkfifo(tmp_path / "backend.yaml")
    with pytest.raises(ParityError, match="not a regular file"):
        Backend.parse(str(tmp_path / "backend.yaml"))


def test_a_backends_missing_simulator_file_is_refused_before_anything_runs(tmp_path, small_reuse_trace):
    """An outside tester's, 2026-12-06: a sim_params file missing (or a folder, or not YAML) was read only by each
    started shard, leaving a half-written --out and a two-line error."""
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["experiment", "run", "offline-limit", "--trace", str(small_reuse_trace),
                                       "--backend", json.dumps({"engine": "sim", "sim_params": str(tmp_path / "nope.yaml")}),
                                       "--out", str(out)])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: simulator parameters not found: {tmp_path / 'nope.yaml'}"]
    assert not out.exists()


def test_mlperf_run_takes_the_backend_or_the_flags_not_both(tmp_path):
    dataset = tmp_path / "d.json"
    dataset.write_text("[]")
    done = subprocess.run([sys.executable, "-m", "parity", "mlperf", "run", "--arm", "standalone", "--dataset",
                           str(dataset), "--out", str(tmp_path / "o"), "--backend", SIM, "--engine", "sim",
                           "--model", "m"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--backend sets --engine, --model already" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_local_model_folder_is_passed_by_its_absolute_path(tmp_path, monkeypatch):
    """Flame's workers start in their executors' folders: a relative model folder would not be found there."""
    (tmp_path / "resources" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert Backend.from_dict({"model": "resources/model"}).model == str(tmp_path / "resources" / "model")
    assert Backend.from_dict({"model": "meta-llama/Llama-3.1-8B-Instruct"}).model == "meta-llama/Llama-3.1-8B-Instruct"


def test_a_number_past_every_float_and_a_selection_the_screens_cannot_run_are_one_line():
    """Found by an outsider: a 401-digit rate was an OverflowError traceback; an admission `selected` in the harvest
    mode was refused for an api the user had not written (the API screen runs the selection with sync too)."""
    from pathlib import Path

    from parity.experiments import plan
    from parity.experiments.settings import AdmissionSettings, SustainedSettings

    with pytest.raises(ParityError, match=r"^sustained rates\[0\] must be a number, got 1000"):
        SustainedSettings.from_dict({"rates": [10**400]})
    settings = AdmissionSettings.from_dict({"batch_windows": [[32, 2]], "selected": {"mode": "harvest", "api": "async"}})
    with pytest.raises(ParityError, match=r"^admission: selected \{'mode': 'harvest', 'api': 'async'\} cannot run the "
                                          r"API screen, which runs it with api sync and async: .*needs api async"):
        plan.admission([Path("reuse.json")], settings)


@pytest.mark.parametrize("build, named", [
    (lambda: FlameSettings.from_dict({"batch_limit": 10**23}),
     "Flame setting batch_limit must be an integer within 64 bits"),
    (lambda: SustainedSettings.from_dict({"rates": [30], "evict": {"cache_blocks": 10**23}}),
     "sustained evict cache_blocks must be an integer within 64 bits"),
    (lambda: SustainedSettings.from_dict({"rates": [30], "schedule": {"seed": -(2**63)}}),
     "sustained schedule setting seed must be an integer within 64 bits"),
])
def test_an_integer_past_64_bits_is_refused_by_name_before_anything_runs(build, named):
    """Found by an outsider: cache_blocks 1e23 ran two trials, then failed inside a worker (OverflowError: cannot fit
    'int' into an index-sized integer), naming no key."""
    with pytest.raises(ParityError, match=named):
        build()


def test_a_key_given_twice_is_refused_in_json_and_yaml_alike(tmp_path):
    """Python's json and PyYAML keep the last of a key given twice, where a manifest's reader refuses it (an
    outsider's, 2026-12-07: --backend '{"engine": "vllm", "engine": "sim"}' ran the simulator)."""
    from parity.workflow_config import experiment_settings, parse_yaml

    with pytest.raises(ParityError, match="duplicate key"):
        Backend.parse('{"engine": "vllm", "engine": "sim"}')
    backend = tmp_path / "backend.yaml"
    backend.write_text("engine: sim\nengine: vllm\n")
    with pytest.raises(ParityError, match="duplicate key 'engine' at line 2"):
        Backend.parse(str(backend))
    with pytest.raises(ParityError, match="duplicate key"):
        experiment_settings("gc", '{"repeats": 1, "repeats": 2}')
    merged = parse_yaml("base: &b {a: 1, b: 2}\nover: {<<: *b, a: 3}\n")  # a merge's keys may be overridden
    assert merged["over"] == {"a": 3, "b": 2}


def test_a_kv_cache_smaller_than_a_prompt_is_refused_before_any_trial(tmp_path, small_reuse_trace):
    """An outsider's, 2026-12-07: `evict: {cache_blocks: 1}` ran the ladder's first pair, then the evict pair's engine
    stalled (a waiting request cannot fit in the KV cache); it is refused with the prompt that does not fit now."""
    out = tmp_path / "sustained"
    result = CliRunner().invoke(main, ["experiment", "run", "sustained", "--trace", str(small_reuse_trace),
                                       "--backend", SIM, "--settings", '{"rates": [5], "evict": {"cache_blocks": 1}}',
                                       "--out", str(out)])
    assert result.exit_code == 1 and "does not fit the KV cache of cache_blocks 1 x 16 tokens = 16" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
