"""Hugging Face Hub sources (the model, the CNN/DailyMail parquet), fetched at a pinned commit.

The access token comes from huggingface_hub's own lookup (`HF_TOKEN`, then the stored login) and is
handed straight to the hub client: it is never logged, never put in a receipt, and scrubbed from any
error message before that message is shown. A failure says what the Hub said (no access, no such
file, the Hub's own fault) and only a request that got no answer at all is "cannot reach the Hub".
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import HfApi, get_token, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from parity.fetch.errors import FetchError
from parity.fetch.pins import Pins
from parity.fetch.transfer import fetch_files, require_pins, write_receipt

TOKEN_HINT = "set HF_TOKEN (or run `hf auth login`)"
LOGIN_HINT = f"{TOKEN_HINT} for an account that has accepted the model's licence"


def fetch(pins: Pins, dest: Path, *, receipt: Path, record_pins: bool, log: Callable[[str], None]) -> Path:
    """Download every pinned file of a Hub repo at its pinned commit into `dest`; returns the receipt."""
    source = pins.source
    repo, repo_type = source["repo"], source.get("repo_type", "model")
    token = get_token()
    require_pins(pins, pins.names(), record_pins=record_pins)
    revision = source.get("revision")
    if revision is None:
        if not record_pins:
            raise FetchError(f"{pins.path}: no revision pinned for {repo}; run once with --record-pins "
                             "on a trusted network to pin the current commit")
        revision = _resolve_commit(repo, repo_type, token)
        pins.record_revision(revision)
        log(f"{repo}: revision pinned to {revision} in {pins.path}")

    def download(name: str, staging: Path) -> Path:
        if source.get("gated") and token is None:  # checked here, so a verified re-run needs no token
            raise FetchError(f"{repo} is gated and no Hugging Face token was found: {LOGIN_HINT}; "
                             "nothing was downloaded")
        log(f"{name}: downloading from {repo_type} {repo}@{revision}")
        with _hub_errors(repo, repo_type, revision, name, token):
            return Path(hf_hub_download(repo, name, repo_type=repo_type, revision=revision, token=token,
                                        local_dir=staging))

    results = fetch_files(pins, dest, download, record_pins=record_pins, log=log)
    return write_receipt(receipt, {"type": "huggingface", "repo": repo, "revision": revision}, results,
                         token_used=token is not None, pins=pins, dest=dest, repo_type=repo_type,
                         revision_pin=pins.revision_status())


def _resolve_commit(repo: str, repo_type: str, token: str | None) -> str:
    """The commit the default branch points at now, to be pinned from then on."""
    with _hub_errors(repo, repo_type, "main", None, token):
        return HfApi().repo_info(repo, repo_type=repo_type, token=token).sha


@contextmanager
def _hub_errors(repo: str, repo_type: str, revision: str, name: str | None, token: str | None):
    """Turn the hub's exceptions into one-line FetchErrors that say what the Hub said, never the token.

    Local write failures (a full disk) pass through: the transfer layer reports them, naming the folder.
    """
    try:
        yield
        return
    except FetchError:
        raise
    except OSError as exc:
        if not isinstance(exc, HfHubHTTPError) and exc.errno is not None:
            raise
        message = _what_the_hub_said(exc, repo, repo_type, revision, name)
    except Exception as exc:  # the HTTP client's own errors: connection refused, timeout, ...
        message = _what_the_hub_said(exc, repo, repo_type, revision, name)
    if token:
        message = message.replace(token, "<token>")
    raise FetchError(" ".join(message.split())) from None


def _what_the_hub_said(exc: Exception, repo: str, repo_type: str, revision: str, name: str | None) -> str:
    """Why a hub call failed: refused (401/403), not there (404), the Hub's own fault (5xx), or no answer at all.

    hf_hub_download reports any failure of its first request that it cannot tell apart (a 403 without the
    gated code, a 500, a connection error) as "not in the local cache", with the real error as the cause:
    that cause is what is read here."""
    where = f"{repo}@{revision}"
    what = name or where
    if isinstance(exc, LocalEntryNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    page = f"https://huggingface.co/{'' if repo_type == 'model' else repo_type + 's/'}{repo}"
    access = f"accept its licence on {page} with your account, then {TOKEN_HINT} for that account"
    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated and this token has no access to it: {access}"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {revision} (check the pins file)"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo} not found, or private or gated and this token cannot see it: check the repo's name; {access}"
    if isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError):
        return f"{where} has no file {name} (check the pins file)"
    if status in (401, 403):
        return f"{what}: the Hugging Face Hub refused access to {where} (HTTP {status}): no access to the (gated?) " \
               f"model with this token; {access}"
    if status == 404:
        return f"{what}: the Hugging Face Hub has no such repo, revision or file: {where} (HTTP 404; check the pins file)"
    if status is not None and status >= 500:
        return f"{what}: the Hugging Face Hub failed (HTTP {status}) on {where}, a fault on its side: retry later"
    if status is not None:
        return f"{what}: the Hugging Face Hub answered HTTP {status} on {where}: {exc}"
    if isinstance(exc, OfflineModeIsEnabled):
        return f"{what}: huggingface_hub is in offline mode (HF_HUB_OFFLINE is set): nothing can be downloaded"
    if isinstance(exc, FileMetadataError):
        return f"{what}: the Hub's answer on {where} lacked the file's metadata (a proxy in between?): {exc}"
    if _unreachable(exc):
        return f"{what}: cannot reach the Hugging Face Hub to download {where} (offline?): {type(exc).__name__}: {exc}"
    return f"{what}: download from {where} failed: {type(exc).__name__}: {exc}"


def _unreachable(exc: Exception) -> bool:
    """No answer from the Hub at all, whichever HTTP client this huggingface_hub uses (httpx2, httpx: a
    TransportError; requests: ConnectionError, Timeout)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return bool({c.__name__ for c in type(exc).__mro__} & {"TransportError", "ConnectionError", "Timeout"})
