"""A device session's trials archive (benchmarks/measured/h*-ladder-*-trials-*.tar.xz) from what its ladder calls
brought back, so every session's archive has one layout and the same bytes from the same calls:

  .venv/bin/python benchmarks/ladder_archive.py OUT.tar.xz EXPERIMENT CALL_DIR...   (the calls' OUTDIRs, in call order)

Each CALL_DIR holds what benchmarks/h200-ladder.sh left in its OUTDIR: ladder.tgz, facts.tgz and gpu.txt. The archive
holds the last call's trials and cleanup receipts at their results/host/EXPERIMENT paths (extract it at the repo root
to continue the ladder; the experiment manifest and pairs too where that call wrote them) and its experiment log; and
per call, under device/<CALL_DIR's name>: gpu.txt, the facts (CPU and GPU samples, engine facts and threads, the
workflow output), its experiment log, and the cleanup receipts, engine logs and JIT records that differ from an
earlier call's (a warm machine's results folder keeps the earlier calls' files). Members are sorted, owned by 0, and
dated by the newest trial of the last call (a time past: benchmarks/cutoff.sh reads an extracted trial's date).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import lzma
import os
import sys
import tarfile
from pathlib import Path

from parity import tarball

RESULTS = ("trials/", "pairs/", "experiment.json")  # the last call's alone, at their results paths
CALL_FILES = ("ladder.tgz", "facts.tgz", "gpu.txt")  # what benchmarks/h200-ladder.sh leaves in a call's OUTDIR


def _read(tgz: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a call's .tgz: its name, bytes and date; one that cannot be read whole (cut short, a damaged
    stream or header, a member named outside its root) is refused in one line."""
    try:
        return tarball.read(tgz)
    except (tarball.Unreadable, OSError) as e:
        raise SystemExit(f"ladder_archive.py: {tgz} cannot be read whole: {' '.join(str(e).split())}") from None


def build(out: Path, experiment: str, calls: list[Path]) -> int:
    """Write the archive; the number of files in it."""
    if out.is_dir():
        raise SystemExit(f"ladder_archive.py: {out} is a folder; name the archive to write")
    if any(out.resolve() == (call / name).resolve() for call in calls for name in CALL_FILES):
        raise SystemExit(f"ladder_archive.py: {out} is one of the calls' own files; write the archive elsewhere")
    # a call is named by its folder as given, `.` and `..` made absolute first (device/./ and device/../ were
    # members its own reader refused: an outsider's), links not followed (a call's link names it: call3 -> /tmp/...)
    calls = [Path(os.path.abspath(call)) for call in calls]
    if not all(call.name for call in calls):
        raise SystemExit("ladder_archive.py: a call folder must have a name (not /): its facts go under device/<name>")
    named = [call.name for call in calls]
    if len(set(named)) < len(named):  # each call's facts go under device/<its name>: one would overwrite another's
        raise SystemExit(f"ladder_archive.py: two calls are named {min(n for n in named if named.count(n) > 1)}; "
                         "name each call's folder differently (device/<name> in the archive)")
    for call in calls:
        for name in CALL_FILES:
            if not (call / name).is_file():
                raise SystemExit(f"ladder_archive.py: {call} has no {name} (a ladder call's OUTDIR has all three)")
    root, log = f"results/host/{experiment}/", f"results/host/logs/experiment_{experiment}.log"
    results = tuple(root + part for part in RESULTS)
    files: dict[str, bytes] = {}
    seen: set[tuple[str, str]] = set()
    ladders = [_read(call / "ladder.tgz") for call in calls]
    last = ladders[-1]
    trials = [date for name, (_, date) in last.items() if name.startswith(root + "trials/")]
    if not trials:
        raise SystemExit(f"ladder_archive.py: the last call ({calls[-1]}) brought back no {root}trials")
    for name, (data, _) in last.items():
        if name == log or name.startswith((root + "cleanup/", *results)):
            files[name] = data
    for call, ladder in zip(calls, ladders):
        here = f"device/{call.name}/"
        files[here + "gpu.txt"] = (call / "gpu.txt").read_bytes()
        for name, (data, _) in _read(call / "facts.tgz").items():
            files[here + name] = data
        for name, (data, _) in ladder.items():
            if name == log:
                files[here + Path(log).name] = data
            elif name.startswith(root) and not name.startswith(results):
                key = (name, hashlib.sha256(data).hexdigest())
                if key not in seen:  # the same receipt or log as an earlier call's: kept once, under the first
                    seen.add(key)
                    files[here + name.removeprefix(root)] = data
    date = int(max(trials))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(files[name]), date, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(files[name]))
    part = out.with_name(out.name + ".part")
    try:
        part.write_bytes(lzma.compress(buffer.getvalue(), preset=9))
        part.replace(out)  # whole or not at all
    except OSError as e:  # a missing or read-only folder, a full disk: nothing half written left behind
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)
        raise SystemExit(f"ladder_archive.py: {out} cannot be written ({e.strerror or type(e).__name__})") from None
    return len(files)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0].endswith("/"):
        raise SystemExit(f"ladder_archive.py: {argv[0]} is a folder; name the archive to write")
    out, experiment, calls = Path(argv[0]), argv[1], [Path(a) for a in argv[2:]]
    count = build(out, experiment, calls)
    print(f"{out}: {count} files from {len(calls)} call(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
