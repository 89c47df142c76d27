"""Pins files: which files to fetch from where, and the SHA-256 each must have.

A pin is either a hex digest or `null`. A null pin is filled in once, by a fetch run with
`--record-pins` on a trusted network, and from then on only verified: a recorded pin is never
overwritten. A pin taken from a public source carries `evidence` (where that hash was published),
and a pinned revision may carry `revision_evidence`; `status` tells the three kinds apart, so a
receipt never passes off a hash we recorded ourselves as one someone else published.
Pins files are plain JSON (no `kind`), so `parity validate` leaves them alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from parity.fetch.errors import FetchError
from parity.manifest import ManifestError, atomic_write_text, read_regular, strict_loads

SHA256 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")
SOURCE_TYPES = ("huggingface", "url")
SECTIONS = ("files", "derived")
PUBLISHED = "published"  # the hash (or commit) comes from a public source, named in its evidence
RECORDED = "recorded on first download"  # trust on first use: filled in by a --record-pins run
MISSING = "missing"  # still null: the next fetch needs --record-pins


def plain_url(url) -> bool:
    """An http(s) URL with no credentials in it: receipts and logs may show it."""
    if not isinstance(url, str):
        return False
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc


@dataclass
class Pins:
    path: Path
    doc: dict

    @classmethod
    def load(cls, path: Path | str) -> Pins:
        path = Path(path)
        try:  # strict: a file named twice was verified against its last pin alone (an outsider's, 2026-12-07)
            doc = strict_loads(read_regular(path).decode("utf-8"))
        except FileNotFoundError:
            raise FetchError(f"{path}: no such pins file") from None
        except (OSError, ValueError, ManifestError) as exc:
            raise FetchError(f"{path}: not a readable JSON pins file: {exc}") from None
        pins = cls(path, doc)
        pins._check()
        return pins

    def _check(self) -> None:
        """Refuse a malformed pins file before anything is downloaded."""
        doc, where = self.doc, self.path
        source = doc.get("source") if isinstance(doc, dict) else None
        if not isinstance(source, dict) or source.get("type") not in SOURCE_TYPES:
            raise FetchError(f"{where}: needs a source with type one of {', '.join(SOURCE_TYPES)}")
        if source["type"] == "huggingface":
            if not isinstance(source.get("repo"), str) or source.get("repo_type", "model") not in ("model", "dataset"):
                raise FetchError(f"{where}: a huggingface source needs repo and repo_type model|dataset")
            revision = source.get("revision")
            if revision is not None and not (isinstance(revision, str) and COMMIT.fullmatch(revision)):
                raise FetchError(f"{where}: revision must be a full 40-hex commit (or null until recorded), "
                                 f"not {revision!r}: a branch or tag can move")
            _check_evidence(where, "source.revision_evidence", source.get("revision_evidence"), revision, "revision")
        elif not plain_url(source.get("url")):
            raise FetchError(f"{where}: a url source needs an http(s) url without user:password@")
        if not isinstance(doc.get("files"), dict) or not doc["files"]:
            raise FetchError(f"{where}: files must name at least one file")
        for section in SECTIONS:
            if not isinstance(doc.get(section) or {}, dict):
                raise FetchError(f"{where}: {section} must be an object of file name to pin")
            for name, entry in (doc.get(section) or {}).items():
                path = PurePosixPath(name)
                if path.is_absolute() or ".." in path.parts or not name or "\\" in name:
                    raise FetchError(f"{where}: {section} name {name!r} must be a relative path inside the destination")
                if not isinstance(entry, dict) or "sha256" not in entry:
                    raise FetchError(f"{where}: {section}[{name!r}] must be an object with sha256 (hex or null)")
                if "url" in entry and not plain_url(entry["url"]):
                    raise FetchError(f"{where}: {section}[{name!r}].url must be http(s) without user:password@")
                digest = entry["sha256"]
                if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
                    raise FetchError(f"{where}: {section}[{name!r}].sha256 must be 64 lower-case hex digits or null")
                _check_evidence(where, f"{section}[{name!r}].evidence", entry.get("evidence"), digest, "sha256")

    @property
    def source(self) -> dict:
        return self.doc["source"]

    def names(self, section: str = "files") -> list[str]:
        return list(self.doc.get(section) or {})

    def entry(self, name: str, section: str = "files") -> dict:
        try:
            return self.doc[section][name]
        except KeyError:
            raise FetchError(f"{self.path}: no pin for {name!r} in {section}") from None

    def sha256(self, name: str, section: str = "files") -> str | None:
        return self.entry(name, section)["sha256"]

    def status(self, name: str, section: str = "files") -> str:
        """PUBLISHED, RECORDED or MISSING: where this file's pin came from."""
        return _status(self.sha256(name, section), self.evidence(name, section))

    def evidence(self, name: str, section: str = "files") -> str | None:
        return self.entry(name, section).get("evidence")

    def revision_status(self) -> str | None:
        """Like `status`, for a Hub source's commit; None for a source without one (a URL)."""
        if self.source["type"] != "huggingface":
            return None
        return _status(self.source.get("revision"), self.source.get("revision_evidence"))

    def status_lines(self) -> list[str]:
        """The pins file, its revision and each file, one line each, with the evidence of published pins."""
        lines = [str(self.path)]
        if (revision := self.revision_status()) is not None:
            lines.append(_line(f"revision {self.source.get('revision') or '(none)'}", revision,
                               self.source.get("revision_evidence")))
        for section in SECTIONS:
            suffix = "" if section == "files" else f" ({section})"
            lines += [_line(name + suffix, self.status(name, section), self.evidence(name, section))
                      for name in self.names(section)]
        return lines

    def unpinned(self, section: str = "files") -> list[str]:
        return [name for name in self.names(section) if self.sha256(name, section) is None]

    def record(self, name: str, digest: str, section: str = "files") -> None:
        """Fill in a null pin and save at once, so an interrupted run keeps what it already verified."""
        current = self.sha256(name, section)
        if current is not None and current != digest:
            raise FetchError(f"{self.path}: {name} is pinned to {current}; refusing to re-pin it to {digest}")
        self.doc[section][name]["sha256"] = digest
        self._save()

    def record_revision(self, revision: str) -> None:
        if not COMMIT.fullmatch(revision):
            raise FetchError(f"{self.path}: refusing to record revision {revision!r}: not a full commit hash")
        if self.source.get("revision") not in (None, revision):
            raise FetchError(f"{self.path}: revision is pinned to {self.source['revision']}, not {revision}")
        self.source["revision"] = revision
        self._save()

    def _save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.doc, indent=2, ensure_ascii=False) + "\n")


def _check_evidence(where: Path, key: str, evidence, value, what: str) -> None:
    """Evidence names a public source for a value, so it needs a value and must say something."""
    if evidence is None:
        return
    if not isinstance(evidence, str) or not evidence.strip():
        raise FetchError(f"{where}: {key} must be a non-empty text naming the public source")
    if value is None:
        raise FetchError(f"{where}: {key} is given but {what} is null: evidence is for a published value")


def _status(value, evidence) -> str:
    if value is None:
        return MISSING
    return PUBLISHED if evidence else RECORDED


def _line(label: str, status: str, evidence: str | None) -> str:
    detail = {PUBLISHED: f" ({evidence})", MISSING: f" (no public hash; {RECORDED} with --record-pins)"}
    return f"  {label}: {status}{detail.get(status, '')}"
