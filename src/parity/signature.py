"""A detached signature over a sealed tree's run manifest, by a key the reviewer trusts: what a hash chain
cannot give.

`parity.rederive` makes a forgery agree with the trace and with itself on every line, but someone who
invents records and runs parity's own code over them makes a consistent tree. Only a signature by a key
whose public half the reviewer got from the authors out of band (the paper, the artifact page) says who
vouched for `run.json`, and so, through its hash links, for every kept file.

The format is minisign's (Ed25519 over the file's BLAKE2b-512, a trusted comment signed too), through
the `py-minisign` library: it works offline (GPU hosts and reviewers' clusters often are: Sigstore's
keyless signing needs its certificate authority and transparency log online), and a reviewer can check
it with a tool nobody here wrote: `minisign -V -p KEY.pub -m RESULTS/run.json`. Keys are made with
`minisign -G`. A secret key and its password are never recorded anywhere.
"""

from __future__ import annotations

from pathlib import Path

from parity.errors import ParityError
from parity.manifest import RUN_MANIFEST, sha256_file
SIGNATURE = "run.json.minisig"  # beside run.json (minisign's own default name for it)


class SignatureError(ParityError):
    """A key or signature that cannot be read or used; the message is one line."""


def _minisign():
    try:
        import minisign
    except ImportError:
        raise SignatureError("signatures need py-minisign: pip install 'parity[sign]' (or check with the minisign "
                             "tool: minisign -V -p KEY.pub -m RESULTS/run.json)") from None
    return minisign


def public_key(text_or_path: str):
    """A minisign public key: a .pub file, or its base64 line (as published beside the artifact)."""
    minisign = _minisign()
    if not text_or_path.strip():  # an unset shell variable: never "no key given", which would skip the check
        raise SignatureError("an empty public key: give a minisign .pub file or its base64 line")
    if not Path(text_or_path).is_file() and "." in text_or_path:  # a file's name (a base64 line has no dot)
        raise SignatureError(f"no public key file at {text_or_path} (give a minisign .pub file or its base64 line)")
    try:
        if Path(text_or_path).is_file():
            return minisign.PublicKey.from_file(text_or_path)
        return minisign.PublicKey.from_base64(text_or_path)
    except (minisign.Error, OSError, ValueError) as exc:
        raise SignatureError(f"not a minisign public key: {text_or_path} ({exc})") from None


def sign(results: Path, secret_key: Path, password: str | None = None) -> Path:
    """Sign RESULTS/run.json with a minisign secret key; returns the signature's path."""
    minisign = _minisign()
    run = Path(results) / RUN_MANIFEST
    if not run.is_file():
        raise SignatureError(f"{results} is not sealed (no {RUN_MANIFEST}): run `parity seal {results}` first")
    if not Path(secret_key).is_file():  # a named pipe was read for ever (an outsider's, 2026-12-07)
        raise SignatureError(f"cannot use the secret key {secret_key}: not a regular file")
    try:
        key = minisign.SecretKey.from_file(secret_key)
        if key.is_encrypted():
            if password is None:
                raise SignatureError(f"{secret_key} is encrypted: give its password (PARITY_SIGNING_PASSWORD)")
            key.decrypt(password)
    except (minisign.Error, OSError, ValueError) as exc:
        raise SignatureError(f"cannot use the secret key {secret_key}: {exc}") from None
    comment = f"parity run manifest of {Path(results).resolve().name}, sha256 {sha256_file(run)}"
    signature = key.sign(run.read_bytes(), trusted_comment=comment)
    key.wipe()
    out = Path(results) / SIGNATURE
    from parity.manifest import atomic_write_bytes

    atomic_write_bytes(out, bytes(signature))
    return out


def problems(results: Path, key) -> list[str]:
    """Why RESULTS/run.json is not signed by `key` (a `public_key`); [] when it is."""
    minisign = _minisign()
    run, sig = Path(results) / RUN_MANIFEST, Path(results) / SIGNATURE
    if not sig.is_file():
        return [f"{run}: not signed (no {SIGNATURE} beside it), though a public key was given to check it with"]
    try:
        key.verify(run.read_bytes(), minisign.Signature.from_file(sig))
    except (minisign.Error, OSError, ValueError) as exc:
        return [f"{sig}: does not verify {run} with the key given ({exc})"]
    return []


def signed_by(results: Path) -> str | None:
    """The key ID a tree's signature names (unverified), for saying that one is there; None if unsigned."""
    sig = Path(results) / SIGNATURE
    if not sig.is_file():
        return None
    lines = sig.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        import base64

        return base64.b64decode(lines[1])[2:10][::-1].hex().upper()
    except (IndexError, ValueError):
        return "?"
