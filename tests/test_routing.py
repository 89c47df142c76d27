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
