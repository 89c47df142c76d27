"""The admission benchmark runs and reports its ratio to the router's cost; timings themselves are not asserted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.bench import admission
from parity.cli import main


def test_admission_benchmark_reports_both_costs_and_their_ratio():
    result = admission.run(num_requests=64, repeats=1)
    assert result["clock"] == "simulated" and result["target_us_per_request"] == 20.0
    assert [r["reroute"] for r in result["rows"]] == [False, True]
    for row in result["rows"]:
        assert row["admitted"] + row["refused"] == 64 and row["refused"] > 0  # 1.5x the engines: some refused
        assert row["controller_us"]["p99"] > 0 and row["router_us"]["p99"] > 0
        assert row["ratio_mean"] == row["controller_us"]["mean"] / row["router_us"]["mean"]
        assert isinstance(row["meets_target"], bool)


def test_the_command_prints_a_line_per_setting_and_saves_json(tmp_path):
    out = tmp_path / "admission.json"
    result = CliRunner().invoke(main, ["bench", "admission", "--requests", "32", "--repeats", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.count("us/request; router") == 2 and "ratio" in result.output
    # each run as it ends, on stderr, and every run's p99 kept and its range printed (outside pass Q: 17 s silent,
    # and only the best run kept)
    assert result.stderr.count(", run 2 of 2: controller p99") == 2 and "controller p99 over the runs" in result.stdout
    assert [len(row["controller_p99_us_runs"]) for row in json.loads(out.read_text())["rows"]] == [2, 2]
    assert result.stdout.count("us/request; router") == 2  # the result on stdout, as every bench's (an outsider's:
    # it went to stderr, so `> result.txt` kept nothing)
    assert len(json.loads(out.read_text())["rows"]) == 2


@pytest.mark.parametrize("load", ["0", "nan", "inf", "-inf"])
def test_a_load_of_zero_or_no_number_is_a_usage_error(load):
    """click's FloatRange lets NaN (and inf, where a side is open) through: parity.cli.options.Finite does not."""
    result = CliRunner().invoke(main, ["bench", "admission", "--load", load])
    assert result.exit_code == 2 and "Invalid value for '--load'" in result.output
