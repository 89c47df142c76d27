"""The one exception type the CLI turns into a one-line error instead of a traceback."""


class ParityError(Exception):
    """Bad input or a failed check that the user can act on; the message says what and where."""
