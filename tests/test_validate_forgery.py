"""`parity validate` of a tree (an outside tester's, 2026-12-06): JSON that is not a manifest where one belongs is
named, not skipped; and a trial forged and re-hashed is named even when a file it links (its trace) is missing."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge import edit, rehash  # tests/ is on sys.path
from parity import rederive
from parity.checks import config_sha256
from parity.cli import main
from parity.manifest import manifests_in, validate_paths, write_manifest
from parity.record import timing
from test_manifest import cleanup_receipt_doc, pair_tree, rules, trial_doc

ARCHIVE = (Path(__file__).resolve().parents[1] / "benchmarks" / "measured"
           / "h100-ladder-2026-12-06-trials-session35-confirmation.tar.xz")
NOT_MANIFESTS = ["null", "[1, 2]", '"hi"', "{}"]


def validate(path: Path):
    return CliRunner().invoke(main, ["validate", str(path)])


def sound_trial() -> dict:
    """`trial_doc`, its config hash and timing made what its content gives, so only a forgery disagrees."""
    doc = trial_doc()
    doc["config_sha256"] = config_sha256(doc["config"])
    doc["timing"] = timing(doc["records"], doc["timing"]["release_s"])
    return doc


def halve(doc: dict) -> None:
    for record in doc["records"]:
        record["complete_s"] = record["complete_s"] / 2


# ---- JSON that is not a manifest where one belongs ------------------------------------------------

@pytest.mark.parametrize("text", NOT_MANIFESTS)
@pytest.mark.parametrize("where", ["exp/experiment.json", "exp/trials/t9.json", "exp/pairs/p9.json",
                                   "exp/cleanup/c9.json"])
def test_json_that_is_not_a_manifest_where_one_belongs_is_named(tmp_path, where, text):
    write_manifest(tmp_path / "c.json", cleanup_receipt_doc())
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(text)
    checked, problems = validate_paths([tmp_path])
    assert checked == 2 and [p.file for p in problems] == [str(tmp_path / where)]
    assert rules(problems) in ([("", "type")], [("/kind", "unknown-kind")])
    unreadable: list = []
    assert [p for p, _ in manifests_in(tmp_path, unreadable)] == [tmp_path / "c.json"]
    assert unreadable == problems  # what `parity seal` refuses the tree with: the same line
    result = validate(tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{tmp_path / where}: " in result.output


def test_other_json_is_still_skipped(tmp_path):
    write_manifest(tmp_path / "c.json", cleanup_receipt_doc())
    for name in ("tokenizer.json", "logs/deadline.json", "inputs/tokenizer/config.json", "list.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"model": {}}' if name != "list.json" else "[1, 2]")
    assert validate_paths([tmp_path]) == (1, [])
    assert validate(tmp_path).exit_code == 0


@pytest.mark.skipif(not ARCHIVE.is_file(), reason="the measured archive is not in this checkout")
@pytest.mark.parametrize("text", NOT_MANIFESTS)
def test_the_testers_null_experiment_fails_the_archived_tree(tmp_path, text):
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(tmp_path, filter="data")
    results = tmp_path / "results"
    before = validate(results)
    experiment = results / "host" / "confirmation" / "experiment.json"
    experiment.write_text(text)
    after = validate(results)
    assert after.exit_code == 1 and "Traceback" not in after.output
    added = set(after.output.splitlines()) - set(before.output.splitlines())
    assert any(line.startswith(f"{experiment}: ") for line in added), after.output


# ---- a forged trial beside a missing file -----------------------------------------------------------

def test_a_forged_trial_whose_trace_is_missing_is_still_derived(tmp_path):
    trial = tmp_path / "trials" / "t0.json"
    write_manifest(trial, sound_trial())  # its trace, trials/reuse.json, is not there
    checked, problems = rederive.validate([tmp_path])
    assert checked == 1 and rules(problems) == [("/trace", "file-missing")]  # said once, not again as "disagrees"
    edit(trial, halve)
    checked, problems = rederive.validate([tmp_path])
    assert rules(problems) == [("/trace", "file-missing"), ("/timing", "disagrees")]
    assert "its timing is not what its records give" in problems[1].message


def test_a_document_with_a_wrong_hash_is_not_derived(tmp_path):
    """Only a missing file lets derivation go ahead: a link with the wrong hash leaves the document unsound."""
    trial = tmp_path / "trials" / "t0.json"
    (tmp_path / "trace.bin").write_bytes(b"t")
    doc = sound_trial() | {"trace": {"path": "../trace.bin", "sha256": "0" * 64}}
    halve(doc)
    write_manifest(trial, doc)
    assert rules(rederive.validate([tmp_path])[1]) == [("/trace", "sha256-mismatch")]


def test_a_derivation_the_missing_file_stops_is_one_line_not_a_traceback(tmp_path):
    trial = pair_tree(tmp_path)
    trial.unlink()
    checked, problems = rederive.validate([tmp_path])
    assert {(p.pointer, p.rule) for p in problems} == {("/reference/manifest", "file-missing"),
                                                       ("/candidate/manifest", "file-missing")}
    result = validate(tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output


def forged(archive: Path, tmp_path: Path, trial: str, forgery) -> tuple[Path, object, set[str]]:
    """The archive's results tree with `forgery` made to one trial (host/EXPERIMENT/trials/ID.json) and every hash
    written again: the trial's path, `validate`'s result, and the lines it added to the pristine tree's."""
    with tarfile.open(archive) as opened:
        opened.extractall(tmp_path, filter="data")
    results = tmp_path / "results"
    before = validate(results)
    path = results / "host" / trial
    edit(path, forgery)
    assert rehash(results) > 0
    after = validate(results)
    return path, after, set(after.output.splitlines()) - set(before.output.splitlines())


@pytest.mark.skipif(not ARCHIVE.is_file(), reason="the measured archive is not in this checkout")
def test_the_testers_halved_trial_is_named_though_its_trace_is_not_archived(tmp_path):
    trial, after, added = forged(ARCHIVE, tmp_path,
                                 "confirmation/trials/confirmation-final-express3-reuse-p0-flame.json", halve)
    assert after.exit_code == 1
    assert [line for line in added if not line.startswith("Error:")] == [
        f"{trial}: /timing: disagrees: its timing is not what its records give: a record completed before it "
        "was submitted"], after.output


# ---- a paced trial relabelled in both of its places (outside pass M) --------------------------------

LADDER = ARCHIVE.parent / "h100-ladder-2026-12-05-trials-session26.tar.xz"


def _replayed(doc: dict) -> None:
    """A paced trial made a replay in its schedule and in what it ran with, every arrival 74 ms later: each
    request's first-token latency 74 ms better, and no offsets to check the arrivals by."""
    doc["schedule"]["kind"] = doc["ran_with"]["load"]["schedule"]["kind"] = "replay"
    for record in doc["records"] + doc.get("refused", []):
        record["arrival_s"] += 0.074
        if "sent_s" in record:
            record["sent_s"] = max(record["sent_s"], record["arrival_s"])
    doc["timing"] = timing(doc["records"], doc["timing"]["release_s"])


@pytest.mark.skipif(not LADDER.is_file(), reason="the measured archive is not in this checkout")
@pytest.mark.parametrize("forgery, says", [
    (_replayed, "/load/schedule/kind: disagrees: its trial ran with 'replay', its settings plan 'poisson'"),
    (lambda doc: doc.pop("ran_with"), "its trial records no ran_with"),
])
def test_a_trials_load_is_held_to_the_plan_so_a_paced_trial_relabelled_everywhere_is_named(tmp_path, forgery,
                                                                                           says):
    """The trial's schedule is held to its ran_with.load (checks.py), which a forger edits too, or deletes: the
    experiment holds each trial's recorded load to the one its settings plan (experiments.derive)."""
    trial, after, added = forged(LADDER, tmp_path, "sustained/trials/sustained-rate-16-unbounded-hot-640-p0-vllm.json",
                                 forgery)
    assert after.exit_code == 1 and "Traceback" not in after.output
    experiment = trial.parent.parent / "experiment.json"
    assert any(line.startswith(f"{experiment}: ") and says in line for line in added), after.output
