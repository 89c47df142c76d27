"""Each experiment's settings class and the config schema say the same: the same keys, of the same JSON types,
nested sections included (the schema's `$defs/flame` and `FlameSettings` too). A setting added to one and not
the other fails here by experiment and key. Every range and enum of the schema is probed on both sides through
the classes: each refuses what the schema refuses and takes what it takes. Then: the registry builds typed
settings and refuses bad ones in one line."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest

from parity.errors import ParityError
from parity.experiments import plan
from parity.experiments.settings import ExtraPair, FlameChanges
from parity.flame.settings import FlameSettings
from parity.settings import Settings
from parity.workflow_config import experiment_names, schema

TRACES = [Path("t/no-reuse.json"), Path("t/reuse.json")]


def json_types(hint) -> set[str]:
    """The JSON types a field's hint allows (null left out: unset is its default)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return set().union(*(json_types(a) for a in typing.get_args(hint)))
    if hint is type(None):
        return set()
    if hint is FlameChanges or origin is dict or (isinstance(hint, type) and issubclass(hint, Settings)):
        return {"object"}
    if origin is tuple:
        return {"array"}
    return {{bool: "boolean", int: "integer", float: "number", str: "string"}[hint]}


def resolve(node: dict) -> dict:
    while "$ref" in node:
        node = schema()["$defs"][node["$ref"].split("/")[-1]] if node["$ref"].count("/") == 2 else \
            schema()["$defs"]["experiments"][node["$ref"].split("/")[-1]]
    return node


def schema_types(node: dict) -> set[str]:
    node = resolve(node)
    if "oneOf" in node:
        return set().union(*(schema_types(n) for n in node["oneOf"]))
    if "type" in node:
        return {node["type"]} if isinstance(node["type"], str) else set(node["type"]) - {"null"}
    if "enum" in node:
        named = {bool: "boolean", int: "integer", float: "number", str: "string"}
        return {named[type(v)] for v in node["enum"]}
    return set()


def fields_of(cls) -> dict:
    """A settings class's keys as the config writes them: a flattened field's keys beside its pair's."""
    hints = typing.get_type_hints(cls)
    keys = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    if issubclass(cls, ExtraPair) and cls.flattened:
        inner = keys.pop(cls.flattened)
        keys |= {f.name: typing.get_type_hints(inner)[f.name] for f in dataclasses.fields(inner)}
    return keys


def disagreements(where: str, cls, node: dict) -> list[str]:
    """Keys in one and not the other, and type mismatches, nested sections walked too."""
    node = resolve(node)
    fields, properties = fields_of(cls), node.get("properties", {})
    found = [f"{where}: {key} is in {cls.__name__}, not in the schema" for key in fields.keys() - properties.keys()]
    found += [f"{where}: {key} is in the schema, not in {cls.__name__}" for key in properties.keys() - fields.keys()]
    for key in fields.keys() & properties.keys():
        hint, prop = fields[key], properties[key]
        if json_types(hint) != schema_types(prop):
            found.append(f"{where}: {key} is {sorted(json_types(hint))} in {cls.__name__}, "
                         f"{sorted(schema_types(prop))} in the schema")
        nested = [a for a in typing.get_args(hint) or (hint,) if isinstance(a, type) and issubclass(a, Settings)]
        if nested and "properties" in resolve(prop):
            found += disagreements(f"{where}.{key}", nested[0], prop)
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    if required != set(node.get("required", [])):
        found.append(f"{where}: required {sorted(required)} in {cls.__name__}, {sorted(node.get('required', []))} "
                     f"in the schema")
    return found


def test_every_experiment_in_the_schema_is_registered_and_no_other():
    assert set(plan.EXPERIMENTS) == set(experiment_names())


@pytest.mark.parametrize("name", sorted(plan.EXPERIMENTS))
def test_each_experiments_settings_class_and_its_schema_agree(name):
    found = disagreements(name, plan.EXPERIMENTS[name].settings, schema()["$defs"]["experiments"][name])
    assert not found, "\n".join(found)


def test_flame_settings_and_the_schemas_flame_agree():
    found = disagreements("flame", FlameSettings, schema()["$defs"]["flame"])
    assert not found, "\n".join(found)


def test_the_walk_names_a_key_the_schema_lacks():
    @dataclasses.dataclass(frozen=True)
    class Grown(plan.GcSettings):
        window: int = 3

    assert disagreements("gc", Grown, schema()["$defs"]["experiments"]["gc"]) == [
        "gc: window is in Grown, not in the schema"]


def test_defaults_are_declared_once_in_the_classes():
    s = plan.settings_of("sustained", {"rates": [4, 8]})
    assert (s.output_tokens, s.repeats, s.schedule.kind, s.arms, s.evict) == ((16,), 1, "poisson", {}, None)
    assert plan.settings_of("confirmation", {}).pairs == 5 and plan.settings_of("gc", None).trace == "reuse"
    assert plan.settings_of("routing", {}).placements == ("sticky", "prefix")


def test_a_rung_gets_its_own_rate_and_no_placeholder():
    (case, *_) = plan.for_experiment("sustained", TRACES[1:], {"rates": [8], "schedule": {"kind": "gamma", "seed": 2}})
    assert case.schedule.to_dict() == {"kind": "gamma", "rate": 8.0, "burstiness": 1.0, "seed": 2, "replay": ""}


@pytest.mark.parametrize("name, settings, says", [
    ("gc", {"repeat": 2}, "gc: unknown setting(s) repeat: known are trace, repeats, flame"),
    ("sustained", {}, "sustained: rates must be given"),
    ("sustained", {"rates": [4, "8"]}, "sustained rates[1] must be a number, got '8'"),
    ("sustained", {"rates": [4], "evict": {"rate": 4}}, "sustained evict: cache_blocks must be given"),
    ("sustained", {"rates": [4], "restart": {"shard": 1, "when": 2}}, "sustained restart: unknown setting(s) when"),
    ("sustained", {"rates": [4], "arms": {"x": {"inflite": 1}}}, "unknown sustained arms.x: Flame setting(s) inflite"),
    ("confirmation", {"pairs": "5"}, "confirmation pairs must be an integer or a mapping, got '5'"),
    ("locality", {"flame": {"order": "random"}}, "order"),
    ("offline-limit", {}, "offline-limit has no cases"),
    ("gc", {"repeats": 0}, "gc repeats: 0 is less than the minimum of 1"),  # ranges and enums: the schema's words
    ("routing", {"placements": ["global"]}, "routing placements.0: 'global' is not one of ['sticky', 'prefix']"),
    ("sustained", {"rates": [4], "arms": {"x": {"batch_limit": 0}}}, "sustained arms.x.batch_limit: 0 is less than"),
    ("speed", {}, "unknown experiment 'speed'"),
])
def test_bad_settings_are_refused_in_one_line(name, settings, says):
    with pytest.raises(ParityError) as error:
        plan.for_experiment(name, TRACES, settings)
    assert says in str(error.value) and "\n" not in str(error.value)


# ---- ranges and enums: every bound and enum of the schema probed on both sides, through the classes ----------------

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum")
# What a probed key needs beside it to be judged alone: the classes' rules between keys (harvest mode needs the async
# API; hold_ms and rotate_tasks apply only in harvest; lengths need low <= median <= high) are not the bound probed.
BESIDE = {("flame", "mode"): {"api": "async"}, ("flame", "hold_ms"): {"mode": "harvest", "api": "async"},
          ("flame", "rotate_tasks"): {"mode": "harvest", "api": "async"}, ("lengths", "high"): {"median": 1}}
MINIMAL = {"admission": {"batch_windows": [[32, 2]], "selected": {}}, "sustained": {"rates": [4]}}


def sample(node: dict):
    """A value `node` accepts."""
    node = resolve(node)
    if "enum" in node:
        return node["enum"][0]
    if "oneOf" in node:
        return sample(node["oneOf"][0])
    kind = node.get("type")
    if kind == "object":
        return {key: sample(node["properties"][key]) for key in node.get("required", [])}
    if kind == "array":
        return [sample(item) for item in node.get("prefixItems", [])] or [sample(node["items"])]
    low = node.get("minimum", node.get("exclusiveMinimum", 0) + (kind == "integer" or 0.5))
    return {"integer": int(low), "number": float(low), "string": "x", "boolean": True}[kind]


def probes(node: dict) -> list:
    """Values on both sides of each bound of a leaf, every enum value and one outside."""
    step = 1 if node.get("type") == "integer" else 0.5
    values = []
    if "enum" in node:
        values += node["enum"] + (["zzz"] if isinstance(node["enum"][0], str) else [max(node["enum"]) + 1, -1])
    if "minimum" in node:
        values += [node["minimum"], node["minimum"] - step]
    if "maximum" in node:
        values += [node["maximum"], node["maximum"] + step]
    if "exclusiveMinimum" in node:
        values += [node["exclusiveMinimum"], node["exclusiveMinimum"] + step / (2 if "exclusiveMaximum" in node else 1)]
    if "exclusiveMaximum" in node:
        values += [node["exclusiveMaximum"], node["exclusiveMaximum"] - step / 2]
    return values


def bounded(node: dict, place, where: str, flame: bool = False, parent: str = ""):
    """(where, a function placing a value at this leaf into a document, the leaf) for every bounded leaf below
    `node`; `place(value)` builds the enclosing document around a leaf's value."""
    is_flame = node.get("$ref", "").endswith("/flame")
    node = resolve(node)
    if "oneOf" in node:
        for i, branch in enumerate(node["oneOf"]):
            yield from bounded(branch, place, f"{where}|{i}", flame, parent)
        return
    if any(bound in node for bound in BOUNDS):
        yield where, place, node
    if "properties" in node:
        required = {k: sample(node["properties"][k]) for k in node.get("required", [])}
        for key, prop in node["properties"].items():
            beside = BESIDE.get(("flame" if is_flame else parent, key), {})
            yield from bounded(prop, lambda v, key=key, beside=beside: place(required | beside | {key: v}),
                               f"{where}.{key}", is_flame, key)
    if isinstance(node.get("additionalProperties"), dict):
        yield from bounded(node["additionalProperties"], lambda v: place({"x": v}), f"{where}.*", flame, parent)
    if isinstance(node.get("items"), dict) and "prefixItems" not in node:
        yield from bounded(node["items"], lambda v: place([v]), f"{where}[]", flame, parent)
    for i, item in enumerate(node.get("prefixItems", [])):
        others = [sample(p) for p in node["prefixItems"]]
        yield from bounded(item, lambda v, i=i, others=others: place(others[:i] + [v] + others[i + 1:]),
                           f"{where}[{i}]", flame, parent)


def verdicts(leaves, schema_check, build) -> tuple[list[str], int, int]:
    """(disagreements, values accepted, values refused): each probe judged by the schema and by the class."""
    found, accepted, refused = [], 0, 0
    for where, place, leaf in leaves:
        for value in probes(leaf):
            document = place(value)
            try:
                schema_check(document)
                by_schema = True
            except ParityError:
                by_schema = False
            try:
                build(document)
                by_class = True
            except ParityError as exc:
                by_class, why = False, str(exc)
            accepted, refused = accepted + by_schema, refused + (not by_schema)
            if by_schema != by_class:
                found.append(f"{where} = {value!r}: the schema {'accepts' if by_schema else 'refuses'} it, the class "
                             + ("accepts it" if by_class else f"refuses it ({why})"))
    return found, accepted, refused


@pytest.mark.parametrize("name", sorted(plan.EXPERIMENTS))
def test_each_experiment_refuses_what_its_schema_refuses_and_takes_what_it_takes(name):
    from parity.workflow_config import check_experiment_settings

    base = MINIMAL.get(name, {})
    leaves = list(bounded(schema()["$defs"]["experiments"][name], lambda v: _merged(base, v), name))
    found, accepted, refused = verdicts(leaves, lambda doc: check_experiment_settings(name, doc),
                                        lambda doc: plan.settings_of(name, doc))
    assert not found, "\n".join(found)
    assert accepted and refused  # both sides probed: the documents around a probe are valid


def test_flame_settings_refuse_what_the_schemas_flame_refuses_and_take_what_it_takes():
    """FlameSettings is built on routes without the schema too (parity flame run's options, a worker's session
    data), so its own checks must hold the same bounds."""
    from parity.workflow_config import check

    leaves = list(bounded({"$ref": "#/$defs/flame"}, lambda v: v, "flame"))
    found, accepted, refused = verdicts(leaves, lambda doc: check(schema()["$defs"]["flame"], doc, "flame"),
                                        FlameSettings.from_dict)
    assert not found, "\n".join(found)
    assert len(leaves) == 9 and accepted and refused


def _merged(base: dict, change):
    if not isinstance(base, dict) or not isinstance(change, dict):
        return change
    return base | {k: _merged(base.get(k), v) if k in base else v for k, v in change.items()}


def test_the_backend_refuses_what_the_schemas_backend_refuses_and_takes_what_it_takes():
    from parity.backend import Backend
    from parity.workflow_config import check_backend

    leaves = list(bounded({"$ref": "#/$defs/backend"}, lambda v: v, "backend"))
    found, accepted, refused = verdicts(leaves, check_backend, Backend.from_dict)
    assert not found, "\n".join(found)
    assert len(leaves) == 6 and accepted and refused
