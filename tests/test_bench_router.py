"""The router benchmark runs and reports its ratio; timings themselves are not asserted."""

from __future__ import annotations

from parity.bench import router


def test_router_benchmark_reports_a_ratio():
    result = router.run(num_requests=16, repeats=1)
    assert {"requests", "prompt_tokens", "route_us_per_request", "hash_us_per_request",
            "ratio_route_to_hash", "target_us_per_request", "meets_target", "python"} <= result.keys()
    assert result["requests"] == 16 and result["prompt_tokens"] == 8000
    assert result["route_us_per_request"] > 0 and result["hash_us_per_request"] > 0
    assert result["ratio_route_to_hash"] == result["route_us_per_request"] / result["hash_us_per_request"]
    assert result["target_us_per_request"] == 20.0 and isinstance(result["meets_target"], bool)
