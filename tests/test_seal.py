"""The run manifest: after `parity seal`, every kept file of a results tree is linked by path and hash, so
`parity validate` names any file changed, deleted or added; a tree that does not validate is not sealed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity import seal
from parity.cli import main
from parity.manifest import header, linked_files, manifests_in, write_manifest
from parity.trace import TraceSpec, build_trace


@pytest.fixture
def results(tmp_path, small_inputs) -> Path:
    """A results tree as the smoke profile leaves it: generated inputs, a trace reading them, a cleanup
    receipt, logs (one empty), a lock file, a side file no step's manifest links."""
    tree = tmp_path / "results" / "smoke"
    corpus, tok = small_inputs
    shutil.copytree(tok, tree / "inputs" / "tokenizer")
    shutil.copy(corpus, tree / "inputs" / "corpus.jsonl")
    build_trace(TraceSpec("reuse", documents=2, questions_per_document=1, prefix_tokens=200, seed=1),
                tree / "inputs" / "corpus.jsonl", tree / "inputs" / "tokenizer", tree / "traces")
    write_manifest(tree / "locality" / "cleanup" / "t0.json", header("cleanup-receipt", simulated=True) | {
        "what": "replicas", "processes": [], "ports_released": [], "gpus_released": [], "clean": True, "errors": []})
    for rel, text in {"logs/trace_reuse.log": "built\n", "logs/empty.log": "", "locality/gpu-locks/g0.lock": "",
                      "offline-limit/trials/summary.jsonl": '{"trial": "t0"}\n'}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


def sealed(results: Path) -> dict:
    summary, problems = seal.seal(results, log=lambda m: None)
    assert problems == [], problems
    return json.loads((results / seal.RUN_MANIFEST).read_text())


def test_after_the_seal_every_kept_file_is_linked_from_some_manifest(results):
    doc = sealed(results)
    linked = {t for path, d in manifests_in(results) for t in linked_files(d, path)}
    kept = {(results / rel).resolve() for rel in seal.kept(results)} - {(results / seal.RUN_MANIFEST).resolve()}
    assert kept <= linked  # the tokenizer's config, the log, the side file, the receipt: none left out
    assert not (kept & {(results / "logs" / "empty.log").resolve(), (results / "locality/gpu-locks/g0.lock").resolve()})
    assert sorted(r["path"] for r in doc["manifests"]) == ["locality/cleanup/t0.json", "traces/reuse.json"]
    assert "inputs/tokenizer/tokenizer_config.json" in {r["path"] for r in doc["files"]}
    assert "inputs/corpus.jsonl" not in {r["path"] for r in doc["files"]}  # the trace links it already
    assert doc["simulated"] is True  # one of its manifests is
    ok = CliRunner().invoke(main, ["validate", str(results)])
    assert ok.exit_code == 0 and "manifest(s) valid" in ok.output


@pytest.mark.parametrize("change, rule", [
    (lambda t: (t / "notes.txt").write_text("added later"), "unlinked"),
    (lambda t: (t / "logs" / "trace_reuse.log").write_text("edited\n"), "sha256-mismatch"),
    (lambda t: (t / "offline-limit" / "trials" / "summary.jsonl").unlink(), "file-missing"),
    (lambda t: (t / "inputs" / "tokenizer" / "tokenizer_config.json").write_text("{}"), "sha256-mismatch"),
])
def test_a_change_to_a_sealed_tree_is_named(results, change, rule):
    sealed(results)
    change(results)
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1 and f": {rule}: " in result.output, result.output


def test_a_tree_that_does_not_validate_is_not_sealed_and_an_earlier_seal_is_removed(results):
    sealed(results)
    (results / "traces" / "reuse.tokens").write_bytes(b"tampered")
    result = CliRunner().invoke(main, ["seal", str(results)])
    assert result.exit_code == 1 and "traces/reuse.json: /tokens: sha256-mismatch" in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: not sealed: ")
    assert not (results / seal.RUN_MANIFEST).exists()  # nothing vouches for the tree now


@pytest.mark.parametrize("cut", [b"", b'{"kind": "trace", '])
def test_a_manifest_emptied_or_cut_short_is_not_sealed_as_a_plain_file(results, cut):
    """Found by an outsider: a *.json that is not JSON was skipped as no manifest and sealed as one of the tree's
    plain files, where `parity validate` of the same tree reports it."""
    sealed(results)
    (results / "traces" / "reuse.json").write_bytes(cut)
    result = CliRunner().invoke(main, ["seal", str(results)])
    assert result.exit_code == 1 and "traces/reuse.json: : not-json: " in result.output, result.output
    assert not (results / seal.RUN_MANIFEST).exists()


def test_sealing_again_links_what_a_rerun_added_and_the_cli_says_what_it_did(results):
    sealed(results)
    (results / "logs" / "rerun.log").write_text("again\n")
    result = CliRunner().invoke(main, ["seal", str(results)])
    assert result.exit_code == 0 and "sealed" in result.output, result.output
    assert "logs/rerun.log" in {r["path"] for r in json.loads((results / seal.RUN_MANIFEST).read_text())["files"]}
    assert CliRunner().invoke(main, ["validate", str(results)]).exit_code == 0


def test_fetch_receipts_outside_the_tree_are_linked_as_its_inputs(results, tmp_path):
    receipt = tmp_path / "resources" / "model" / "fetch-receipt.json"
    write_manifest(receipt, header("fetch-receipt", simulated=False) | {
        "source": {"type": "url", "url": "https://example.org/stand-in"}, "files": [], "token_used": False})
    result = CliRunner().invoke(main, ["seal", str(results), "--input", str(receipt)])
    assert result.exit_code == 0, result.output
    doc = json.loads((results / seal.RUN_MANIFEST).read_text())
    assert [r["path"] for r in doc["inputs"]] == ["../../resources/model/fetch-receipt.json"]
    receipt.write_text(receipt.read_text().replace("stand-in", "stand-by"))
    assert CliRunner().invoke(main, ["validate", str(results)]).exit_code == 1  # followed from the run manifest


def test_bad_seal_input_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["seal", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["seal", str(tmp_path / "empty")])  # a wrong folder, not an empty run: it
    # sealed as empty until an outside evaluator's second 2026-12-05 pass
    assert result.exit_code == 1 and "nothing to seal in" in result.output
    assert not (tmp_path / "empty" / seal.RUN_MANIFEST).exists() and seal.unlinked(tmp_path / "empty") == []


def test_a_seal_whose_own_output_lies_in_the_tree_is_refused_in_one_line(results):
    """`parity seal RESULTS > RESULTS/logs/seal.log` would link its log before its last line is written."""
    import subprocess
    import sys

    log = results / "logs" / "seal.log"
    with open(log, "w") as handle:
        run = subprocess.run([sys.executable, "-m", "parity", "seal", str(results)], stdout=handle, stderr=subprocess.STDOUT)
    assert run.returncode == 1
    assert log.read_text().strip().splitlines()[-1] == (
        f"Error: {log} is this command's own output: write it outside the tree it seals")
    assert not (results / seal.RUN_MANIFEST).exists()


@pytest.mark.parametrize("forged", ["{}", "[]", '{"kind": "run"}', "folder",
                                    json.dumps(header("cleanup-receipt", simulated=True))])
def test_a_run_json_that_is_not_a_run_manifest_is_refused(results, forged):
    """A forged run.json made the tree read as sealed while nothing checked it: a file added and a log removed
    passed `parity validate` (an outside tester's report)."""
    sealed(results)
    run = results / seal.RUN_MANIFEST
    run.unlink()
    if forged == "folder":
        run.mkdir()
    else:
        run.write_text(forged)
    (results / "notes.txt").write_text("forged")
    (results / "logs" / "trace_reuse.log").unlink()
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    *lines, last = result.output.strip().splitlines()
    assert lines and all(line.startswith(f"{run}: ") for line in lines), lines  # only run.json is named
    rule = "not-json" if forged == "folder" else "not-a-seal"  # a folder: named by the walk, as any *.json folder
    assert [line for line in lines if f": {rule}: " in line] and last.startswith(f"Error: {len(lines)} problem(s)")
    assert seal.sealed_trees(results.parent) == []  # and the bundle finds no sealed tree in it


def test_a_manifest_with_its_schema_version_deleted_is_a_schema_error_not_a_plain_file(results):
    """An outside evaluator deleted a manifest's `schema_version` and forged its content: a manifest was a JSON
    object with both `kind` and `schema_version`, so this one passed for one of the tree's plain files:
    `parity validate` counted one manifest fewer and passed, and `parity seal` linked it as a plain file. A
    `kind` that names a manifest kind makes it a manifest, and its missing schema version a schema error; JSON
    files that are no manifest (the tokenizer's, a JSON object with a kind no schema names) stay plain files."""
    receipt = results / "locality" / "cleanup" / "t0.json"
    doc = json.loads(receipt.read_text())
    del doc["schema_version"]
    receipt.write_text(json.dumps(doc | {"clean": False, "errors": "forged"}))
    (results / "logs" / "schedule.json").write_text(json.dumps({"kind": "burst", "rate": 1}))  # not a manifest kind
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1, result.output
    assert f"{receipt}: : required: 'schema_version' is a required property" in result.output, result.output
    assert "schedule.json" not in result.output and "tokenizer" not in result.output, result.output
    result = CliRunner().invoke(main, ["seal", str(results)])
    assert result.exit_code == 1 and "'schema_version' is a required property" in result.output, result.output
    assert not (results / seal.RUN_MANIFEST).exists()
    receipt.write_text(json.dumps(doc | {"schema_version": 3}))  # put back: the tree seals and validates again
    sealed(results)
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 0, result.output


def test_a_folder_or_manifest_inside_a_sealed_tree_is_checked_within_that_tree(results):
    """An outside evaluator's: `parity validate TREE/traces` (or one manifest of it) said `bad-path ... leaves the
    evidence tree` for the trace's link to ../inputs: with no Snakefile above, the named folder was the tree. The
    sealed tree (its run.json) is the tree now; an unsealed one's message says which folder to name."""
    unsealed = CliRunner().invoke(main, ["validate", str(results / "traces")])
    assert unsealed.exit_code == 1 and "(name the tree's top folder, or the work folder holding its Snakefile)" \
        in unsealed.output
    sealed(results)
    for named in (results / "traces", results / "traces" / "reuse.json"):
        ok = CliRunner().invoke(main, ["validate", str(named)])
        assert ok.exit_code == 0 and "manifest(s) valid" in ok.output, ok.output


def test_a_manifest_with_its_kind_deleted_is_named_not_a_plain_file(results):
    """The same forgery the other way round: with its `kind` deleted, a manifest that keeps its schema version
    passed for a plain file too."""
    receipt = results / "locality" / "cleanup" / "t0.json"
    doc = json.loads(receipt.read_text())
    del doc["kind"]
    receipt.write_text(json.dumps(doc | {"clean": False}))
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1 and f"{receipt}: /kind: unknown-kind: no kind" in result.output, result.output
    assert CliRunner().invoke(main, ["seal", str(results)]).exit_code == 1


def test_an_input_that_is_no_fetch_receipt_or_lies_in_the_tree_is_refused_in_one_line(results, tmp_path):
    """`seal --input` linked any manifest as the run's input, even one of the tree's own (an outsider's,
    2026-12-07): it names a fetch receipt from outside the tree."""
    other = tmp_path / "cleanup.json"
    write_manifest(other, header("cleanup-receipt", simulated=False) | {
        "what": "stand-in", "processes": [], "ports_released": [], "gpus_released": [], "clean": True, "errors": []})
    inside = next((results / "traces").glob("*.json"))
    for given, says in ((other, "is a manifest of kind 'cleanup-receipt', not a fetch receipt"),
                        (inside, f"lies in {results}")):
        result = CliRunner().invoke(main, ["seal", str(results), "--input", str(given)])
        assert result.exit_code == 1 and says in result.output and len(result.output.splitlines()) == 1, result.output
    assert not (results / seal.RUN_MANIFEST).exists()


def test_a_switched_off_arms_earlier_pairs_are_sealed_as_superseded_not_as_evidence(tmp_path, tiny_reuse_trace,
                                                                                     sim_backend):
    """A confirmation run with a Flame arm, then again with the arm switched off (null): the arm's trials, pair and
    cleanup receipts stay on disk (nothing lost), and the seal linked its pair among the tree's tops, as evidence of a
    run whose settings say it never ran (outside pass M). They are sealed as `superseded` now, and said so."""
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment

    results = tmp_path / "results"
    for source in tiny_reuse_trace.parent.parent.iterdir():  # the trace and the inputs it links, in the tree as they
        if source.name.startswith(("small-inputs", "tiny-traces")):  # lie beside each other
            shutil.copytree(source, results / source.name)
    trace = results / tiny_reuse_trace.parent.name / tiny_reuse_trace.name
    out = results / "confirmation"
    flame = {"batch_limit": 128, "window_ms": 10, "budget_mib": 4, "api": "async", "compress": True,
             "order": "arrival", "gc_freeze": True}
    for arm in ({"batch_limit": 256, "order": "prefix"}, None):
        settings = {"pairs": 1, "shards": 1, "flame": flame, "flame_arms": {"tuned": arm}}
        run_experiment("confirmation", plan.for_experiment("confirmation", [trace], settings), sim_backend, out,
                       settings=settings, log=lambda _: None)
    said: list[str] = []
    summary, problems = seal.seal(results, log=said.append)
    assert problems == [], problems
    doc = json.loads((results / seal.RUN_MANIFEST).read_text())
    tops = {r["path"] for r in doc["manifests"]}
    assert "confirmation/experiment.json" in tops and not any("tuned" in path for path in tops), tops
    superseded = {r["path"] for r in doc["superseded"]}
    assert "confirmation/pairs/final-tuned-reuse-p0.json" in superseded, superseded
    assert all("tuned" in path for path in superseded), superseded
    assert any("none of their experiments' cases" in line for line in said), said
    assert seal.unlinked(results) == []  # every kept file still linked: an edit of a superseded one is named
    earlier = {p.as_posix() for p in seal.superseded(results)}  # what the bundle names no GPU or version from
    assert "confirmation/trials/confirmation-final-tuned-reuse-p0-flame.json" in earlier, earlier
    assert all("tuned" in path for path in earlier) and superseded <= earlier, earlier
    ok = CliRunner().invoke(main, ["validate", str(results)])
    assert ok.exit_code == 0, ok.output


def test_a_top_moved_under_superseded_is_named(results):
    """`superseded` holds an earlier run's trials, pairs and cleanup receipts (seal); a top moved there by hand (a
    trace here: an experiment or a report would be hidden so) is named by validate."""
    from forge import rehash

    doc = sealed(results)
    doc["superseded"] = [ref for ref in doc["manifests"] if ref["path"] == "traces/reuse.json"]
    doc["manifests"] = [ref for ref in doc["manifests"] if ref["path"] != "traces/reuse.json"]
    (results / seal.RUN_MANIFEST).write_text(json.dumps(doc))
    rehash(results)
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1 and "/superseded/0" in result.output and "Traceback" not in result.output, \
        result.output


def test_a_top_moved_among_plain_files_is_named(results):
    """A top moved by hand from `manifests` to `files` (a simulated experiment there would leave the run's label to
    the tops left) is named by validate (outside pass N)."""
    from forge import rehash

    doc = sealed(results)
    doc["files"] += [ref for ref in doc["manifests"] if ref["path"] == "traces/reuse.json"]
    doc["manifests"] = [ref for ref in doc["manifests"] if ref["path"] != "traces/reuse.json"]
    (results / seal.RUN_MANIFEST).write_text(json.dumps(doc))
    rehash(results)
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 1 and "/files/" in result.output and "is a manifest" in result.output \
        and "Traceback" not in result.output, result.output


def test_a_manifest_in_a_hidden_folder_is_a_plain_file_to_the_seal_and_to_validate(results):
    """The seal's walk leaves hidden folders out, so it lists a manifest copied into `.bak/` among the plain files:
    validate then named it "is a manifest" in the tree it had just sealed (outside pass R)."""
    (results / ".bak").mkdir()
    shutil.copy(results / "locality" / "cleanup" / "t0.json", results / ".bak" / "t0.json")
    sealed(results)
    result = CliRunner().invoke(main, ["validate", str(results)])
    assert result.exit_code == 0, result.output
