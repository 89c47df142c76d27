"""How a command fails: a ParityError, or an OSError of the user's environment, as one `Error: ...` line
and exit 1; a bug keeps its traceback."""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import click

from parity.errors import ParityError

# OSErrors that are about the user's machine, not a bug in parity: a full disk, a read-only folder, a
# file where a folder belongs. Any other OSError still shows its traceback.
ENVIRONMENT_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (an immutable file, or another user's)",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.EEXIST: "exists and is not a folder",  # parity's mkdirs all pass exist_ok: a file is in the way
    errno.EISDIR: "is a folder, not a file",
    errno.ENAMETOOLONG: "file name too long",
    errno.ELOOP: "too many levels of symbolic links (a loop of links)",
    errno.EIO: "input/output error (a failing disk or network file system)",
    errno.EFBIG: "file too large (a file-size limit: ulimit -f, or the file system's largest file)",
}


def environment_error(exc: OSError) -> str | None:
    """The one-line message for an OSError of the user's environment, naming the path; else None."""
    reason = ENVIRONMENT_ERRORS.get(exc.errno)
    if reason is None:
        return None
    where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    return reason if where is None else f"{os.fsdecode(where)}: {reason}"


def writable_file(path: Path) -> None:
    """A file a command writes only at its end, checked at its start, so a long run is not refused after it
    ran: not a folder, and no file where a folder of its path belongs (missing folders are made later)."""
    if path.is_dir():
        raise ParityError(f"{path}: {ENVIRONMENT_ERRORS[errno.EISDIR]}")
    if path.is_symlink() or (path.exists() and not path.is_file()):  # the file is written beside it and renamed
        # over it: a link (to /dev/stdout, say) or a device would be replaced by a plain file (an outsider's)
        raise ParityError(f"{path}: {'a link' if path.is_symlink() else 'not a regular file'}, which the command "
                          "would replace by a file: give the path of a file, or of none yet")
    _takes_files(path.parent)


def not_an_input(out: Path, inputs: dict[str, Path | None], folder: bool = False, *, option: str = "--out",
                 writes: Iterable[Path] = ()) -> None:
    """An --out that is one of the command's inputs (by any name: a link, `..`, a hard link), or lies in an
    input folder (or in one the command is yet to make, as a fetch's --dest), is refused: the command would
    overwrite what it reads, silently. With `folder` (an --out the command writes its files into), one that holds
    an input is refused too. `writes`: the files a command writes into the folder `out` under names it derives (a
    --name, an input's stem), checked in place of `folder`: none may be an input. `inputs`: option -> path;
    `option`: the out's own option, as the message names it."""
    article = "an" if option.lstrip("-")[:1] in "aeiou" else "a"
    clash = _input_at(out, inputs, folder)
    if clash is not None:
        where, name, given = clash
        raise ParityError(f"{option} {out} {where} the command's input {name} {given}: give {article} {option} "
                          f"apart from the inputs")
    for path in writes:
        clash = _input_at(path, inputs, False)
        if clash is not None:
            where, name, given = clash
            raise ParityError(f"{option} {out} would write {path}, which {where} the command's input {name} {given}: "
                              f"give another {option} or --name")


def _input_at(out: Path, inputs: dict[str, Path | None], folder: bool) -> tuple[str, str, Path] | None:
    """How `out` meets an input (is it, holds it, lies in it) and which: (how, option, path); None if apart."""
    target = _resolved(out)
    for option, given in inputs.items():
        if given is None:
            continue
        source = _resolved(given)
        same = target == source or (out.exists() and given.exists() and os.path.samefile(out, given))
        inside = folder and target in source.parents
        if same or inside or (not source.is_file() and source in target.parents):
            return "is" if same else "holds" if inside else "lies in", option, given
    return None


def _resolved(path: Path) -> Path:
    """`path` with its links followed; a loop of links refused in one line (Python 3.11 raises RuntimeError)."""
    try:
        return path.resolve()
    except RuntimeError:
        raise ParityError(f"{path}: {ENVIRONMENT_ERRORS[errno.ELOOP]}") from None


def writable_folder(path: Path) -> None:
    """A folder a command writes into (made if missing), checked at its start, as `writable_file` checks a file."""
    if path.exists() and not path.is_dir():
        raise ParityError(f"{path}: {ENVIRONMENT_ERRORS[errno.EEXIST]}")
    _takes_files(path)


def _takes_files(path: Path) -> None:
    """The nearest existing folder of `path` is a folder and takes a new file (one is made there and removed at
    once: a read-only mount, or one like /proc that refuses new files whatever its permissions say, is refused
    here in one line, not by a traceback at the end)."""
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ParityError(f"{folder}: {ENVIRONMENT_ERRORS[errno.ENOTDIR]}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ParityError(f"{folder}: cannot make a file there ({exc.strerror or exc})") from None


def friendly_errors(command):
    """Turn a ParityError, or an OSError of the environment, into a one-line `Error: ...`, exit 1.

    Everything else (a bug) keeps its traceback.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ParityError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            message = environment_error(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None

    return wrapper
