"""CNN/DailyMail parquet → `articles.jsonl`, the corpus `parity trace` reads, as a pinned derivation.

The conversion is a separate step from the download so that both hashes are on record: the parquet
is checked against its pin first, and the JSONL it gives (one `{"article", "id"}` object per row, in
file order, with sorted keys) is deterministic, so its SHA-256 is pinned too (`derived` in the pins
file) and checked on every later run.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from parity.fetch.errors import FetchError
from parity.fetch.pins import Pins
from parity.fetch.transfer import FileResult, file_result, require_pins, write_receipt
from parity.manifest import file_ref, sha256_file

FIELDS = ("id", "article")
BATCH_ROWS = 1024


def convert(parquet: Path, out) -> int:
    """Write one JSON line per parquet row to the open binary file `out`; returns the row count."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(parquet)
        rows = 0
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=list(FIELDS)):
            for row in batch.to_pylist():
                if not isinstance(row["article"], str) or not row["article"].strip():
                    raise FetchError(f"{parquet}: row {rows} has no article text")
                out.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
                rows += 1
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise FetchError(f"{parquet}: not a CNN/DailyMail parquet with columns {', '.join(FIELDS)}: {exc}") from None
    return rows


def derive(pins: Pins, dest: Path, *, receipt: Path | None = None, record_pins: bool = False,
           log: Callable[[str], None] = print) -> Path:
    """Convert the fetched parquet in `dest` to each `derived` file of the pins; returns the receipt."""
    names = pins.names("derived")
    if not names:
        raise FetchError(f"{pins.path}: no derived files to make")
    require_pins(pins, names, record_pins=record_pins, section="derived")
    receipt = receipt if receipt is not None else dest / "articles.receipt.json"
    results, inputs, rows = [], {}, {}
    for name in names:
        source_name = pins.entry(name, "derived").get("from")
        source = dest / str(source_name)
        _check_input(pins, source_name, source)
        inputs[name] = file_ref(source, receipt.parent)
        result, rows[name] = _derive_one(pins, name, source, dest / name, log=log)
        results.append(result)
    return write_receipt(receipt, {"type": "local"}, results, token_used=False, pins=pins, dest=dest,
                         derived_from=inputs, conversion={"function": f"{__name__}.convert",
                                                          "fields": list(FIELDS), "rows": rows})


def _check_input(pins: Pins, name, path: Path) -> None:
    if name not in pins.names():
        raise FetchError(f"{pins.path}: derived file needs `from`, one of the pinned files")
    pinned = pins.sha256(name)
    if pinned is None:
        raise FetchError(f"{name}: has no pin yet; fetch it first (parity fetch dataset --record-pins)")
    if not path.is_file():
        raise FetchError(f"{path}: missing; fetch it first (parity fetch dataset)")
    got = sha256_file(path)
    if got != pinned:
        raise FetchError(f"{path}: SHA-256 mismatch: pinned {pinned}, on disk {got}; fetch it again")


def _derive_one(pins: Pins, name: str, source: Path, target: Path, *, log) -> tuple[FileResult, int]:
    """Skip if the output already matches its pin; else convert to a temporary file, verify, rename."""
    pinned = pins.sha256(name, "derived")
    if pinned is not None and target.is_file() and sha256_file(target) == pinned:
        log(f"{name}: already present and verified (sha256 {pinned}); not converted again")
        with open(target, "rb") as handle:
            rows = sum(1 for _ in handle)
        return file_result(pins, name, pinned, target.stat().st_size, pinned=pinned, downloaded=False,
                           section="derived"), rows
    tmp = tempfile.NamedTemporaryFile(delete=False, dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with tmp:
            rows = convert(source, tmp)
        digest = sha256_file(tmp.name)
        if pinned is not None and digest != pinned:
            raise FetchError(f"{name}: SHA-256 mismatch: pinned {pinned}, converted {digest}; the output was discarded")
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, target)
    except OSError as exc:
        raise FetchError(f"{name}: {exc.strerror or exc} writing under {target.parent}; nothing was kept") from None
    finally:
        Path(tmp.name).unlink(missing_ok=True)
    if pinned is None:
        pins.record(name, digest, "derived")
        log(f"{name}: {rows} articles; pin recorded in {pins.path} (sha256 {digest})")
    else:
        log(f"{name}: {rows} articles, verified (sha256 {digest})")
    return file_result(pins, name, digest, target.stat().st_size, pinned=pinned, downloaded=False,
                       section="derived"), rows
