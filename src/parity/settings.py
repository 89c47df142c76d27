"""Settings objects: frozen dataclasses built from a mapping with every key and type checked, and
recorded back as one, so a setting crosses every boundary (config, command line, child process,
manifest) whole and in one unit.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import ClassVar

from parity.errors import ParityError


class Settings:
    """Base of a frozen settings dataclass: `from_dict` (the defaults with the values given over them;
    an unknown key or a mistyped value refused by name) and `to_dict` (what `from_dict` takes back)."""

    what: ClassVar[str] = "setting"  # how an error names one of its keys: "Flame setting batch_limt"
    typed_fields: ClassVar[bool] = True  # False where fields are nested settings or tuples (experiments' sections)
    # fields `to_dict` records only when set (not falsy): a setting added later leaves every record made before it
    # as it was, so a trial that ran without it is not stale for it
    recorded_when_set: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, values: dict | None):
        """The defaults with `values` over them; each value's type is checked once, by `__post_init__` where the
        class types its fields, else here."""
        if cls.typed_fields:
            return cls(**known_keys(cls, values, cls.what))
        return cls(**checked_fields(cls, values, cls.what))

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        for name in self.recorded_when_set:
            if not values[name]:
                del values[name]
        return values

    def __post_init__(self):
        """Built directly (a test, an adapter) as `from_dict` builds it: each field's type checked in one line
        (an int taken where a number is meant), then the class's own checks across fields (`check`)."""
        if self.typed_fields:
            given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            for key, value in checked_fields(type(self), given, self.what).items():
                object.__setattr__(self, key, value)  # frozen: a float for an int given where a number is meant
        self.check()

    def check(self) -> None:
        """A subclass's checks across its fields, after their types."""


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


def yaml_text_number(text: str) -> bool:
    """Whether `text` is a number Python reads that YAML 1.1 keeps as text (an exponent without a dot: 2e-2)."""
    try:
        float(text)
    except ValueError:
        return False
    return "e" in text.lower() and not any(word in text.lower() for word in ("inf", "nan"))


def yaml_number(text: str) -> str:
    """`text` (2e-2) as YAML reads a number (2.0e-2)."""
    mantissa, _, exponent = text.lower().partition("e")
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    return f"{mantissa}e{exponent if exponent[:1] in '+-' else '+' + exponent}"


def checked_fields(cls, values, what: str) -> dict:
    """`values` for the dataclass `cls`, checked key by key against its field types.

    Refuses (ParityError, one line) anything but a mapping, an unknown key, and a value of the wrong
    type, naming the key, the expected type and the value. An integer is taken where a number is
    meant (YAML and KEY=VALUE write 1 for 1.0); true/false never count as numbers.
    """
    values = known_keys(cls, values, what)
    hints = typing.get_type_hints(cls)
    checked = {}
    for key, value in values.items():
        allowed = typing.get_args(hints[key]) or (hints[key],)
        fits = _fits(value, allowed)
        if not fits and isinstance(value, int) and not isinstance(value, bool) and int in allowed:
            raise ParityError(f"{what} {key} must be an integer within 64 bits, got {value!r}")
        if not fits:
            expected = " or ".join(_TYPE_NAMES[t] for t in allowed)
            hint = ""
            if isinstance(value, str) and float in allowed and yaml_text_number(value):  # YAML 1.1 reads 2e-2 as text
                hint = f" (YAML reads {value} as text: write {yaml_number(value)})"
            raise ParityError(f"{what} {key} must be {expected}, got {value!r}{hint}")
        checked[key] = float(value) if float in allowed and isinstance(value, int) else value
    return checked


def known_keys(cls, values, what: str) -> dict:
    """`values` as a mapping of the dataclass `cls`'s field names (None: none); anything else refused in one line."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ParityError(f"{what}s: expected a mapping of KEY: VALUE, got {type(values).__name__} {values!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(map(str, set(values) - set(known)))
    if unknown:
        raise ParityError(f"unknown {what}(s) {', '.join(unknown)}: known are {', '.join(known)}")
    return values


def within_64_bits(value: int) -> bool:
    """An integer an engine, numpy or a C index takes: a larger count fails late, inside a worker."""
    return -2**63 < value < 2**63


def _fits(value, allowed: tuple) -> bool:
    if isinstance(value, bool):  # an int to Python, never a number here
        return bool in allowed
    if isinstance(value, (int, float)) and float in allowed:
        return finite(value)
    if isinstance(value, int) and int in allowed:
        return within_64_bits(value)
    return isinstance(value, allowed)


def finite(value: int | float) -> bool:
    """A number a float can hold: not NaN or infinite, and not an integer past every float (401 digits)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def key_values(items, what: str) -> dict:
    """KEY=VALUE strings (a command line's overrides) as a mapping, each value read as YAML (so 4096 is an
    int, true a bool) and each key's dashes as underscores; `what` names an item in the one-line error."""
    import yaml

    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ParityError(f"{what} {item!r} is not KEY=VALUE")
        try:
            values[key.replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ParityError(f"{what} {item!r}: the value is not YAML "
                              f"({getattr(exc, 'problem', None) or exc})") from None
    return values
