"""benchmarks/ladder_archive.py: a device session's trials archive from its calls' OUTDIRs, one layout, the same bytes
from the same calls."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRIALS = "results/host/confirmation/trials/"


def _tgz(path: Path, files: dict[str, str], mtime: int) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))


def _call(folder: Path, ladder: dict[str, str], mtime: int) -> Path:
    folder.mkdir()
    _tgz(folder / "ladder.tgz", ladder, mtime)
    _tgz(folder / "facts.tgz", {"cpu.txt": f"cpu {folder.name}", "workflow.txt": "ran"}, mtime)
    (folder / "gpu.txt").write_text("GPU-stand-in\n")
    return folder


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/ladder_archive.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_the_archive_holds_the_last_calls_trials_and_each_calls_new_logs_the_same_bytes_every_time(tmp_path):
    log = "results/host/logs/experiment_confirmation.log"
    first = _call(tmp_path / "call3", {TRIALS + "a-vllm.json": "{}", log: "[1/2]",
                                       "results/host/confirmation/logs/a/replica-0.log": "engine a"}, 1_000)
    second = _call(tmp_path / "call4", {TRIALS + "a-vllm.json": "{}", TRIALS + "a-flame.json": "{}", log: "[2/2]",
                                        "results/host/confirmation/logs/a/replica-0.log": "engine a",
                                        "results/host/confirmation/cleanup/flame-cluster.json": "{}"}, 2_000)
    out = tmp_path / "a.tar.xz"
    done = _run(out, "confirmation", first, second)
    assert done.returncode == 0 and done.stdout == f"{out}: 14 files from 2 call(s)\n", done.stderr
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == sorted([
            "device/call3/cpu.txt", "device/call3/experiment_confirmation.log", "device/call3/gpu.txt",
            "device/call3/logs/a/replica-0.log", "device/call3/workflow.txt",
            "device/call4/cleanup/flame-cluster.json", "device/call4/cpu.txt",
            "device/call4/experiment_confirmation.log", "device/call4/gpu.txt", "device/call4/workflow.txt",
            log, TRIALS + "a-flame.json", TRIALS + "a-vllm.json", "results/host/confirmation/cleanup/flame-cluster.json"])
        assert {name for name in members if name.startswith("results/")} == {
            log, TRIALS + "a-flame.json", TRIALS + "a-vllm.json", "results/host/confirmation/cleanup/flame-cluster.json"}
        assert "device/call4/logs/a/replica-0.log" not in members  # the same as call 3's: kept once
        assert tar.extractfile(log).read() == b"[2/2]"  # the last call's
        assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 2_000)}
    again = tmp_path / "b.tar.xz"
    assert _run(again, "confirmation", first, second).returncode == 0
    assert again.read_bytes() == out.read_bytes()


def test_a_call_folder_without_its_files_or_a_last_call_without_trials_is_refused_in_one_line(tmp_path):
    empty = tmp_path / "call1"
    empty.mkdir()
    done = _run(tmp_path / "a.tar.xz", "confirmation", empty)
    assert done.returncode == 1 and done.stderr == (f"ladder_archive.py: {empty} has no ladder.tgz (a ladder call's "
                                                    "OUTDIR has all three)\n")
    bare = _call(tmp_path / "call2", {"results/host/logs/experiment_confirmation.log": "x"}, 1_000)
    done = _run(tmp_path / "a.tar.xz", "confirmation", bare)
    assert done.returncode == 1 and done.stderr == (f"ladder_archive.py: the last call ({bare}) brought back no "
                                                    "results/host/confirmation/trials\n")
    assert not (tmp_path / "a.tar.xz").exists()
    assert _run(tmp_path / "a.tar.xz").returncode == 2
    broken = _call(tmp_path / "call3", {TRIALS + "a-vllm.json": "{}"}, 1_000)
    for bad in ((broken / "ladder.tgz").read_bytes()[:20], b"junk\n"):  # cut short; no archive at all
        (broken / "ladder.tgz").write_bytes(bad)
        done = _run(tmp_path / "a.tar.xz", "confirmation", broken)
        assert done.returncode == 1 and done.stderr.startswith(
            f"ladder_archive.py: {broken / 'ladder.tgz'} cannot be read whole: ") and done.stderr.count("\n") == 1, \
            done.stderr
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == []  # nothing written


def test_a_damaged_call_archive_an_unwritable_output_or_two_calls_of_one_name_are_refused_in_one_line(tmp_path):
    """Found by an outsider (2026-12-06): a ladder.tgz with a flipped byte was archived as two of its three trials
    (rc 0), a member named ../../x was copied into the archive, an output in a missing folder or on a full disk was a
    traceback that left OUT.part behind, and two calls' folders of one name wrote one call's facts over the other's."""
    import gzip

    trials = {TRIALS + f"t{i}-vllm.json": "{" + f'"pad": "{"x" * 4000}{i}"' + "}" for i in range(3)}
    call = _call(tmp_path / "call3", trials, 1_000)
    whole = (call / "ladder.tgz").read_bytes()
    flipped = bytearray(whole)
    flipped[len(flipped) // 2] ^= 0x40
    (call / "ladder.tgz").write_bytes(bytes(flipped))
    done = _run(tmp_path / "a.tar.xz", "confirmation", call)
    assert done.returncode == 1 and done.stderr.startswith(
        f"ladder_archive.py: {call / 'ladder.tgz'} cannot be read whole: is not a whole gzip stream") and \
        done.stderr.count("\n") == 1, done.stderr
    (call / "ladder.tgz").write_bytes(whole)
    _tgz(call / "facts.tgz", {"../../../../tmp/x": "out"}, 1_000)
    done = _run(tmp_path / "a.tar.xz", "confirmation", call)
    assert done.returncode == 1 and done.stderr == (f"ladder_archive.py: {call / 'facts.tgz'} cannot be read whole: "
                                                    "names '../../../../tmp/x', outside its root\n")
    _tgz(call / "facts.tgz", {"cpu.txt": "cpu"}, 1_000)
    for out, said in ((tmp_path / "gone" / "a.tar.xz", "No such file or directory"), (tmp_path, "is a folder")):
        done = _run(out, "confirmation", call)
        assert done.returncode == 1 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
    twin = tmp_path / "again"
    twin.mkdir()
    done = _run(tmp_path / "a.tar.xz", "confirmation", _call(twin / "call3", trials, 1_000), call)
    assert done.returncode == 1 and done.stderr == ("ladder_archive.py: two calls are named call3; name each call's "
                                                    "folder differently (device/<name> in the archive)\n")
    for out, said in ((call / "ladder.tgz", "is one of the calls' own files"), (f"{tmp_path}/new/", "is a folder")):
        done = _run(out, "confirmation", call)  # a second outsider: the call's own ladder.tgz was overwritten
        assert done.returncode == 1 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert (call / "ladder.tgz").read_bytes() == whole and not (tmp_path / "new").exists()
    assert not [p for p in tmp_path.rglob("*.tar.xz*")]  # nothing written, nothing half written
    assert gzip.decompress(whole)  # the call's own archive is untouched


def test_a_call_given_as_dot_or_dot_dot_is_named_by_its_folder(tmp_path):
    """`..` as a call wrote members device/../cpu.txt, which the archive's own reader refuses, and `.` device//gpu.txt
    (an outsider's, 2026-12-07): a call is named by its folder's own name."""
    call = _call(tmp_path / "call5", {TRIALS + "a-vllm.json": "{}"}, 1_000)
    (call / "sub").mkdir()
    out = tmp_path / "a.tar.xz"
    for given, cwd in ((".", call), ("..", call / "sub")):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks/ladder_archive.py"), str(out), "confirmation",
                               given], capture_output=True, text=True, timeout=60, cwd=cwd)
        assert done.returncode == 0, done.stderr
        with tarfile.open(out) as tar:
            assert sorted(n for n in tar.getnames() if n.startswith("device/")) == [
                "device/call5/cpu.txt", "device/call5/gpu.txt", "device/call5/workflow.txt"]
