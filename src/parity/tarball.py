"""A tar archive read whole or not at all. The device sessions' archives are evidence (benchmarks/ladder_archive.py
builds them from the calls' archives, benchmarks/ladder_record.py checks a record against one), and tarfile alone
reads a damaged one in part without a word: it stops before a compressed stream's checksum, and a damaged header
after the first just ends its member list. So the stream is decompressed whole first (its checksum checked), the
archive must reach tar's end-of-archive blocks, and a member named outside the archive's root is refused."""

from __future__ import annotations

import gzip
import io
import lzma
import tarfile
import zlib
from pathlib import Path

_XZ = b"\xfd7zXZ\x00"


def _xz(raw: bytes) -> bytes:
    """Every xz stream of `raw`, each whole (lzma.decompress ignores what follows a stream it cannot read); between and
    after them only the format's stream padding (zero bytes, four at a time)."""
    out, at = [], 0
    while at < len(raw):
        if not raw.startswith(_XZ, at):
            raise ValueError(f"data that is not an xz stream at byte {at:,}")
        stream = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        out.append(stream.decompress(raw[at:]))
        if not stream.eof:
            raise EOFError("Compressed data ended before the end-of-stream marker was reached")
        rest = len(stream.unused_data)
        at = len(raw) - rest
        while at < len(raw) and raw[at] == 0:
            at += 1
        if (at - (len(raw) - rest)) % 4:
            raise ValueError(f"stream padding that is not whole 4-byte words at byte {len(raw) - rest:,}")
    return b"".join(out)


_STREAMS = ((b"\x1f\x8b", "gzip", gzip.decompress), (_XZ, "xz", _xz))  # gzip.decompress: every member, each whole
_END = 2 * tarfile.BLOCKSIZE  # tar's end-of-archive: two zero blocks


class Unreadable(Exception):
    """Why an archive cannot be read whole, in one line."""


def read(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every regular file of the archive at `path`: name (without a leading ./) -> (bytes, mtime); Unreadable where
    any of it cannot be read, a name is held twice or a member is a hard link (symbolic links and folders are left
    out, never followed)."""
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
                if member.islnk():  # its bytes are another member's: read as nothing, a file would go missing
                    raise Unreadable(f"holds {member.name!r} as a hard link to {member.linkname!r}")
                if name in files:
                    raise Unreadable(f"holds {name!r} twice")
                if member.isfile():
                    files[name] = (tar.extractfile(member).read(), int(member.mtime))
        except tarfile.TarError as e:  # a member's data cut short
            raise Unreadable(f"is cut short or damaged ({' '.join(str(e).split())})") from None
    zeros = raw.count(0, end)  # counted in place: no copy of what follows
    if len(raw) - end < _END or raw.count(0, end, end + _END) < _END:
        raise Unreadable(f"stops at byte {end:,} of {len(raw):,} before tar's end-of-archive blocks (cut short, or a "
                         "damaged header)")
    if zeros < len(raw) - end:
        raise Unreadable(f"has data after its end-of-archive blocks (at byte {end:,} of {len(raw):,})")
    return files
