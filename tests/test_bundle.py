"""The evidence bundle: a BagIt bag of a run's kept files and its workflow, with a Workflow Run RO-Crate
inside; any changed, missing or added file is named, and the crate keeps the profile's MUSTs."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity import bundle, seal, signature
from parity.cli import main
from parity.trace import TraceSpec, build_trace


@pytest.fixture
def run(tmp_path, small_inputs) -> Path:
    """A small sealed run in a work folder: a Snakefile, a results tree whose trace reads inputs from outside it
    (resources/, as a fetched corpus and tokenizer lie), Snakemake's job records."""
    work = tmp_path / "work"
    results = work / "results" / "smoke"
    (work / "workflow" / "rules").mkdir(parents=True)
    (work / "Snakefile").write_text("rule all:\n    input: 'results/smoke/report/report.md'\n")
    (work / "workflow" / "rules" / "report.smk").write_text("# rules\n")
    (work / "config").mkdir()
    (work / "config" / "smoke.yaml").write_text("profile: smoke\n")
    corpus, tok = small_inputs
    inputs = work / "resources" / "inputs"
    shutil.copytree(tok, inputs / "tok")
    shutil.copy(corpus, inputs / "corpus.jsonl")
    (work / "resources" / "unread.bin").write_text("no manifest links this")
    build_trace(TraceSpec("reuse", documents=2, questions_per_document=1, prefix_tokens=200, seed=1),
                inputs / "corpus.jsonl", inputs / "tok", results / "traces")
    files = {  # a kept result file no manifest links (a JSON object of kind `trial` would be a manifest, so the
        # crate's versions and GPUs, which it reads from trial manifests, are given by `provenance` below)
        "locality/t0.json": json.dumps({"trial_id": "t0", "status": "passed"}),
        "logs/experiment_locality.log": "t0: passed\n", "report/report.md": "# report\n",
        "report/plots/sustained.png": "\x89PNG fake", "logs/empty.log": "", "locality/logs/gpu-locks/sim-0.lock": "",
    }
    for rel, text in files.items():
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(text)
    metadata = work / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    for output, rule, inputs, start in (("results/smoke/traces/reuse.json", "trace", [], 100.0),
                                        ("results/smoke/report/report.md", "report", ["results/smoke/locality/t0.json"], 200.0)):
        record = {"rule": rule, "input": inputs, "log": [], "shellcmd": f"parity {rule}", "starttime": start,
                  "endtime": start + 5, "incomplete": False, "job_hash": hash(rule)}
        (metadata / base64.urlsafe_b64encode(output.encode()).decode()).write_text(json.dumps(record))
    summary, problems = seal.seal(results, log=lambda m: None)
    assert problems == [] and summary["files"] == 4  # the trial stand-in, a log, the report, the plot
    return work


TRIAL = {"kind": "trial", "versions": {"parity": "0.1.0", "vllm": None}, "engine": {"name": "sim", "simulated": True},
         "gpus": [{"uuid": "sim-0", "name": "simulated"}]}  # a trial's versions and GPUs, as the crate reads them


@pytest.fixture
def provenance(monkeypatch, tmp_path_factory):
    """The crate reads software versions and GPUs from what `_provenance` finds in the tree's trial manifests
    (tested on its own below): given here, as it reads them from TRIAL (written outside the bundle)."""
    real = bundle._provenance
    folder = tmp_path_factory.mktemp("stand-in")

    def given(trial=TRIAL):
        monkeypatch.setattr(bundle, "_provenance", lambda results, files:
                            real(_stand_in(folder, trial), [Path("trials/t0.json")]))
    given()
    return given


def _stand_in(folder: Path, trial: dict) -> Path:
    (folder / "trials").mkdir(parents=True, exist_ok=True)
    (folder / "trials" / "t0.json").write_text(json.dumps(trial))
    return folder


def test_the_crates_provenance_is_read_from_the_trial_manifests(tmp_path):
    versions, gpus = bundle._provenance(_stand_in(tmp_path, TRIAL), [Path("trials/t0.json")])
    assert versions == {"parity": ["0.1.0"]} and gpus == [{"uuid": "sim-0", "name": "simulated"}]


RESULT_FILES = 9  # the trace (manifest, measured and two warmup token files), the trial, a log, the report, the plot, run.json


def make(run: Path) -> Path:
    out = run.parent / "bundle"
    bundle.make(run / "results" / "smoke", out, workdir=run, log=lambda m: None)
    return out


def test_a_bundle_holds_every_kept_file_and_validates(run):
    out = make(run)
    assert bundle.check(out) == []
    data = out / "data"  # the work folder's layout, so every relative link of a manifest still resolves
    assert (data / "results" / "smoke" / "locality" / "t0.json").is_file() and (data / "Snakefile").is_file()
    assert not (data / "results" / "smoke" / "logs" / "empty.log").exists()  # empty logs and lock files are not kept
    assert not list(data.rglob("*.lock"))
    # the inputs the trace links from outside the results are held; a file nothing links is not
    assert (data / "resources" / "inputs" / "corpus.jsonl").is_file() and (data / "resources" / "inputs" / "tok" / "tokenizer.json").is_file()
    assert not (data / "resources" / "unread.bin").exists()
    assert {"manifest-sha256.txt", "manifest-sha512.txt", "tagmanifest-sha256.txt", "bag-info.txt"} <= {p.name for p in out.iterdir()}


def test_the_crate_is_a_workflow_run_crate_with_one_action_per_job(run, provenance):
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
    # one file is a single value, not a singleton list (roc-validator's RECOMMENDED ro-crate-1.1_24.1)
    assert report["object"] == {"@id": "results/smoke/locality/t0.json"} and report["result"] == {"@id": "results/smoke/report/report.md"}
    assert report["startTime"].startswith("1970-01-01T00:03:20") and report["actionStatus"].endswith("CompletedActionStatus")
    run_action = graph["#run"]
    assert run_action["instrument"]["@id"] == "Snakefile" and len(run_action["result"]) == RESULT_FILES
    assert graph["#software-parity"]["softwareVersion"] == "0.1.0" and graph["#gpu-sim-0"]["identifier"] == "sim-0"


def test_the_crate_keeps_roc_validators_recommendations_it_can_keep_honestly(run, provenance):
    """roc-validator 0.13.0's RECOMMENDED checks (run offline, 2026-12-05): a README.md about the crate, in
    text/markdown (workflow-ro-crate-1.0_6); the Snakefile's encodingFormat (ro-crate-1.1_27.1); where a reviewer
    gets each third-party piece of software (process-run-crate-0.5_3.2). parity's own rules and package have no
    public address, so they carry none."""
    (run / "README.md").write_text("# parity\n")
    provenance({"kind": "trial", "versions": {"parity": "0.1.0", "numpy": "2.4.6"}, "gpus": []})
    out = make(run)
    assert bundle.check(out) == []
    graph = {e["@id"]: e for e in json.loads((out / "data" / bundle.CRATE).read_text())["@graph"]}
    assert graph["README.md"]["about"] == {"@id": "./"} and graph["README.md"]["encodingFormat"] == "text/markdown"
    assert (out / "data" / "README.md").read_text() == "# parity\n"
    assert graph["Snakefile"]["encodingFormat"] == "text/x-python"
    assert graph["#software-numpy"]["url"] == "https://pypi.org/project/numpy/" and "url" not in graph["#software-parity"]


def test_the_crates_context_declares_sha256_which_ro_crate_1_1_does_not_define(run):
    """roc-validator's REQUIRED check ro-crate-1.1_3.1 (found by an outside evaluator, 2026-12-05): every key must
    be a term of the crate's @context; RO-Crate 1.1's has no `sha256`, so the crate declares it beside it."""
    doc = json.loads((make(run) / "data" / bundle.CRATE).read_text())
    assert doc["@context"] == ["https://w3id.org/ro/crate/1.1/context", {"sha256": "http://schema.org/sha256"}]
    doc["@context"] = doc["@context"][0]
    assert bundle.crate_problems(doc) == ["the crate's files carry sha256, a term its RO-Crate 1.1 context does not "
                                          "define and its own context does not declare"]


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
    "a trial, one byte flipped": (lambda d: flip(d / "results/smoke/locality/t0.json"), "data/results/smoke/locality/t0.json"),
    "a trace, one byte flipped": (lambda d: flip(d / "results/smoke/traces/reuse.tokens"), "data/results/smoke/traces/reuse.tokens"),
    "a log, one byte flipped": (lambda d: flip(d / "results/smoke/logs/experiment_locality.log"), "data/results/smoke/logs/experiment_locality.log"),
    "a plot, one byte flipped": (lambda d: flip(d / "results/smoke/report/plots/sustained.png"), "data/results/smoke/report/plots/sustained.png"),
    "the crate, one byte flipped": (lambda d: flip(d / bundle.CRATE), f"data/{bundle.CRATE}"),
    "a file deleted": (lambda d: (d / "results/smoke/report/report.md").unlink(), "data/results/smoke/report/report.md"),
    "a file added": (lambda d: (d / "results/smoke/extra.json").write_text("{}"), "data/results/smoke/extra.json"),
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


@pytest.mark.parametrize("tag", ["bagit.txt", "bag-info.txt", "manifest-sha256.txt", "tagmanifest-sha256.txt"])
def test_a_tag_file_that_is_not_utf8_is_named_in_one_line(run, tag):
    """bagit reads its tag files as text: one that was not raised a UnicodeDecodeError traceback (an outside
    tester's pass)."""
    out = make(run)
    (out / tag).write_bytes(b"\xff\xfe\n")
    assert bundle.check(out) == [f"{out / tag}: not UTF-8 text (byte 0): a bag's tag files are UTF-8, as its "
                                 "bagit.txt declares"]
    result = CliRunner().invoke(main, ["validate", "--bundle", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.splitlines() == [bundle.check(out)[0], "Error: 1 problem(s) in 1 bundle(s)"]


def test_a_fetch_list_is_refused(run):
    """A fetch.txt naming a file to download from elsewhere was accepted silently (an outside evaluator's pass):
    what it names is no part of the payload the bag's manifests check."""
    out = make(run)
    (out / "fetch.txt").write_text("https://example.org/forged.json - data/results/forged.json\n")
    assert bundle.check(out) == [f"{out / 'fetch.txt'}: a fetch list (files to download from elsewhere): a parity "
                                 "bundle holds every file it lists, so none is fetched"]


def test_a_workdir_without_a_snakefile_is_refused_before_any_work(run, tmp_path, monkeypatch):
    """It was a FileNotFoundError traceback once the bundle was half made; the default workdir is `.`."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for args in ([], ["--workdir", str(elsewhere)]):
        result = CliRunner().invoke(main, ["bundle", str(run / "results" / "smoke"), "--out", str(elsewhere / "b"),
                                           *args])
        where = args[-1] if args else "."
        assert result.exit_code == 1 and result.output == f"Error: --workdir {where}: no Snakefile (give the " \
                                                          "workflow's folder)\n", result.output
        assert list(elsewhere.iterdir()) == []  # no bundle, no staging folder


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
        assert f"{RESULT_FILES} result files" in result.output and "2 job(s)" in result.output
    ok = runner.invoke(main, ["validate", "--bundle", str(out)])
    assert ok.exit_code == 0 and "1 bundle(s) valid" in ok.output
    assert runner.invoke(main, ["validate"]).exit_code == 2  # nothing named: a usage error


def test_a_deletion_and_a_change_together_are_both_named(run):
    out = make(run)
    TAMPER["a file deleted"][0](out / "data")
    TAMPER["a trial, one byte flipped"][0](out / "data")
    problems = bundle.check(out)
    assert any(p.startswith("data/results/smoke/report/report.md: missing") for p in problems), problems
    assert any(p.startswith("data/results/smoke/locality/t0.json: changed") for p in problems), problems


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


def test_a_change_made_with_the_bag_remade_to_match_is_still_caught_by_the_run_manifest(run):
    """Someone who edits a log and re-hashes the bag's own manifests gets a valid bag, not a valid bundle:
    the sealed tree inside is re-certified against its run manifest."""
    import bagit

    out = make(run)
    log = out / "data" / "results" / "smoke" / "logs" / "experiment_locality.log"
    log.write_text("t0: failed\n")
    bagit.Bag(str(out)).save(manifests=True)
    assert bagit.Bag(str(out)).is_valid()
    problems = bundle.check(out)
    assert len(problems) == 2, problems  # the crate still states the log's old size and hash; the seal its hash
    assert "the crate says results/smoke/logs/experiment_locality.log has 11 bytes and SHA-256" in problems[0]
    assert "run.json: /files/" in problems[1] and "sha256-mismatch" in problems[1], problems


def test_an_unsealed_tree_is_not_bundled(run, tmp_path):
    (run / "results" / "smoke" / seal.RUN_MANIFEST).unlink()
    with pytest.raises(bundle.BundleError, match=r"is not sealed \(no run.json\): run `parity seal "):
        bundle.make(run / "results" / "smoke", tmp_path / "b", workdir=run, log=lambda m: None)
    assert not (tmp_path / "b").exists()


def test_a_sealed_tree_that_no_longer_validates_is_not_bundled(run):
    (run / "results" / "smoke" / "logs" / "experiment_locality.log").write_text("t0: failed\n")
    with pytest.raises(bundle.BundleError, match=r"no longer validates \(1 problem\(s\), first: .*sha256-mismatch"):
        make(run)
    assert not (run.parent / "bundle").exists()


def test_a_mistyped_image_is_refused_not_left_out_of_the_crate(run):
    result = CliRunner().invoke(main, ["bundle", str(run / "results" / "smoke"), "--out", str(run.parent / "b"),
                                       "--workdir", str(run), "--image", str(run / "parity.sfi")])
    assert result.exit_code == 2 and "parity.sfi' does not exist" in result.output
    with pytest.raises(bundle.BundleError, match="no Apptainer image at"):
        bundle.make(run / "results" / "smoke", run.parent / "b", workdir=run, image=run / "parity.sfi")


def test_a_bag_without_bag_info_is_not_a_parity_bundle(run):
    import bagit

    out = make(run)
    (out / "bag-info.txt").unlink()  # BagIt allows a bag without it: dropped from the tag manifests, a valid bag
    for tags in out.glob("tagmanifest-*.txt"):
        tags.write_text("".join(l for l in tags.read_text().splitlines(True) if "bag-info.txt" not in l))
    assert bagit.Bag(str(out)).is_valid()
    assert bundle.check(out) == [f"{out}: not a parity bundle (no bag-info.txt)"]


def test_the_crate_states_each_files_size_and_hash_as_the_bag_holds_it(run):
    out = make(run)
    doc = json.loads((out / "data" / bundle.CRATE).read_text())
    files = [e for e in doc["@graph"] if "File" in bundle._list(e.get("@type"))]
    assert files and all(e["contentSize"] >= 0 and len(e["sha256"]) == 64 for e in files)
    entity = next(e for e in files if e["@id"].endswith("report/report.md"))
    entity["contentSize"] += 1
    (out / "data" / bundle.CRATE).write_text(json.dumps(doc))
    import bagit

    bagit.Bag(str(out)).save(manifests=True)
    assert any("the crate says results/smoke/report/report.md has" in p for p in bundle.check(out))


def test_a_full_disk_while_bagging_leaves_no_partial_bundle(run, tmp_path, monkeypatch):
    """An outside evaluator (2026-12-05) filled a 64 KiB tmpfs: `parity bundle` said so in one line but left its
    `.partial` staging folder filling the disk. Now it is removed with the error."""
    import errno
    import os

    import bagit

    def full(folder, *args, **kwargs):
        (Path(folder) / "half").write_text("x")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bagit, "make_bag", full)
    out = tmp_path / "bundle"
    with pytest.raises(OSError) as error:
        bundle.make(run / "results" / "smoke", out, workdir=run)
    assert not out.exists() and not out.with_name("bundle.partial").exists()
    assert error.value.filename == str(out)  # bagit's error named no file: the one line names the bundle (pass P)


def test_a_payload_file_nothing_accounts_for_is_named_though_the_bag_was_remade_to_match(run, keys):
    """An outside evaluator added files to a signed bundle's payload, beside the sealed tree (a forged trial
    under results/, a note, a rule file), and recomputed the bag's manifests and Payload-Oxum, as anyone can:
    `parity validate --bundle BAG --public-key K` said all valid. The bag's manifests vouch for nothing, and the
    sealed tree's checks see only inside the tree; now every payload file the crate does not describe is named,
    one line each."""
    import bagit

    signed = CliRunner().invoke(main, ["sign", str(run / "results" / "smoke"), "--key", str(keys / "parity.key")],
                                env={"PARITY_SIGNING_PASSWORD": None})
    assert signed.exit_code == 0, signed.output
    out = make(run)
    data = out / "data"
    trial = json.loads((data / "results/smoke/locality/t0.json").read_text()) | {"status": "passed"}
    added = {"results/extra/trials/x.json": json.dumps(trial), "NOTES.md": "# all passed\n",
             "workflow/rules/evil.smk": "rule evil:\n    shell: 'true'\n"}
    for rel, text in added.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(text)
    bagit.Bag(str(out)).save(manifests=True)  # the manifests, tag manifests and Payload-Oxum, recomputed
    assert bagit.Bag(str(out)).is_valid()
    problems = bundle.check(out)
    assert sorted(problems) == [f"data/{rel}: added (in the bag's payload, but the crate does not describe it)"
                                for rel in sorted(added)], problems
    result = CliRunner().invoke(main, ["validate", "--bundle", str(out), "--public-key", str(keys / "parity.pub")])
    assert result.exit_code == 1 and all(f"data/{rel}" in result.output for rel in added), result.output


def test_a_file_the_bundle_never_holds_is_named_in_a_sealed_tree_though_the_crate_describes_it(run):
    """A GPU lock file is not kept (`seal.kept`), so the seal's check of unlinked files passes over it: one added
    to the sealed tree inside a bundle, with a crate entity and the bag remade to match, was carried silently."""
    import bagit

    out = make(run)
    lock = out / "data" / "results" / "smoke" / "locality" / "x.lock"
    lock.write_text("anything at all")
    crate = out / "data" / bundle.CRATE
    doc = json.loads(crate.read_text())
    doc["@graph"].append({"@id": "results/smoke/locality/x.lock", "@type": "File", "contentSize": lock.stat().st_size,
                          "sha256": bundle.sha256_file(lock)})
    crate.write_text(json.dumps(doc))
    bagit.Bag(str(out)).save(manifests=True)
    assert bundle.check(out) == ["data/results/smoke/locality/x.lock: added (in the sealed tree results/smoke, "
                                 "which keeps no such file)"]


def test_software_or_a_gpu_the_crate_names_unlike_its_trials_is_named_though_the_bag_was_remade(run, provenance):
    """The crate's software versions and GPUs are derived from the trial manifests it holds: a crate whose numpy
    version was edited and re-hashed into its bag passed (an outsider's, 2026-12-07)."""
    import bagit

    out = make(run)
    crate = out / "data" / bundle.CRATE
    doc = json.loads(crate.read_text())
    graph = {e["@id"]: e for e in doc["@graph"]}
    assert graph["#software-parity"]["softwareVersion"] == "0.1.0" and "#gpu-sim-0" in graph
    assert bundle.check(out) == []
    graph["#software-parity"]["softwareVersion"] = "9.9.9"
    graph["#gpu-sim-0"]["name"] = "NVIDIA H200"
    crate.write_text(json.dumps(doc))
    bagit.Bag(str(out)).save(manifests=True)
    problems = bundle.check(out)
    assert problems == [
        f"{crate}: #software-parity: the crate says version '9.9.9', its trials record '0.1.0'",
        f"{crate}: #gpu-sim-0: the crate names it as 'NVIDIA H200', its trials as 'simulated'"], problems


def _recrate(out: Path) -> None:
    """A forger's re-hash: every file entity's size and SHA-256 recomputed, those of files gone dropped, one added
    for each payload file the crate does not describe; then the bag's manifests (outside pass P's rehash.py)."""
    import bagit

    data, crate = out / "data", out / "data" / bundle.CRATE
    doc = json.loads(crate.read_text())
    files = {p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file() and p.name != bundle.CRATE}
    graph = [e for e in doc["@graph"] if "File" not in bundle._list(e.get("@type")) or e["@id"] in files]
    described = {e["@id"] for e in graph}
    graph += [{"@id": name, "@type": "File"} for name in sorted(files - described)]
    for entity in graph:
        if "File" in bundle._list(entity.get("@type")):
            entity["contentSize"] = (data / entity["@id"]).stat().st_size
            entity["sha256"] = bundle.sha256_file(data / entity["@id"])
    doc["@graph"] = graph
    crate.write_text(json.dumps(doc))
    bagit.Bag(str(out)).save(manifests=True)


def test_a_tree_unsealed_inside_a_bundle_beside_a_sealed_decoy_is_named(run, keys):
    """Outside pass P: a forger edited the tree, removed its run.json (and signature), copied the untouched signed
    tree elsewhere under data/, and re-hashed the crate and the bag: `validate --bundle --public-key` said valid,
    for only sealed trees were re-certified. Now the run's results and every manifest outside a sealed tree are
    named."""
    signed = CliRunner().invoke(main, ["sign", str(run / "results" / "smoke"), "--key", str(keys / "parity.key")],
                                env={"PARITY_SIGNING_PASSWORD": None})
    assert signed.exit_code == 0, signed.output
    out = make(run)
    tree = out / "data" / "results" / "smoke"
    shutil.copytree(tree, out / "data" / "archive" / "smoke")
    trace = tree / "traces" / "reuse.json"
    trace.write_text(trace.read_text().replace('"seed": 1', '"seed": 7'))
    (tree / seal.RUN_MANIFEST).unlink()
    (tree / "run.json.minisig").unlink()
    _recrate(out)
    forged = out / "data" / "results" / "final" / "report" / "report.md"  # outside pass R: described, not a #run result
    forged.parent.mkdir(parents=True)
    forged.write_text("# every target met\n")
    for name in ("traces/reuse.json", "locality/t0.json"):  # a manifest's kind renamed passed for a plain file (pass R)
        doc = json.loads((tree / name).read_text())
        (tree / name).write_text(json.dumps({k: v for k, v in doc.items() if k != "schema_version"}
                                            | {"kind": "x-" + str(doc.get("kind"))}))
    _recrate(out)
    problems = bundle.check(out, key=signature.public_key(str(keys / "parity.pub")))
    for name in ("results/smoke/traces/reuse.json", "results/smoke/locality/t0.json", "results/smoke/report/report.md",
                 "results/final/report/report.md"):
        assert f"data/{name}: outside every sealed tree, neither the workflow's nor linked by a sealed tree: nothing " \
               "re-certifies it (its tree's run.json removed?)" in problems, (name, problems)
    assert not any("data/config/" in p or "data/archive/" in p or "data/resources/" in p for p in problems), problems
    result = CliRunner().invoke(main, ["validate", "--bundle", str(out), "--public-key", str(keys / "parity.pub")])
    assert result.exit_code == 1 and "outside every sealed tree" in result.output, result.output


def test_a_named_pipe_a_file_beside_data_and_a_crate_of_the_wrong_shape_are_one_line_each(run):
    """Outside pass P: a named pipe in the payload made `validate --bundle` wait for ever; a forged report beside
    data/ passed; a crate that was a list, or whose references were strings, was a traceback; a file named with a
    line break printed a false "valid" line."""
    import bagit

    out = make(run)
    pipe = out / "data" / "config" / "smoke.yaml"
    pipe.unlink()
    os.mkfifo(pipe)
    assert bundle.check(out) == [f"{pipe}: not a plain file (a named pipe, socket or device): a bundle holds files"]
    pipe.unlink()
    out = make(run)
    (out / "results").mkdir()
    (out / "results" / "report.md").write_text("# all met\n")
    assert bundle.check(out) == [f"{out / 'results'}: added (beside data/: a parity bundle holds only its tag files "
                                 "there)"]
    out = make(run)
    crate = out / "data" / bundle.CRATE
    for edit in (lambda doc: [doc], lambda doc: None,
                 lambda doc: doc | {"@graph": [e | {"mainEntity": "Snakefile"} if e.get("@id") == "./" else e
                                               for e in doc["@graph"]]},
                 lambda doc: doc | {"@graph": [e | {"object": "config/smoke.yaml"} if e.get("@id") == "#run" else e
                                               for e in doc["@graph"]]}):
        original = json.loads(crate.read_text())
        crate.write_text(json.dumps(edit(original)))
        bagit.Bag(str(out)).save(manifests=True)
        problems = bundle.check(out)
        assert len(problems) >= 1 and all(p.startswith(str(crate)) for p in problems[:1]), problems
        crate.write_text(json.dumps(original))
    bagit.Bag(str(out)).save(manifests=True)
    odd = out / "data" / "x: fine\n1 bundle(s) valid\nz"
    odd.write_text("x")
    bagit.Bag(str(out)).save(manifests=True)
    problems = bundle.check(out)
    assert problems and all("\n" not in p for p in problems) and "\\n1 bundle(s) valid" in problems[0], problems


def test_a_seal_inputs_own_links_are_bundled_too(run):
    """Outside pass R: an `articles` receipt, a seal input, links the parquet it was derived from; the bundle held the
    receipt and not the parquet, so `validate --bundle` refused every real run's bundle (file-missing)."""
    from parity.manifest import file_ref, header, sha256_file, write_manifest

    corp = run / "resources" / "corp"
    corp.mkdir(parents=True)
    (corp / "articles.jsonl").write_text('{"article": "a"}\n')
    (corp / "validation.parquet").write_bytes(b"PAR1 not really")
    digest = sha256_file(corp / "articles.jsonl")
    receipt = corp / "articles.receipt.json"
    write_manifest(receipt, header("fetch-receipt", simulated=False) | {
        "source": {"type": "local"}, "token_used": False, "pins_recorded": [],
        "files": [{"name": "articles.jsonl", "sha256": digest, "bytes": 17, "pinned_sha256": digest, "verified": True,
                   "downloaded": True}],
        "derived_from": {"articles.jsonl": file_ref(corp / "validation.parquet", corp)}})
    results = run / "results" / "smoke"
    summary, problems = seal.seal(results, [receipt], log=lambda m: None)
    assert problems == [], problems
    out = make(run)
    assert (out / "data" / "resources" / "corp" / "validation.parquet").is_file()
    assert bundle.check(out) == []
