"""The confirmation's Flame arms and shard count (ours, issue 28): the study's pairs again with only the Flame side
changed, on one sticky shard per side where a host lends one GPU; the study's plan unchanged when neither is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.errors import ParityError
from parity.experiments import plan
from parity.flame.settings import FlameSettings

ROOT = Path(__file__).resolve().parents[1]
TRACES = [Path("t/no-reuse.json"), Path("t/reuse.json")]
STUDY = {"pairs": 5, "flame": {"batch_limit": 128, "window_ms": 10, "budget_mib": 4, "api": "async", "compress": True,
                               "order": "arrival", "gc_freeze": True}}  # config/experiments.yaml's confirmation


def test_the_study_plan_is_unchanged_and_the_shard_count_changes_no_trial_id_or_stage():
    """The trial ids main produced for the study's settings (fba27bc), in its order; `shards` changes none."""
    expected = [f"confirmation-final-{trace}-p{k}-{side}" for k in range(5) for trace in ("no-reuse", "reuse")
                for side in (("vllm", "flame") if k % 2 == 0 else ("flame", "vllm"))]
    for settings in (STUDY, STUDY | {"shards": 1}, STUDY | {"shards": 2}):
        cases = plan.for_experiment("confirmation", TRACES, settings)
        assert [c.trial_id for c in cases] == expected
        assert {c.stage for c in cases} == {"final"} and all(c.placement == "sticky" for c in cases)
        assert all(c.pinned == (c.system == "flame") for c in cases)


def test_flame_arms_rerun_the_pairs_with_only_the_flame_side_changed_pair_by_pair():
    settings = STUDY | {"pairs": 2, "flame_arms": {"harvest": {"mode": "harvest"}}}
    cases = plan.for_experiment("confirmation", TRACES, settings)
    study = plan.for_experiment("confirmation", TRACES, STUDY | {"pairs": 2})
    assert [c for c in cases if c.stage == "final"] == study  # the study's cases, each as it was
    harvest = [c for c in cases if c.stage == "final-harvest"]
    assert [c.trial_id.removeprefix("confirmation-final-harvest-") for c in harvest] == [
        "no-reuse-p0-vllm", "no-reuse-p0-flame", "reuse-p0-vllm", "reuse-p0-flame",
        "no-reuse-p1-flame", "no-reuse-p1-vllm", "reuse-p1-flame", "reuse-p1-vllm"]
    assert all(c.placement == "sticky" and c.pinned == (c.system == "flame") for c in harvest)
    final = FlameSettings.from_dict(STUDY["flame"])
    assert all(c.flame.mode == "harvest" and c.flame.label() == final.label() + "-harvest-h5ms" for c in harvest)
    assert [c.pair for c in cases] == sorted(c.pair for c in cases)  # pair 0 of every stage before pair 1 of any
    assert {c.arm for c in harvest} == {"harvest"} and {c.arm for c in study} == {None}
    placed = plan.for_experiment("confirmation", TRACES, STUDY | {"pairs": 1, "arms": ["prefix"]})
    assert {c.stage: c.arm for c in placed} == {"final": None, "final-prefix": "prefix"}
    with pytest.raises(ParityError, match="flame_arms and arms both name 'prefix'"):
        plan.for_experiment("confirmation", TRACES, STUDY | {"arms": ["prefix"], "flame_arms": {"prefix": {}}})


@pytest.mark.parametrize("arms, flame_arms", [((), None), (("prefix",), None), ((), {"tuned": None}),
                                               (("prefix",), {"harvest": {"mode": "harvest"}, "tuned": None,
                                                              "express3": {"mode": "harvest", "hold_ms": 3}})])
def test_the_stages_the_workflow_checks_are_the_stages_the_plan_runs(arms, flame_arms):
    """The workflow checks a profile's `stages` before any job against plan.confirmation_stages (it had its own copy
    of the naming, a twin of the plan's): those are the plan's stages, in its order, a switched-off arm none."""
    settings = STUDY | {"pairs": 1, "arms": list(arms)} | ({"flame_arms": flame_arms} if flame_arms else {})
    cases = plan.for_experiment("confirmation", TRACES, settings)
    stages = plan.confirmation_stages(arms, flame_arms)
    assert stages == list(dict.fromkeys(c.stage for c in cases)) and "final-tuned" not in stages
    for stage in stages:
        picked = plan.for_experiment("confirmation", TRACES, settings | {"stages": [stage]})
        assert picked and {c.stage for c in picked} == {stage}


def test_a_sweep_is_recorded_on_every_case_and_unset_it_changes_nothing():
    """`sweep` (ours) goes into every case's load, so a trial run without it is never kept for a run with it;
    unset, the cases are the study's exactly."""
    settings = STUDY | {"pairs": 2, "flame_arms": {"harvest": {"mode": "harvest"}}}
    cases = plan.for_experiment("confirmation", TRACES, settings)
    swept = plan.for_experiment("confirmation", TRACES, settings | {"sweep": 64})
    assert [c.trial_id for c in swept] == [c.trial_id for c in cases]
    assert all(c.sweep == 64 and c.load["sweep"] == 64 for c in swept)
    assert all(c.sweep is None and "sweep" not in c.load for c in cases)


def test_stages_keep_only_those_stages_pairs_and_an_unknown_stage_is_refused_in_one_line():
    """`stages` (ours): a device session runs one arm's pairs alone, each case as the whole plan makes it."""
    settings = STUDY | {"pairs": 2, "flame_arms": {"harvest": {"mode": "harvest"}, "express3": {
        "mode": "harvest", "express": True, "hold_ms": 3}}, "sweep": 64}
    whole = plan.for_experiment("confirmation", TRACES, settings)
    only = plan.for_experiment("confirmation", TRACES, settings | {"stages": ["final-express3"]})
    assert only == [c for c in whole if c.stage == "final-express3"] and len(only) == 8
    assert all(c.sweep == 64 and c.flame.hold_ms == 3 for c in only)
    with pytest.raises(ParityError, match=r"^confirmation: stages names 'final-exprss3', not a stage of this plan "
                                          r"\(final, final-harvest, final-express3\)$"):
        plan.for_experiment("confirmation", TRACES, settings | {"stages": ["final-exprss3"]})


def test_a_bad_sweep_is_refused_by_the_config_schema():
    import jsonschema
    import yaml

    schema = yaml.safe_load((ROOT / "schemas/config.schema.yaml").read_text())
    part = {"$defs": schema["$defs"], **schema["$defs"]["experiments"]["confirmation"]}
    jsonschema.validate({"sweep": 64}, part)
    for bad in (0, -1, "64", 1.5):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"sweep": bad}, part)
    jsonschema.validate({"stages": ["final-express3"]}, part)
    for bad in ([], "final", ["final", "final"], ["express3"], [3]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"stages": bad}, part)


def test_host_profile_runs_harvest_confirmation_pairs_on_one_shard_and_smoke_does_not():
    import yaml

    host = yaml.safe_load((ROOT / "config/host.yaml").read_text())["experiments"]["confirmation"]
    tuned = {"batch_limit": 256, "order": "prefix"}  # each host arm as it ran in sessions 6-36 (the tuned final)
    assert host == {"shards": 1, "pairs": 2, "flame_arms": {"tuned": None, "harvest": {"mode": "harvest"} | tuned,
                                                            "express3": {"mode": "harvest", "express": True,
                                                                         "hold_ms": 3} | tuned}, "sweep": 64}
    smoke = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())["experiments"]["confirmation"]
    # the smoke run is at its 10-minute limit: no Flame arm (the shared config's `tuned` switched off), two shards
    assert smoke["flame_arms"] == {"tuned": None} and "shards" not in smoke


def test_a_one_shard_confirmation_with_a_harvest_arm_runs_reports_apart_and_is_never_kept_for_two(
        tiny_reuse_trace, sim_backend, tmp_path):
    """On the simulator and the stand-in (simulated): one GPU of the two the backend names, every trial passed
    and pinned, the harvest pairs in their own table; a two-shard rerun keeps none of the one-shard trials."""
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest
    from parity.report import write_report

    settings = {"pairs": 1, "shards": 1, "flame": STUDY["flame"], "flame_arms": {"harvest": {"mode": "harvest"}},
                "sweep": 2}
    cases = plan.for_experiment("confirmation", [tiny_reuse_trace], settings)
    assert [c.stage for c in cases] == ["final", "final", "final-harvest", "final-harvest"]
    out = tmp_path / "confirmation"
    run_experiment("confirmation", cases, sim_backend, out, settings=settings, log=lambda _: None)
    doc = read_manifest(out / "experiment.json")
    assert doc["backend"]["gpus"] == ["sim-0"] and doc["settings"]["shards"] == 1
    for case in cases:
        trial = read_manifest(out / "trials" / f"{case.trial_id}.json")
        assert trial["verdict"]["status"] == "passed", (case.trial_id, trial["verdict"]["reasons"])
        assert trial["ran_with"]["gpus"] == ["sim-0"] and {r["shard"] for r in trial["records"]} == {0}
        assert trial["warmup_sweep"]["groups"] == 2 and trial["ran_with"]["load"]["sweep"] == 2  # fresh engines each
    harvested = read_manifest(out / "trials" / "confirmation-final-harvest-reuse-p0-flame.json")
    assert harvested["config"]["flame"]["mode"] == "harvest" and "harvest" in harvested
    assert sorted(p.name for p in (out / "pairs").glob("*.json")) == ["final-harvest-reuse-p0.json",
                                                                      "final-reuse-p0.json"]

    made = write_report([out], None, ROOT / "config/study-reference.yaml", tmp_path / "report")
    md = made["markdown"]
    section = md[md.index("## 1. Final throughput"):md.index("## 2. Prefix affinity")]
    arms = section[section.index("### Confirmation pairs, Flame arms (ours)"):section.index("### Where the time goes")]
    rows = [line for line in arms.splitlines() if line.startswith("| reuse |")]
    assert [row.split(" | ")[1] for row in rows] == ["final (the study's)", "harvest"]
    assert all("ours, simulated" in row and "| 1 / 0 |" in row for row in rows)
    assert "harvest-h5ms" in rows[1] and "one sticky shard per side on one GPU" in arms
    final = section[:section.index("### Confirmation pairs, Flame arms (ours)")]
    assert "| Prefix reuse | ours, simulated |" in final and "| 1 / 0 |" in final  # the study's pair alone
    assert made["manifest"]["headline"]["reuse"]["pairs"] == 1


def test_a_confirmation_of_one_flame_arm_alone_runs_and_reports_without_the_study_stage(
        tiny_reuse_trace, sim_backend, tmp_path):
    """`stages` as a device session uses it: the arm's pairs alone make a whole experiment manifest, and the
    report shows the arm's pair without a study pair beside it (simulated)."""
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest
    from parity.report import write_report

    settings = {"pairs": 1, "shards": 1, "flame": STUDY["flame"], "flame_arms": {"harvest": {"mode": "harvest"}},
                "stages": ["final-harvest"]}
    cases = plan.for_experiment("confirmation", [tiny_reuse_trace], settings)
    out = tmp_path / "confirmation"
    run_experiment("confirmation", cases, sim_backend, out, settings=settings, log=lambda _: None)
    doc = read_manifest(out / "experiment.json")
    assert doc["settings"]["stages"] == ["final-harvest"]
    assert not (out / "logs" / "deadline.json").exists()  # no deadline set: no memory of its times kept
    assert sorted(p.name for p in (out / "pairs").glob("*.json")) == ["final-harvest-reuse-p0.json"]
    md = write_report([out], None, ROOT / "config/study-reference.yaml", tmp_path / "report")["markdown"]
    arms = md[md.index("### Confirmation pairs, Flame arms (ours)"):md.index("### Where the time goes")]
    assert [line.split(" | ")[1] for line in arms.splitlines() if line.startswith("| reuse |")] == ["harvest"]

    lines: list[str] = []  # the study's two shards: nothing that ran on one is kept, the pairs not either
    two = {k: v for k, v in settings.items() if k != "shards"}
    run_experiment("confirmation", cases, sim_backend, out, settings=two, log=lines.append)
    assert not any("kept" in line or "judged there" in line for line in lines)
    assert sum("stale" in line and "other gpus" in line for line in lines) == len(cases)
    assert all(read_manifest(out / "trials" / f"{c.trial_id}.json")["ran_with"]["gpus"] == ["sim-0", "sim-1"]
               for c in cases)


def test_a_profile_switches_off_a_flame_arm_the_shared_config_names_with_null(tmp_path):
    """The shared config names ours, `tuned`, beside the study's final configuration; the smoke and host profiles
    switch it off with null (the smoke's 10 minutes; the host's arms carry its settings already)."""
    from parity.experiments import plan
    from parity.experiments.settings import ConfirmationSettings
    from parity.workflow_config import load

    traces = [tmp_path / "reuse.json"]
    for profile, stages in ((("config/experiments.yaml",), ["final", "final-tuned"]),
                            (("config/experiments.yaml", "config/smoke.yaml"), ["final"]),
                            (("config/experiments.yaml", "config/host.yaml"), ["final", "final-harvest",
                                                                                "final-express3"])):
        settings = ConfirmationSettings.from_dict(load([ROOT / p for p in profile])["experiments"]["confirmation"])
        cases = plan.EXPERIMENTS["confirmation"].plan(traces, settings)
        assert list(dict.fromkeys(c.stage for c in cases)) == stages, profile
        final = next(c for c in cases if c.stage == "final").flame
        assert (final.batch_limit, final.order) == (128, "arrival")  # the study's, in every profile
        assert all((c.flame.batch_limit, c.flame.order) == (256, "prefix") for c in cases if c.stage != "final")


def test_an_arm_whose_stage_reads_as_another_on_a_trace_is_refused_by_the_plan():
    """A Flame arm "no": stage final-no on trace reuse made trial confirmation-final-no-reuse-p0-vllm, stage final's on
    no-reuse; the dry run let it by and the job refused it hours in, without the id (outside pass M)."""
    with pytest.raises(ParityError, match="names trial confirmation-final-no-reuse-p0-vllm twice"):
        plan.for_experiment("confirmation", TRACES, STUDY | {"flame_arms": {"no": {"batch_limit": 64}}})
