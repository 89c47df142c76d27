"""Manifests: schema validation with pointers, atomic writes, hash-linked references, `parity validate`."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import shutil
import stat

import pytest
from click.testing import CliRunner

from parity import manifest
from parity.cli import main
from parity.record import config_sha256
from parity.manifest import (
    SCHEMA_VERSION,
    ManifestError,
    Problem,
    atomic_write_bytes,
    atomic_write_text,
    check_references,
    dumps,
    file_ref,
    header,
    known_kinds,
    read_manifest,
    schemas_dir,
    sha256_bytes,
    sha256_file,
    strict_loads,
    validate_document,
    validate_paths,
    write_manifest,
)

SHA = "0" * 64


# ---- minimal valid documents of each kind ------------------------------------------------------

def trial_doc() -> dict:
    """A minimal valid trial manifest (simulated); its `trace` link is only checked by validate_paths."""
    return header("trial", simulated=True) | {
        "trial_id": "locality-vllm-sticky-reuse-r0", "experiment": "locality", "system": "vllm",
        "engine": {"name": "sim", "version": "0.1.0", "args": {}, "simulated": True},
        "trace": {"path": "reuse.json", "sha256": SHA}, "trace_name": "reuse",
        "config": {"routing": "sticky"}, "config_sha256": config_sha256({"routing": "sticky"}),
        "versions": {"parity": "0.1.0", "python": "3.11.7", "vllm": None},
        "gpus": [{"uuid": "sim-0"}],
        "timing": {"release_s": 0.0, "last_completion_s": 2.0, "duration_s": 2.0, "requests_per_s": 1.0},
        "records": [{"request_id": "reuse-d0000-q0", "position": 0, "input_sha256": SHA, "shard": 0,
                     "worker_id": "replica-0", "gpu_uuid": "sim-0", "prompt_tokens": 8012,
                     "cached_tokens": 0, "output_token_ids": [1] * 16, "submit_s": 0.0, "complete_s": 2.0}],
        "verdict": {"status": "passed", "checks": {"coverage": {"passed": True}}, "reasons": []},
    }


def pair_doc() -> dict:
    side = {"manifest": {"path": "trials/t0.json", "sha256": SHA}, "system": "vllm", "requests_per_s": 2.0}
    return header("pair", simulated=True) | {
        "trace_name": "reuse", "pair_index": 0, "reference": side,
        "candidate": copy.deepcopy(side) | {"system": "flame", "requests_per_s": 1.99},
        "ratio": 0.995, "meets_99": True,
    }


def fetch_receipt_doc() -> dict:
    return header("fetch-receipt", simulated=False) | {
        "source": {"type": "huggingface", "repo": "meta-llama/Llama-3.1-8B-Instruct", "revision": "0e9e39f"},
        "files": [{"name": "config.json", "sha256": SHA, "bytes": 855, "pinned_sha256": SHA,
                   "verified": True, "downloaded": True},
                  {"name": "tokenizer.json", "sha256": SHA, "bytes": 9085657, "pinned_sha256": None,
                   "verified": False, "downloaded": False}],
        "token_used": True,
    }


def cleanup_receipt_doc() -> dict:
    return header("cleanup-receipt", simulated=True) | {
        "what": "flame session reuse-r0", "processes": [{"pid": 4242, "name": "flame-executor",
                                                         "exit_code": None, "signal": "SIGTERM"}],
        "ports_released": [8080], "gpus_released": ["sim-0"], "clean": True, "errors": [],
    }


MINIMAL = {"trial": trial_doc, "pair": pair_doc, "fetch-receipt": fetch_receipt_doc,
           "cleanup-receipt": cleanup_receipt_doc}


def rules(problems: list[Problem]) -> list[tuple[str, str]]:
    return [(p.pointer, p.rule) for p in problems]


# ---- schemas -----------------------------------------------------------------------------------

def test_every_kind_has_a_schema():
    assert {"trace", "trial", "pair", "fetch-receipt", "cleanup-receipt"} <= set(known_kinds())
    assert "common" not in known_kinds()


def test_schema_ids_follow_file_names():
    for path in schemas_dir().glob("*.schema.json"):
        schema = json.loads(path.read_text())
        assert schema["$id"] == f"https://parity.invalid/schemas/{path.name}"
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_new_schema_files_are_discovered(tmp_path, monkeypatch):
    for path in schemas_dir().glob("*.schema.json"):
        shutil.copy(path, tmp_path)
    (tmp_path / "widget.schema.json").write_text(json.dumps({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://parity.invalid/schemas/widget.schema.json",
        "allOf": [{"$ref": "common.schema.json#/$defs/header"}], "properties": {"kind": {"const": "widget"}}}))
    monkeypatch.setattr(manifest, "schemas_dir", lambda: tmp_path)
    manifest._validators.cache_clear()
    try:
        assert "widget" in known_kinds()
        assert validate_document(header("widget", simulated=False)) == []
        assert rules(validate_document({"kind": "widget"}))[0] == ("", "required")
    finally:
        manifest._validators.cache_clear()


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_minimal_document_of_each_kind_is_valid(kind):
    doc = MINIMAL[kind]()
    assert doc["kind"] == kind and doc["schema_version"] == SCHEMA_VERSION
    assert validate_document(doc) == []


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_header_fields_are_required(kind):
    for field in ("kind", "schema_version", "simulated", "parity_version"):
        doc = MINIMAL[kind]()
        del doc[field]
        problems = validate_document(doc)
        if field == "kind":
            assert rules(problems) == [("/kind", "unknown-kind")]
        else:
            assert ("", "required") in rules(problems) and field in problems[0].message


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_an_unknown_top_level_field_is_refused(kind):
    """A field no schema declares is named, not carried along unchecked (a forged or misspelt entry)."""
    doc = MINIMAL[kind]() | {"speedup_claimed": 2.0}
    problems = validate_document(doc)
    assert rules(problems) == [("", "unevaluatedProperties")] and "speedup_claimed" in problems[0].message


def test_an_unknown_field_is_named_once_the_rest_is_right():
    """A failing part of a schema leaves the fields it declares unevaluated: beside a real problem they are not
    named as unexpected (an MLPerf run with a wrong scenario names the scenario, not its other fields)."""
    doc = MINIMAL["trial"]() | {"speedup_claimed": 2.0}
    doc["schema_version"] = SCHEMA_VERSION + 1
    assert rules(validate_document(doc)) == [("/schema_version", "const")]


# ---- schema problems: pointer, rule, message ---------------------------------------------------

def test_missing_field_is_named_with_pointer_and_rule():
    doc = trial_doc()
    del doc["records"][0]["cached_tokens"]
    problems = validate_document(doc)
    assert rules(problems) == [("/records/0", "required")]
    assert "cached_tokens" in problems[0].message


def test_wrong_type_pointer():
    doc = trial_doc()
    doc["records"][0]["cached_tokens"] = "many"
    assert rules(validate_document(doc)) == [("/records/0/cached_tokens", "type")]


def test_all_problems_are_reported_sorted_by_pointer():
    doc = trial_doc()
    doc["schema_version"] = SCHEMA_VERSION + 1
    doc["timing"]["duration_s"] = -1
    doc["records"][0]["surprise"] = 1
    doc["records"][0]["output_token_ids"][3] = 2**32
    assert rules(validate_document(doc, path="t.json")) == [
        ("/records/0", "additionalProperties"),
        ("/records/0/output_token_ids/3", "maximum"),
        ("/schema_version", "const"),
        ("/timing/duration_s", "minimum"),
    ]


def test_problem_is_one_line():
    doc = trial_doc()
    doc["records"] = {"a": "x" * 5000}  # the validator's message quotes the whole value
    (problem,) = validate_document(doc, path="runs/t.json")
    text = str(problem)
    assert text.startswith("runs/t.json: /records: type: ") and "\n" not in text and len(text) < 400


def test_unknown_or_missing_kind():
    (problem,) = validate_document({"kind": "banana"}, path="x.json")
    assert (problem.pointer, problem.rule) == ("/kind", "unknown-kind")
    assert "banana" in problem.message and "trial" in problem.message
    assert rules(validate_document({"schema_version": 1})) == [("/kind", "unknown-kind")]
    assert rules(validate_document([1, 2])) == [("", "type")]


def test_simulated_trial_cannot_name_a_real_gpu_and_vice_versa():
    doc = trial_doc()
    doc["gpus"] = [{"uuid": "GPU-1234"}]
    assert rules(validate_document(doc)) == [("/gpus/0/uuid", "pattern")]
    real = trial_doc() | {"simulated": False}
    assert ("/engine/simulated", "const") in rules(validate_document(real))
    assert ("/records/0/gpu_uuid", "not") in rules(validate_document(real))


def test_verdict_must_agree_with_its_checks():
    doc = trial_doc()
    doc["verdict"]["checks"]["coverage"]["passed"] = False
    assert rules(validate_document(doc)) == [("/verdict/checks/coverage/passed", "const")]
    doc["verdict"]["status"] = "failed"
    assert rules(validate_document(doc)) == [("/verdict/reasons", "minItems")]
    doc["verdict"]["reasons"] = ["coverage: 3 requests missing"]
    assert validate_document(doc) == []


def test_pair_ratio_must_be_positive():
    doc = pair_doc()
    doc["ratio"] = 0
    assert rules(validate_document(doc)) == [("/ratio", "exclusiveMinimum")]


def test_fetch_receipt_never_holds_a_credential():
    doc = fetch_receipt_doc() | {"token": "hf_abcdefghijklmnopqrstuvwxyz"}
    (problem,) = validate_document(doc)
    assert (problem.pointer, problem.rule) == ("", "not") and "'token'" in problem.message
    doc = fetch_receipt_doc()
    doc["source"] = {"type": "url", "url": "https://user:hf_secret@example.org/model.bin"}
    assert rules(validate_document(doc)) == [("/source/url", "not")]
    doc["source"] = {"type": "huggingface"}
    assert rules(validate_document(doc)) == [("/source", "required")]


def test_clean_cleanup_has_no_errors():
    doc = cleanup_receipt_doc()
    doc["errors"] = ["port 8080 still bound"]
    assert rules(validate_document(doc)) == [("/errors", "maxItems")]


def test_problem_str():
    assert str(Problem("a.json", "/records/3", "required", "'x' is a required property")) == \
        "a.json: /records/3: required: 'x' is a required property"


# ---- writing -----------------------------------------------------------------------------------

def test_write_manifest_returns_its_hash(tmp_path):
    ref = write_manifest(tmp_path / "sub" / "t.json", trial_doc())
    data = (tmp_path / "sub" / "t.json").read_bytes()
    assert ref == {"path": str(tmp_path / "sub" / "t.json"), "sha256": hashlib.sha256(data).hexdigest(),
                   "bytes": len(data)}
    assert read_manifest(tmp_path / "sub" / "t.json") == trial_doc()
    assert stat.S_IMODE(os.stat(tmp_path / "sub" / "t.json").st_mode) & 0o044  # not left 0600


def test_invalid_manifest_is_not_written(tmp_path):
    path = tmp_path / "trial.json"
    path.write_text("old")
    doc = trial_doc()
    doc["system"] = "Not A Path Name"
    with pytest.raises(ManifestError, match="/system: pattern"):
        write_manifest(path, doc)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["trial.json"]
    with pytest.raises(ManifestError):
        write_manifest(tmp_path / "new.json", doc)
    assert [p.name for p in tmp_path.iterdir()] == ["trial.json"]


def test_failed_serialisation_leaves_nothing(tmp_path):
    doc = trial_doc()
    doc["config"]["bad"] = float("nan")  # schema-valid (config is free-form) but not JSON
    with pytest.raises(ValueError):
        write_manifest(tmp_path / "t.json", doc)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "t.json").write_text("old")
    with pytest.raises(ValueError):
        write_manifest(tmp_path / "t.json", doc)
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"] and (tmp_path / "t.json").read_text() == "old"


def test_atomic_write_failing_mid_way_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    path.write_text("old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(manifest.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(path, b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"] and path.read_text() == "old"
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(path, "lone surrogate \ud800")
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"] and path.read_text() == "old"


def test_atomic_write_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(manifest.os, "fsync", full)
    with pytest.raises(OSError) as err:
        atomic_write_bytes(tmp_path / "m.json", b"new")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "m.json")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_onto_a_folder_names_it_and_leaves_no_temporary_file(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError) as err:
        atomic_write_bytes(tmp_path / "out", b"new")
    assert err.value.filename == str(tmp_path / "out") and err.value.filename2 is None
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_dumps_is_deterministic(tmp_path):
    a, b = trial_doc(), dict(reversed(list(trial_doc().items())))
    assert dumps(a) == dumps(b) and dumps(a).endswith("}\n")
    assert write_manifest(tmp_path / "a.json", a)["sha256"] == write_manifest(tmp_path / "b.json", b)["sha256"]
    assert dumps({"name": "Zürich"}) == '{\n "name": "Zürich"\n}\n'


# ---- reading -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, says", [
    ("{", "not valid JSON"),
    ('{"x": NaN}', "NaN"),
    ('{"kind": "a", "kind": "b"}', "duplicate key"),
    ("[1]", "not a JSON object"),
    # an outside tester's: JSON that Python cannot hold was a RecursionError (and a ValueError) traceback
    ("[" * 100_000, "not valid JSON: nested more deeply than Python's JSON parser reads"),
    ('{"x": ' + "9" * 5000 + "}", "not valid JSON: a number of more than 4300 digits"),
])
def test_read_manifest_refuses_what_json_would_accept(tmp_path, text, says):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(ManifestError, match=says) as info:
        read_manifest(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_read_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no such manifest"):
        read_manifest(tmp_path / "nope.json")


# ---- hashes and links --------------------------------------------------------------------------

def test_sha256_file(tmp_path):
    data = os.urandom(3 * (1 << 20) + 17)  # several chunks and a partial one
    path = tmp_path / "x"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest() == sha256_bytes(data)


def test_file_ref_is_relative_with_forward_slashes(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "reuse.tokens").write_bytes(b"abc")
    ref = file_ref(tmp_path / "traces" / "reuse.tokens", tmp_path / "runs" / "locality")
    assert ref == {"path": "../../traces/reuse.tokens", "sha256": hashlib.sha256(b"abc").hexdigest(), "bytes": 3}


def test_check_references_reports_missing_tampered_and_bad_paths(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a")
    good = file_ref(tmp_path / "a.bin", tmp_path)
    doc = {"ok": good, "list": [good | {"bytes": 2}],
           "gone": {"path": "b.bin", "sha256": SHA},
           "abs": {"path": "/etc/passwd", "sha256": SHA},
           "not_a_ref": {"path": "c.bin", "sha256": SHA, "note": "extra keys: not a reference"}}
    problems = check_references(doc, tmp_path / "m.json")
    assert sorted(rules(problems)) == [("/abs", "bad-path"), ("/gone", "file-missing"),
                                       ("/list/0", "bytes-mismatch")]
    (tmp_path / "a.bin").write_bytes(b"A")
    (problem,) = check_references({"ok": good}, tmp_path / "m.json")
    assert problem.rule == "sha256-mismatch"
    assert hashlib.sha256(b"A").hexdigest() in problem.message and good["sha256"] in problem.message


def pair_tree(tmp_path):
    trial = tmp_path / "trials" / "t0.json"
    write_manifest(trial, trial_doc() | {"trace": {"path": "../trace.bin", "sha256": hashlib.sha256(b"t").hexdigest()}})
    (tmp_path / "trace.bin").write_bytes(b"t")
    side = {"manifest": file_ref(trial, tmp_path), "system": "vllm", "requests_per_s": 1.0}
    pair = header("pair", simulated=True) | {"trace_name": "reuse", "pair_index": 0, "reference": side,
                                              "candidate": copy.deepcopy(side), "ratio": 1.0, "meets_99": True}
    write_manifest(tmp_path / "pair.json", pair)
    return trial


def test_hash_linked_tree_is_checked(tmp_path):
    trial = pair_tree(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {}}))  # not a manifest: skipped
    assert validate_paths([tmp_path]) == (2, [])
    trial.write_text(trial.read_text().replace('sticky-reuse-r0', 'tampered'))
    checked, problems = validate_paths([tmp_path])
    assert checked == 2
    assert {(p.pointer, p.rule) for p in problems} == {("/candidate/manifest", "sha256-mismatch"),
                                                       ("/reference/manifest", "sha256-mismatch")}
    assert all(p.file == str(tmp_path / "pair.json") for p in problems)


def test_naming_the_top_of_a_tree_checks_what_it_links(tmp_path):
    pair_tree(tmp_path)
    assert validate_paths([tmp_path / "pair.json"]) == (2, [])  # the pair, and the trial it links
    (tmp_path / "trace.bin").write_bytes(b"changed")
    checked, problems = validate_paths([tmp_path / "pair.json", tmp_path])  # each manifest once
    assert checked == 2
    assert rules(problems) == [("/trace", "sha256-mismatch")]
    assert problems[0].file == str(tmp_path / "trials" / "t0.json")


def test_directory_validation_skips_other_json_but_reports_broken_json(tmp_path):
    write_manifest(tmp_path / "c.json", cleanup_receipt_doc())
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / ".snakemake").mkdir()
    (tmp_path / ".snakemake" / "junk.json").write_text("{")
    assert validate_paths([tmp_path]) == (1, [])
    (tmp_path / "broken.json").write_text('{"kind": "trial", ')
    checked, problems = validate_paths([tmp_path])
    assert checked == 1 and rules(problems) == [("", "not-json")]
    checked, problems = validate_paths([tmp_path / "tokenizer.json"])  # named explicitly: validated
    assert checked == 1 and rules(problems) == [("/kind", "unknown-kind")]
    checked, problems = validate_paths([tmp_path / "list.json", tmp_path / "gone.json"])
    assert checked == 1 and rules(problems) == [("", "type"), ("", "file-missing")]
    (tmp_path / "broken.json").write_text("[" * 100_000)  # nested past Python's parser: reported, not raised
    checked, problems = validate_paths([tmp_path])
    assert checked == 1 and rules(problems) == [("", "not-json")] and "nested more deeply" in problems[0].message


def test_a_folder_where_a_manifest_belongs_is_reported(tmp_path):
    """A manifest replaced by a folder of its name: in an unsealed tree nothing links it, so the walk must name it
    (it was skipped, and the tree passed)."""
    write_manifest(tmp_path / "c.json", cleanup_receipt_doc())
    (tmp_path / "exp" / "experiment.json").mkdir(parents=True)
    checked, problems = validate_paths([tmp_path])
    assert checked == 1 and rules(problems) == [("", "not-json")]
    assert problems[0].file == str(tmp_path / "exp" / "experiment.json") and "not a plain file" in problems[0].message
    unreadable: list[Problem] = []
    assert [p for p, _ in manifest.manifests_in(tmp_path, unreadable)] == [tmp_path / "c.json"]
    assert unreadable == problems  # what `parity seal` reports of it: the same line
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == "Error: 1 problem(s) in 1 manifest(s)"


# ---- the command ---------------------------------------------------------------------------------

def test_cli_validate(tmp_path):
    """(Kinds whose content is not derived again; a trial's and a pair's are: tests/test_rederive.py.)"""
    (tmp_path / "trace.bin").write_bytes(b"t")
    receipt = tmp_path / "cleanup" / "c0.json"
    write_manifest(receipt, cleanup_receipt_doc())
    write_manifest(tmp_path / "logs.json", header("run", simulated=True) | {
        "results": tmp_path.name, "manifests": [file_ref(receipt, tmp_path)],
        "files": [file_ref(tmp_path / "trace.bin", tmp_path)], "inputs": []})
    ok = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert ok.exit_code == 0 and "2 manifest(s) valid" in ok.output, ok.output
    (tmp_path / "trace.bin").write_bytes(b"changed")
    bad = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert bad.exit_code == 1
    lines = bad.output.strip().splitlines()
    assert lines[0].startswith(f"{tmp_path / 'logs.json'}: /files/0: sha256-mismatch: ")
    assert lines[-1] == "Error: 1 problem(s) in 2 manifest(s)"
    missing = CliRunner().invoke(main, ["validate", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "Traceback" not in missing.output


def test_every_command_has_help():
    runner = CliRunner()
    for args in ([], ["trace"], ["validate"], ["smoke-inputs"], ["bench"], ["bench", "router"]):
        result = runner.invoke(main, args + ["--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, args


def test_no_help_shows_a_range_of_none():
    """Every command's --help, walked: an unbounded number option printed `[x<=None]` (`--deadline`, 2026-12-05)."""
    import click

    def walk(command, path):
        yield path
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, path + [name])

    runner = CliRunner()
    paths = list(walk(main, []))
    assert len(paths) > 30
    for args in paths:
        result = runner.invoke(main, args + ["--help"], terminal_width=200)
        assert result.exit_code == 0 and "None]" not in result.output and "=None" not in result.output, args


def test_a_trial_names_the_image_it_ran_in_by_the_sif_files_own_hash(tmp_path, monkeypatch):
    """Inside Apptainer (its runtime sets APPTAINER_CONTAINER) a trial records the SIF's SHA-256 read from the file;
    on the host it says so; an image it cannot read is named with why, never given a hash it did not compute.
    Each form validates; a malformed one is refused."""
    from parity import record

    sif = tmp_path / "parity.sif"
    sif.write_bytes(b"not really an image")
    cases = [({}, {"inside": False}),
             ({"APPTAINER_CONTAINER": str(sif)}, {"inside": True, "name": "parity.sif", "bytes": 19,
                                                  "sha256": hashlib.sha256(b"not really an image").hexdigest()}),
             ({"SINGULARITY_CONTAINER": str(tmp_path)}, {"inside": True, "name": tmp_path.name, "sha256": None})]
    for env, expected in cases:
        for name in record.IMAGE_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        record.image.cache_clear()
        got = record.image()
        assert {k: v for k, v in got.items() if k != "why"} == expected
        assert manifest.validate_document(trial_doc() | {"image": got}) == []
    record.image.cache_clear()
    assert "not a file" in got["why"]
    assert rules(manifest.validate_document(trial_doc() | {"image": {"inside": True, "sha256": "abc"}}))


def test_a_named_pipe_is_refused_as_a_manifest_never_waited_on(tmp_path):
    """An outside tester's, 2026-12-06: `parity check FIFO` and `validate` on a tree whose trial was a FIFO hung
    for ever in read_manifest; it is refused in one line."""
    import os

    os.mkfifo(tmp_path / "trial.json")
    with pytest.raises(ManifestError, match="not a regular file"):
        read_manifest(tmp_path / "trial.json")


@pytest.mark.parametrize("number", ["1e400", "-1e400"])
def test_a_number_past_a_floats_range_is_not_read_as_infinity(tmp_path, number):
    """An outside tester's, 2026-12-06: a forged rate of 1e400 was read as inf by the strict reader (it refuses
    the word Infinity, not a number that overflows), and a report printed it."""
    path = tmp_path / "m.json"
    path.write_text('{"requests_per_s": %s}' % number)
    with pytest.raises(ManifestError, match="beyond what a float holds"):
        read_manifest(path)
    assert strict_loads('{"requests_per_s": 1e300}') == {"requests_per_s": 1e300}


def test_a_problem_with_a_line_break_in_its_files_name_is_one_line():
    """An outside tester's, 2026-12-06: a trial file named with a newline split validate's FILE: POINTER: RULE line
    in two, so one line's text could pose as another problem's."""
    problem = Problem("trials/a\nb.json: : ok: fine", "/x", "rule", "message")
    assert str(problem) == "trials/a\\nb.json: : ok: fine: /x: rule: message" and "\n" not in str(problem)
    assert str(Problem("t.json", "", "r", "m")) == "t.json: : r: m"
