"""The evidence bundle: a BagIt bag of a run's kept files and its workflow, with a Workflow Run RO-Crate
inside; any changed, missing or added file is named, and the crate keeps the profile's MUSTs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity import bundle
from parity.cli import main


@pytest.fixture
def run(tmp_path) -> Path:
    """A small finished run in a work folder: a Snakefile, a results tree, Snakemake's job records."""
    work = tmp_path / "work"
    results = work / "results" / "smoke"
    (work / "workflow" / "rules").mkdir(parents=True)
    (work / "Snakefile").write_text("rule all:\n    input: 'results/smoke/report/report.md'\n")
    (work / "workflow" / "rules" / "report.smk").write_text("# rules\n")
    (work / "config").mkdir()
    (work / "config" / "smoke.yaml").write_text("profile: smoke\n")
    files = {
        "traces/reuse.json": '{"kind": "trace"}', "traces/reuse.tokens": "\x00\x01\x02",
        "locality/trials/t0.json": json.dumps({"kind": "trial", "versions": {"parity": "0.1.0", "vllm": None},
                                               "engine": {"name": "sim", "simulated": True},
                                               "gpus": [{"uuid": "sim-0", "name": "simulated"}]}),
        "logs/experiment_locality.log": "t0: passed\n", "report/report.md": "# report\n",
        "report/plots/sustained.png": "\x89PNG fake", "logs/empty.log": "", "locality/logs/gpu-locks/sim-0.lock": "",
    }
    for rel, text in files.items():
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(text)
    metadata = work / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    for output, rule, inputs, start in (("results/smoke/traces/reuse.json", "trace", [], 100.0),
                                        ("results/smoke/report/report.md", "report", ["results/smoke/locality/trials/t0.json"], 200.0)):
        record = {"rule": rule, "input": inputs, "log": [], "shellcmd": f"parity {rule}", "starttime": start,
                  "endtime": start + 5, "incomplete": False, "job_hash": hash(rule)}
        (metadata / base64.urlsafe_b64encode(output.encode()).decode()).write_text(json.dumps(record))
    return work


def make(run: Path) -> Path:
    out = run.parent / "bundle"
    bundle.make(run / "results" / "smoke", out, workdir=run, log=lambda m: None)
    return out


def test_a_bundle_holds_every_kept_file_and_validates(run):
    out = make(run)
    assert bundle.check(out) == []
    data = out / "data"
    assert (data / "results" / "locality" / "trials" / "t0.json").is_file() and (data / "workflow" / "Snakefile").is_file()
    assert not (data / "results" / "logs" / "empty.log").exists()  # empty logs and lock files are not kept
    assert not list(data.rglob("*.lock"))
    assert {"manifest-sha256.txt", "manifest-sha512.txt", "tagmanifest-sha256.txt", "bag-info.txt"} <= {p.name for p in out.iterdir()}


def test_the_crate_is_a_workflow_run_crate_with_one_action_per_job(run):
    doc = json.loads((make(run) / "data" / bundle.CRATE).read_text())
    assert bundle.crate_problems(doc) == []
    graph = {e["@id"]: e for e in doc["@graph"]}
    root = graph["./"]
    assert {c["@id"] for c in root["conformsTo"]} == set(bundle.PROFILES)
    assert "ComputationalWorkflow" in graph[root["mainEntity"]["@id"]]["@type"]
    actions = [e for e in doc["@graph"] if e["@type"] == "CreateAction"]
    jobs = [a for a in actions if a["@id"].startswith("#job-")]
    assert [a["instrument"]["@id"] for a in jobs] == ["#rule-trace", "#rule-report"]  # oldest first
    report = jobs[1]
    assert report["object"] == [{"@id": "results/locality/trials/t0.json"}] and report["result"] == [{"@id": "results/report/report.md"}]
    assert report["startTime"].startswith("1970-01-01T00:03:20") and report["actionStatus"].endswith("CompletedActionStatus")
    run_action = graph["#run"]
    assert run_action["instrument"]["@id"] == "workflow/Snakefile" and len(run_action["result"]) == 6
    assert graph["#software-parity"]["softwareVersion"] == "0.1.0" and graph["#gpu-sim-0"]["identifier"] == "sim-0"


def test_a_crate_that_breaks_a_must_is_named():
    doc = {"@graph": [{"@id": bundle.CRATE, "conformsTo": {"@id": "https://w3id.org/ro/crate/1.1"}, "about": {"@id": "./"}},
                      {"@id": "./", "@type": "Dataset", "name": "x"}]}
    problems = bundle.crate_problems(doc)
    assert "the root dataset has no license" in problems and "the main entity is not a ComputationalWorkflow" in problems
    assert any("does not conform to https://w3id.org/ro/wfrun/workflow/0.5" in p for p in problems)


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


TAMPER = {  # the tamper cases: (what is done, the file the check must name)
    "a trial, one byte flipped": (lambda d: flip(d / "results/locality/trials/t0.json"), "data/results/locality/trials/t0.json"),
    "a trace, one byte flipped": (lambda d: flip(d / "results/traces/reuse.tokens"), "data/results/traces/reuse.tokens"),
    "a log, one byte flipped": (lambda d: flip(d / "results/logs/experiment_locality.log"), "data/results/logs/experiment_locality.log"),
    "a plot, one byte flipped": (lambda d: flip(d / "results/report/plots/sustained.png"), "data/results/report/plots/sustained.png"),
    "the crate, one byte flipped": (lambda d: flip(d / bundle.CRATE), f"data/{bundle.CRATE}"),
    "a file deleted": (lambda d: (d / "results/report/report.md").unlink(), "data/results/report/report.md"),
    "a file added": (lambda d: (d / "results/extra.json").write_text("{}"), "data/results/extra.json"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_every_tamper_case_is_detected_naming_the_file(run, case):
    out = make(run)
    change, named = TAMPER[case]
    change(out / "data")
    problems = bundle.check(out)
    assert problems and any(p.startswith(named + ":") for p in problems), problems
    result = CliRunner().invoke(main, ["validate", "--bundle", str(out)])
    assert result.exit_code == 1 and named in result.output


def test_a_changed_tag_file_is_detected(run):
    out = make(run)
    (out / "bag-info.txt").write_text((out / "bag-info.txt").read_text() + "Contact-Name: someone\n")
    assert any("bag-info.txt" in p for p in bundle.check(out))


def test_bad_bundle_input_is_refused_in_one_line(run, tmp_path):
    results = run / "results" / "smoke"
    with pytest.raises(bundle.BundleError, match="must lie outside the results"):
        bundle.make(results, results / "bundle", workdir=run, log=lambda m: None)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    with pytest.raises(bundle.BundleError, match="is not a bundle: not replacing it"):
        bundle.make(results, tmp_path / "keep", workdir=run, log=lambda m: None)
    assert (tmp_path / "keep" / "notes.txt").read_text() == "mine"
    with pytest.raises(bundle.BundleError, match="no results folder"):
        bundle.make(tmp_path / "nothing", tmp_path / "b", workdir=run, log=lambda m: None)
    assert bundle.check(tmp_path / "keep") == [f"{tmp_path / 'keep'}: not a bundle (no bagit.txt)"]


def test_the_cli_writes_a_bundle_and_a_rerun_replaces_it(run):
    runner, out = CliRunner(), run.parent / "b"
    for _ in range(2):
        result = runner.invoke(main, ["bundle", str(run / "results" / "smoke"), "--out", str(out), "--workdir", str(run)])
        assert result.exit_code == 0, result.output
        assert "6 result files" in result.output and "2 job(s)" in result.output
    ok = runner.invoke(main, ["validate", "--bundle", str(out)])
    assert ok.exit_code == 0 and "1 bundle(s) valid" in ok.output
    assert runner.invoke(main, ["validate"]).exit_code == 2  # nothing named: a usage error


def test_a_deletion_and_a_change_together_are_both_named(run):
    out = make(run)
    TAMPER["a file deleted"][0](out / "data")
    TAMPER["a trial, one byte flipped"][0](out / "data")
    problems = bundle.check(out)
    assert any(p.startswith("data/results/report/report.md: missing") for p in problems), problems
    assert any(p.startswith("data/results/locality/trials/t0.json: changed") for p in problems), problems


def test_a_folder_bundled_by_hand_without_job_records_still_keeps_the_profile(run, tmp_path):
    """No .snakemake/metadata (results copied off a GPU host, bundled there by hand): the run's span comes
    from its files' times, and the crate still has every MUST."""
    import shutil

    shutil.rmtree(run / ".snakemake")
    out = tmp_path / "by-hand"
    bundle.make(run / "results" / "smoke", out, workdir=run, log=lambda m: None)
    assert bundle.check(out) == []
    doc = json.loads((out / "data" / bundle.CRATE).read_text())
    action = next(e for e in doc["@graph"] if e["@id"] == "#run")
    assert action["startTime"] <= action["endTime"] and not [e for e in doc["@graph"] if e["@id"].startswith("#job-")]
