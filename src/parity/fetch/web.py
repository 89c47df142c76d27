"""Plain HTTP(S) sources, including MLCommons' R2 buckets (the MLPerf `cnn_eval.json`).

A `url` pins source names a base URL; each file is fetched from `base/name` unless its pin gives its
own `url`. With `"resolver": "mlcommons-r2"` the source URL is an MLCommons `.uri` metadata file: it
holds the dataset's base URL, and the `.md5` list next to it holds each file's path and MD5 (what the
official `mlc-r2-downloader.sh` reads). The MD5 is checked as well, but the SHA-256 pin decides.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from parity.fetch.errors import FetchError
from parity.fetch.pins import Pins, plain_url
from parity.fetch.transfer import fetch_files, write_receipt

CHUNK = 1 << 20
TIMEOUT = httpx.Timeout(30.0, read=300.0)
R2_RESOLVER = "mlcommons-r2"


def fetch(pins: Pins, dest: Path, *, receipt: Path, record_pins: bool, log: Callable[[str], None]) -> Path:
    """Download every pinned file of a URL source into `dest`; returns the receipt."""
    source = pins.source
    resolver = source.get("resolver")
    if resolver not in (None, R2_RESOLVER):
        raise FetchError(f"{pins.path}: unknown resolver {resolver!r} (known: {R2_RESOLVER})")
    base = source["url"].rstrip("/") + "/"
    # resolved on the first download, so a re-run whose files are all verified needs no network
    locations: dict[str, tuple[str, str | None]] = {}

    def locate(name: str) -> tuple[str, str | None]:
        if not locations:
            locations.update(resolve_r2(source["url"], pins.names()) if resolver == R2_RESOLVER else
                             {n: (pins.entry(n).get("url") or base + n, None) for n in pins.names()})
        return locations[name]

    def download(name: str, staging: Path) -> Path:
        url, md5 = locate(name)
        log(f"{name}: downloading {url}")
        target = staging / posixpath.basename(name)
        final = download_url(url, target, label=name)
        if final != url and plain_url(final):  # the receipt says where the bytes came from: a redirect's end (its
            # start alone was recorded, an outsider's, 2026-12-07); a URL with credentials in it is never recorded
            log(f"{name}: redirected to {final}")
            locations[name] = (final, md5)
        if md5 is not None:
            got = _md5(target)
            if got != md5:
                raise FetchError(f"{name}: MD5 mismatch against the bucket's list: expected {md5}, downloaded {got}")
        return target

    results = fetch_files(pins, dest, download, record_pins=record_pins, log=log)
    return write_receipt(receipt, {"type": "url", "url": source["url"]}, results, token_used=False, pins=pins, dest=dest,
                         resolved_urls={name: url for name, (url, _) in locations.items()})


def download_url(url: str, target: Path, *, label: str) -> str:
    """Stream `url` into `target` with a progress bar on stderr; HTTP and transfer errors become FetchErrors.
    Returns the URL the bytes came from, after any redirects."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    if not plain_url(url):
        raise FetchError(f"{label}: refusing {url!r}: only http(s) URLs without credentials are fetched")
    columns = ("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=TIMEOUT) as response:
            response.raise_for_status()
            total = int(response.headers.get("content-length") or 0) or None
            with open(target, "wb") as out, Progress(*columns, console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task(label, total=total)
                for chunk in response.iter_bytes(CHUNK):
                    out.write(chunk)
                    bar.advance(task, len(chunk))
            return str(response.url)
    except httpx.HTTPStatusError as exc:
        raise FetchError(f"{label}: HTTP {exc.response.status_code} from {url}") from None
    except httpx.HTTPError as exc:  # connection refused, timeout, body shorter than Content-Length, ...
        raise FetchError(f"{label}: download from {url} failed: {type(exc).__name__}: {exc}") from None


def resolve_r2(uri_url: str, names: list[str]) -> dict[str, tuple[str, str]]:
    """{name: (url, md5)} from an MLCommons `.uri` file and the `.md5` list beside it."""
    parts = urlsplit(uri_url)
    if not parts.path.endswith(".uri"):
        raise FetchError(f"{uri_url}: an MLCommons R2 source must point at a .uri metadata file")
    base = _get_text(uri_url).strip().rstrip("/")
    if not plain_url(base):
        raise FetchError(f"{uri_url}: does not hold a plain http(s) base URL (got {base[:80]!r})")
    md5_url = urlunsplit(parts._replace(path=parts.path[: -len(".uri")] + ".md5", query="", fragment=""))
    listed = {}
    for line in _get_text(md5_url).splitlines():
        fields = line.split(maxsplit=1)
        if len(fields) == 2 and len(fields[0]) == 32:
            listed[fields[1].strip().removeprefix("./")] = fields[0].lower()
    found = {}
    for name in names:
        matches = [path for path in listed if path == name or path.endswith("/" + name)]
        if len(matches) != 1:
            what = "no entry" if not matches else f"{len(matches)} entries"
            raise FetchError(f"{md5_url}: {what} for {name} (listed: {', '.join(sorted(listed)) or 'nothing'})")
        found[name] = (f"{base}/{matches[0]}", listed[matches[0]])
    return found


def _get_text(url: str) -> str:
    try:
        response = httpx.get(url, follow_redirects=True, timeout=TIMEOUT)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise FetchError(f"HTTP {exc.response.status_code} from {url}") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"cannot read {url}: {type(exc).__name__}: {exc}") from None
    return response.text


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
