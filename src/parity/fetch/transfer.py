"""Download, verify, rename: the one path by which a fetched file reaches its destination.

Each file is downloaded into a fresh staging folder inside the destination (same filesystem, so the
final rename is atomic), hashed, compared with its pin, and only then renamed into place. Whatever
goes wrong (a mismatch, a dropped connection, Ctrl-C, a full disk) the staging folder is removed, so
nothing half-written is ever left where a later step could read it. A file already in place whose
hash matches its pin is re-hashed and kept, not downloaded again.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from parity.errors import ParityError
from parity.fetch.errors import FetchError
from parity.fetch.pins import RECORDED, Pins
from parity.manifest import header, sha256_file, write_manifest

STAGING_PREFIX = ".fetch-"

# download(name, staging_dir) -> path of the downloaded file, somewhere inside staging_dir
Downloader = Callable[[str, Path], Path]


@dataclass(frozen=True)
class FileResult:
    """One line of a receipt: what the file hashed to, what it was pinned to, and what was done.

    `pin` says where the pin came from (pins.PUBLISHED with `pin_evidence`, or pins.RECORDED), so a
    reader of the receipt knows whether the hash was checked against a public source or only recorded.
    """

    name: str
    sha256: str
    bytes: int
    pinned_sha256: str | None
    verified: bool
    downloaded: bool
    pin: str
    pin_evidence: str | None


def file_result(pins: Pins, name: str, digest: str, size: int, *, pinned: str | None, downloaded: bool,
                section: str = "files") -> FileResult:
    """The receipt line for a file now on disk whose pin `pins` holds (recorded by now, if it was null)."""
    return FileResult(name, digest, size, pinned, pinned is not None, downloaded,
                      pins.status(name, section), pins.evidence(name, section))


def require_pins(pins: Pins, names: list[str], *, record_pins: bool, section: str = "files") -> None:
    """Fail before any download if a file has no pin and this run may not record one."""
    missing = [name for name in names if pins.sha256(name, section) is None]
    if missing and not record_pins:
        raise FetchError(f"{pins.path}: no SHA-256 pinned yet for {', '.join(missing)}; "
                         "run once with --record-pins on a trusted network to record them")


def fetch_files(pins: Pins, dest: Path, download: Downloader, *, record_pins: bool,
                log: Callable[[str], None]) -> list[FileResult]:
    """Bring every pinned file into `dest`, verified; record null pins only when `record_pins`."""
    names = pins.names()
    require_pins(pins, names, record_pins=record_pins)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    for stale in sorted(dest.glob(f"{STAGING_PREFIX}*")):  # a fetch killed mid-download (SIGKILL) left its staging
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
            log(f"removed {stale}, a killed fetch's partial download")
    results = []
    try:  # SIGTERM and SIGHUP raise here too (`parity` arms them for every command), so a staging is removed
        for name in names:
            results.append(_fetch_one(pins, dest, name, download, record_pins=record_pins, log=log))
    except BaseException:
        if created and not any(dest.iterdir()):
            dest.rmdir()  # leave no empty folder behind either
        raise
    return results


def _fetch_one(pins: Pins, dest: Path, name: str, download: Downloader, *, record_pins: bool,
               log: Callable[[str], None]) -> FileResult:
    target = dest / name
    pinned = pins.sha256(name)
    if pinned is not None and target.is_file():
        on_disk = sha256_file(target)
        if on_disk == pinned:
            log(f"{name}: already present and verified (sha256 {pinned}); not downloaded again")
            return file_result(pins, name, on_disk, target.stat().st_size, pinned=pinned, downloaded=False)
        log(f"{name}: on disk with sha256 {on_disk}, pinned {pinned}; downloading it again")
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=dest))
    try:
        got = Path(download(name, staging))
        digest = sha256_file(got)
        if pinned is not None and digest != pinned:
            raise FetchError(f"{name}: SHA-256 mismatch: pinned {pinned} ({pins.status(name)}), "
                             f"downloaded {digest}; the download was discarded")
        target.parent.mkdir(parents=True, exist_ok=True)
        size = got.stat().st_size
        os.replace(got, target)
    except OSError as exc:
        what = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise FetchError(f"{name}: {what} under {dest}; the partial download was removed") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if pinned is None:
        pins.record(name, digest)
        log(f"{name}: downloaded; pin {RECORDED}, saved in {pins.path} (sha256 {digest})")
    else:
        log(f"{name}: downloaded and verified (sha256 {digest}; pin {pins.status(name)})")
    return file_result(pins, name, digest, size, pinned=pinned, downloaded=True)


def write_receipt(path: Path, source: dict, results: list[FileResult], *, token_used: bool, pins: Pins, dest: Path,
                  **extra) -> Path:
    """The fetch-receipt manifest: source, each file's hash against its pin, whether a token was used.

    `source` holds only type/repo/revision/url (the schema's fields); nothing here ever holds a token.
    """
    doc = header("fetch-receipt", simulated=False) | {
        "source": source,
        "files": [asdict(result) for result in results],
        "token_used": bool(token_used),
        "pins_file": str(pins.path),
        "pins_recorded": [r.name for r in results if r.pinned_sha256 is None],
        "dest": Path(os.path.relpath(os.path.abspath(dest), os.path.abspath(Path(path).parent))).as_posix(),
    } | extra
    write_manifest(path, doc)
    return path


HASHED_AGAIN = 256 * 2**20  # a fetched file up to this size is hashed again where it was fetched to when its receipt
# is checked; a larger one (a model's weights) is held to its size there, and hashed again by the next `parity fetch`


def receipt_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) where a receipt states what its own lines, or the files it names, do not give: a
    file is verified exactly when it had a pin, and then hashed to it; the pins this fetch recorded are the lines
    with none; a file still where the fetch put it (the folder `dest` names, relative to the receipt) has the size it
    states, and its hash where small enough to read again. A receipt edited to "verified" over another hash, its file
    corrupted after the fetch, passed `validate` and was sealed as an input (outside pass P)."""
    problems, recorded = [], []
    # where its files went: a receipt that does not say is not read again there (a same-named file beside a
    # --receipt elsewhere is no fetched file: outside pass R)
    dest = Path(path).parent / doc["dest"] if isinstance(doc.get("dest"), str) else None
    for number, line in enumerate(doc.get("files") or []):
        if not isinstance(line, dict):
            continue
        where, name, pinned = f"/files/{number}", line.get("name"), line.get("pinned_sha256")
        if line.get("verified") != (pinned is not None):
            problems.append((f"{where}/verified", f"{name}: states {line.get('verified')}, but its pin is "
                             f"{'null (this fetch recorded it)' if pinned is None else pinned}: a file is verified "
                             "exactly when it had a pin to check"))
        elif pinned is not None and line.get("sha256") != pinned:
            problems.append((f"{where}/sha256", f"{name}: verified, yet its SHA-256 {line.get('sha256')} is not its "
                             f"pin {pinned}"))
        if pinned is None:
            recorded.append(name)
            if line.get("pin") == "published":
                problems.append((f"{where}/pin", f"{name}: a published pin, yet none was set before this fetch"))
        if dest is not None:
            problems += _where_fetched(dest, where, line)
    if doc.get("pins_recorded") is not None and doc["pins_recorded"] != recorded:
        problems.append(("/pins_recorded", f"states {doc['pins_recorded']}, its lines with no pin are {recorded}"))
    return problems + _against_pins(doc)


def _against_pins(doc: dict) -> list[tuple[str, str]]:
    """Each line against the pins file the receipt names, where that file is here to read: a pin, once recorded,
    never changes, so the file holds the line's pin, or the hash this fetch recorded (a receipt forged with a made-up
    pin and hash, kept apart from its files, passed: outside pass R)."""
    try:
        pins = Pins.load(doc["pins_file"])
    except (KeyError, TypeError, ParityError, OSError):
        return []  # not named, or not on this machine (a bundle's receipt, a receipt from another host)
    problems = []
    for number, line in enumerate(doc.get("files") or []):
        if not isinstance(line, dict):
            continue
        name = line.get("name")
        section = next((s for s in ("files", "derived") if name in pins.names(s)), None)
        expected = line.get("pinned_sha256") or line.get("sha256")
        if section is None:
            problems.append((f"/files/{number}/name", f"{name}: not in the pins file {pins.path} it names"))
        elif (pinned := pins.sha256(name, section)) is not None and pinned != expected:
            problems.append((f"/files/{number}/pinned_sha256", f"{name}: the pins file {pins.path} pins {pinned}, "
                             f"the receipt {expected}"))
    return problems


def _where_fetched(folder: Path, where: str, line: dict) -> list[tuple[str, str]]:
    """A fetched file still in `folder`, where it was fetched to, held to the size (and, small enough, the hash) its
    receipt's line states."""
    name = line.get("name")
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        return []
    file = folder / name
    if not file.is_file():
        return []  # moved away: nothing to read again here
    size = file.stat().st_size
    if size != line.get("bytes"):
        return [(f"{where}/bytes", f"{name}: states {line.get('bytes')} bytes, {file} holds {size}")]
    if size <= HASHED_AGAIN and (digest := sha256_file(file)) != line.get("sha256"):
        return [(f"{where}/sha256", f"{name}: states SHA-256 {line.get('sha256')}, {file} hashes to {digest}")]
    return []
