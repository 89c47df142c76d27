"""The workflow as a reviewer meets it: the bare command gets the default profile, every profile dry-runs
on a machine without GPUs, Apptainer or sbatch, the linter is quiet, and configuration has one route.

Each test runs the real `snakemake` (dry runs) on a copy of the workflow's files in a temporary folder,
so nothing is written into the checkout.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import time
import sys
from pathlib import Path

import pytest
import yaml

from parity.backend import Backend

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "config", "schemas", "manifests")
SNAKEMAKE = shutil.which("snakemake", path=os.path.dirname(sys.executable)) or shutil.which("snakemake")
PROFILES = ("default", "slurm", "smoke", "host")

pytestmark = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed (the workflow extra)")


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The workflow's files, copied; the folder name has a space, as a reviewer's home folder may."""
    root = tmp_path / "a reviewer's copy"
    root.mkdir()
    for name in WORKFLOW_FILES:
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
    return root


def snakemake(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE")}
    # a machine without GPUs, Apptainer or sbatch: only this interpreter's folder and the basics on PATH
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    return subprocess.run([SNAKEMAKE, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def shell_commands(output: str) -> list[list[str]]:
    return [shlex.split(line.split("Shell command: ", 1)[1]) for line in output.splitlines()
            if line.startswith("Shell command: ") and not line.endswith("None")]


def edit_config(root: Path, name: str, change) -> None:
    path = root / "config" / f"{name}.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


def test_a_bare_invocation_gets_the_default_profile(checkout):
    if shutil.which("apptainer") or shutil.which("singularity"):
        pytest.skip("this machine has apptainer: the dry run would use it")
    run = snakemake(checkout, "-n", "-p", "--cores", "20", "all")
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stdout + run.stderr
    assert "Using workflow specific profile profiles/default" in log
    assert "config/default.yaml" in log  # the profile names its config
    assert "apptainer is not installed: only a dry run (-n) can go on" in log
    experiments = [c for c in shell_commands(log) if c[:3] == ["parity", "experiment", "run"]]
    assert len(experiments) == 7
    backend = experiments[0][experiments[0].index("--backend") + 1]
    assert '"engine":"vllm"' in backend and '"cluster":"flame"' in backend  # the default profile's backend


def test_a_real_run_without_apptainer_stops_before_any_job(checkout):
    if shutil.which("apptainer") or shutil.which("singularity"):
        pytest.skip("this machine has apptainer")
    run = snakemake(checkout, "--cores", "20", "all")
    assert run.returncode != 0
    assert "apptainer is not installed" in run.stderr
    assert not (checkout / "results").exists() and not (checkout / "resources").exists()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_dry_runs_without_gpus_apptainer_or_sbatch(checkout, profile):
    if profile == "slurm":
        pytest.importorskip("snakemake_executor_plugin_slurm", reason="the slurm extra is not installed")
    run = snakemake(checkout, "-n", "--workflow-profile", profile, "all")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert f"Using workflow specific profile profiles/{profile}" in run.stdout + run.stderr


def test_the_linter_reports_nothing(checkout):
    for profile in PROFILES:
        if profile == "slurm" and shutil.which("sbatch") is None:
            try:
                import snakemake_executor_plugin_slurm  # noqa: F401
            except ImportError:
                continue
        run = snakemake(checkout, "--lint", "--workflow-profile", profile)
        log = run.stdout + run.stderr
        assert run.returncode == 0 and "Lints for" not in log, log[-3000:]
        assert "Congratulations, your workflow is in a good condition!" in log


def test_every_shell_argument_is_quoted(checkout):
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "all", "--config", "results=results/a b")
    assert run.returncode == 0, run.stderr[-2000:]
    commands = shell_commands(run.stdout + run.stderr)
    assert len(commands) > 10
    words = [word for command in commands for word in command]
    assert any(word.startswith("results/a b/") for word in words)
    assert not any(word in ("b", "results/a") or word.startswith("b/") for word in words)


def test_a_nested_config_override_keeps_its_numbers_and_booleans(checkout):
    """Found by an outsider: Snakemake reads a nested --config value with YAML's BaseLoader, so ARTIFACT.md's own
    `--config fetch='{record_pins: true}'` was refused ('true' is not of type 'boolean'), as was any number in one."""
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "results/smoke/gc/experiment.json",
                    "--config", "fetch={record_pins: true}", 'experiments={"gc": {"flame": {"batch_limit": 64}}}')
    assert run.returncode == 0, run.stderr[-2000:]
    (command,) = [c for c in shell_commands(run.stdout + run.stderr) if c[:4] == ["parity", "experiment", "run", "gc"]]
    assert yaml.safe_load(command[command.index("--settings") + 1])["flame"]["batch_limit"] == 64
    bad = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all", "--config", "fetch={record_pins: maybe}")
    assert bad.returncode != 0 and "'maybe' is not of type 'boolean'" in bad.stdout + bad.stderr


def test_a_bad_config_key_or_profile_is_refused_in_a_line_that_names_it(checkout):
    """An outsider (2026-12-05): `--config sim_parms=x` was refused by name, then Snakemake printed the whole schema
    and config (about 2,000 lines); `--workflow-profile smok` said only that no profile config was loaded."""
    for override, said in (("sim_parms=x", "Additional properties are not allowed ('sim_parms' was unexpected) "
                                           "(at config;"),
                           ('experiments={"gc": {"repeats": "two"}}',
                            "'two' is not of type 'integer' (at config['experiments']['gc']['repeats'];")):
        bad = snakemake(checkout, "-n", "all", "--workflow-profile", "smoke", "--config", override)
        log = bad.stdout + bad.stderr
        assert bad.returncode != 0 and f"the workflow config is refused: {said}" in log, log[-2000:]
        assert len(log.splitlines()) < 12 and "Failed validating" not in log
    # a blank path (a --config value is stripped: a profile's file), in the words parity's own check says it with, not
    # jsonschema's "does not match '\\S'" (an outsider, 2026-12-07)
    (checkout / "blank.yaml").write_text('backend:\n  flame_bin_dir: " "\n')
    blank = snakemake(checkout, "-n", "all", "--workflow-profile", "smoke", "--configfile", "config/experiments.yaml",
                      "config/smoke.yaml", "blank.yaml")
    log = blank.stdout + blank.stderr
    assert blank.returncode != 0 and "the workflow config is refused: ' ' is blank: name it (or null) (at " \
        "config['backend']['flame_bin_dir'];" in log, log[-2000:]
    typo = snakemake(checkout, "-n", "all", "--workflow-profile", "smok")
    assert typo.returncode != 0 and "a profile is one of default, host, slurm, smoke)" in typo.stdout + typo.stderr


def test_a_confirmation_stage_the_plan_does_not_make_is_refused_before_any_job(checkout):
    """An outsider (2026-12-06): `stages: [final-expres3]` passed the dry run and every job before the confirmation's
    (hours on a GPU host), and only the confirmation's own log said why it failed."""
    for profile, stage, planned in (("host", "final-expres3", "final, final-harvest, final-express3"),
                                    ("smoke", "final-harvest", "final")):
        bad = snakemake(checkout, "-n", "all", "--workflow-profile", profile, "--config",
                        f"experiments={{confirmation: {{stages: [{stage}]}}}}")
        log = bad.stdout + bad.stderr
        assert bad.returncode != 0 and (f"experiments.confirmation.stages names '{stage}', not a stage of this plan "
                                        f"({planned})") in log, log[-2000:]
    clash = snakemake(checkout, "-n", "all", "--workflow-profile", "host", "--config",
                      "experiments={confirmation: {arms: [prefix], flame_arms: {prefix: {mode: harvest}}}}")
    assert clash.returncode != 0 and ("experiments.confirmation: flame_arms and arms both name 'prefix'"
                                      in clash.stdout + clash.stderr), (clash.stdout + clash.stderr)[-2000:]


def test_a_truncated_profile_config_does_not_fall_back_to_another(checkout):
    edit_config(checkout, "smoke", lambda doc: doc.pop("backend"))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert run.returncode != 0
    assert "'backend' is a required property" in run.stdout + run.stderr


def test_no_profile_config_is_refused_with_a_hint(checkout):
    run = snakemake(checkout, "-n", "--workflow-profile", "none", "--cores", "1", "all")
    assert run.returncode != 0
    assert "no profile config" in run.stdout + run.stderr


def test_a_misspelt_key_is_refused_by_name(checkout):
    edit_config(checkout, "smoke", lambda doc: doc["experiments"].update(gc={"flame": {"batch_limt": 64}}))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert run.returncode != 0
    assert "batch_limt" in run.stdout + run.stderr


@pytest.mark.parametrize("key, value", [("bounded", {"orphan_s": math.nan}), ("objective", {"ttft_s": math.inf})])
def test_a_non_finite_number_is_refused_by_name_before_any_job(checkout, key, value):
    """YAML's .nan and .inf pass the schema (no minimum fails for NaN): refused by the workflow, not by the job."""
    edit_config(checkout, "smoke", lambda doc: doc["experiments"]["sustained"].update({key: value}))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert run.returncode != 0
    name, number = next(iter(value.items()))
    assert f"experiments.sustained.{key}.{name}: must be a finite number, got {number!r}" in run.stdout + run.stderr


@pytest.mark.parametrize("where", ["backend", "trace", "confirmation", "head", "context"])
def test_a_whole_float_or_a_misspelt_trace_is_refused_before_any_job(checkout, where):
    """An outsider's, 2026-12-07: JSON Schema counts 2.0 as an integer, so `warmup_rounds: 2.0` or `documents: 64.0`
    passed the dry run and failed in a job (a traceback once engines had started); and a confirmation `pairs` key
    naming no trace was dropped without a word. Each is refused by name at parse time now."""
    def edit(doc):
        if where == "backend":
            doc["backend"]["warmup_rounds"] = 2.0
        elif where == "trace":
            doc["traces"][next(iter(doc["traces"]))]["documents"] = 64.0
        elif where == "confirmation":
            doc["experiments"].setdefault("confirmation", {})["pairs"] = {"reuse": 1, "reuze": 5}
        elif where == "head":  # the trace job refused it, after the inputs were fetched
            doc["traces"]["reuse"]["head_tokens"] = 5000
        else:
            doc["traces"]["reuse"]["prefix_tokens"] = 40000

    edit_config(checkout, "smoke", edit)
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    said = run.stdout + run.stderr
    assert run.returncode != 0
    assert {"backend": "backend.warmup_rounds: 2.0 is not of type 'integer'",
            "trace": ".documents: 64.0 is not of type 'integer'",
            "confirmation": "pairs names trace 'reuze' is none of the traces given",
            "head": "traces.reuse: head tokens must be 0..968 (leaving each document two cache blocks of its own)",
            "context": "traces.reuse: prefix_tokens 40000 and 16 new tokens do not fit the study's max_model_len 32768",
            }[where] in said, said[-2000:]


def test_a_profile_changes_one_key_and_keeps_the_study_settings_beside_it(checkout):
    edit_config(checkout, "smoke", lambda doc: doc["experiments"].update(gc={"flame": {"batch_limit": 64}}))
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "results/smoke/gc/experiment.json")
    assert run.returncode == 0, run.stderr[-2000:]
    (command,) = [c for c in shell_commands(run.stdout + run.stderr) if c[:4] == ["parity", "experiment", "run", "gc"]]
    settings = yaml.safe_load(command[command.index("--settings") + 1])
    assert settings["flame"] == {"batch_limit": 64, "window_ms": 10, "budget_mib": 4, "api": "async",
                                 "compress": True, "order": "arrival"}  # the study's order beside it


def test_mlperf_jobs_get_the_same_backend_as_the_experiments(checkout):
    edit_config(checkout, "smoke", lambda doc: doc["backend"].update(load_format="dummy",
                                                                     engine_args={"max_num_seqs": 32}))
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "all")
    assert run.returncode == 0, run.stderr[-2000:]
    commands = shell_commands(run.stdout + run.stderr)
    backends = {c[c.index("--backend") + 1] for c in commands if "--backend" in c}
    assert len(backends) == 1 and '"load_format":"dummy"' in backends.pop()
    assert sum(c[:3] == ["parity", "mlperf", "run"] for c in commands) == 3


def test_mlperf_flame_arms_and_their_settings_come_from_the_config(checkout):
    edit_config(checkout, "smoke", lambda doc: doc["mlperf"].update(flame_arms={"w5": {"batch_limit": 16,
                                                                                      "window_ms": 5}}))
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "mlperf")
    assert run.returncode == 0, run.stderr[-2000:]
    runs = {_option(c, "--out"): c for c in shell_commands(run.stdout + run.stderr) if c[:3] == ["parity", "mlperf", "run"]}
    flags = {os.path.basename(out): c[c.index("--arm"):c.index("--dataset")] for out, c in runs.items()}
    assert flags == {"standalone": ["--arm", "standalone"],  # the study's arms (config/experiments.yaml), then the profile's
                     "flame-b32": ["--arm", "flame", "--batch-limit", "32"],
                     "flame-b64": ["--arm", "flame", "--batch-limit", "64"],
                     "flame-w5": ["--arm", "flame", "--batch-limit", "16", "--window-ms", "5"]}
    assert jobs_of(run)["mlperf_compare"] == 3 and "results/smoke/mlperf/compare-w5.json" in run.stdout


def test_validation_depends_on_every_manifest_it_vouches_for(checkout):
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stdout
    block = log[log.index("rule all:"):].split("\n\n")[0]
    for name in ("locality", "admission", "confirmation", "gc", "offline-limit"):
        assert f"results/smoke/{name}/experiment.json" in block
    for path in ("results/smoke/report/report.json", "results/smoke/traces/reuse.json",
                 "results/smoke/mlperf/compare-b32.json"):
        assert path in block


def _finished_smoke_run(root: Path) -> None:
    """Every output of the smoke workflow present, each newer than its inputs (as after `make smoke`)."""
    import time

    r = "results/smoke"
    files = [f"{r}/inputs/corpus.jsonl", f"{r}/inputs/tokenizer/tokenizer.json", f"{r}/mlperf/cnn_eval-smoke.json"]
    files += [f"{r}/traces/{n}.{e}" for n in ("no-reuse", "reuse", "shared-head", "reuse-32") for e in ("json", "tokens")]
    files += [f"{r}/{n}/experiment.json" for n in ("locality", "admission", "confirmation", "gc", "offline-limit",
                                                   "routing", "sustained")]
    files += [f"{r}/mlperf/{a}/mlperf-run.json" for a in ("standalone", "flame-b32", "flame-b64")]
    files += [f"{r}/mlperf/compare-b{b}.json" for b in (32, 64)]
    files += [f"{r}/report/report.md", f"{r}/report/report.html", f"{r}/report/report.json"]
    start = time.time() + 1  # newer than every file of the copy, as outputs are after a run
    for offset, name in enumerate(files):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (start + offset, start + offset))


def jobs_of(run: subprocess.CompletedProcess) -> dict[str, int]:
    table = run.stdout.split("Job stats:")[1].split("\n\n")[0].splitlines()[3:]
    return {line.split()[0]: int(line.split()[1]) for line in table if line.strip() and line.split()[0] != "total"}


def test_all_validates_the_evidence_even_when_nothing_is_remade(checkout):
    _finished_smoke_run(checkout)
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert jobs_of(run) == {"all": 1}, run.stdout[-2000:]  # the validation of a finished run, every time


def test_a_deleted_experiment_is_run_again_and_revalidated(checkout):
    _finished_smoke_run(checkout)
    shutil.rmtree(checkout / "results/smoke/gc")
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    assert jobs_of(run) == {"experiment": 1, "report": 1, "all": 1}, run.stdout[-2000:]


def test_a_tree_that_fails_its_seal_keeps_no_bundle_of_an_earlier_one(checkout):
    """Found by an outsider: a failed seal removed run.json but left the last run's bundle, valid for that tree,
    beside a tree it no longer stands for."""
    _finished_smoke_run(checkout)  # empty manifests: the seal refuses them
    stale = checkout / "results/smoke-bundle"
    partial = checkout / "results/smoke-bundle.partial"  # a killed `parity bundle`'s whole bag (outside pass P)
    for folder in (stale, partial):
        folder.mkdir(parents=True)
        (folder / "bagit.txt").write_text("BagIt-Version: 1.0\n")
    run = snakemake(checkout, "--workflow-profile", "smoke", "all")
    assert run.returncode != 0 and "parity seal" in run.stdout + run.stderr, (run.stdout + run.stderr)[-2000:]
    assert not stale.exists() and not partial.exists() and not (checkout / "results/smoke/run.json").exists()


def test_a_run_that_changes_the_tree_first_removes_the_earlier_bundle(checkout):
    """Found by an outsider: a killed (or failed) report job left the last run's bundle beside a tree it no longer
    stood for. A run with nothing to do keeps it, as does a `--touch` that succeeds (it changes only times, which no
    bundle holds); a `--touch` that fails (Snakemake then removes the failed job's outputs) and a run that remakes
    anything remove it."""
    _finished_smoke_run(checkout)
    now = time.time()
    for path in checkout.rglob("*"):  # the finished tree and its inputs an hour back, their order kept: no
        if path.is_file():  # file newer than the clock, which Snakemake's --touch refuses (clock skew)
            os.utime(path, (path.stat().st_mtime - 3600, path.stat().st_mtime - 3600))
    stale = checkout / "results/smoke-bundle"
    stale.mkdir(parents=True)
    (stale / "bagit.txt").write_text("BagIt-Version: 1.0\n")
    report = "results/smoke/report/report.json"
    idle = snakemake(checkout, "--workflow-profile", "smoke", report)
    assert idle.returncode == 0 and stale.exists(), (idle.stdout + idle.stderr)[-2000:]
    reference = checkout / "config/study-reference.yaml"
    os.utime(reference, (now - 60, now - 60))  # newer than the report: the report is to be made again
    touched = snakemake(checkout, "--touch", "--workflow-profile", "smoke", report)
    assert touched.returncode == 0 and stale.exists(), (touched.stdout + touched.stderr)[-2000:]
    reference.write_text(reference.read_text() + "# changed\n")
    os.utime(reference, (now + 60, now + 60))  # newer than the clock: the touch fails, the report's outputs go
    failed = snakemake(checkout, "--touch", "--workflow-profile", "smoke", report)
    assert failed.returncode != 0 and not stale.exists(), (failed.stdout + failed.stderr)[-2000:]
    stale.mkdir(parents=True)
    (stale / "bagit.txt").write_text("BagIt-Version: 1.0\n")
    os.utime(reference, (time.time(), time.time()))
    run = snakemake(checkout, "--workflow-profile", "smoke", report)
    assert run.returncode != 0 and "rule report" in run.stdout + run.stderr, (run.stdout + run.stderr)[-2000:]
    assert not stale.exists()


@pytest.mark.parametrize("results", ["results/../../victim", "results/smoke/", "results/", "results/a/../../b"])
def test_a_results_folder_outside_results_is_refused_before_anything_is_removed(checkout, results):
    """Found by an outsider: `results: results/../../victim` passed the schema, and the run's start removed the
    folder victim-bundle beside the checkout. A results path that climbs out or ends in a slash is refused."""
    victim = checkout.parent / "victim-bundle"
    victim.mkdir()
    run = snakemake(checkout, "--workflow-profile", "smoke", "--config", f"results={results}", "--until", "trace")
    assert run.returncode != 0 and "results" in run.stderr, run.stderr[-2000:]
    assert victim.exists()

@pytest.mark.parametrize("results, file, said", [
    ("results/afile", "results/afile", "results: results/afile is a file, not a folder"),
    ("results/afile/run", "results/afile", "results: results/afile is a file, not a folder"),
    ("results/rt", "results/rt/traces", "results: results/rt/traces is a file, not a folder (where the workflow "
                                        "makes its traces folder)")])
def test_a_results_folder_that_is_a_file_is_refused_in_a_line(checkout, results, file, said):
    """An outside tester's (2026-12-06): a `results` that is a file, or holds a file where the workflow makes a
    folder, ended in a 67-line Snakemake traceback."""
    (checkout / file).parent.mkdir(parents=True, exist_ok=True)
    (checkout / file).write_text("hi\n")
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all", "--config", f"results={results}")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and said in log, log[-2000:]
    assert len(log.splitlines()) < 12, log


def test_a_lock_left_by_a_killed_run_names_its_remedy_first(checkout):
    """`kill -9` of Snakemake leaves its lock (.snakemake/locks: the files it was making, one a line); the rerun's
    refusal begins with the remedy, Snakemake's own message after it."""
    locks = checkout / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("results/smoke/traces/reuse.json\n")
    run = snakemake(checkout, "--touch", "--workflow-profile", "smoke", "all")  # --touch: were it not refused, nothing runs
    error = run.stderr[run.stderr.index("Building DAG of jobs...\n"):].splitlines()[1:]
    assert run.returncode != 0 and "`snakemake --unlock`" in error[0], run.stderr[-2000:]
    assert error[1:3] == ["LockException:", "Error: Directory cannot be locked. Please make sure that no other "
                          "Snakemake process is trying to create the same files in the following directory:"]
    dry = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")  # goes on, and says so the same way
    said = (dry.stdout + dry.stderr).splitlines()
    at = said.index("Error: Directory cannot be locked. Another Snakemake instance is running.")
    assert dry.returncode == 0 and "`snakemake --unlock`" in said[at - 1]
    assert snakemake(checkout, "--unlock", "--workflow-profile", "smoke").returncode == 0 and not locks.exists()


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _values(command: list[str], name: str) -> list[str]:
    """Every value of an option given more than once (--trace A --trace B)."""
    return [value for word, value in zip(command, command[1:]) if word == name]


def test_the_host_profile_runs_the_offline_limit_on_real_vllm_with_dummy_weights(checkout):
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "host", "offline_limit")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert jobs_of(run) == {"smoke_inputs": 1, "trace": 2, "dummy_model": 1, "experiment": 1, "offline_limit": 1}
    commands = shell_commands(run.stdout + run.stderr)
    (command,) = [c for c in commands if c[:4] == ["parity", "experiment", "run", "offline-limit"]]
    backend = yaml.safe_load(_option(command, "--backend"))
    model = checkout / "results/host/model/llama31-8b-dummy"
    assert backend == {"engine": "vllm", "gpus": ["auto"], "cluster": "flame", "flame_bin_dir": None,
                       "model": str(model), "load_format": "dummy", "warmup_rounds": 2,
                       "engine_cpus": 2}  # ours, on in the host profile since session 14 (config/host.yaml)
    assert yaml.safe_load(_option(command, "--settings")) == {"shards": 2}
    assert _values(command, "--trace") == ["results/host/traces/no-reuse.json", "results/host/traces/reuse.json"]
    (copy,) = [c for c in commands if c[0] == "cp"]
    assert copy[1:3] == ["config/models/llama31-8b-config.json", "results/host/model/llama31-8b-dummy/config.json"]
    assert (checkout / copy[1]).is_file()  # the committed Llama 3.1 8B shape


def test_the_host_ladders_newest_arm_runs_first_through_the_workflow(checkout, tiny_reuse_trace, tmp_path):
    """The sustained ladder ran its arms newest (last named) first, by the order of `arms`, but the workflow passes
    its settings with their keys sorted (and Snakemake's merge puts a profile's keys first), so on the GPU
    (2026-12-06, H100) the express arm came after harvest and gathered and the device call ended before it. Now
    `run_first` names it; planned from the workflow's own --settings, its pair comes first."""
    from parity.experiments import plan

    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "host", "sustained")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    (command,) = [c for c in shell_commands(run.stdout + run.stderr)
                  if c[:4] == ["parity", "experiment", "run", "sustained"]]
    settings = json.loads(_option(command, "--settings"))
    assert settings["run_first"] == ["express3", "express"]
    assert sorted(settings["arms"]) == ["express", "express3", "gathered", "harvest"]
    traces = []
    for name in settings["traces"]:
        traces.append(tmp_path / f"{name}.json")
        traces[-1].write_bytes(tiny_reuse_trace.read_bytes())
    cases = plan.for_experiment("sustained", traces, settings)
    assert list(dict.fromkeys(c.arm for c in cases))[:2] == ["express3", "express"]  # arm by arm (shared starts)


@pytest.mark.parametrize("inputs, refused", [
    ("{'tokenizer': 'results/smoke/inputs/tok'}", True), ("{'corpus': 'results/smoke/inputs/news.jsonl'}", True),
    ("{'corpus': 'results/smoke/other/corpus.jsonl'}", True),
    ("{'corpus': 'results/smoke/in2/corpus.jsonl', 'tokenizer': 'results/smoke/in2/tokenizer/'}", False)])
def test_generated_inputs_the_smoke_inputs_rule_cannot_make_are_refused_before_any_job(checkout, inputs, refused):
    """Found by an outsider: with inputs.generate the workflow took any corpus and tokenizer names, but its
    smoke_inputs rule runs `parity smoke-inputs --out dirname(corpus)`, which writes DIR/corpus.jsonl and DIR/tokenizer:
    inputs={'tokenizer': 'results/smoke/inputs/tok'} ran the job and then failed with MissingOutputException."""
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all", "--config", f"inputs={inputs}")
    said = run.stdout + run.stderr
    assert (run.returncode != 0) == refused, said[-2000:]
    assert ("inputs: generated inputs (generate: true) are DIR/corpus.jsonl and DIR/tokenizer, one folder" in said) \
        == refused


def test_the_host_profile_builds_the_study_size_traces_offline(checkout):
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "host", "traces")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert jobs_of(run) == {"smoke_inputs": 1, "trace": 2, "traces": 1}
    traces = {_option(c, "--name"): c for c in shell_commands(run.stdout + run.stderr) if c[:2] == ["parity", "trace"]}
    sizes = {name: [int(_option(c, k)) for k in ("--documents", "--questions", "--prefix-tokens", "--seed")]
             for name, c in traces.items()}
    assert sizes == {"no-reuse": [64, 1, 8000, 0], "reuse": [64, 4, 8000, 1]}  # benchmarks/measured/'s traces
    for c in traces.values():
        assert (_option(c, "--corpus-origin"), _option(c, "--tokenizer-origin")) == ("synthetic-news", "smoke-bpe")
        assert _values(c, "--warmup-shift") == ["1009", "2027"]


def test_the_host_profiles_engine_only_targets_run_one_parity_command_each(checkout):
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "host", "calibration", "order", "mlperf",
                    "--config", "results=results/a b")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    jobs = jobs_of(run)
    assert jobs["calibration_run"] == 4 and jobs["order_run"] == 2 and jobs["trace"] == 5
    assert jobs["mlperf_random_dataset"] == 1 and jobs["mlperf_run"] == 3 and "mlperf_smoke_dataset" not in jobs
    commands = shell_commands(run.stdout + run.stderr)
    engine_runs = {_option(c, "--out"): c for c in commands if c[:3] == ["parity", "engine", "run"]}
    assert sorted(engine_runs) == [f"results/a b/calibration/{r}" for r in ("async", "async-b32", "sync", "sync-b32")]
    sync = engine_runs["results/a b/calibration/sync"]
    backend = Backend.parse(_option(sync, "--backend"))  # the backend whole, not flags rebuilt from it
    assert _option(sync, "--engine") == "vllm-sync" and backend.load_format == "dummy" and backend.engine == "vllm"
    assert [os.path.basename(v) for v in _values(sync, "--trace")] == [
        "no-reuse.json", "reuse.json", "u2k.json", "u4k.json", "short.json"]
    assert _option(engine_runs["results/a b/calibration/async-b32"], "--batch") == "32"
    assert backend.warmup_rounds == 1 and "--warmup-rounds" not in sync and "--engine-arg" not in sync
    orders = {_option(c, "--engine"): c for c in commands if c[:3] == ["parity", "bench", "order"]}
    assert _values(orders["vllm-sync"], "--shard") == ["0", "1"] and _values(orders["vllm-async"], "--shard") == ["1"]
    (dataset,) = [c for c in commands if c[:3] == ["parity", "mlperf", "random-dataset"]]
    assert _option(dataset, "--samples") == "256"
    arm = next(c for c in commands if c[:3] == ["parity", "mlperf", "run"])
    assert [_option(arm, k) for k in ("--min-duration-ms", "--min-query-count", "--probe-samples", "--max-tokens")] == [
        "60000", "256", "64", "128"]
    words = [word for command in commands for word in command]
    assert not any(word in ("b", "results/a") or word.startswith("b/") for word in words)  # every argument quoted


@pytest.mark.parametrize("change, message", [
    (lambda doc: doc["backend"].update(load_format=None),
     "inputs.model_config makes a model folder of a config.json alone: it needs backend.model"),
    (lambda doc: doc["bench"]["order"]["sync-reuse"].update(trace="reuse-2"),
     "bench.order.sync-reuse.trace: no trace 'reuse-2' in traces or bench.traces"),
    (lambda doc: doc["bench"]["traces"].update(reuse={"documents": 2, "questions": 1, "prefix_tokens": 64, "seed": 0}),
     "bench.traces: reuse is already in traces"),
    (lambda doc: doc["bench"]["calibration"]["runs"]["sync"].update(engine="vllm"), "'vllm' is not one of"),
    (lambda doc: doc["backend"].update(model=doc["inputs"]["tokenizer"]), "is the tokenizer's folder"),
])
def test_a_host_config_whose_keys_disagree_is_refused_by_name(checkout, change, message):
    edit_config(checkout, "host", change)
    run = snakemake(checkout, "-n", "--workflow-profile", "host", "all")
    assert run.returncode != 0
    assert message in run.stdout + run.stderr


def test_a_synthetic_mlperf_dataset_needs_generated_inputs(checkout):
    edit_config(checkout, "default", lambda doc: doc["mlperf"].update(synthetic="random"))
    run = snakemake(checkout, "-n", "--cores", "20", "all")
    assert run.returncode != 0
    assert "mlperf.synthetic needs inputs.generate: true" in run.stdout + run.stderr


def test_a_mooncake_file_is_made_a_trace_and_replayed_by_the_sustained_experiment_only_when_given(checkout):
    """Ours (issue 31): mooncake.file (none by default: no such job) becomes a trace the sustained experiment
    replays."""
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "sustained")
    assert run.returncode == 0, run.stderr[-2000:]
    assert not [c for c in shell_commands(run.stdout + run.stderr) if c[:2] == ["parity", "trace-mooncake"]]
    (checkout / "mc.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}\n')
    edit_config(checkout, "smoke", lambda doc: doc.update(mooncake={"file": "mc.jsonl", "name": "mc", "limit": 5}))
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "sustained")
    assert run.returncode == 0, run.stderr[-2000:]
    commands = shell_commands(run.stdout + run.stderr)
    (made,) = [c for c in commands if c[:2] == ["parity", "trace-mooncake"]]
    assert made[2] == "mc.jsonl" and made[made.index("--name") + 1] == "mc" and "--limit" in made
    (command,) = [c for c in commands if c[:4] == ["parity", "experiment", "run", "sustained"]]
    assert yaml.safe_load(command[command.index("--settings") + 1])["replay"] == {"trace": "mc"}
    traces = [command[i + 1] for i, arg in enumerate(command) if arg == "--trace"]
    assert traces == ["results/smoke/traces/reuse-32.json", "results/smoke/traces/mc.json"]
    edit_config(checkout, "smoke", lambda doc: doc["mooncake"].update(name="reuse-32"))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "sustained")
    assert run.returncode != 0 and "mooncake.name: 'reuse-32' is already in traces" in run.stdout + run.stderr


@pytest.mark.parametrize("change, said", [
    (lambda s: s["restart"].update(shard=7), "experiments.sustained: restart shard 7 does not exist: the path has 2 "
                                             "shard(s)"),
    (lambda s: s.update(rates={"nosuch": [30]}), "experiments.sustained: rates name trace 'nosuch', which is not among "
                                                 "the traces given"),
])
def test_what_an_experiments_job_would_refuse_is_refused_before_any_job(checkout, change, said):
    """An outside tester's, 2026-12-06: the dry run took settings the sustained job refused only when it ran (a
    restart's shard after trials ran); each experiment is planned on its traces' names at parse time (the other
    refusals: tests/test_workflow_config.py)."""
    edit_config(checkout, "smoke", lambda doc: change(doc["experiments"]["sustained"]))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and said in log and len(log.splitlines()) < 12, log[-2000:]


@pytest.mark.parametrize("change, said", [
    (lambda doc: doc.update(mooncake={"file": "nonexistent.jsonl"}), "mooncake.file: no such file: nonexistent.jsonl"),
    (lambda doc: doc.update(mooncake={"file": "config"}), "mooncake.file: a folder, not a file: config"),
    (lambda doc: doc["backend"].update(warmup_rounds=3), "backend.warmup_rounds: 3 warm-up rounds, but each trace has 2 "
                                                         "warm-up variant(s)"),
    (lambda doc: doc["backend"].update(sim_params="nonexistent.yaml"), "backend.sim_params: no such file: "
                                                                       "nonexistent.yaml"),
])
def test_a_file_or_count_the_jobs_need_is_refused_in_a_line_before_any_job(checkout, change, said):
    """An outside tester's, 2026-12-06: a missing mooncake.file ended in a 27-line traceback (Snakemake tried the rule
    `trace` for it, KeyError 'mooncake'); warm-up rounds past the traces' variants and a missing simulator file were
    refused only by the jobs."""
    edit_config(checkout, "smoke", change)
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and said in log and len(log.splitlines()) < 12, log[-2000:]


def test_a_config_files_quoted_strings_stay_strings(checkout):
    """An outside tester's, 2026-12-06: the nested --config values' re-reading (numbers and booleans) took the config
    files' values too, so a quoted trace name "2024", gpus ["0", "1"] and corpus_origin "1" became numbers and were
    refused, and model "null" became null; only --config's values are read again."""
    def change(doc):
        doc["bench"]["traces"]["2024"] = doc["bench"]["traces"].pop("reuse-32")
        doc["experiments"]["sustained"]["traces"] = ["2024"]
        doc["backend"].update(gpus=["0", "1"], model="null")
        doc["inputs"]["corpus_origin"] = "1"

    edit_config(checkout, "smoke", change)
    assert "'2024'" in (checkout / "config" / "smoke.yaml").read_text()  # quoted, as the tester wrote it
    run = snakemake(checkout, "-n", "-p", "--workflow-profile", "smoke", "sustained")
    assert run.returncode == 0, run.stderr[-2000:]
    commands = shell_commands(run.stdout + run.stderr)
    (command,) = [c for c in commands if c[:4] == ["parity", "experiment", "run", "sustained"]]
    backend = json.loads(command[command.index("--backend") + 1])
    assert backend["gpus"] == ["0", "1"] and backend["model"] == "null"
    assert "results/smoke/traces/2024.json" in command
    (trace,) = [c for c in commands if c[:2] == ["parity", "trace"] and "2024" in c]
    assert trace[trace.index("--corpus-origin") + 1] == "1"


@pytest.mark.parametrize("kind, said", [
    ("fifo", "inputs.model_config: not a regular file: "), ("folder", "inputs.model_config: a folder, not a file: "),
    ("text", "inputs.model_config: not a readable JSON file"), ("list", "a model's config.json is a JSON object"),
])
def test_a_model_config_that_is_no_json_file_is_refused_before_its_job(checkout, kind, said):
    """An outsider's, 2026-12-07: a named pipe as inputs.model_config passed the dry run and hung the job that copies
    it; a folder failed only in that job."""
    path = checkout / "model-config"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_text("not json" if kind == "text" else "[1]")
    edit_config(checkout, "host", lambda doc: doc["inputs"].update(model_config=str(path)))
    run = snakemake(checkout, "-n", "--workflow-profile", "host", "all")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and said in log and len(log.splitlines()) < 12, log[-2000:]


def test_a_key_given_twice_in_a_config_file_is_refused_before_any_job(checkout):
    """Snakemake keeps the last of a key given twice: `engine: sim` then `engine: vllm` planned vLLM jobs on the smoke
    profile without a word (an outsider's, 2026-12-07)."""
    path = checkout / "config" / "smoke.yaml"
    text = path.read_text()
    assert "\n  engine: sim\n" in text
    path.write_text(text.replace("\n  engine: sim\n", "\n  engine: sim\n  engine: vllm\n", 1))
    run = snakemake(checkout, "-n", "--workflow-profile", "smoke", "all")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and "config/smoke.yaml: not a readable workflow config (duplicate key 'engine' at " \
        "line" in log and len(log.splitlines()) < 12, log[-2000:]
