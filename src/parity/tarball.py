"""A tar archive read whole or not at all. The device sessions' archives are evidence (benchmarks/ladder_archive.py
builds them from the calls' archives, benchmarks/ladder_record.py checks a record against one), and tarfile alone
reads a damaged one in part without a word: it stops before a compressed stream's checksum, and a damaged header
after the first just ends its member list. So the stream is decompressed whole first (its checksum checked), the
archive must reach tar's end-of-archive blocks, and a member named outside the archive's root is refused."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zlib
from pathlib import Path

_STREAMS = ((b"\x1f\x8b", "gzip", gzip.decompress), (b"\xfd7zXZ\x00", "xz", lzma.decompress),
            (b"BZh", "bzip2", bz2.decompress))
_END = 2 * tarfile.BLOCKSIZE  # tar's end-of-archive: two zero blocks


class Unreadable(Exception):
    """Why an archive cannot be read whole, in one line."""


def read(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every regular file of the archive at `path`: name (without a leading ./) -> (bytes, mtime); Unreadable where
    any of it cannot be read (links and folders are left out, never followed)."""
    raw = Path(path).read_bytes()
    if not raw:
        raise Unreadable("is empty")
    for magic, kind, decompress in _STREAMS:
        if raw.startswith(magic):
            try:
                raw = decompress(raw)
            except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error) as e:
                raise Unreadable(f"is not a whole {kind} stream ({type(e).__name__}: {' '.join(str(e).split())})") \
                    from None
            break
    try:
        tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    except tarfile.TarError:
        raise Unreadable("is not a tar archive") from None
    files = {}
    with tar:
        try:
            members = tar.getmembers()
            end = tar.offset  # where reading stopped: the end-of-archive blocks, or a header it could not read
            for member in members:
                name = member.name.removeprefix("./")
                if name.startswith("/") or ".." in name.split("/"):
                    raise Unreadable(f"names {member.name!r}, outside its root")
                if member.isfile():
                    files[name] = (tar.extractfile(member).read(), int(member.mtime))
        except tarfile.TarError as e:  # a member's data cut short
            raise Unreadable(f"is cut short or damaged ({' '.join(str(e).split())})") from None
    if len(raw) - end < _END or raw[end:].strip(b"\0"):
        raise Unreadable(f"stops at byte {end:,} of {len(raw):,} before tar's end-of-archive blocks (cut short, or a "
                         "damaged header)")
    return files
