"""The device sessions' ladder records agree with the archives they name (benchmarks/ladder_record.py), and a record
edited after the fact is caught: each number it states about a trial, a pair or a rung is derived again from the
archived manifests."""

import importlib.util
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "measured"
spec = importlib.util.spec_from_file_location("ladder_record", ROOT / "benchmarks" / "ladder_record.py")
ladder_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ladder_record)

RECORDS = sorted(p for p in MEASURED.glob("h[12]00-ladder-*.json") if "archive" in json.loads(p.read_text()))


def test_there_are_archived_records():
    assert len(RECORDS) >= 3


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.stem)
def test_record_agrees_with_its_archive(record):
    assert ladder_record.check(record) == []


def _copy(tmp_path, name="h200-ladder-2026-12-04-session16.json"):
    record = json.loads((MEASURED / name).read_text())
    archive = record["archive"].split(":")[0]
    shutil.copy(MEASURED / archive, tmp_path / archive)
    return record, tmp_path / name


def test_an_edited_ratio_a_hash_and_a_rung_are_each_named(tmp_path):
    record, path = _copy(tmp_path)
    record["pairs"][0]["achieved_ratio"] += 0.004
    record["trials"][0]["manifest_sha256"] = "0" * 64
    record["rungs"][0]["ttft_client_p99_ratio"]["worst"] = 1.0
    record["pairs"][1]["same_gpu"] = False
    path.write_text(json.dumps(record))
    problems = ladder_record.check(path)
    assert len(problems) == 4, problems
    assert any(f"pair {record['pairs'][0]['pair']}.achieved_ratio" in p for p in problems)
    assert any(f"trial {record['trials'][0]['trial']}.manifest_sha256" in p for p in problems)
    assert any(f"rung {record['rungs'][0]['rung']}.ttft_client_p99_ratio.worst" in p for p in problems)
    assert any(".same_gpu: the record says False" in p for p in problems)


def test_rounding_is_not_a_disagreement(tmp_path):
    record, path = _copy(tmp_path)
    record["pairs"][0]["achieved_ratio"] += 0.0001  # the last digit of a 4-place ratio
    record["trials"][0]["ttft_client_ms"]["p50"] += 0.05  # ms to 0.1
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == []


def test_a_trial_not_archived_and_a_missing_archive_are_one_line_each(tmp_path):
    record, path = _copy(tmp_path)
    record["trials"].append({"trial": "sustained-rate-99-harvest-reuse-640-p0-vllm"})
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: trial sustained-rate-99-harvest-reuse-640-p0-vllm is not in "
                                         f"{record['archive'].split(':')[0]}"]
    record["trials"].pop()
    record["pairs"] = {"free-form": {}}
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: its pairs are not a list of objects that each name their pair"]
    record["archive"] = "gone.tar.xz: nothing"
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: its archive gone.tar.xz is not beside it"]


def test_the_cli_exits_1_on_a_disagreement(tmp_path, capsys):
    record, path = _copy(tmp_path)
    path.write_text(json.dumps(record))
    assert ladder_record.main(["check", str(path)]) == 0
    record["pairs"][0]["token_ids_identical"] = False
    path.write_text(json.dumps(record))
    assert ladder_record.main(["check", str(path)]) == 1
    assert "token_ids_identical: the record says False, its trials give True" in capsys.readouterr().out


def test_a_record_or_archive_that_cannot_be_read_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert ladder_record.check(bad)[0].startswith("bad.json: not a readable JSON record")
    bad.write_text("[]")
    assert ladder_record.check(bad) == ["bad.json: not a record (a JSON object)"]
    record, path = _copy(tmp_path)
    archive = tmp_path / record["archive"].split(":")[0]
    archive.write_bytes(archive.read_bytes()[:1000])  # cut short
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: its archive {archive.name} is not a whole xz stream (EOFError: "
                                         "Compressed data ended before the end-of-stream marker was reached)"]
    record, path = _copy(tmp_path)  # found by an outsider: a flipped byte was an LZMAError traceback
    archive = tmp_path / record["archive"].split(":")[0]
    data = bytearray(archive.read_bytes())
    data[2000] ^= 0x40
    archive.write_bytes(bytes(data))
    path.write_text(json.dumps(record))
    (problem,) = ladder_record.check(path)
    assert problem.startswith(f"{path.name}: its archive {archive.name} is not a whole xz stream (LZMAError: ")


def test_an_archived_trial_derive_cannot_read_is_named_in_one_line(tmp_path):
    """derive summarizes each trial once (its entry and its pair share it); a trial it cannot read is named, by
    check as by derive, not a traceback."""
    import tarfile

    record, path = _copy(tmp_path)
    path.write_text(json.dumps(record))
    archive = tmp_path / record["archive"].split(":")[0]
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo("results/host/sustained/trials/broken-p0-flame.json")
        info.size = len(data := b'{"trial_id": "broken-p0-flame", "records": []}')
        tar.addfile(info, io.BytesIO(data))
    assert ladder_record.check(path) == [f"{path.name}: its archive {archive.name}'s trial broken-p0-flame is not a "
                                         f"trial manifest derive can read (KeyError: 'gpus')"]


def test_a_bounded_ladder_rung_is_derived_per_arm_and_an_edited_one_is_named(tmp_path):
    """Issue 30's bounded ladder: each rung's arms (here session 20's unbounded comparator alone) and its ratios come
    from the trials, never in the issue-28 pairs; a record's edited bounded number is named."""
    record, path = _copy(tmp_path, "h200-ladder-2026-12-05-session20.json")
    derived = ladder_record.derive(ladder_record.archived(tmp_path / record["archive"].split(":")[0]))
    [rung] = derived["bounded"]
    assert rung["rung"] == "rate-14-reuse-640-p0" and list(rung["arms"]) == ["unbounded-vllm"]
    assert rung["arms"]["unbounded-vllm"]["goodput_ttft_per_s"] == 0.0 and rung["arms"]["unbounded-vllm"]["saturated"]
    assert not any("unbounded" in p["pair"] for p in derived["pairs"])
    record["bounded"] = [json.loads(json.dumps(rung))]
    record["bounded"][0]["arms"]["unbounded-vllm"]["achieved_per_s"] += 0.5
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: bounded rate-14-reuse-640-p0.arms.unbounded-vllm.achieved_per_s: "
                                         f"the record says {rung['arms']['unbounded-vllm']['achieved_per_s'] + 0.5!r}, "
                                         f"its trials give {rung['arms']['unbounded-vllm']['achieved_per_s']!r}"]


def _session23(tmp_path):
    record, path = _copy(tmp_path, "h200-ladder-2026-12-05-session23.json")
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == []
    return record, path


@pytest.mark.parametrize("forge, named", [
    (lambda r: r["bounded"][0]["arms"].pop("bounded-flame"), "arms.bounded-flame: its trials give it, the record leaves it out"),
    (lambda r: r["bounded"][0]["arms"].__setitem__("bounded-flame-x", {}), "arms.bounded-flame-x: the record states it"),
    (lambda r: r["bounded"][0].__setitem__("flame_over_vllm_goodput", 99), "flame_over_vllm_goodput: the record states it"),
    (lambda r: r["bounded"].pop(), "bounded rung rate-18-reuse-640-p0 of its trials is not stated"),
    (lambda r: r["bounded"][0]["arms"]["bounded-vllm"].__setitem__("saturated", 1), "saturated: the record says 1"),
    (lambda r: r.__setitem__("bounded", {"rung": "x"}), "its bounded are not a list of objects that each name their rung"),
    (lambda r: r["bounded"].append(None), "its bounded are not a list of objects that each name their rung"),
    (lambda r: r["rungs"].append({"ratio": 1}), "its rungs are not a list of objects that each name their rung"),
    (lambda r: r.__setitem__("trials", {"trial": "x"}), "its trials are not a list of objects that each name their trial"),
])
def test_a_forged_or_malformed_bounded_ladder_is_one_line_each(tmp_path, forge, named):
    """Found by an outsider: a record's bounded rungs were compared only on the keys both sides had (a dropped arm, a
    forged key, a dropped rung, 1 for true passed) and a malformed section was a traceback."""
    record, path = _session23(tmp_path)
    record.setdefault("rungs", [])
    forge(record)
    path.write_text(json.dumps(record))
    problems = ladder_record.check(path)
    assert len(problems) == 1 and named in problems[0], problems


def test_a_bounded_rung_at_another_answer_length_is_its_own_rung_and_never_a_pair(tmp_path):
    """Found by an outsider: `-outN` trial ids (the ladder at 128 and 512 tokens) fell out of the bounded rungs and were
    paired Flame against standalone."""
    manifests = ladder_record.archived(MEASURED / "h200-ladder-2026-12-05-trials-session23.tar.xz")
    renamed = {tid.replace("rate-16-", "rate-16-out128-"): raw for tid, raw in manifests.items() if "rate-16-" in tid}
    derived = ladder_record.derive(renamed, named=False)  # ids renamed on purpose
    assert [b["rung"] for b in derived["bounded"]] == ["rate-16-out128-hot-640-p0"] and derived["pairs"] == []
    assert set(derived["bounded"][0]["arms"]) == {"unbounded-vllm", "bounded-vllm", "bounded-flame"}


def test_the_bounded_seeds_archive_draws_report_section_7_alone(tmp_path):
    """ARTIFACT.md's command: the GPU's bounded ladder (seed p0, session 24's archive: its twelve trials and the
    experiment manifest) gives the report's section 7, goodput curves and first over-saturated rungs, with nothing
    else."""
    import tarfile

    from parity.report import write_report
    from parity.report.reference import DEFAULT_REFERENCE

    with tarfile.open(MEASURED / "h200-ladder-2026-12-05-trials-session24.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    out = tmp_path / "report"
    write_report([tmp_path / "results/host/sustained"], None, DEFAULT_REFERENCE, out)
    text = (out / "report.md").read_text()
    assert (out / "sustained.png").stat().st_size > 10_000
    assert "First over-saturated rung (measured" in text and "bounded admission on reuse-640: 14 req/s" in text
    # a bounded arm refusing a tenth of the load is said to be that, apart from the ladder's saturated rungs
    unbounded, bounded = text.split("A bounded arm's achieved rate counts only what it admitted")[:2]
    assert "comparator) on reuse-640: 14 req/s" in unbounded and "bounded admission on reuse-640: 6 req/s" in bounded
    # its 18/s rung ran whole on another GPU: each row says which, and whose arrivals (an outsider's, 2026-12-07),
    # a rung's unbounded comparator first; the note counts its cases as what they are, unpaired
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| reuse-640 | 18 | 16 |")]
    assert [(row[3].split(", ")[-1], row[4]) for row in rows] == [
        ("unbounded (the bounded arm's comparator)", "ours, measured; arrivals seed 0; GPU-6fe39279"),
        ("bounded admission", "ours, measured; arrivals seed 0; GPU-6fe39279"),
        ("bounded admission", "ours, measured; arrivals seed 0; GPU-6fe39279")]
    assert "Ours only, beyond the study: 12 unpaired case(s)" in text and "pair(s)" not in text.split("Ours only")[1][:40]


@pytest.mark.parametrize("forge, named", [
    ("objective", "its experiment states objective {'ttft_s': 30.0, 'itl_s': 1.0}, trial "),
    ("drop", "its experiment results/host/sustained/experiment.json is not in"),
    ("garbage", "its experiment results/host/sustained/experiment.json is not an experiment manifest"),
    ("relink", "its experiment links trial sustained-rate-18-bounded-reuse-640-p0-flame by another SHA-256"),
])
def test_the_experiment_manifest_a_record_names_is_checked_even_when_rehashed(tmp_path, forge, named):
    """Found by an outsider: session 24's archive holds the experiment manifest the report draws from, which no
    check covered: its objective, edited, turned the unbounded arm's goodput from 0 to 9.48/s. The record states its
    SHA-256; a manifest edited and re-hashed into the record still disagrees with the trials it links."""
    import hashlib
    import io
    import tarfile

    name = "h200-ladder-2026-12-05-session24.json"
    record = json.loads((MEASURED / name).read_text())
    source = MEASURED / record["archive"].split(":")[0]
    path = record["experiment"]["path"]
    forged = tmp_path / source.name
    with tarfile.open(source) as tar_in, tarfile.open(forged, "w:xz") as tar_out:
        for member in tar_in.getmembers():
            data = tar_in.extractfile(member).read() if member.isfile() else None
            if member.name == path:
                if forge == "drop":
                    continue
                doc = json.loads(data)
                if forge == "objective":
                    doc["settings"]["objective"] = {"ttft_s": 30.0, "itl_s": 1.0}
                elif forge == "relink":
                    doc["cases"][-1]["manifest"]["sha256"] = "0" * 64
                data = b"not json" if forge == "garbage" else json.dumps(doc).encode()
                record["experiment"]["sha256"] = hashlib.sha256(data).hexdigest()  # re-hashed into the record
                member.size = len(data)
            tar_out.addfile(member, io.BytesIO(data) if data is not None else None)
    record["archive"] = re.sub(r"sha256 [0-9a-f]{64}", f"sha256 {hashlib.sha256(forged.read_bytes()).hexdigest()}",
                               record["archive"])  # the archive re-hashed into the record too
    (tmp_path / name).write_text(json.dumps(record))
    problems = ladder_record.check(tmp_path / name)
    assert len(problems) == 1 and named in problems[0], problems


def test_an_experiment_manifest_stating_another_objective_than_its_trials_were_admitted_by_is_named(tmp_path):
    """The same forgery on a results tree (`parity validate`): the objective the report judges goodput by must be
    the one the bounded trials were admitted against; one line for all of them."""
    import tarfile

    from parity.experiments.derive import derived_problems

    with tarfile.open(MEASURED / "h200-ladder-2026-12-05-trials-session24.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    path = tmp_path / "results/host/sustained/experiment.json"
    doc = json.loads(path.read_text())
    assert derived_problems(path, doc) == []
    doc["settings"]["objective"] = {"ttft_s": 30.0, "itl_s": 1.0}
    (problem,) = derived_problems(path, doc)
    assert problem[0] == "/settings/objective" and "(and 7 more)" in problem[1]
    # an outsider's (2026-12-07): bounded settings no trial ran with passed validate, though the runner calls such
    # trials stale
    doc = json.loads(path.read_text())
    doc["settings"]["bounded"] = dict(doc["settings"].get("bounded") or {}, headroom=5.0)
    (problem,) = derived_problems(path, doc)
    assert problem[0] == "/settings/bounded" and "states headroom 5.0" in problem[1], problem
    assert "ran with headroom 1.0" in problem[1] and "more)" in problem[1]


@pytest.mark.parametrize("forge, named", [
    (lambda r: r.__setitem__("trials", []), "trial sustained-rate-12-harvest-reuse-640-p0-flame of its archive is not stated"),
    (lambda r: r.__setitem__("pairs", []), "pair sustained-rate-12-harvest-reuse-640-p0 of its trials is not stated"),
    (lambda r: r.__setitem__("rungs", []), "rung rate-12-harvest-reuse-640 of its trials is not stated"),
    (lambda r: r.pop("rungs"), "rung rate-12-harvest-reuse-640 of its trials is not stated"),
    (lambda r: r["pairs"].remove(min(r["pairs"], key=lambda p: p["achieved_ratio"])),
     "pair sustained-rate-12-harvest-reuse-640-p0 of its trials is not stated"),
    (lambda r: r["pairs"].append(r["pairs"][0]), "pair sustained-rate-4-harvest-reuse-640-p0 is stated twice"),
    (lambda r: r["rungs"][0]["achieved_ratio"].pop("worst"), "achieved_ratio.worst: its trials give it, the record leaves it out"),
    (lambda r: r["trials"][0].pop("itl_ms"), "itl_ms: its trials give it, the record leaves it out"),
    (lambda r: r.__setitem__("gpus", "GPU-FORGED"), "its gpus do not name GPU-5a9d2317-977d-72d9-5f2e-b1d6dd3ecb8a"),
    (lambda r: r.pop("gpus"), "its gpus do not name GPU-5a9d2317-977d-72d9-5f2e-b1d6dd3ecb8a"),
    (lambda r: r["gpus"].__setitem__("calls 1-6", "NVIDIA H200, GPU-00000000-0000-0000-0000-000000000000"),
     "its gpus name GPU-00000000-0000-0000-0000-000000000000, which none of its trials ran on"),
])
def test_a_record_stripped_of_its_evidence_or_gpus_is_named(tmp_path, forge, named):
    """Found by an outsider: a record with its trials, pairs and rungs set to [] (gpus 'GPU-FORGED', any conclusion)
    was '1 record(s) agree', and so was one missing its worst pair or a rung's `worst`: only what a record stated was
    compared. It must state exactly what its archive derives (no entry missing, none twice, every key) and name every
    GPU its trials ran on, and no other."""
    record, path = _copy(tmp_path)
    forge(record)
    path.write_text(json.dumps(record))
    problems = ladder_record.check(path)
    assert problems and any(named in p for p in problems), problems
    assert ladder_record.main(["check", str(path)]) == 1


def test_everything_forged_at_once_is_refused(tmp_path, capsys):
    record, path = _copy(tmp_path)
    record.update(trials=[], pairs=[], rungs=[], gpus="GPU-FORGED", conclusion="anything")
    path.write_text(json.dumps(record))
    assert ladder_record.main(["check", str(path)]) == 1
    assert "agree" not in capsys.readouterr().out


@pytest.mark.parametrize("archive", ["/abs/h200-ladder-2026-12-04-trials-session16.tar.xz",
                                     "../measured/h200-ladder-2026-12-04-trials-session16.tar.xz",
                                     "sub/h200-ladder-2026-12-04-trials-session16.tar.xz", ".."])
def test_an_archive_not_named_beside_its_record_is_refused_in_one_line(tmp_path, archive):
    """Found by an outsider: an `archive` with an absolute path, a `..` or a `/` was followed out of the record's
    folder; the archive must lie beside the record."""
    record, path = _copy(tmp_path)
    (tmp_path / "sub").mkdir()
    shutil.copy(tmp_path / record["archive"].split(":")[0], tmp_path / "sub")
    record["archive"] = archive + ": moved"
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: its archive {archive} is not a file name beside it"]


def test_derive_on_a_folder_of_trials_gives_what_check_compares(tmp_path, capsys):
    import tarfile

    with tarfile.open(MEASURED / "h200-ladder-2026-12-05-trials-session19b.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    [folder] = {p.parent for p in tmp_path.rglob("trials/*.json")}
    assert ladder_record.main(["derive", str(folder)]) == 0
    record = json.loads((MEASURED / "h200-ladder-2026-12-05-session19b.json").read_text())
    assert [t["trial"] for t in json.loads(capsys.readouterr().out)["trials"]] == [t["trial"] for t in record["trials"]]


@pytest.mark.parametrize("content, said", [
    (b'{"what": "a record"}', "is not a trial manifest (an object with a trial_id and records)"),
    (b"[1]", "is not a trial manifest (an object with a trial_id and records)"),
    (b"\xff\xfe", "is not UTF-8 JSON (UnicodeDecodeError)"),
    (b'{"trial_id": "a", "records": []}', "is not a trial manifest derive can read (KeyError: 'gpus')"),
])
def test_derive_refuses_a_file_that_is_no_trial_in_one_line(tmp_path, capsys, content, said):
    """Found by an outsider: `derive benchmarks/measured` (any non-trial JSON) was a KeyError traceback, a file of
    [1] a TypeError, non-UTF-8 a UnicodeDecodeError. It is refused naming the file, not skipped: a skipped damaged
    trial would leave the record short of it."""
    (tmp_path / "x.json").write_bytes(content)
    assert ladder_record.main(["derive", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"ladder_record.py: {tmp_path / 'x.json'} {said}; derive reads a folder of trial manifests only\n"


def test_derive_on_a_folder_that_does_not_exist_says_so(tmp_path, capsys):
    """Found by an outsider: `derive /nonexistent` said 'no trial manifests in' it."""
    assert ladder_record.main(["derive", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"ladder_record.py: {tmp_path / 'gone'} is not a folder\n"


@pytest.mark.parametrize("content, said", [(b"", "is empty"), (b"hello\n" * 200, "is not a tar archive")])
def test_an_empty_or_non_tar_archive_is_one_line(tmp_path, content, said):
    """Found by an outsider: tarfile's ReadError, one line per compression it tried, was the record's 'one line'."""
    record, path = _copy(tmp_path)
    archive = tmp_path / record["archive"].split(":")[0]
    archive.write_bytes(content)
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == [f"{path.name}: its archive {archive.name} {said}"]


def _with_members(tmp_path, extra: dict):
    """Session 16's record beside its archive rewritten (plain tar, quick) with `extra` members (name -> bytes) added;
    its first trial's id and bytes."""
    import tarfile

    record, path = _copy(tmp_path)
    path.write_text(json.dumps(record))
    archive = tmp_path / record["archive"].split(":")[0]
    tid, raw = sorted(ladder_record.archived(archive).items())[0]
    with tarfile.open(MEASURED / archive.name) as tar_in, tarfile.open(archive, "w") as tar_out:
        for member in tar_in.getmembers():
            tar_out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
        for name, data in extra(tid, raw).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar_out.addfile(info, io.BytesIO(data))
    return path, archive, tid


@pytest.mark.parametrize("extra, said", [
    (lambda tid, raw: {f"results/host/aaa/trials/{tid}.json": raw.replace(b'"status"', b'"forged": 1, "status"')},
     "holds trial {tid} twice (results/host/aaa/trials/{tid}.json and results/host/sustained/trials/{tid}.json)"),
    (lambda tid, raw: {"results/host/sustained/trials/renamed-p0-flame.json": raw},
     "'s trial renamed-p0-flame is not named for its trial_id '{tid}'"),
])
def test_a_trial_held_twice_or_under_another_name_in_an_archive_is_refused(tmp_path, extra, said):
    """Found by an outsider: trials were keyed by file-name stem, so a forged copy of a trial in another folder of the
    archive silently won when read last, and the record 'agreed' with it."""
    path, archive, tid = _with_members(tmp_path, extra)
    (problem,) = ladder_record.check(path)
    assert problem.startswith(f"{path.name}: its archive {archive.name}") and said.format(tid=tid) in problem, problem


@pytest.mark.parametrize("data, said", [(b"[" * 100_000, "not strict JSON (nested more deeply than Python's JSON parser reads)"),
                                        (b"\xff\xfe", "not UTF-8 JSON (UnicodeDecodeError)")])
def test_a_deep_or_undecodable_trial_or_record_is_one_line(tmp_path, data, said):
    """Found by an outsider: a trial nested 100000 deep (a record too) was a RecursionError, a non-UTF-8 trial a
    UnicodeDecodeError traceback."""
    bad = {"results/host/sustained/trials/bad-p0-flame.json": data}
    path, archive, _ = _with_members(tmp_path, lambda tid, raw: bad)
    assert ladder_record.check(path) == [f"{path.name}: its archive {archive.name}'s trial bad-p0-flame is {said}"]
    path.write_bytes(data)
    (problem,) = ladder_record.check(path)
    assert problem.startswith(f"{path.name}: not a readable JSON record (")


def test_derive_reads_only_the_folders_regular_files_each_named_for_its_trial(tmp_path, capsys):
    """Found by an outsider: a folder or a dangling link named zz.json was a traceback, a FIFO hung for ever, and a
    link out of the folder to a copy of a trial was followed (the trial listed twice, rc 0)."""
    import os

    folder = tmp_path / "trials"
    folder.mkdir()
    tid, raw = sorted(ladder_record.archived(MEASURED / "h200-ladder-2026-12-04-trials-session16.tar.xz").items())[0]
    (folder / f"{tid}.json").write_bytes(raw)
    (tmp_path / "copy.json").write_bytes(raw)
    for make, said in [(lambda p: p.mkdir(), "is not a regular file (a folder, pipe or device)"),
                       (lambda p: p.symlink_to(tmp_path / "gone"), "is not a regular file (a symbolic link)"),
                       (lambda p: os.mkfifo(p), "is not a regular file (a folder, pipe or device)"),
                       (lambda p: p.symlink_to(tmp_path / "copy.json"), "is not a regular file (a symbolic link)"),
                       (lambda p: p.write_bytes(raw), f"is not named for its trial_id {tid!r}"),
                       (lambda p: p.write_bytes(b"[" * 100_000), "is not strict JSON (nested more deeply than Python's JSON parser reads)")]:
        odd = folder / "zz.json"
        make(odd)
        assert ladder_record.main(["derive", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err == f"ladder_record.py: {odd} {said}; derive reads a folder of trial manifests only\n"
        odd.rmdir() if odd.is_dir() and not odd.is_symlink() else odd.unlink()
    assert ladder_record.main(["derive", str(folder)]) == 0


@pytest.mark.parametrize("command", ["derive", "check"])
def test_output_to_a_full_disk_is_one_line_and_exit_1(tmp_path, command):
    """Found by an outsider: `derive > /dev/full` and `check > /dev/full` ended in an OSError traceback."""
    import subprocess
    import sys

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    folder = tmp_path / "trials"
    folder.mkdir()
    for tid, raw in ladder_record.archived(MEASURED / "h200-ladder-2026-12-04-trials-session16.tar.xz").items():
        (folder / f"{tid}.json").write_bytes(raw)
    arg = str(folder) if command == "derive" else str(MEASURED / "h200-ladder-2026-12-04-session16.json")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ladder_record.py"), command, arg],
                              stdout=full, stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT / "src")})
    said = "ladder_record.py: cannot write its output (No space left on device)\n"
    assert (done.returncode, done.stderr) == (1, said)


def test_a_trial_holding_infinity_is_refused_never_written_out(tmp_path, capsys):
    """Found by an outsider: a trial with `"requests_per_s": Infinity` gave a record that is not JSON, with rc 0."""
    tid, raw = sorted(ladder_record.archived(MEASURED / "h200-ladder-2026-12-04-trials-session16.tar.xz").items())[0]
    forged = raw.replace(b'"status"', b'"requests_per_s": Infinity, "status"', 1)
    (tmp_path / f"{tid}.json").write_bytes(forged)
    assert ladder_record.main(["derive", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"ladder_record.py: {tmp_path / tid}.json is not strict JSON (Infinity is "
                                       "not JSON); derive reads a folder of trial manifests only\n")


@pytest.mark.parametrize("argv", [["derive", "--help"], ["check", "-h"], ["--help"]])
def test_help_prints_the_usage(capsys, argv):
    """Found by an outsider: `check --help` said '--help: not a readable JSON record', `derive --help` 'is not a
    folder'."""
    assert ladder_record.main(argv) == 0
    assert capsys.readouterr().out == ladder_record.__doc__.split("\n\n")[1] + "\n"


@pytest.mark.parametrize("archive", [None, 3, "", ": nothing", ["x.tar.xz"]])
def test_an_archive_that_is_no_file_name_is_named_no_archive(tmp_path, archive):
    """Found by an outsider: `"archive": null` said 'its archive None is not beside it'."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"archive": archive}))
    assert ladder_record.check(path) == ["r.json: names no archive"]


def test_derive_refuses_a_trial_whose_stated_rate_its_records_do_not_give(tmp_path, capsys):
    """An outside tester's, 2026-12-06: derive took a trial's forged timing.requests_per_s as written (rc 0, the
    forged rate in the pair's ratio) where `parity report` refuses that trial."""
    tid, raw = sorted(ladder_record.archived(MEASURED / "h200-ladder-2026-12-04-trials-session16.tar.xz").items())[0]
    doc = json.loads(raw)
    doc["timing"]["requests_per_s"] = 5.0
    (tmp_path / f"{tid}.json").write_text(json.dumps(doc))
    assert ladder_record.main(["derive", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "a trial whose timing is not what its records give" in err and len(err.splitlines()) == 1


def test_a_repacked_archive_is_refused_where_the_record_states_its_hash(tmp_path):
    """An archive repacked with its trials kept and other evidence edited (a GPU's name in a call's gpu.txt) agreed by
    its trials alone (an outsider's, 2026-12-07): where the record states the archive's sha256, it is checked."""
    name = "h100-ladder-2026-12-07-session37.json"
    record, path = _copy(tmp_path, name)
    path.write_text(json.dumps(record))
    assert ladder_record.check(path) == []
    archive = tmp_path / record["archive"].split(":")[0]
    with tarfile.open(archive) as tar_in:
        members = [(m, tar_in.extractfile(m).read() if m.isfile() else None) for m in tar_in.getmembers()]
    with tarfile.open(archive, "w:xz") as tar_out:
        for member, data in members:
            if member.name.endswith("gpu.txt"):
                data = data.replace(b"H100 80GB HBM3", b"H200")
                member.size = len(data)
            tar_out.addfile(member, io.BytesIO(data) if data is not None else None)
    (problem,) = ladder_record.check(path)
    assert problem.startswith(f"{name}: its archive {archive.name} has sha256 ") and "not the 89fc8c0c" in problem
