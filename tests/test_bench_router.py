"""The router benchmark runs and reports its ratio; timings themselves are not asserted."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from parity.bench import router
from parity.cli import main


def test_router_benchmark_reports_a_ratio():
    result = router.run(num_requests=16, repeats=1)
    assert {"requests", "prompt_tokens", "route_us_per_request", "hash_us_per_request",
            "ratio_route_to_hash", "target_us_per_request", "meets_target", "python"} <= result.keys()
    assert result["requests"] == 16 and result["prompt_tokens"] == 8000
    assert result["route_us_per_request"] > 0 and result["hash_us_per_request"] > 0
    assert result["ratio_route_to_hash"] == result["route_us_per_request"] / result["hash_us_per_request"]
    assert result["target_us_per_request"] == 20.0 and isinstance(result["meets_target"], bool)


@pytest.mark.parametrize("args, option", [
    (["--requests", "0"], "--requests"), (["--requests", "-5"], "--requests"),
    (["--repeats", "0"], "--repeats"), (["--prompt-tokens", "16"], "--prompt-tokens"),
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
