"""Each experiment's settings class and the config schema say the same: the same keys, of the same JSON types,
nested sections included (the schema's `$defs/flame` and `FlameSettings` too). A setting added to one and not
the other fails here by experiment and key. Then: the registry builds typed settings and refuses bad ones in
one line."""

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
    ("speed", {}, "unknown experiment 'speed'"),
])
def test_bad_settings_are_refused_in_one_line(name, settings, says):
    with pytest.raises(ParityError) as error:
        plan.for_experiment(name, TRACES, settings)
    assert says in str(error.value) and "\n" not in str(error.value)
