"""The fetch layer, offline: a local HTTP server on 127.0.0.1 and a fake Hugging Face Hub.

What must hold: a file reaches its destination only after its SHA-256 matched its pin; a mismatch,
a cut connection, Ctrl-C or a full disk leaves nothing behind; a verified file is not downloaded
again; pins are recorded once and then only verified; the token never reaches a receipt or a log.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import io
import json
import os
import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub.errors import GatedRepoError, RevisionNotFoundError

from parity.cli import main
from parity.fetch import FetchError, Pins, fetch_pinned, hub, web
from parity.fetch.articles import convert, derive
from parity.fetch.transfer import STAGING_PREFIX
from parity.manifest import read_manifest, validate_document, validate_paths

COMMIT = "a2856192dd7c25b842431f39c179a6c2c2f627d1"
OTHER_COMMIT = "0" * 40
TOKEN = "hf_SENTINELtoken0123456789abcdef"
FILES = {"config.json": b'{"model_type": "llama"}\n', "tokenizer.json": b'{"version": "1.0"}\n' * 50}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """Everything under `folder` (relative paths), hidden files included: must be [] after a failure."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def write_pins(path: Path, source: dict, files: dict, derived: dict | None = None) -> Path:
    doc = {"source": source, "files": {name: {"sha256": digest} for name, digest in files.items()}}
    if derived is not None:
        doc["derived"] = derived
    path.write_text(json.dumps(doc, indent=2))
    return path


# ---- a local HTTP file server ------------------------------------------------------------------

class Server:
    """Serves `routes` {path: bytes}; `short` {path: n} announces the full length but sends n bytes."""

    def __init__(self):
        self.routes: dict[str, bytes] = {}
        self.short: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                if isinstance(body, str):  # a redirect to this URL
                    self.send_response(302)
                    self.send_header("Location", body)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: server.short.get(self.path, len(body))])
                if self.path in server.short:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.close()


@pytest.fixture
def url_pins(tmp_path, server):
    """Two files served under /data/, pinned to their true hashes."""
    for name, data in FILES.items():
        server.routes[f"/data/{name}"] = data
    return write_pins(tmp_path / "pins.json", {"type": "url", "url": f"{server.url}/data"},
                      {name: sha(data) for name, data in FILES.items()})


def run_fetch(pins: Path, dest: Path, **kwargs):
    lines = []
    receipt = fetch_pinned(pins, dest, log=lines.append, **kwargs)
    return receipt, lines


# ---- URL sources -------------------------------------------------------------------------------

def test_good_fetch_writes_verified_files_and_a_valid_receipt(tmp_path, url_pins):
    dest = tmp_path / "dest"
    receipt, _ = run_fetch(url_pins, dest)
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    doc = read_manifest(receipt)
    assert receipt == dest / "fetch-receipt.json"
    assert validate_document(doc) == []
    assert doc["kind"] == "fetch-receipt" and doc["token_used"] is False
    assert doc["source"]["type"] == "url"
    assert [f["name"] for f in doc["files"]] == list(FILES)
    assert all(f["verified"] and f["downloaded"] and f["sha256"] == f["pinned_sha256"] for f in doc["files"])
    assert leftovers(dest) == sorted([*FILES, "fetch-receipt.json"])  # no staging folder left
    assert validate_paths([receipt]) == (1, [])


def test_a_receipt_edited_or_its_file_corrupted_after_the_fetch_is_named_by_validate(tmp_path, url_pins):
    """Outside pass P: a receipt edited to "verified" over another hash and another size, with a published pin made
    up, passed `parity validate` and was sealed as an input; a fetched file overwritten beside it, too."""
    from parity.rederive import validate as validate_paths  # what `parity validate` runs: the derivations too

    dest = tmp_path / "dest"
    receipt, _ = run_fetch(url_pins, dest)
    assert validate_paths([receipt]) == (1, [])
    doc = read_manifest(receipt)
    first, second = doc["files"][0]["name"], doc["files"][1]["name"]
    doc["files"][0] |= {"sha256": "0" * 64}
    doc["files"][1] |= {"pinned_sha256": None, "pin": "published", "pin_evidence": "https://example.org/made-up"}
    receipt.write_text(json.dumps(doc))
    problems = [f"{p.pointer}: {p.message}" for p in validate_paths([receipt])[1]]
    assert any(p.startswith("/files/0/sha256") and "is not its pin" in p for p in problems), problems
    assert any(p.startswith("/files/1/verified") for p in problems), problems
    assert any(p.startswith("/files/1/pin") and "published pin" in p for p in problems), problems
    assert any(p.startswith("/pins_recorded") for p in problems), problems
    run_fetch(url_pins, dest)  # the receipt whole again; then a file changed after it
    (dest / first).write_bytes(b"CORRUPT")
    problems = [f"{p.pointer}: {p.message}" for p in validate_paths([receipt])[1]]
    assert problems == [f"/files/0/bytes: {first}: states {len(FILES[first])} bytes, {dest / first} holds 7"], problems
    (dest / first).write_bytes(FILES[first][:-1] + b"?")
    assert [p.pointer for p in validate_paths([receipt])[1]] == ["/files/0/sha256"]
    (dest / first).unlink()  # a file moved away: nothing to read again beside the receipt
    assert validate_paths([receipt]) == (1, [])
    apart = tmp_path / "elsewhere" / "receipt.json"  # --receipt away from its files, beside another file of that name
    apart.parent.mkdir()
    (apart.parent / first).write_text("not the fetched file")
    run_fetch(url_pins, dest, receipt=apart)
    assert read_manifest(apart)["dest"] == "../dest" and validate_paths([apart]) == (1, [])  # outside pass R
    (dest / first).write_bytes(b"CORRUPT")
    assert [p.pointer for p in validate_paths([apart])[1]] == ["/files/0/bytes"]  # read where the fetch put it
    doc = read_manifest(apart)  # a made-up pin and hash, the receipt apart from its files: held to its pins file
    doc["files"][1] |= {"sha256": "ab" * 32, "pinned_sha256": "ab" * 32}
    doc.pop("dest")
    apart.write_text(json.dumps(doc))
    assert [p.pointer for p in validate_paths([apart])[1]] == ["/files/1/pinned_sha256"]


def test_already_verified_file_is_rehashed_not_downloaded_again(tmp_path, url_pins, server):
    dest = tmp_path / "dest"
    run_fetch(url_pins, dest)
    receipt, lines = run_fetch(url_pins, dest)
    assert all(count == 1 for count in server.hits.values())
    assert all(not f["downloaded"] and f["verified"] for f in read_manifest(receipt)["files"])
    assert any("not downloaded again" in line for line in lines)


def test_file_on_disk_that_no_longer_matches_is_downloaded_again(tmp_path, url_pins, server):
    dest = tmp_path / "dest"
    run_fetch(url_pins, dest)
    (dest / "config.json").write_bytes(b"tampered")
    run_fetch(url_pins, dest)
    assert (dest / "config.json").read_bytes() == FILES["config.json"]
    assert server.hits["/data/config.json"] == 2 and server.hits["/data/tokenizer.json"] == 1


def test_corrupted_file_is_refused_naming_the_file_and_both_hashes(tmp_path, url_pins, server):
    corrupt = bytearray(FILES["tokenizer.json"])
    corrupt[10] ^= 0xFF
    server.routes["/data/tokenizer.json"] = bytes(corrupt)
    dest = tmp_path / "dest"
    with pytest.raises(FetchError) as info:
        run_fetch(url_pins, dest)
    message = str(info.value)
    assert "tokenizer.json" in message and sha(FILES["tokenizer.json"]) in message and sha(bytes(corrupt)) in message
    assert not (dest / "tokenizer.json").exists() and not (dest / "fetch-receipt.json").exists()
    assert not [p for p in leftovers(dest) if STAGING_PREFIX in p]


def test_truncated_file_fails_verification(tmp_path, url_pins, server):
    server.routes["/data/config.json"] = FILES["config.json"][:-5]  # a short file, served cleanly
    dest = tmp_path / "dest"
    with pytest.raises(FetchError, match="config.json: SHA-256 mismatch"):
        run_fetch(url_pins, dest)
    assert leftovers(dest) == []  # the folder this run created is gone too


def test_connection_cut_mid_body_leaves_nothing(tmp_path, url_pins, server):
    server.short["/data/tokenizer.json"] = 7  # Content-Length says more than is sent
    dest = tmp_path / "dest"
    with pytest.raises(FetchError, match="tokenizer.json: download from .* failed"):
        run_fetch(url_pins, dest)
    assert not (dest / "tokenizer.json").exists()
    assert not [p for p in leftovers(dest) if STAGING_PREFIX in p]


def test_interruption_leaves_nothing_behind(tmp_path, url_pins, monkeypatch):
    real = web.download_url

    def interrupted(url, target, *, label):
        real(url, target, label=label)  # the bytes are on disk in the staging folder ...
        raise KeyboardInterrupt  # ... when the user presses Ctrl-C

    monkeypatch.setattr(web, "download_url", interrupted)
    dest = tmp_path / "dest"
    with pytest.raises(KeyboardInterrupt):
        run_fetch(url_pins, dest)
    assert leftovers(dest) == []


class FullDisk(io.RawIOBase):
    """A file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, room: int):
        self.room = room

    def writable(self):
        return True

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return len(data)


def test_disk_full_is_reported_and_leaves_nothing(tmp_path, url_pins, monkeypatch):
    real_open = open

    def open_on_full_disk(path, mode="r", *args, **kwargs):
        if "w" in mode and STAGING_PREFIX in str(path):
            real_open(path, mode).close()  # the partial file exists, as on a real disk
            return FullDisk(room=4)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(web, "open", open_on_full_disk, raising=False)
    dest = tmp_path / "dest"
    with pytest.raises(FetchError, match="config.json: no space left on device"):
        run_fetch(url_pins, dest)
    assert leftovers(dest) == []


def test_http_error_names_status_and_url(tmp_path, url_pins, server):
    del server.routes["/data/config.json"]
    with pytest.raises(FetchError, match=r"config.json: HTTP 404 from http://127\.0\.0\.1:\d+/data/config.json"):
        run_fetch(url_pins, tmp_path / "dest")


def test_unpinned_file_needs_record_pins_then_is_pinned_once(tmp_path, server):
    server.routes["/data/config.json"] = FILES["config.json"]
    pins = write_pins(tmp_path / "pins.json", {"type": "url", "url": f"{server.url}/data"}, {"config.json": None})
    dest = tmp_path / "dest"
    with pytest.raises(FetchError, match="no SHA-256 pinned yet for config.json.*--record-pins"):
        run_fetch(pins, dest)
    assert not dest.exists() and server.hits == {}  # refused before any download

    receipt, _ = run_fetch(pins, dest, record_pins=True)
    assert Pins.load(pins).sha256("config.json") == sha(FILES["config.json"])
    entry = read_manifest(receipt)["files"][0]
    assert entry["pinned_sha256"] is None and entry["verified"] is False and entry["downloaded"] is True
    assert read_manifest(receipt)["pins_recorded"] == ["config.json"]

    # from now on only verified: a changed upstream file is refused, and the pin is not rewritten
    server.routes["/data/config.json"] = b"changed upstream"
    (dest / "config.json").unlink()
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        run_fetch(pins, dest, record_pins=True)
    assert Pins.load(pins).sha256("config.json") == sha(FILES["config.json"])


def test_mlcommons_r2_resolver_checks_md5_and_sha256(tmp_path, server):
    data = b'[{"input": "article", "tok_input": [128000], "output": "summary"}]'
    server.routes["/metadata/cnn-eval.uri"] = f"{server.url}/bucket/cnn-eval\n".encode()
    server.routes["/metadata/cnn-eval.md5"] = f"{hashlib.md5(data).hexdigest()}  ./cnn_eval.json\n".encode()
    server.routes["/bucket/cnn-eval/cnn_eval.json"] = data
    pins = write_pins(tmp_path / "pins.json", {"type": "url", "url": f"{server.url}/metadata/cnn-eval.uri",
                                               "resolver": "mlcommons-r2"}, {"cnn_eval.json": sha(data)})
    receipt, _ = run_fetch(pins, tmp_path / "mlperf")
    assert (tmp_path / "mlperf" / "cnn_eval.json").read_bytes() == data
    assert read_manifest(receipt)["resolved_urls"] == {"cnn_eval.json": f"{server.url}/bucket/cnn-eval/cnn_eval.json"}

    server.routes["/metadata/cnn-eval.md5"] = b"0" * 32 + b"  cnn_eval.json\n"
    with pytest.raises(FetchError, match="MD5 mismatch"):
        run_fetch(pins, tmp_path / "other")
    assert leftovers(tmp_path / "other") == []


def test_malformed_pins_are_refused(tmp_path):
    bad = [
        ({"type": "url", "url": "https://user:pw@example.invalid/x"}, {"a": None}, "without user:password@"),
        ({"type": "huggingface", "repo": "o/r", "revision": "main"}, {"a": None}, "full 40-hex commit"),
        ({"type": "url", "url": "https://example.invalid"}, {"../escape": None}, "relative path"),
        ({"type": "url", "url": "https://example.invalid"}, {"a": "not-a-hash"}, "64 lower-case hex"),
    ]
    for source, files, message in bad:
        with pytest.raises(FetchError, match=message):
            Pins.load(write_pins(tmp_path / "pins.json", source, files))


def test_a_pins_file_with_a_name_twice_a_list_for_derived_or_too_deep_is_refused_in_one_line(tmp_path):
    """An outsider's (2026-12-07): a file named twice was verified against its last pin alone, exit 0; `derived` as
    a list was an AttributeError and nesting past the parser a RecursionError."""
    digest = "a" * 64
    cases = [('{"source": {"type": "url", "url": "https://example.invalid"}, "files": {"a": {"sha256": null}, '
              '"a": {"sha256": "' + digest + '"}}}', "duplicate key(s) 'a'"),
             ('{"source": {"type": "url", "url": "https://example.invalid"}, "files": {"a": {"sha256": null}}, '
              '"derived": [1]}', "derived must be an object"),
             ('{"source": ' + "[" * 100_000, "nested more deeply")]
    for text, message in cases:
        path = tmp_path / "pins.json"
        path.write_text(text)
        with pytest.raises(FetchError, match=re.escape(message)):
            Pins.load(path)


def test_a_pinned_file_where_the_receipt_goes_is_refused_before_any_download(tmp_path, server):
    """A pinned `fetch-receipt.json` was downloaded, verified, then overwritten by the receipt, exit 0."""
    pins = write_pins(tmp_path / "pins.json", {"type": "url", "url": server.url}, {"fetch-receipt.json": None})
    with pytest.raises(FetchError, match="would be written where the receipt goes"):
        fetch_pinned(pins, tmp_path / "dest", record_pins=True, log=lambda m: None)
    assert not (tmp_path / "dest").exists()


# ---- Hugging Face sources (a fake hub) ---------------------------------------------------------

class FakeHub:
    """Stands in for hf_hub_download: files per (repo, commit); gated repos need a token."""

    def __init__(self, repo: str = "meta-llama/Llama-3.1-8B-Instruct", gated: bool = True):
        self.repo, self.gated = repo, gated
        self.files = {COMMIT: dict(FILES)}
        self.calls: list[tuple] = []
        self.tokens_seen: list = []
        self.fail_after_write: BaseException | None = None

    def download(self, repo_id, filename, *, repo_type=None, revision=None, token=None, local_dir=None):
        self.calls.append((repo_id, filename, revision))
        self.tokens_seen.append(token)
        if self.gated and token is None:
            raise hub_error(GatedRepoError, f"401 Client Error: access to model {repo_id} is restricted")
        if revision not in self.files:
            raise hub_error(RevisionNotFoundError, f"404 Client Error: Revision Not Found for url {revision}")
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / ".cache").mkdir(exist_ok=True)  # hub metadata, as the real client writes
        target.write_bytes(self.files[revision][filename])
        if self.fail_after_write is not None:
            raise self.fail_after_write
        return str(target)


def hub_error(cls, message):
    """A hub exception without an HTTP response object (the real ones are built from one)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


@pytest.fixture
def fake_hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(hub, "hf_hub_download", fake.download)
    monkeypatch.setattr(hub, "get_token", lambda: os.environ.get("HF_TOKEN"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return fake


def hub_pins(tmp_path, revision=COMMIT, digests=None, gated=True) -> Path:
    digests = digests if digests is not None else {name: sha(data) for name, data in FILES.items()}
    return write_pins(tmp_path / "model-pins.json",
                      {"type": "huggingface", "repo": "meta-llama/Llama-3.1-8B-Instruct", "repo_type": "model",
                       "revision": revision, "gated": gated}, digests)


def test_hub_good_fetch_pins_the_commit_and_passes_the_token(tmp_path, fake_hub):
    dest = tmp_path / "model"
    receipt, _ = run_fetch(hub_pins(tmp_path), dest)
    assert {name: (dest / name).read_bytes() for name in FILES} == FILES
    assert {revision for _, _, revision in fake_hub.calls} == {COMMIT}
    assert set(fake_hub.tokens_seen) == {TOKEN}
    doc = read_manifest(receipt)
    assert validate_document(doc) == []
    assert doc["source"] == {"type": "huggingface", "repo": "meta-llama/Llama-3.1-8B-Instruct", "revision": COMMIT}
    assert doc["token_used"] is True
    assert leftovers(dest) == sorted([*FILES, "fetch-receipt.json"])  # no .cache, no staging


def test_hub_already_verified_files_are_not_downloaded_again(tmp_path, fake_hub):
    pins, dest = hub_pins(tmp_path), tmp_path / "model"
    run_fetch(pins, dest)
    run_fetch(pins, dest)
    assert len(fake_hub.calls) == len(FILES)


def test_hub_corrupted_file_is_refused(tmp_path, fake_hub):
    fake_hub.files[COMMIT]["tokenizer.json"] = b"corrupted"
    dest = tmp_path / "model"
    with pytest.raises(FetchError) as info:
        run_fetch(hub_pins(tmp_path), dest)
    assert "tokenizer.json" in str(info.value) and sha(b"corrupted") in str(info.value)
    assert sha(FILES["tokenizer.json"]) in str(info.value)
    assert not (dest / "tokenizer.json").exists()
    assert not [p for p in leftovers(dest) if STAGING_PREFIX in p]


def test_hub_wrong_revision_is_a_clear_error(tmp_path, fake_hub):
    dest = tmp_path / "model"
    with pytest.raises(FetchError, match=f"has no revision {OTHER_COMMIT}"):
        run_fetch(hub_pins(tmp_path, revision=OTHER_COMMIT), dest)
    assert leftovers(dest) == []


def test_hub_branch_name_is_not_a_pin(tmp_path, fake_hub):
    with pytest.raises(FetchError, match="full 40-hex commit"):
        run_fetch(hub_pins(tmp_path, revision="main"), tmp_path / "model")
    assert fake_hub.calls == []


def test_gated_repo_without_token_fails_before_writing_anything(tmp_path, fake_hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    dest = tmp_path / "model"
    with pytest.raises(FetchError, match="is gated and no Hugging Face token was found.*HF_TOKEN"):
        run_fetch(hub_pins(tmp_path), dest)
    assert not dest.exists() and fake_hub.calls == []


def raising(error):
    def download(*args, **kwargs):
        raise error
    return download


def test_gated_repo_refusing_the_token_is_a_clear_error(tmp_path, fake_hub, monkeypatch):
    monkeypatch.setattr(hub, "hf_hub_download", raising(hub_error(GatedRepoError, f"denied for {TOKEN}")))
    dest = tmp_path / "model"
    with pytest.raises(FetchError) as info:
        run_fetch(hub_pins(tmp_path), dest)
    assert "no access" in str(info.value) and TOKEN not in str(info.value)
    assert leftovers(dest) == []


@pytest.fixture
def hub_answers(monkeypatch):
    """The real hf_hub_download against a Hub that answers what the test says (no network): `answer(request)`
    returns an httpx2 response or raises the client's own error. Its retries do not sleep."""
    import httpx2
    import huggingface_hub
    from huggingface_hub.utils import _http

    hub_side = {}
    huggingface_hub.set_client_factory(
        lambda: httpx2.Client(transport=httpx2.MockTransport(lambda request: hub_side["answer"](request))))
    monkeypatch.setattr(_http.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(hub, "get_token", lambda: TOKEN)
    yield lambda answer: hub_side.update(answer=answer)
    huggingface_hub.set_client_factory(_http.default_client_factory)


def status(code: int, **headers):
    import httpx2

    return lambda request: httpx2.Response(code, headers=headers, request=request)


def unreachable(request):
    import httpx2

    raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution", request=request)


@pytest.mark.parametrize("answer, said", [
    (status(403), r"refused access to meta-llama/\S+ \(HTTP 403\): no access to the \(gated\?\) model with this token; "
                  r"accept its licence on https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct with your account, "
                  r"then set HF_TOKEN \(or run `hf auth login`\)"),
    (status(403, **{"X-Error-Code": "GatedRepo"}), r"is gated and this token has no access to it: accept its licence"),
    (status(401), r"not found, or private or gated and this token cannot see it: check the repo's name; accept its "),
    (status(404), r"has no such repo, revision or file: meta-llama/\S+ \(HTTP 404"),
    (status(404, **{"X-Error-Code": "EntryNotFound"}), r"has no file \S+ \(check the pins file\)"),
    (status(500), r"the Hugging Face Hub failed \(HTTP 500\) on meta-llama/\S+, a fault on its side: retry later"),
    (status(503), r"the Hugging Face Hub failed \(HTTP 503\)"),
    (unreachable, r"cannot reach the Hugging Face Hub to download \S+ \(offline\?\): ConnectError"),
], ids=["403", "403-gated", "401", "404", "404-file", "500", "503", "no-answer"])
def test_hub_errors_say_what_the_hub_said_and_never_the_token(tmp_path, hub_answers, answer, said):
    hub_answers(answer)
    dest = tmp_path / "model"
    with pytest.raises(FetchError, match=said) as info:
        run_fetch(hub_pins(tmp_path), dest)
    message = str(info.value)
    assert "\n" not in message and TOKEN not in message and leftovers(dest) == []
    assert ("offline" in message) == (answer is unreachable)  # only no answer at all is "offline"


@pytest.mark.parametrize("answer, said", [(status(502), r"failed \(HTTP 502\) on \S+@main, a fault on its side"),
                                          (unreachable, r"cannot reach the Hugging Face Hub .*\(offline\?\)")],
                         ids=["502", "no-answer"])
def test_pinning_the_revision_says_what_the_hub_said(tmp_path, hub_answers, answer, said):
    hub_answers(answer)  # HfApi's errors come unwrapped, not as hf_hub_download's "not in the local cache"
    pins = hub_pins(tmp_path, revision=None, digests={name: None for name in FILES})
    with pytest.raises(FetchError, match=said):
        run_fetch(pins, tmp_path / "model", record_pins=True)


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_hub_interruption_or_full_disk_leaves_nothing(tmp_path, fake_hub, failure):
    fake_hub.fail_after_write = failure
    dest = tmp_path / "model"
    with pytest.raises((KeyboardInterrupt, FetchError)) as info:
        run_fetch(hub_pins(tmp_path), dest)
    if isinstance(failure, OSError):
        assert "no space left on device" in str(info.value)
    assert leftovers(dest) == []


def test_hub_revision_is_recorded_on_first_trusted_download(tmp_path, fake_hub, monkeypatch):
    class FakeApi:
        def repo_info(self, repo, *, repo_type=None, token=None):
            return type("Info", (), {"sha": COMMIT})()

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    pins = hub_pins(tmp_path, revision=None, digests={name: None for name in FILES})
    with pytest.raises(FetchError, match="no SHA-256 pinned yet"):
        run_fetch(pins, tmp_path / "model")
    run_fetch(pins, tmp_path / "model", record_pins=True)
    recorded = Pins.load(pins)
    assert recorded.source["revision"] == COMMIT
    assert {name: recorded.sha256(name) for name in FILES} == {name: sha(data) for name, data in FILES.items()}


def test_token_never_appears_in_receipt_pins_or_output(tmp_path, fake_hub, monkeypatch):
    pins, dest = hub_pins(tmp_path, digests={name: None for name in FILES}), tmp_path / "model"
    result = CliRunner().invoke(main, ["fetch", "model", "--pins", str(pins), "--dest", str(dest), "--record-pins"])
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output
    for path in [pins, *dest.rglob("*")]:
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert read_manifest(dest / "fetch-receipt.json")["token_used"] is True

    # and not in an error either, even when the hub's own message quotes it
    monkeypatch.setattr(hub, "hf_hub_download", raising(RuntimeError(f"Bearer {TOKEN} rejected")))
    (dest / "config.json").unlink()
    result = CliRunner().invoke(main, ["fetch", "model", "--pins", str(pins), "--dest", str(dest)])
    assert result.exit_code == 1 and "download from" in result.output and TOKEN not in result.output


def test_cli_prints_one_line_errors(tmp_path):
    result = CliRunner().invoke(main, ["fetch", "url", "--pins", str(tmp_path / "none.json"),
                                       "--dest", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {tmp_path / 'none.json'}: no such pins file"]


# ---- the derived articles.jsonl ----------------------------------------------------------------

PARQUET = "3.0.0/validation-00000-of-00001.parquet"


def make_parquet(path: Path, articles: list[str]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"article": articles, "highlights": ["h"] * len(articles),
                      "id": [f"{i:040x}" for i in range(len(articles))]})
    pq.write_table(table, path)
    return path.read_bytes()


def articles_pins(tmp_path, parquet_sha, derived_sha=None) -> Path:
    return write_pins(tmp_path / "cnn-pins.json",
                      {"type": "huggingface", "repo": "abisee/cnn_dailymail", "repo_type": "dataset",
                       "revision": COMMIT, "gated": False},
                      {PARQUET: parquet_sha}, {"articles.jsonl": {"sha256": derived_sha, "from": PARQUET}})


def test_articles_conversion_is_deterministic_pinned_and_linked(tmp_path):
    dest = tmp_path / "cnn"
    data = make_parquet(dest / PARQUET, ["First story.", "Second story, with ünïcode."])
    pins = articles_pins(tmp_path, sha(data))
    receipt = derive(Pins.load(pins), dest, record_pins=True, log=lambda line: None)
    lines = (dest / "articles.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["article"] for line in lines] == ["First story.", "Second story, with ünïcode."]
    first = (dest / "articles.jsonl").read_bytes()

    doc = read_manifest(receipt)
    assert validate_document(doc) == [] and doc["source"] == {"type": "local"}
    assert doc["derived_from"]["articles.jsonl"]["path"] == PARQUET
    assert validate_paths([receipt]) == (1, [])  # the parquet is hash-linked
    assert Pins.load(pins).sha256("articles.jsonl", "derived") == sha(first)

    # again from scratch: the same bytes, verified against the recorded pin
    (dest / "articles.jsonl").unlink()
    derive(Pins.load(pins), dest, log=lambda line: None)
    assert (dest / "articles.jsonl").read_bytes() == first


def test_articles_refuses_an_unverified_parquet_and_a_changed_output(tmp_path):
    dest = tmp_path / "cnn"
    data = make_parquet(dest / PARQUET, ["Story."])
    with pytest.raises(FetchError, match="SHA-256 mismatch: pinned 0{64}"):
        derive(Pins.load(articles_pins(tmp_path, "0" * 64, "1" * 64)), dest, log=lambda line: None)
    with pytest.raises(FetchError, match="articles.jsonl: SHA-256 mismatch: pinned 1{64}"):
        derive(Pins.load(articles_pins(tmp_path, sha(data), "1" * 64)), dest, log=lambda line: None)
    assert sorted(p.name for p in dest.iterdir()) == ["3.0.0"]  # no output, no temporary file


def test_convert_writes_sorted_json_lines(tmp_path):
    make_parquet(tmp_path / "x.parquet", ["a", "b"])
    out = io.BytesIO()
    assert convert(tmp_path / "x.parquet", out) == 2
    assert out.getvalue().decode().splitlines()[0] == json.dumps({"article": "a", "id": "0" * 40})



def test_hub_errors_hide_the_original_exception_that_may_quote_the_token():
    with pytest.raises(FetchError) as info:
        with hub._hub_errors("o/r", "model", COMMIT, "config.json", TOKEN):
            raise RuntimeError(f"header Authorization: Bearer {TOKEN}")
    assert TOKEN not in str(info.value) and "<token>" in str(info.value)
    assert info.value.__suppress_context__ and info.value.__cause__ is None


def test_verified_rerun_needs_no_network(tmp_path, url_pins, server):
    dest = tmp_path / "dest"
    run_fetch(url_pins, dest)
    server.close()
    receipt, _ = run_fetch(url_pins, dest)
    assert all(f["verified"] and not f["downloaded"] for f in read_manifest(receipt)["files"])


def test_hub_verified_rerun_needs_no_token(tmp_path, fake_hub, monkeypatch):
    pins, dest = hub_pins(tmp_path), tmp_path / "model"
    run_fetch(pins, dest)
    monkeypatch.delenv("HF_TOKEN")
    receipt, _ = run_fetch(pins, dest)
    assert read_manifest(receipt)["token_used"] is False and len(fake_hub.calls) == len(FILES)


# ---- pin provenance: published, recorded on first download, missing ----------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED_PINS = sorted((REPO_ROOT / "manifests" / "pins").glob("*.json"))


def test_pinned_file_with_other_content_is_refused_in_one_line_and_leaves_nothing(tmp_path, server):
    server.routes["/data/config.json"] = b'{"model_type": "not llama"}\n'
    pinned = sha(FILES["config.json"])
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"source": {"type": "url", "url": f"{server.url}/data"},
                                "files": {"config.json": {"sha256": pinned, "evidence": "a public listing"}}}))
    dest = tmp_path / "dest"
    result = CliRunner().invoke(main, ["fetch", "url", "--pins", str(pins), "--dest", str(dest)])
    assert result.exit_code == 1
    [line] = [line for line in result.output.splitlines() if line.startswith("Error:")]  # others: the log
    assert line.startswith("Error: config.json: SHA-256 mismatch: pinned ")
    assert pinned in line and sha(server.routes["/data/config.json"]) in line and "(published)" in line
    assert leftovers(dest) == []  # no file, no staging folder, no receipt, not even the folder


def test_pin_status_tells_published_recorded_and_missing_apart(tmp_path, server):
    for name in ("a.json", "b.json", "c.json"):
        server.routes[f"/data/{name}"] = name.encode()
    pins_path = tmp_path / "pins.json"
    pins_path.write_text(json.dumps({"source": {"type": "url", "url": f"{server.url}/data"}, "files": {
        "a.json": {"sha256": sha(b"a.json"), "evidence": "listed in a public index"},
        "b.json": {"sha256": sha(b"b.json")},
        "c.json": {"sha256": None}}}))
    pins = Pins.load(pins_path)
    assert [pins.status(n) for n in ("a.json", "b.json", "c.json")] == ["published", "recorded on first download",
                                                                       "missing"]
    assert pins.revision_status() is None  # a URL source has no commit to pin
    lines = pins.status_lines()
    assert lines[0] == str(pins_path)
    assert lines[1] == "  a.json: published (listed in a public index)"
    assert lines[2] == "  b.json: recorded on first download"
    assert lines[3].startswith("  c.json: missing (no public hash; recorded on first download")

    receipt, _ = run_fetch(pins_path, tmp_path / "dest", record_pins=True)
    doc = read_manifest(receipt)
    assert validate_document(doc) == []
    assert {f["name"]: (f["pin"], f["pin_evidence"]) for f in doc["files"]} == {
        "a.json": ("published", "listed in a public index"),
        "b.json": ("recorded on first download", None),
        "c.json": ("recorded on first download", None)}  # recorded by this very run
    assert Pins.load(pins_path).status("c.json") == "recorded on first download"


def test_hub_revision_status_and_receipt(tmp_path, fake_hub):
    pins_path = hub_pins(tmp_path)
    doc = json.loads(pins_path.read_text())
    assert Pins.load(pins_path).revision_status() == "recorded on first download"
    doc["source"]["revision_evidence"] = "a saved Hub API response"
    pins_path.write_text(json.dumps(doc))
    assert Pins.load(pins_path).revision_status() == "published"
    receipt, _ = run_fetch(pins_path, tmp_path / "model")
    assert read_manifest(receipt)["revision_pin"] == "published"
    doc["source"]["revision"] = None
    del doc["source"]["revision_evidence"]
    pins_path.write_text(json.dumps(doc))
    assert Pins.load(pins_path).revision_status() == "missing"


def test_evidence_without_a_value_or_empty_is_refused(tmp_path):
    url = {"type": "url", "url": "https://example.invalid"}
    bad = [
        (url, {"a": {"sha256": None, "evidence": "somewhere"}}, r"files\['a'\].evidence is given but sha256 is null"),
        (url, {"a": {"sha256": "0" * 64, "evidence": " "}}, r"files\['a'\].evidence must be a non-empty text"),
        ({"type": "huggingface", "repo": "o/r", "revision": None, "revision_evidence": "x"}, {"a": {"sha256": None}},
         "source.revision_evidence is given but revision is null"),
    ]
    for source, files, message in bad:
        path = tmp_path / "pins.json"
        path.write_text(json.dumps({"source": source, "files": files}))
        with pytest.raises(FetchError, match=message):
            Pins.load(path)


def test_cli_pins_status_lists_each_pin(tmp_path, monkeypatch):
    result = CliRunner().invoke(main, ["fetch", "pins-status", *map(str, COMMITTED_PINS)])
    assert result.exit_code == 0, result.output
    assert "  cnn_eval.json: missing (no public hash; recorded on first download with --record-pins)" in result.output
    assert "  model-00001-of-00004.safetensors: published (LFS oid" in result.output
    monkeypatch.chdir(tmp_path)  # no manifests/pins here
    result = CliRunner().invoke(main, ["fetch", "pins-status"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        "Error: manifests/pins: no pins files (*.json) found; name the pins files to list"]


@pytest.mark.parametrize("path", COMMITTED_PINS, ids=lambda p: p.name)
def test_committed_pins_files_are_well_formed(path):
    assert COMMITTED_PINS, "manifests/pins/*.json not found"
    pins = Pins.load(path)  # refuses a bad digest, a branch as revision, evidence without a value
    source = pins.source
    if source["type"] == "huggingface" and source.get("revision") is not None:
        assert re.fullmatch(r"[0-9a-f]{40}", source["revision"])
    if source["type"] == "url" and "raw.githubusercontent.com" in source["url"]:
        ref = source["url"].split("/")[5]  # https://raw.githubusercontent.com/OWNER/REPO/REF/...
        assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{path.name}: {ref} is a branch, and a branch can move"
    for section in ("files", "derived"):
        for name in pins.names(section):
            digest = pins.sha256(name, section)
            assert digest is None or re.fullmatch(r"[0-9a-f]{64}", digest)
            assert pins.status(name, section) in ("published", "recorded on first download", "missing")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def llama_index() -> bytes:
    """model.safetensors.index.json of Llama 3.1 8B as transformers writes it: 5 GB shards, sorted, indent 2."""
    hidden, inter, vocab, kv, b = 4096, 14336, 128256, 1024, 2
    tensors = [("model.embed_tokens.weight", vocab * hidden * b)]
    for layer in range(32):
        p = f"model.layers.{layer}."
        tensors += [(p + f"self_attn.{w}_proj.weight", rows * hidden * b)
                    for w, rows in (("q", hidden), ("k", kv), ("v", kv), ("o", hidden))]
        tensors += [(p + f"mlp.{w}_proj.weight", inter * hidden * b) for w in ("gate", "up", "down")]
        tensors += [(p + "input_layernorm.weight", hidden * b), (p + "post_attention_layernorm.weight", hidden * b)]
    tensors += [("model.norm.weight", hidden * b), ("lm_head.weight", vocab * hidden * b)]
    shards, size = [[]], 0
    for name, nbytes in tensors:
        if size + nbytes > 5_000_000_000 and shards[-1]:
            shards, size = [*shards, []], 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {n: f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i, s in enumerate(shards) for n in s}
    doc = {"metadata": {"total_size": sum(n for _, n in tensors)}, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256}
LLAMA_GENERATION = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
                    "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}
SPECIAL = {"content": None, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
LLAMA_SPECIAL_TOKENS = {"bos_token": SPECIAL | {"content": "<|begin_of_text|>"},
                        "eos_token": SPECIAL | {"content": "<|eot_id|>"}}


@pytest.mark.parametrize(("name", "data", "hub_blob_id"), [
    ("config.json", (json.dumps(LLAMA_CONFIG, indent=2) + "\n").encode(), "0bb6fd75b3ad2fe988565929f329945262c2814e"),
    ("generation_config.json", (json.dumps(LLAMA_GENERATION, indent=2) + "\n").encode(),
     "cc7276afd599de091142c6ed3005faf8a74aa257"),
    ("special_tokens_map.json", (json.dumps(LLAMA_SPECIAL_TOKENS, indent=2) + "\n").encode(),
     "02ee80b6196926a5ad790a004d9efd6ab1ba6542"),
    ("model.safetensors.index.json", llama_index(), "0fd8120f1c6acddc268ebc2583058efaf699a771"),
])
def test_rebuilt_model_files_match_the_hub_blob_ids_and_the_committed_pins(name, data, hub_blob_id):
    """The evidence 'rebuilt bytes whose git blob id is the Hub's' of these pins, checked offline.

    The blob ids are the Hub's own (`blobId` at 0e9e39f2 in the saved API response the evidence names): a file
    rebuilt here with the same git blob id has the Hub's bytes, so its SHA-256 is the file's true one.
    """
    pins = Pins.load(REPO_ROOT / "manifests" / "pins" / "llama-3.1-8b-instruct.json")
    assert git_blob_id(data) == hub_blob_id
    assert pins.sha256(name) == sha(data) and pins.status(name) == "published"
    assert hub_blob_id in pins.evidence(name)


def test_the_engine_loads_the_revision_the_pins_fetch():
    """One revision for the weights: what `parity fetch model` downloads is what vLLM is told to load."""
    from parity.engine import HUB_REVISION, EngineArgs

    pins = json.loads((Path(__file__).resolve().parents[1] / "manifests/pins/llama-3.1-8b-instruct.json").read_text())
    assert pins["source"]["revision"] == HUB_REVISION == EngineArgs().revision
    assert EngineArgs().model == pins["source"]["repo"]


def test_a_killed_fetchs_staging_is_removed_by_the_next(tmp_path, url_pins):
    """A SIGTERM or SIGKILL mid-download left DEST/.fetch-XXXX with the partial file, and reruns never removed it
    (an outsider's, 2026-12-07): SIGTERM now raises inside the fetch, as Ctrl-C does, and a fetch removes what a
    killed one left."""
    dest = tmp_path / "dest"
    stale = dest / ".fetch-abc123"
    stale.mkdir(parents=True)
    (stale / "big.bin").write_bytes(b"half")
    lines = []
    fetch_pinned(url_pins, dest, log=lines.append)
    assert not stale.exists() and f"removed {stale}, a killed fetch's partial download" in lines


def test_the_receipt_names_where_a_redirect_ended_never_a_url_with_credentials(tmp_path, server):
    """A redirect to another host was followed and the receipt named only the URL asked for (an outsider's)."""
    data = b"redirected bytes"
    elsewhere = server.url.replace("127.0.0.1", "localhost")
    server.routes["/data/a.txt"] = f"{elsewhere}/real/a.txt"
    server.routes["/real/a.txt"] = data
    pins = write_pins(tmp_path / "pins.json", {"type": "url", "url": f"{server.url}/data"}, {"a.txt": sha(data)})
    lines = []
    receipt = fetch_pinned(pins, tmp_path / "dest", log=lines.append)
    assert read_manifest(receipt)["resolved_urls"] == {"a.txt": f"{elsewhere}/real/a.txt"}
    assert f"a.txt: redirected to {elsewhere}/real/a.txt" in lines
