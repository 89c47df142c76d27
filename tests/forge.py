"""A forger's tool for the tests: after editing evidence, re-write every hash link up the chain, so each
manifest's SHA-256 and sizes match again (what `parity validate` must still catch by deriving content)."""

from __future__ import annotations

import json
from pathlib import Path

from parity.manifest import dumps, file_ref, is_file_reference, sha256_file


def _relink(node, folder: Path) -> bool:
    changed = False
    if is_file_reference(node):
        target = folder / node["path"]
        if target.is_file() and node["sha256"] != sha256_file(target):
            fresh = file_ref(target, folder)
            node.update({k: fresh[k] for k in node})
            changed = True
    elif isinstance(node, dict):
        for value in node.values():
            changed |= _relink(value, folder)
    elif isinstance(node, list):
        for value in node:
            changed |= _relink(value, folder)
    return changed


def rehash(tree: Path) -> int:
    """Re-write the links of every manifest under `tree` until none is stale; returns manifests re-written."""
    count, again = 0, True
    while again:
        again = False
        for path in sorted(Path(tree).rglob("*.json")):
            try:
                doc = json.loads(path.read_text())
            except ValueError:
                continue
            if isinstance(doc, dict) and "kind" in doc and _relink(doc, path.parent):
                path.write_text(dumps(doc))
                count, again = count + 1, True
    return count


def edit(path: Path, change) -> None:
    """Apply `change(doc)` to a JSON manifest in place, written as parity writes manifests."""
    doc = json.loads(Path(path).read_text())
    change(doc)
    Path(path).write_text(dumps(doc))
