"""Bounded admission judged at a quantile (issue 30): a shard's predicted first token is the wait it stays within
`quantile` of the time: the central wait (the line times its recent bias) plus a margin from the spread of its
errors and the line's own uncertainty where the work is far from what it has seen. Nothing is timed: every `now`
is given."""

import math

import numpy as np
import pytest

from parity.admission import BoundedSettings, Controller, ServiceRate
from parity.errors import ParityError
from parity.latency import Objective
from parity.routing import PrefixRouter

Z99 = 2.3263478740408408  # the standard normal score of 0.99


def _scattered(z: float, sd: float, seed: int = 1, count: int = 2000) -> ServiceRate:
    """A shard whose waits are 20 ms + work / 40,000 tokens/s, scattered by `sd` seconds, work 2,000-12,000 tokens."""
    rng = np.random.default_rng(seed)
    learner = ServiceRate(1, seed=16_000.0, alpha=0.05, span=8_000.0, z=z)
    for work in rng.uniform(2_000, 12_000, count):
        learner.observe(0, work, 0.0, 0.02 + work / 40_000.0 + rng.normal(0.0, sd), learner.central(0, work))
    return learner


def test_the_margin_is_the_quantile_of_the_errors_the_shard_has_shown():
    """Where the work is what the shard has seen, the predicted wait is the central wait plus z standard deviations
    of its errors; without a quantile, the central wait alone."""
    plain, judged = _scattered(0.0, 0.05), _scattered(Z99, 0.05)
    work = 6_000.0  # about the mean work seen
    central = judged.central(0, work)
    assert central == pytest.approx(0.02 + work / 40_000.0, abs=0.02)
    assert plain.predict(0, work) == plain.central(0, work)
    margin = judged.predict(0, work) - central
    assert margin == pytest.approx(Z99 * 0.05, rel=0.3)
    assert judged.errors(0)[1] == pytest.approx(0.05, rel=0.3)


def test_the_margin_grows_with_the_spread_and_away_from_the_work_seen():
    """A noisier shard gets a wider margin; a work far past what the line was fitted on is less certain."""
    calm, noisy = _scattered(Z99, 0.02), _scattered(Z99, 0.08)
    margin = lambda learner, work: learner.predict(0, work) - learner.central(0, work)
    assert margin(noisy, 6_000) > 3 * margin(calm, 6_000)
    assert margin(calm, 60_000) > margin(calm, 6_000) * 1.2


def test_a_shard_refuses_work_ahead_until_its_errors_say_something_of_their_spread():
    """One error says nothing of a spread: until a second, at a quantile the margin is infinite (an idle shard still
    admits, so the waits come)."""
    learner = ServiceRate(1, seed=16_000.0, alpha=0.05, span=8_000.0, z=Z99)
    assert learner.predict(0, 1_000) == pytest.approx(1_000 / 16_000.0)  # nothing seen: the seed line, no margin
    learner.observe(0, 0, 1_000, 0.1, learner.central(0, 1_000))
    assert learner.predict(0, 1_000) == math.inf
    learner.observe(0, 1_000, 1_000, 0.2, learner.central(0, 2_000))
    assert math.isfinite(learner.predict(0, 1_000))


def test_a_request_that_brings_its_own_prefill_is_judged_by_its_own_kind_of_errors():
    """The two kinds' errors apart: fresh requests (a document's first question) that wait 0.1 s longer than the
    line and the others 0.04 s less are predicted so, each with its own spread; a kind not yet seen twice takes the
    pooled spread and no mean."""
    rng = np.random.default_rng(2)
    learner = ServiceRate(1, seed=16_000.0, alpha=0.05, span=8_000.0, z=Z99)
    for _ in range(3):  # cached questions only: the fresh kind has no errors of its own yet
        work = float(rng.uniform(2_000, 12_000))
        learner.observe(0, work, 0.0, 0.02 + work / 40_000.0 - 0.04 + rng.normal(0.0, 0.01), learner.central(0, work))
    mean = learner.errors(0)[0]  # so far every error is the cached kind's: the same spread, and this mean
    assert learner.predict(0, 6_000.0, True) == pytest.approx(learner.predict(0, 6_000.0) - mean)
    for _ in range(2000):
        fresh = bool(rng.random() < 0.3)
        work = float(rng.uniform(2_000, 12_000))
        off, sd = (0.1, 0.06) if fresh else (-0.04, 0.02)
        learner.observe(0, work, 0.0, 0.02 + work / 40_000.0 + off + rng.normal(0.0, sd), learner.central(0, work),
                        fresh=fresh)
    work = 6_000.0
    central = learner.central(0, work)
    fresh_margin, other_margin = learner.predict(0, work, True) - central, learner.predict(0, work) - central
    mean = learner.errors(0)[0]  # the pooled errors' mean, between the two
    assert fresh_margin == pytest.approx(0.1 - mean + Z99 * 0.06, abs=0.05)
    assert other_margin == pytest.approx(-0.04 - mean + Z99 * 0.02, abs=0.03)
    assert fresh_margin > other_margin + 0.15


def test_a_cold_start_prior_gives_the_margin_a_spread_until_the_shard_has_seen_its_window():
    """With `cold_sd_s`, a shard that has seen a handful of first tokens is judged with that spread (a calibrated
    engine's), not its own few errors' (infinite after one); from 1 / alpha first tokens on, by its own."""
    cold = ServiceRate(1, seed=16_000.0, alpha=0.05, span=8_000.0, z=Z99, cold_sd_s=0.05)
    plain = ServiceRate(1, seed=16_000.0, alpha=0.05, span=8_000.0, z=Z99)
    for learner in (cold, plain):
        learner.observe(0, 0, 1_000, 0.1, learner.central(0, 1_000))
    assert plain.predict(0, 1_000) == math.inf
    margin = cold.predict(0, 1_000) - cold.central(0, 1_000)
    assert Z99 * 0.05 < margin < 2 * Z99 * 0.05  # widened by the line's uncertainty after one pair
    rng = np.random.default_rng(3)
    works, noise = rng.uniform(1_000, 4_000, 19), rng.normal(0.0, 0.01, 19)
    for learner in (cold, plain):  # 19 more: the window seen, its own errors (about 0.01 s) from then on
        for work, error in zip(works, noise):
            learner.observe(0, work, 0.0, 0.02 + work / 40_000.0 + error, learner.central(0, work))
    assert cold.predict(0, 2_000) == plain.predict(0, 2_000) < cold.central(0, 2_000) + Z99 * 0.05
    with pytest.raises(ParityError, match="admission setting cold_sd_s must be 0 to 3600 seconds") as error:
        BoundedSettings(cold_sd_s=-0.1)
    assert "\n" not in str(error.value)
    assert BoundedSettings().cold_sd_s == 0.0  # off by default


def test_the_controller_judges_at_its_quantile_and_says_so():
    """Same learned waits, same request: admitted by the line's bias alone, refused at 0.99 when the spread's
    margin pushes it past the objective; the reason names the margin."""
    def controller(quantile):
        c = Controller(PrefixRouter(1, "rev", cache_tokens=1_000_000),
                       BoundedSettings(seed_tokens_per_s=10_000.0, quantile=quantile), Objective(ttft_s=0.5))
        rng, now = np.random.default_rng(2), 0.0
        for i in range(400):  # one at a time, each 2,000 tokens in 0.2 s +- 0.05 s: the line learned, its spread seen
            d = c.decide(np.random.default_rng(i).integers(0, 32_000, 2_000, dtype=np.uint32), now)
            c.first_token(d.index, now + 0.2 + rng.normal(0.0, 0.05))
            c.complete(d.index, now + 0.3)
            now += 1.0
        return c, now
    for quantile, admitted in ((0.0, True), (0.99, False)):
        c, now = controller(quantile)
        c.decide(np.random.default_rng(999).integers(0, 32_000, 2_000, dtype=np.uint32), now)  # 2,000 ahead
        d = c.decide(np.random.default_rng(998).integers(0, 32_000, 2_000, dtype=np.uint32), now)  # ~0.4 s by the line
        assert d.admitted == admitted, (quantile, d.predicted_s)
        if not admitted:
            assert "margin" in d.reason and "99th percentile" in d.reason and "\n" not in d.reason


@pytest.mark.parametrize("quantile", [0.3, 1.0, -0.1])
def test_a_quantile_outside_its_range_is_refused_in_one_line(quantile):
    with pytest.raises(ParityError, match="admission setting quantile must be 0 or in") as error:
        BoundedSettings(quantile=quantile)
    assert "\n" not in str(error.value)


def test_the_default_judges_at_the_99th_percentile_against_the_whole_objective():
    settings = BoundedSettings()
    assert (settings.quantile, settings.headroom) == (0.99, 1.0)
    assert settings.z == pytest.approx(Z99)
    assert BoundedSettings(quantile=0).z == 0.0


def test_a_refusal_while_the_margin_is_unknown_says_when_to_retry_by_the_central_wait():
    """Refused on a shard that has seen a single first token (its margin infinite), a request is told to retry
    when the central wait would fit, never after an infinite Retry-After (a client would wait for ever)."""
    c = Controller(PrefixRouter(1, "rev", cache_tokens=1_000_000),
                   BoundedSettings(seed_tokens_per_s=10_000.0), Objective(ttft_s=0.5))
    prompt = lambda seed: np.random.default_rng(seed).integers(0, 32_000, 2_000, dtype=np.uint32)
    first = c.decide(prompt(1), 0.0)
    c.first_token(first.index, 0.2)
    c.complete(first.index, 0.3)
    assert c.decide(prompt(2), 1.0).admitted  # idle: admitted whatever the margin
    refused = c.decide(prompt(3), 1.0)  # 2,000 ahead, one error seen: the margin is not known
    assert not refused.admitted and refused.predicted_s == math.inf
    assert math.isfinite(refused.retry_after_s) and refused.retry_after_s >= 0.01
    assert "inf s" in refused.reason and "\n" not in refused.reason
