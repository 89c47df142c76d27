"""Issue 31's workload families in `parity bench routing` (conversations, tenants, hot documents): each builds
the sharing it stands for, deterministically; the rows that miss issue 31's targets are flagged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.bench import routing
from parity.cli.bench_placing import bench_routing


def same(a: routing.Workload, b: routing.Workload) -> bool:
    return a.documents == b.documents and all(np.array_equal(x, y) for x, y in zip(a.prompts, b.prompts))


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_conversations_next_turn_starts_with_its_whole_last_prompt_and_grows_by_the_same_step(lockstep):
    make = dict(convs=5, turns=4, first_tokens=300, grow_tokens=300, lockstep=lockstep, seed=3)
    w = routing.conversations("conversation", "", **make)
    assert same(w, routing.conversations("conversation", "", **make))
    turns: dict[int, list[np.ndarray]] = {}
    for chat, prompt in zip(w.documents, w.prompts):
        turns.setdefault(chat, []).append(prompt)
    assert sorted(turns) == list(range(5)) and all(len(t) == 4 for t in turns.values())
    for chat in turns.values():
        assert [len(p) for p in chat] == [300, 600, 900, 1200]  # in arrival order: 4x the first turn by turn 4
        assert all(np.array_equal(later[:len(earlier)], earlier) for earlier, later in zip(chat, chat[1:]))
    firsts = [chat[0] for chat in turns.values()]
    assert all(a[0] != b[0] or not np.array_equal(a[:16], b[:16]) for a in firsts for b in firsts if a is not b)
    rounds = [sorted(w.documents[k:k + 5]) == [0, 1, 2, 3, 4] for k in range(0, 20, 5)]
    assert all(rounds) == lockstep  # lockstep: every conversation's turn k before any turn k + 1
    assert w.documents[:5] != w.documents[5:10] or w.documents[5:10] != w.documents[10:15]  # each round shuffled


def test_a_tenants_documents_share_its_head_only_and_the_unshared_requests_share_nothing():
    w = routing.tenants("tenants", "", tenants=3, docs=2, questions=2, prefix_tokens=200, head_tokens=128,
                        unshared=4, seed=1)
    assert same(w, routing.tenants("tenants", "", tenants=3, docs=2, questions=2, prefix_tokens=200,
                                   head_tokens=128, unshared=4, seed=1))
    assert w.head_tokens == 0 and len(w.prompts) == 3 * 2 * 2 + 4 and len(set(w.documents)) == 3 * 2 + 4
    assert all(len(p) == 128 + 200 + routing.QUESTION_TOKENS for p in w.prompts)
    heads = {}
    for doc, prompt in zip(w.documents, w.prompts):
        if doc < 6:
            heads.setdefault(doc // 2, set()).add(prompt[:128].tobytes())
    assert all(len(h) == 1 for h in heads.values()) and len(set.union(*heads.values())) == 3  # one head per tenant
    unshared = [p for d, p in zip(w.documents, w.prompts) if d >= 6]
    assert len({p[:16].tobytes() for p in unshared} | set.union(*heads.values())) == 4 + 3  # nothing shared


def test_the_hot_document_family_asks_one_document_from_once_to_hundreds_of_times():
    quick = [w for w in routing.families(quick=True) if w.family == "hot-doc"]
    full = [w for w in routing.families() if w.family == "hot-doc"]
    assert [max(w.documents.count(d) for d in set(w.documents)) for w in full] == [3, 10, 120, 600, 600]
    assert {w.shards for w in full} == {2, 8} and all(w.documents.count(0) in (1, 10, 120, 600) for w in full)
    assert all(sorted(w.documents.count(d) for d in set(w.documents) - {0}) == [3] * 16 for w in quick)


def test_the_full_conversation_family_grows_about_fivefold_from_a_few_thousand_tokens_at_2_and_8_shards():
    conv = [w for w in routing.families() if w.family == "conversation"]
    assert {(w.shards, "lockstep" in w.case) for w in conv} == {(2, False), (2, True), (8, False), (8, True)}
    lengths = sorted({len(p) for p in conv[0].prompts})
    assert lengths[0] >= 2000 and lengths[-1] == 5 * lengths[0]


def test_the_prefix_aware_hindsight_keeps_a_tenants_documents_together_where_it_can():
    w = routing.tenants("tenants", "", tenants=2, docs=4, questions=2, prefix_tokens=64, head_tokens=2048,
                        unshared=0, seed=2)
    shard_of = routing.by_prefix(w)
    tenant_shards = {}
    for doc, shard in zip(w.documents, shard_of):
        tenant_shards.setdefault(doc // 4, set()).add(shard)
    assert tenant_shards in ({0: {0}, 1: {1}}, {0: {1}, 1: {0}})  # each head held once, the two shards even


def row(alternating: float, sticky: float, prefix: float, hindsight: float) -> dict:
    rps = {"alternating": alternating, "sticky": sticky, "prefix": prefix, "hindsight": hindsight}
    return {"placements": {p: {"requests_per_s": v} for p, v in rps.items()}}


@pytest.mark.parametrize("rates, below", [
    ((90, 95, 100, 100), []),
    ((90, 95, 97, 100), []),  # exactly 97% of the bound
    ((90, 95, 96.9, 100), ["bound"]),
    ((90, 100, 99.5, 100), []),  # within 1% of sticky
    ((90, 100, 98.9, 101), ["baseline"]),  # 1.1% under sticky, 97.9% of the bound
    ((101, 60, 98.9, 101), ["baseline"]),  # the better of the two is alternating
    ((90, 100, 91, 100), ["bound", "baseline"]),
])
def test_a_row_is_flagged_below_97_percent_of_the_bound_or_1_percent_under_the_better_baseline(rates, below):
    r = row(*rates)
    assert routing.flags(r) == below
    r["below"] = below
    assert routing.flag_text(r) == (f"BELOW {'+'.join(below)}" if below else "")


def test_the_printout_marks_flagged_rows_and_counts_them():
    rows = []
    for rates, family in (((90, 95, 100, 100), "zipf"), ((90, 100, 91, 100), "tenants")):
        r = row(*rates) | {"family": family, "case": "c", "prefix_vs_hindsight": 1.0, "prefix_vs_alternating": 1.0,
                           "prefix_vs_sticky": 1.0, "expected_vs_realized_hits": 1.0}
        r["placements"]["prefix"]["split_documents"] = 0
        r["below"] = routing.flags(r)
        rows.append(r)
    lines = routing.summary_lines({"rows": rows, "router_cost": {"shards": 64, "prompt_tokens": 1, "p50_us": 1,
                                                                 "p99_us": 1}})
    assert not lines[1].endswith("BELOW bound+baseline") and lines[2].endswith("BELOW bound+baseline")
    assert lines[3].startswith("flagged: 1 of 2 rows BELOW")


@pytest.mark.parametrize("family", ["conversation", "tenants", "hot-doc"])
def test_each_new_family_runs_by_name_in_quick_and_its_rows_carry_the_flag(family, tmp_path):
    out = tmp_path / "routing.json"
    result = CliRunner().invoke(bench_routing, ["--quick", "--family", family, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["family"] for r in rows} == {family} and all(isinstance(r["below"], list) for r in rows)
    assert "flagged:" in result.output
    assert all(r["placements"]["hindsight"]["requests_per_s"] >= r["placements"]["sticky"]["requests_per_s"]
               for r in rows)  # the bound of issue 31's families includes the study's placement


def test_an_idle_shard_spreads_as_null_not_infinity():
    """A router that leaves a shard idle (sticky on a trace whose every request starts alike) writes JSON that a
    strict reader accepts: no Infinity."""
    import json

    from parity.bench.routing import spread

    assert spread([1.0, 2.0]) == pytest.approx(1.0)
    assert spread([0.0, 2.0]) is None
    json.dumps({"work_spread": spread([0.0, 2.0])}, allow_nan=False)


def test_explain_prints_the_prefix_routers_first_decisions_per_family():
    from click.testing import CliRunner

    from parity.cli import main

    result = CliRunner().invoke(main, ["bench", "routing", "--quick", "--family", "conversation", "--explain", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("conversation: ") and len(lines) == 4
    assert all(line.startswith("  #") and " -> shard " in line for line in lines[1:])


def test_case_picks_rows_and_the_case_explain_reads():
    """--case runs only the cases whose name contains it (one row in seconds, not the whole printout)."""
    from click.testing import CliRunner

    from parity.cli import main

    result = CliRunner().invoke(main, ["bench", "routing", "--quick", "--family", "conversation", "--case", "8 sh"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("conversation ")]
    assert rows and all("8 sh" in line for line in rows) and not any("2 sh" in line for line in rows)
    result = CliRunner().invoke(main, ["bench", "routing", "--quick", "--family", "conversation", "--case", "8 sh",
                                       "--explain", "2"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("conversation: 12x3 lockstep 8 sh")
    for explain in ([], ["--explain", "2"]):  # a case that names nothing is refused, not run as an empty bench
        result = CliRunner().invoke(main, ["bench", "routing", "--quick", "--family", "tenants", "--case", "8 sh",
                                           *explain])
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [
            "Error: bench routing: no case of tenants has '8 sh' in its name; the cases: 4 heads 512 +16 2 sh"]


@pytest.mark.parametrize("args, says", [
    (["--trace-file", "t.jsonl", "--explain", "2"], "--explain: not used with --trace-file"),
    (["--trace-file", "t.jsonl", "--family", "zipf", "--quick"], "--family, --quick: not used with --trace-file"),
    (["--trace-limit", "5"], "--trace-limit: not used with the families' bench"),
    (["--quick", "--shards", "2"], "--shards: not used with the families' bench"),
    (["--quick", "--explain", "1", "--out", "e.json"], "--out: not used with --explain"),
])
def test_an_option_the_chosen_run_would_ignore_is_a_usage_error(args, says):
    """Found by an outsider: --trace-file with --explain explained the families, and --trace-limit alone ran them."""
    from click.testing import CliRunner

    from parity.cli import main

    result = CliRunner().invoke(main, ["bench", "routing", *args])
    assert result.exit_code == 2 and f"Error: {says} (" in result.output, result.output


def test_the_bound_of_every_family_is_never_below_sticky_or_alternating():
    """Issue 31: on `zipf one doc x 120 + 10 x 2` sticky (140.93 req/s) beat the hindsight "bound" (132.74), which
    did not try it outside issue 31's families; every family's bound now takes the better of them too."""
    from parity.bench.routing import evaluate, select
    from parity.engine.sim import SimParams

    params = SimParams.load(None)
    for w in select(only={"zipf"}, cases=("one doc x 120",)) + select(quick=True, only={"working-set"}):
        rps = {p: v["requests_per_s"] for p, v in evaluate(w, params)["placements"].items()}
        assert rps["hindsight"] >= max(rps["sticky"], rps["alternating"]), (w.case, rps)
