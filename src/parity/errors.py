"""The one exception type the CLI turns into a one-line error instead of a traceback."""


class ParityError(Exception):
    """Bad input or a failed check that the user can act on; the message says what and where."""


def first_problem(problems: list[str]) -> str:
    """The first of several problems, and how many more there are: an error stays one line."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"
