"""Pinned downloads: every input file is checked against a committed SHA-256 before it is kept.

The pins live in `manifests/pins/*.json`; a download goes to a staging folder inside the destination,
is hashed, and is renamed into place only if it matches, so a mismatch, an interruption or a full
disk leaves nothing behind. Each fetch writes a `fetch-receipt` manifest. This package never
generates data: traces are `parity.trace`'s job.
"""

from __future__ import annotations

from pathlib import Path

from parity.fetch.errors import FetchError
from parity.fetch.pins import Pins

__all__ = ["FetchError", "Pins", "fetch_pinned"]


def fetch_pinned(pins_path: Path | str, dest: Path | str, *, record_pins: bool = False,
                 receipt: Path | str | None = None, log=print) -> Path:
    """Fetch every file a pins file lists into `dest`, from wherever its source says; returns the receipt."""
    pins = Pins.load(pins_path)
    receipt = Path(receipt) if receipt is not None else Path(dest) / "fetch-receipt.json"
    for section in ("files", "derived"):  # the receipt written over a verified download, exit 0 (an outsider's)
        if clash := next((n for n in pins.names(section) if (Path(dest) / n).resolve() == receipt.resolve()), None):
            raise FetchError(f"{pins.path}: {section} {clash!r} would be written where the receipt goes ({receipt}): "
                             "give another --receipt")
    if pins.source["type"] == "huggingface":
        from parity.fetch import hub

        return hub.fetch(pins, Path(dest), receipt=receipt, record_pins=record_pins, log=log)
    from parity.fetch import web

    return web.fetch(pins, Path(dest), receipt=receipt, record_pins=record_pins, log=log)
