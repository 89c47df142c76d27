"""Hugging Face Hub sources (the model, the CNN/DailyMail parquet), fetched at a pinned commit.

The access token comes from huggingface_hub's own lookup (`HF_TOKEN`, then the stored login) and is
handed straight to the hub client: it is never logged, never put in a receipt, and scrubbed from any
error message before that message is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import HfApi, get_token, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from parity.fetch.errors import FetchError
from parity.fetch.pins import Pins
from parity.fetch.transfer import fetch_files, require_pins, write_receipt

LOGIN_HINT = "set HF_TOKEN (or run `hf auth login`) for an account that has accepted the model's licence"


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
        with _hub_errors(repo, revision, name, token):
            return Path(hf_hub_download(repo, name, repo_type=repo_type, revision=revision, token=token,
                                        local_dir=staging))

    results = fetch_files(pins, dest, download, record_pins=record_pins, log=log)
    return write_receipt(receipt, {"type": "huggingface", "repo": repo, "revision": revision}, results,
                         token_used=token is not None, pins=pins, repo_type=repo_type,
                         revision_pin=pins.revision_status())


def _resolve_commit(repo: str, repo_type: str, token: str | None) -> str:
    """The commit the default branch points at now, to be pinned from then on."""
    with _hub_errors(repo, "main", None, token):
        return HfApi().repo_info(repo, repo_type=repo_type, token=token).sha


@contextmanager
def _hub_errors(repo: str, revision: str, name: str | None, token: str | None):
    """Turn the hub's exceptions into one-line FetchErrors that never contain the token.

    Local write failures (a full disk) pass through: the transfer layer reports them, naming the folder.
    """
    where = f"{repo}@{revision}"
    try:
        yield
        return
    except FetchError:
        raise
    except GatedRepoError:
        message = f"{repo} is gated and this token has no access to it: {LOGIN_HINT}"
    except RevisionNotFoundError:
        message = f"{repo} has no revision {revision} (check the pins file)"
    except RepositoryNotFoundError:
        message = f"{repo} not found, or private and the token cannot see it"
    except LocalEntryNotFoundError:
        message = f"{name or where}: cannot reach the Hugging Face Hub to download {where} (offline?)"
    except EntryNotFoundError:
        message = f"{where} has no file {name} (check the pins file)"
    except OSError as exc:
        if not isinstance(exc, HfHubHTTPError) and exc.errno is not None:
            raise
        message = f"{name or where}: download from {where} failed: {exc}"
    except Exception as exc:  # the hub's HTTP client errors: connection reset, timeout, ...
        message = f"{name or where}: download from {where} failed: {type(exc).__name__}: {exc}"
    if token:
        message = message.replace(token, "<token>")
    raise FetchError(" ".join(message.split())) from None
