"""The fetch layer's one error type, so the CLI prints a single line instead of a traceback."""

from parity.errors import ParityError


class FetchError(ParityError):
    """A download, pin or verification failure; the message names the file (and both hashes on a mismatch)."""
