"""parity.tarball: an archive read whole or refused in one line (found by an outsider, 2026-12-06: tarfile alone read
a gzip with a flipped byte as two of its three trials, and a damaged second header as one, without a word)."""

from __future__ import annotations

import gzip
import io
import lzma
import tarfile

import pytest

from parity import tarball

FILES = {f"results/trials/t{i}.json": (f'{{"trial": {i}, "pad": "{"x" * 3000}{i}"}}').encode() for i in range(3)}


def _tar(files: dict[str, bytes] = FILES) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_whole_archive_of_each_compression_reads_every_file(tmp_path):
    for name, data in (("a.tar", _tar()), ("a.tgz", gzip.compress(_tar())), ("a.tar.xz", lzma.compress(_tar()))):
        (tmp_path / name).write_bytes(data)
        assert tarball.read(tmp_path / name) == {k: (v, 1_000) for k, v in FILES.items()}


def test_a_flipped_byte_in_a_compressed_stream_is_refused_not_read_in_part(tmp_path):
    for name, compress, kind in (("a.tgz", gzip.compress, "gzip"), ("a.tar.xz", lzma.compress, "xz")):
        data = bytearray(compress(_tar()))
        data[len(data) // 2] ^= 0x40
        (tmp_path / name).write_bytes(bytes(data))
        with pytest.raises(tarball.Unreadable, match=f"^is not a whole {kind} stream"):
            tarball.read(tmp_path / name)


def test_a_damaged_header_after_the_first_or_an_archive_cut_at_a_member_is_refused(tmp_path):
    raw = bytearray(_tar())
    second = raw.index(b"results/trials/t1.json")  # its name in the second member's header (after the PAX one)
    raw[second] ^= 0x01  # the header's checksum no longer matches: tarfile ends its member list there
    (tmp_path / "a.tgz").write_bytes(gzip.compress(bytes(raw)))  # the stream itself is whole
    with pytest.raises(tarball.Unreadable, match="before tar's end-of-archive blocks"):
        tarball.read(tmp_path / "a.tgz")
    whole = _tar()
    (tmp_path / "b.tar").write_bytes(whole[: whole.index(b"results/trials/t2.json")])  # at a header: two members
    with pytest.raises(tarball.Unreadable, match="before tar's end-of-archive blocks"):
        tarball.read(tmp_path / "b.tar")
    (tmp_path / "b.tar").write_bytes(whole[: whole.index(b"results/trials/t2.json") - 1024])  # in a member's data
    with pytest.raises(tarball.Unreadable, match=r"^is cut short or damaged \(unexpected end of data\)$"):
        tarball.read(tmp_path / "b.tar")


@pytest.mark.parametrize("name", ["results/trials/../../../../tmp/x", "/etc/x", "../x", "./a/../../x"])
def test_a_member_named_outside_the_archive_root_is_refused(tmp_path, name):
    (tmp_path / "a.tgz").write_bytes(gzip.compress(_tar({name: b"x"})))
    with pytest.raises(tarball.Unreadable, match="outside its root"):
        tarball.read(tmp_path / "a.tgz")


def test_an_empty_file_or_no_archive_at_all_is_one_line(tmp_path):
    (tmp_path / "a").write_bytes(b"")
    with pytest.raises(tarball.Unreadable, match="^is empty$"):
        tarball.read(tmp_path / "a")
    (tmp_path / "a").write_bytes(b"hello\n" * 200)
    with pytest.raises(tarball.Unreadable, match="^is not a tar archive$"):
        tarball.read(tmp_path / "a")


def test_xz_streams_are_read_each_whole_with_only_their_padding_between(tmp_path):
    """A second outsider (2026-12-06): lzma.decompress accepted a whole stream followed by a corrupt one or by
    garbage, and refused the format's own stream padding (zero bytes, four at a time), which xz -t accepts."""
    whole = lzma.compress(_tar())
    (tmp_path / "a.txz").write_bytes(whole + b"\0" * 4)
    assert tarball.read(tmp_path / "a.txz") == {k: (v, 1_000) for k, v in FILES.items()}
    for tail, said in ((b"\0" * 3, "stream padding that is not whole 4-byte words"),
                       (b"GARBAGE!", "data that is not an xz stream at byte"),
                       (lzma.compress(b"x" * 5000)[:-30], "Compressed data ended before the end-of-stream marker")):
        (tmp_path / "a.txz").write_bytes(whole + tail)
        with pytest.raises(tarball.Unreadable, match=f"^is not a whole xz stream .*{said}"):
            tarball.read(tmp_path / "a.txz")


def test_a_name_held_twice_a_hard_link_or_data_after_the_end_blocks_is_refused(tmp_path):
    """A second outsider: two members of one name (or `a` and `./a`) kept the last without a word, a hard link's
    file went missing (its bytes are another member's), and data after a whole archive was called cut short."""
    (tmp_path / "a.tar").write_bytes(_tar({"a": b"1", "./a": b"2"}))
    with pytest.raises(tarball.Unreadable, match="^holds 'a' twice$"):
        tarball.read(tmp_path / "a.tar")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("a")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
        link = tarfile.TarInfo("b")
        link.type, link.linkname = tarfile.LNKTYPE, "a"
        tar.addfile(link)
    (tmp_path / "a.tar").write_bytes(buffer.getvalue())
    with pytest.raises(tarball.Unreadable, match="^holds 'b' as a hard link to 'a'$"):
        tarball.read(tmp_path / "a.tar")
    (tmp_path / "a.tar").write_bytes(_tar() + b"GARBAGE")
    with pytest.raises(tarball.Unreadable, match="^has data after its end-of-archive blocks"):
        tarball.read(tmp_path / "a.tar")
