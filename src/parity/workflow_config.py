"""What a workflow setting may be: `schemas/config.schema.yaml`, one schema for every route a setting takes.

Snakemake validates the whole merged config with it before any job starts; the CLI validates the parts
it receives as JSON (`--settings` of an experiment, `--backend`) against the same definitions, so a
misspelt key, a wrong type or an out-of-range value is refused with its name, whichever way it came in.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

from parity.errors import ParityError, first_problem
from parity.settings import yaml_number, yaml_text_number

SCHEMA_FILE = "config.schema.yaml"


@lru_cache(maxsize=1)
def schema() -> dict:
    """The schema, parsed once per process (with libyaml where installed: every `parity` process reads it)."""
    import yaml

    from parity.manifest import schemas_dir

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((schemas_dir() / SCHEMA_FILE).read_text(encoding="utf-8"), Loader=loader)


@lru_cache(maxsize=1)
def _strict():
    """Draft 2020-12, where an integer is an int: JSON Schema counts 2.0 as one, and a `warmup_rounds: 2.0` or a
    `documents: 64.0` passed every check, then failed inside a job (a traceback, after its engines started)."""
    from jsonschema import Draft202012Validator, validators

    integers = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool))
    return validators.extend(Draft202012Validator, type_checker=integers)


def _validator(part: dict):
    return _strict()({**part, "$defs": schema()["$defs"]})


BLANK = "is blank: name it (or null)"  # a text setting of no letter but spaces (the schema's pattern "\\S")
_RAW_BLANK = re.compile(r"^(.*) does not match '\\\\S'$")  # jsonschema's words for it, as Snakemake's validation says them


def reworded(message: str) -> str:
    """jsonschema's message (Snakemake's validation of the config) in the words `check` says it with, where they
    differ: a blank text setting (`' ' does not match '\\\\S'` said nothing of what to write)."""
    blank = _RAW_BLANK.match(message)
    return f"{blank.group(1)} {BLANK}" if blank else message


def _message(error, what: str) -> str:
    """One line: what was checked, the key path, the problem; an unknown key is named as such."""
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in known)
        return (f"unknown {what} setting(s){f' in {where}' if where else ''}: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})")
    message = error.message
    if error.validator in ("oneOf", "anyOf") and (choices := _choices(error.schema[error.validator])):
        message = f"{error.instance!r} is none of: {choices}"  # "not valid under any of the given schemas" said nothing
    elif error.validator == "pattern" and error.validator_value == "\\S":  # a path, say, of no letter but spaces
        message = f"{error.instance!r} {BLANK}"
    elif error.validator == "type" and isinstance(error.instance, str) and yaml_text_number(error.instance):
        message += f" (YAML reads {error.instance} as text: write {yaml_number(error.instance)})"
    return f"{what}{f' {where}' if where else ''}: {message}"


def _choices(alternatives: list[dict]) -> str | None:
    """A setting's alternatives in words (`0, or a number >= 0.5 and < 1`); None where one is not a plain value or a
    bounded number (the validator's own message then)."""
    words = []
    for alternative in alternatives:
        if set(alternative) == {"const"}:
            words.append(repr(alternative["const"]))
        elif set(alternative) <= {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} \
                and isinstance(alternative.get("type"), str):
            bounds = [f"{sign} {alternative[key]:g}" for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                                      ("maximum", "<="), ("exclusiveMaximum", "<"))
                      if key in alternative]
            words.append(f"a{'n' if alternative['type'][0] in 'aeiou' else ''} {alternative['type']}"
                         + (f" {' and '.join(bounds)}" if bounds else ""))
        else:
            return None
    return ", or ".join(words) or None


def check(part: dict, values, what: str) -> None:
    """ParityError naming the first problem (by key path) if `values` does not fit `part` of the schema, or holds
    a number that is not finite (a schema's minimum passes NaN: a NaN startup_timeout_s waited for ever)."""
    where = not_text_key(values)  # first: the schema's checks and their sorting assume text keys (a bool key crashed)
    if where is not None:
        raise ParityError(f"{what}{f' {where[0]}' if where[0] else ''}: key {where[1]!r} is not text (YAML reads yes, "
                          f"no, on, off, true and false unquoted as booleans, and bare numbers as numbers): quote it")
    errors = sorted(_validator(part).iter_errors(values), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        raise ParityError(first_problem([_message(error, what) for error in errors]))
    where = not_finite(values)
    if where is not None:
        raise ParityError(f"{what}{f' {where[0]}' if where[0] else ''}: must be a finite number, got {where[1]!r}")


def _nodes(value, path: str = ""):
    """Every node of a parsed config with its key path (`a.b[2]`), parents before their children."""
    yield path, value
    if isinstance(value, dict):
        children = ((f"{path}.{key}" if path else str(key), child) for key, child in value.items())
    elif isinstance(value, list):
        children = ((f"{path}[{at}]", child) for at, child in enumerate(value))
    else:
        return
    for where, child in children:
        yield from _nodes(child, where)


def not_finite(value) -> tuple[str, float] | None:
    """The key path and value of the first float in `value` that is NaN or infinite (None: none is): what the
    schema cannot say, since YAML's .nan and .inf are numbers to it and no setting means either."""
    return next(((where, node) for where, node in _nodes(value)
                 if isinstance(node, float) and not math.isfinite(node)), None)


def not_text_key(value) -> tuple[str, object] | None:
    """The key path of the first mapping in `value` with a key that is not text, and that key (None: every key is):
    a Flame arm named `no:` unquoted is the boolean False to YAML, which the schema's name pattern lets by (an
    outsider's: the dry run ended in a TypeError)."""
    return next(((where, key) for where, node in _nodes(value) if isinstance(node, dict)
                 for key in node if not isinstance(key, str)), None)


def experiment_names() -> list[str]:
    return list(schema()["$defs"]["experiments"])


def check_experiment_settings(name: str, settings) -> None:
    """An experiment's settings (the config's experiments.NAME) as the schema allows them."""
    definitions = schema()["$defs"]["experiments"]
    if name not in definitions:
        raise ParityError(f"unknown experiment {name!r}: use one of {', '.join(definitions)}")
    check(definitions[name], settings, name)


def experiment_settings(name: str, text: str) -> dict:
    """An experiment's settings from JSON text (`parity experiment run --settings`), checked by the schema."""
    from parity.manifest import one_line, strict_loads

    try:
        settings = strict_loads(text)  # a key given twice is refused, not read as its last value
    except ValueError as exc:
        raise ParityError(f"--settings is not JSON: {one_line(str(exc))}") from None
    if not isinstance(settings, dict):
        raise ParityError(f"--settings must be a JSON object, got {type(settings).__name__}")
    check_experiment_settings(name, settings)
    return settings


def check_backend(values) -> None:
    check(schema()["$defs"]["backend"], values, "backend")


@lru_cache(maxsize=1)
def _unique_keys_loader():
    """PyYAML's safe loader, refusing a key given twice in one mapping (it keeps the last silently, where strict JSON
    refuses: an outsider's `engine: sim` then `engine: vllm` ran vLLM); keys a merge (`<<:`) brings may be
    overridden, as YAML means them to be."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if isinstance(key, (str, int, float, bool)) or key is None:
                        if key in seen:
                            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}",
                                                                    key_node.start_mark)
                        seen.add(key)
            return super().construct_mapping(node, deep)

    return Loader


def parse_yaml(text: str):
    """YAML text parsed (PyYAML's safe loader, a key given twice refused), every way it fails a ValueError of one
    line: PyYAML's own message quotes the source with a caret under it, over several lines, so only what it found and
    where (line, column) are kept; nesting past Python's recursion limit (a RecursionError in PyYAML) is said as
    such."""
    import yaml

    from parity.manifest import one_line

    try:
        return yaml.load(text, Loader=_unique_keys_loader())
    except RecursionError:
        raise ValueError("nested more deeply than Python's YAML parser reads") from None
    except yaml.MarkedYAMLError as exc:
        def at(mark) -> str:
            return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

        found = f"{exc.problem or 'not YAML'}{at(exc.problem_mark)}"
        context = f" ({exc.context}{at(exc.context_mark)})" if exc.context else ""
        raise ValueError(one_line(found + context)) from None
    except yaml.YAMLError as exc:
        raise ValueError(one_line(str(exc))) from None


def load(files) -> dict:
    """A workflow config as Snakemake merges it: each YAML file deeply over those before it (config/
    experiments.yaml first, then a profile's file), so a bench reads the settings of the workflow it is given,
    not the source tree's."""
    merged: dict = {}
    for path in files:
        try:
            doc = parse_yaml(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ParityError(f"{path}: no such workflow config (run from the repository root, or name one with "
                              f"--config)") from None
        except (OSError, ValueError) as exc:  # ValueError: parse_yaml's, and UnicodeDecodeError
            raise ParityError(f"{path}: not a readable workflow config ({exc})") from None
        if not isinstance(doc, dict):
            raise ParityError(f"{path}: a workflow config is a mapping, got {type(doc).__name__}")
        merged = _merge(merged, doc)
    return merged


def _merge(base: dict, over: dict) -> dict:
    """`over` deeply over `base` (a mapping key by key, anything else replaced), as Snakemake merges configs."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def experiment_section(files, name: str) -> dict:
    """experiments.NAME of the workflow config merged from `files`, checked by the schema."""
    section = load(files).get("experiments", {}).get(name)
    if section is None:
        raise ParityError(f"{', '.join(map(str, files))}: no experiments.{name} in this workflow config")
    check_experiment_settings(name, section)
    return section

