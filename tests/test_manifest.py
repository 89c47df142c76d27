"""Manifests: schema validation with pointers, atomic writes, hash-linked references, `parity validate`."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from click.testing import CliRunner

from parity.cli import main
from parity.manifest import (
    ManifestError,
    dumps,
    file_ref,
    header,
    known_kinds,
    sha256_file,
    validate_document,
    validate_paths,
    write_manifest,
)

SHA = "0" * 64


def trial_doc() -> dict:
    return header("trial", simulated=True) | {
        "trial_id": "locality-vllm-sticky-reuse-r0", "experiment": "locality", "system": "vllm",
        "engine": {"name": "sim", "version": "0.1.0", "args": {}, "simulated": True},
        "trace": {"path": "reuse.json", "sha256": SHA}, "trace_name": "reuse",
        "config": {"routing": "sticky"}, "config_sha256": SHA,
        "versions": {"parity": "0.1.0", "python": "3.11.7", "vllm": None},
        "gpus": [{"uuid": "sim-0"}],
        "timing": {"release_s": 0.0, "last_completion_s": 2.0, "duration_s": 2.0, "requests_per_s": 1.0},
        "records": [{"request_id": "reuse-d0000-q0", "position": 0, "input_sha256": SHA, "shard": 0,
                     "worker_id": "replica-0", "gpu_uuid": "sim-0", "prompt_tokens": 8012,
                     "cached_tokens": 0, "output_token_ids": [1] * 16, "submit_s": 0.0, "complete_s": 2.0}],
        "verdict": {"status": "passed", "checks": {"coverage": {"passed": True}}, "reasons": []},
    }


def test_every_kind_has_a_schema():
    assert {"trace", "trial", "pair", "fetch-receipt", "cleanup-receipt"} <= set(known_kinds())


def test_valid_trial():
    assert validate_document(trial_doc()) == []


def test_missing_field_is_named_with_pointer_and_rule():
    doc = trial_doc()
    del doc["records"][0]["cached_tokens"]
    problems = validate_document(doc)
    assert [(p.pointer, p.rule) for p in problems] == [("/records/0", "required")]
    assert "cached_tokens" in problems[0].message


def test_wrong_type_pointer():
    doc = trial_doc()
    doc["records"][0]["cached_tokens"] = "many"
    assert [(p.pointer, p.rule) for p in validate_document(doc)] == [("/records/0/cached_tokens", "type")]


def test_simulated_flag_is_required():
    doc = trial_doc()
    del doc["simulated"]
    assert any(p.rule == "required" and "simulated" in p.message for p in validate_document(doc))


def test_unknown_kind():
    problems = validate_document({"kind": "banana"})
    assert [p.rule for p in problems] == ["unknown-kind"]


def test_invalid_manifest_is_not_written(tmp_path):
    path = tmp_path / "trial.json"
    path.write_text("old")
    doc = trial_doc()
    doc["system"] = "other"
    with pytest.raises(ManifestError, match="/system"):
        write_manifest(path, doc)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["trial.json"]


def test_failed_serialisation_leaves_nothing(tmp_path):
    doc = trial_doc()
    doc["config"]["bad"] = float("nan")
    with pytest.raises(ValueError):
        write_manifest(tmp_path / "t.json", doc)
    assert list(tmp_path.iterdir()) == []


def test_dumps_is_deterministic():
    a, b = trial_doc(), dict(reversed(list(trial_doc().items())))
    assert dumps(a) == dumps(b)


def test_sha256_file(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"abc" * 1000)
    assert sha256_file(path) == hashlib.sha256(b"abc" * 1000).hexdigest()


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


def test_cli_validate(tmp_path):
    pair_tree(tmp_path)
    ok = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert ok.exit_code == 0 and "2 manifest(s) valid" in ok.output
    (tmp_path / "trace.bin").write_bytes(b"changed")
    bad = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert bad.exit_code == 1
    lines = bad.output.strip().splitlines()
    assert lines[0].startswith(f"{tmp_path / 'trials' / 't0.json'}: /trace: sha256-mismatch: ")
    assert lines[-1] == "Error: 1 problem(s) in 2 manifest(s)"
    missing = CliRunner().invoke(main, ["validate", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "Traceback" not in missing.output


def test_every_command_has_help():
    runner = CliRunner()
    for args in ([], ["trace"], ["validate"], ["smoke-inputs"], ["bench"], ["bench", "router"]):
        result = runner.invoke(main, args + ["--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, args
