"""Bounded admission's orphan refusal (`BoundedSettings.orphan_s`, off by default): for `orphan_s` after a document's
uncached question was refused, a later question of it that would also come uncached is refused too, even where it
would fit; a question that would hit its cache, another document, or one past the window is judged as ever. Nothing is
timed: every `now` is given."""

import numpy as np
import pytest

from parity.admission import BoundedSettings, Controller
from parity.errors import ParityError
from parity.latency import Objective
from parity.routing import PrefixRouter

RNG = np.random.default_rng(9)


def _doc(tokens: int) -> np.ndarray:
    return RNG.integers(0, 32_000, tokens, dtype=np.uint32)


def _controller(orphan_s=1.0) -> Controller:
    """1,000 prefill tokens/s seeded, judged by the line alone, a 2 s objective, one shard."""
    router = PrefixRouter(1, "rev", cache_tokens=1_000_000)
    return Controller(router, BoundedSettings(seed_tokens_per_s=1000.0, quantile=0.0, orphan_s=orphan_s),
                      Objective(ttft_s=2.0))


def _question(doc: np.ndarray, words: int = 16) -> np.ndarray:
    return np.concatenate([doc, _doc(words)])


def test_an_orphan_is_refused_in_its_window_and_judged_as_ever_after_it():
    c = _controller()
    busy, other = _doc(1200), _doc(800)
    first = c.decide(_question(busy), now=0.0)
    assert first.admitted  # 1,200 ahead now
    refused = c.decide(_question(other), now=0.1)  # (1,216 + 816) / 1,000 = 2.03 s > 2 s: refused, uncached
    assert not refused.admitted and refused.reason.startswith("predicted first token in")
    small = _doc(200)
    c.decide(_question(small), now=0.15)  # another document that fits: admitted, the window says nothing of it
    c.first_token(first.index, now=0.2)  # the first's prefill done: 216 ahead, `other` would now fit (1.03 s)
    orphan = c.decide(_question(other), now=0.3)
    assert not orphan.admitted and orphan.shard is None
    assert orphan.reason.startswith("an orphan on shard 0: its document's uncached question was refused 0.200 s ago")
    assert "\n" not in orphan.reason and c.orphans == 1 and c.stats()["orphans"] == 1
    assert c.decide(_question(other), now=1.2).admitted  # past the window (1.1 s): judged as ever, and fits
    assert c.decide(_question(other), now=1.25).admitted  # now a hit of its cache: never an orphan
    assert (c.admitted, c.refused) == (4, 2)


def test_a_question_that_hits_its_document_is_never_an_orphan():
    c = _controller(orphan_s=10.0)
    doc, busy = _doc(1000), _doc(1500)
    seed = c.decide(_question(doc), now=0.0)
    assert seed.admitted  # the document is cached from here on
    c.decide(_question(busy), now=0.01)  # 1,016 ahead + 1,516 own = 2.5 s: refused, uncached
    c.first_token(seed.index, now=0.5)
    assert c.decide(_question(doc), now=0.6).admitted  # its document held: 16 uncached
    assert c.orphans == 0


def test_off_by_default_and_bad_settings_refused_in_one_line():
    assert BoundedSettings().orphan_s == 0.0
    c = Controller(PrefixRouter(1, "rev", cache_tokens=1_000_000),
                   BoundedSettings(seed_tokens_per_s=1000.0, quantile=0.0), Objective(ttft_s=2.0))
    doc = _doc(800)
    first = c.decide(_question(_doc(1200)), now=0.0)
    assert not c.decide(_question(doc), now=0.1).admitted
    c.first_token(first.index, now=0.2)
    assert c.decide(_question(doc), now=0.3).admitted and "orphans" not in c.stats()
    for bad, named in ((-1.0, "0 or more seconds"), (float("inf"), "a number")):  # inf: refused as every setting's
        with pytest.raises(ParityError, match=f"admission setting orphan_s must be {named}, got "):
            BoundedSettings(orphan_s=bad)


def test_orphan_grace_judges_a_refused_documents_next_questions_as_any_before_the_rest_are_orphans():
    """`orphan_grace: 1`: the first question after a document's refusal may still seed it (here it fits and is
    admitted); with it refused too, the next is an orphan. Off (0) by default; needs orphan_s; bad values refused."""
    router = PrefixRouter(1, "rev", cache_tokens=1_000_000)
    c = Controller(router, BoundedSettings(seed_tokens_per_s=1000.0, quantile=0.0, orphan_s=10.0, orphan_grace=1),
                   Objective(ttft_s=2.0))
    busy, other, late = _doc(1200), _doc(800), _doc(1900)
    first = c.decide(_question(busy), now=0.0)
    assert not c.decide(_question(other), now=0.1).admitted  # 2.03 s: refused, its document's first refusal
    c.first_token(first.index, now=0.2)
    assert c.decide(_question(other), now=0.3).admitted and c.orphans == 0  # the grace: judged, fits, seeds it
    busy2 = c.decide(_question(_doc(1100)), now=0.4)  # 816 + 1,116 ahead: 1.93 s
    assert busy2.admitted
    assert not c.decide(_question(late), now=0.5).admitted  # refused (its first)
    assert not c.decide(_question(late), now=0.6).admitted and c.orphans == 0  # refused as any (its grace)
    orphan = c.decide(_question(late), now=0.7)
    assert not orphan.admitted and c.orphans == 1 and orphan.reason.startswith("an orphan on shard 0")
    assert BoundedSettings().orphan_grace == 0
    for bad, message in ((-1, "must be a whole number 0 or more"), (1.5, "must be an integer, got 1.5"),
                         (True, "must be an integer, got True")):
        with pytest.raises(ParityError, match=f"admission setting orphan_grace {message}"):
            BoundedSettings(orphan_s=1.0, orphan_grace=bad)
    with pytest.raises(ParityError, match="orphan_grace .* it needs orphan_s"):
        BoundedSettings(orphan_grace=1)


@pytest.mark.parametrize("demand, seeded", [(0, False), (4, False), (3, True)])
def test_orphan_demand_judges_a_document_asked_that_often_since_its_refusal_as_any_again(demand, seeded):
    """`orphan_demand: 3`: a refused document asked a third time (its orphans counted) is hot, so that question is
    judged as any request and may seed it (here it fits: admitted); off, or at 4, it is still an orphan."""
    c = Controller(PrefixRouter(1, "rev", cache_tokens=1_000_000),
                   BoundedSettings(seed_tokens_per_s=1000.0, quantile=0.0, orphan_s=10.0, orphan_demand=demand),
                   Objective(ttft_s=2.0))
    busy, hot = _doc(1200), _doc(800)
    first = c.decide(_question(busy), now=0.0)
    assert not c.decide(_question(hot), now=0.1).admitted  # 2.03 s: refused, asked once
    assert c.decide(_question(_doc(200)), now=0.12).admitted  # another document: 216 stays ahead
    assert not c.decide(_question(hot), now=0.15).admitted and c.orphans == 1  # asked twice: an orphan
    c.first_token(first.index, now=0.2)  # 216 ahead: the hot document would now fit (1.03 s)
    third = c.decide(_question(hot), now=0.3)
    assert third.admitted is seeded and c.orphans == (1 if seeded else 2)
    if seeded:
        assert c.decide(_question(hot), now=0.31).admitted  # its cache now held: a hit, never an orphan


def test_orphan_demand_is_off_by_default_and_bad_values_are_refused_in_one_line():
    assert BoundedSettings().orphan_demand == 0
    for bad, message in ((-1, "must be a whole number 0 or more"), (2.5, "must be an integer, got 2.5")):
        with pytest.raises(ParityError, match=f"admission setting orphan_demand {message}"):
            BoundedSettings(orphan_s=1.0, orphan_demand=bad)
    with pytest.raises(ParityError, match="orphan_demand .* it needs orphan_s"):
        BoundedSettings(orphan_demand=3)


def test_orphan_demand_is_recorded_only_when_set_so_the_trials_made_before_it_stay_current():
    """A trial's ran_with.load.admission is these settings' to_dict: a field recorded at its default would make every
    bounded trial measured before it stale (run again)."""
    before = BoundedSettings(orphan_s=30.0, orphan_grace=1)
    assert "orphan_demand" not in before.to_dict() and BoundedSettings.from_dict(before.to_dict()) == before
    hot = BoundedSettings(orphan_s=30.0, orphan_grace=1, orphan_demand=4)
    assert hot.to_dict()["orphan_demand"] == 4 and BoundedSettings.from_dict(hot.to_dict()) == hot
