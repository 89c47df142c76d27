"""The routing room's declared interface: every router is a `Router` and says what else it can do."""

import pytest

from parity.routing import AffinityRouter, AlternatingRouter, PrefixRouter, Router

CAPABILITIES = {"follows_kv_events": ("follow", "sync"), "released_on_completion": ("complete",),
                "observes": ("observe",), "models_cache": ("cache_tokens", "overflowed"), "quotes": ("quote", "commit")}


def make(cls, shards=2):
    return cls(shards) if cls is AlternatingRouter else cls(shards, "rev", **(
        {"cache_tokens": 1 << 20} if cls is PrefixRouter else {}))


@pytest.mark.parametrize("cls", [AlternatingRouter, AffinityRouter, PrefixRouter])
def test_every_router_declares_each_capability_and_has_what_it_declares(cls):
    router = make(cls)
    assert isinstance(router, Router)
    for capability, members in CAPABILITIES.items():
        declared = getattr(cls, capability)
        assert isinstance(declared, bool), f"{cls.__name__}.{capability} is not declared as a bool"
        if declared:
            assert all(hasattr(router, m) for m in members), f"{cls.__name__} declares {capability} without {members}"


def test_the_study_routers_declare_nothing_beyond_route_and_stats_and_ours_everything():
    for cls in (AlternatingRouter, AffinityRouter):
        assert not any(getattr(cls, c) for c in CAPABILITIES), cls
    assert all(getattr(PrefixRouter, c) for c in CAPABILITIES)


# ---- the placement registry: one declaration that the paths, the command line, the schema and the benches read ----

def test_each_placement_makes_its_router_and_global_is_a_flame_session_layout():
    from parity.routing import PLACEMENTS, RouterSettings

    for name, facts in PLACEMENTS.items():
        assert type(RouterSettings(name).make(2)) is facts.router, name
    shared = PLACEMENTS["global"]
    assert shared.shared_session and shared.flame and shared.router is AlternatingRouter  # one shard: nothing to choose
    assert [n for n, p in PLACEMENTS.items() if p.shared_session] == ["global"]
    assert [n for n, p in PLACEMENTS.items() if p.follows_kv_events] == ["prefix"]
    assert RouterSettings("prefix").facts.models_cache and not RouterSettings().facts.models_cache


def test_the_paths_and_the_command_line_take_the_registrys_placements():
    from parity import paths
    from parity.cli import main
    from parity.mlperf.run import PLACEMENTS as MLPERF
    from parity.routing import FLAME, SHARDED

    assert paths.get("standalone").placements == paths.get("engine").placements == SHARDED
    assert paths.get("flame").placements == FLAME == ("global", "sticky", "prefix")
    (option,) = [p for p in main.commands["mlperf"].commands["run"].params if p.name == "placement"]
    assert tuple(option.type.choices) == MLPERF == ("global", "sticky")  # layouts: LoadGen's SUT has no router


def test_the_config_schemas_placement_enums_are_the_registrys():
    """The schema cannot import the registry: its routing placements are the routers both paths take, and the
    confirmation's router arms are those beside the study's own."""
    from parity.routing import BOTH_PATHS, STUDY
    from parity.workflow_config import schema

    experiments = schema()["$defs"]["experiments"]
    assert experiments["routing"]["properties"]["placements"]["items"]["enum"] == list(BOTH_PATHS)
    assert experiments["confirmation"]["properties"]["arms"]["items"]["enum"] == [p for p in BOTH_PATHS if p != STUDY]

