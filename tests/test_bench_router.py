"""The router benchmark runs and reports its ratio; timings themselves are not asserted."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from parity.bench import router
from parity.cli import main


def test_router_benchmark_reports_each_router_per_request_against_hashing():
    result = router.run(num_requests=16, repeats=1)
    assert result["requests"] == 16 and result["prompt_tokens"] == 8000 and result["target_us_per_request"] == 20.0
    assert set(result["routers"]) == {"alternating", "sticky", "prefix"}
    hashed = result["hash"]
    for r in result["routers"].values():
        for stat in ("mean", "p50", "p99"):
            assert r[f"{stat}_us"] > 0 and hashed[f"{stat}_us"] > 0
            assert r[f"ratio_{stat}_to_hash"] == r[f"{stat}_us"] / hashed[f"{stat}_us"]
        assert r["p50_us"] <= r["p99_us"] and r["meets_target"] == (r["p99_us"] <= 20.0)
    assert 0 < result["chain"]["p50_us"] <= result["chain"]["p99_us"]
    lines = router.summary_lines(result)
    assert len(lines) == len(result["routers"]) + 4 and lines[-2].startswith("prefix chain")
    assert result["garbage_collector"] == "paused"
    assert router.run(num_requests=4, repeats=1, collect=True)["garbage_collector"] == "running"


def test_each_requests_own_cost_is_its_least_time_over_the_repeats(monkeypatch):
    """A stall another job puts on one request of one repeat moves that repeat's p99, not the request's own cost."""
    ticks = iter([0, 5_000, 0, 100_000,   # repeat 1: 5 us, then 100 us (a stall)
                  0, 90_000, 0, 7_000])   # repeat 2: 90 us (a stall), then 7 us
    monkeypatch.setattr(router.time, "perf_counter_ns", lambda: next(ticks))
    seen = router.per_call_us(lambda: lambda item: None, ["a", "b"], repeats=2, collect=False)
    assert seen["p99_us"] == 90.0 and seen["own_p99_us"] == 7.0 and seen["own_p50_us"] == 7.0


@pytest.mark.parametrize("args, option", [
    (["--requests", "0"], "--requests"), (["--requests", "-5"], "--requests"),
    (["--repeats", "0"], "--repeats"), (["--prompt-tokens", "16"], "--prompt-tokens"),
    (["--prompt-tokens", "100000000000"], "--prompt-tokens"), (["--requests", str(10**23)], "--requests"),
    (["--shards", str(10**23)], "--shards"),
])
def test_out_of_range_options_are_a_usage_error_not_a_traceback(args, option):
    result = CliRunner().invoke(main, ["bench", "router", *args])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert f"Invalid value for '{option}'" in result.output and "Traceback" not in result.output


def test_the_shards_option_reaches_the_router():
    import json

    result = CliRunner().invoke(main, ["bench", "router", "--shards", "64", "--requests", "16", "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["shards"] == 64


def test_prompts_past_what_the_bench_holds_at_once_are_refused_in_one_line():
    """An outside tester's 100 x 1,000,000 tokens: a MemoryError traceback before; one line now, nothing run."""
    result = CliRunner().invoke(main, ["bench", "router", "--requests", "100", "--prompt-tokens", "1000000"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "more than the 67,108,864 tokens the bench holds at once" in result.output
