"""Output lengths per request (ours, beyond the study): seeded draws, each length exact on both paths,
carried in Flame's task payload, refused when bad, and checked against what the trial drew."""

from __future__ import annotations

import numpy as np
import pytest

from parity.errors import ParityError
from parity.lengths import OutputLengths, lengths_sha256


def test_lengths_are_seeded_log_normal_within_their_bounds():
    drawn = np.array(OutputLengths(median=64, sigma=0.8, low=4, high=512, seed=3).draw(20000))
    assert np.median(drawn) == pytest.approx(64, rel=0.05)
    inside = drawn[(drawn > 4) & (drawn < 512)]
    assert np.log(inside).std() == pytest.approx(0.8, rel=0.1)  # the clipped tails aside
    assert drawn.min() >= 4 and drawn.max() <= 512 and (drawn == 512).any()
    assert OutputLengths(seed=3).draw(50) == OutputLengths(seed=3).draw(50) != OutputLengths(seed=4).draw(50)
    assert OutputLengths(median=16, sigma=0.0, high=16).draw(5) == [16] * 5  # sigma 0: the study's fixed length
    described = OutputLengths(seed=3).describe(50)
    assert described["lengths_sha256"] == lengths_sha256(OutputLengths(seed=3).draw(50))
    assert described["requests"] == 50 and described["min"] <= described["mean"] <= described["max"]


@pytest.mark.parametrize("values, message", [
    ({"median": 0}, "1 <= low <= median <= high"), ({"median": 600}, "1 <= low <= median <= high"),
    ({"low": 100}, "1 <= low <= median <= high"), ({"sigma": -1.0}, "sigma must be in"),
    ({"median": "long"}, "output length setting median must be an integer"),
    ({"mean": 64}, "unknown output length setting")])
def test_bad_length_settings_are_refused_by_name(values, message):
    with pytest.raises(ParityError, match=message):
        OutputLengths.from_dict(values)


def test_the_workflow_config_refuses_bad_lengths_in_one_line():
    from parity.workflow_config import check_experiment_settings

    with pytest.raises(ParityError, match="lengths"):
        check_experiment_settings("sustained", {"rates": [4], "lengths": {"median": 0}})


def test_a_task_payload_carries_each_prompts_length_and_keeps_room_for_long_outputs():
    from parity.flame import codec

    rng = np.random.default_rng(0)
    prompts = [codec.Prompt(f"r{i}", rng.integers(0, 128_256, 2000, dtype=np.uint32), 16 + 40 * i) for i in range(8)]
    for compress in (False, True):
        data = codec.encode(prompts, compress=compress)
        back = codec.decode(data, budget=4 << 20)
        assert [p.max_tokens for p in back] == [p.max_tokens for p in prompts]
        assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(back, prompts))
    study = [codec.Prompt(p.request_id, p.tokens) for p in prompts]
    assert codec.decode(codec.encode(study, compress=False), budget=4 << 20)[0].max_tokens is None
    assert len(codec.encode(study, compress=False)) == len(codec.encode(prompts, compress=False)) - 4 * len(prompts)
    with pytest.raises(codec.PayloadError, match="all or none"):
        codec.encode(study[:1] + prompts[1:], compress=False)
    # 512-token outputs (ids and times) take room a 16-token batch does not: the task is cut smaller
    big = [codec.Prompt(f"r{i}", rng.integers(0, 128_256, 8000, dtype=np.uint32)) for i in range(128)]
    short = codec.split(big, compress=False, budget=8 << 20, output_tokens=16)
    long = codec.split(big, compress=False, budget=8 << 20, output_tokens=512)
    assert len(long) > len(short)
    for tasks, tokens in ((short, 16), (long, 512)):
        assert all(len(t.data) + codec.output_reserve(big[:t.count], tokens) <= codec.FLAME_MESSAGE_CAP for t in tasks)


def test_the_simulator_gives_each_request_exactly_its_length_and_refuses_one_beyond_max_tokens():
    from parity.engine import EngineArgs
    from parity.engine.sim import SimEngine, output_tokens

    engine = SimEngine(EngineArgs(max_tokens=64))
    prompts = [np.arange(100 + i, dtype=np.uint32) for i in range(3)]
    done = engine.generate(prompts, [1, 16, 64])
    assert [len(c.output_token_ids) for c in done] == [1, 16, 64] == [len(c.token_s) for c in done]
    assert done[2].output_token_ids == output_tokens(prompts[2], engine.params.vocab_size, 64)
    with pytest.raises(ParityError, match="outside 1..max_tokens"):
        engine.generate(prompts[:1], [65])
    with pytest.raises(ParityError, match="2 output lengths for 3 prompts"):
        engine.generate(prompts, [1, 2])


def test_the_sim_server_serves_any_exact_length_up_to_its_max_tokens_and_refuses_others(tmp_path):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from parity.engine import EngineArgs
    from parity.engine.sim import SimEngine
    from parity.standalone.sim_server import make_app

    args = EngineArgs(max_tokens=32)

    async def go():
        engine = SimEngine(args, clock="paced", mode="async")
        async with TestClient(TestServer(make_app(engine, "m"))) as client:
            replies = []
            for body in ({**args.sampling(5)}, {**args.sampling(32)}, {**args.sampling(33)},
                         {**args.sampling(5), "min_tokens": 1}, {**args.sampling(), "max_tokens": "many"}):
                response = await client.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], **body})
                replies.append((response.status, await response.json()))
            return replies

    (ok5, five), (ok32, thirty_two), (over, refused), (loose, loose_doc), (typed, _) = asyncio.run(go())
    assert (ok5, ok32) == (200, 200)
    assert len(five["choices"][0]["token_ids"]) == 5 and len(thirty_two["choices"][0]["token_ids"]) == 32
    assert over == loose == typed == 400
    assert "1..32" in refused["error"]["message"] and "min_tokens = max_tokens" in loose_doc["error"]["message"]


def test_both_paths_give_each_request_its_own_length_and_the_check_holds_them_to_it(tiny_reuse_trace, sim_backend,
                                                                                   tmp_path):
    from parity.checks import check_trial, trace_of
    from parity.experiments import plan
    from parity.experiments.runner import run_experiment
    from parity.manifest import read_manifest

    settings = {"rates": [20], "lengths": {"median": 24, "sigma": 0.7, "high": 96, "seed": 2},
                "flame": {"window_ms": 5}}
    cases = [c for c in plan.for_experiment("sustained", [tiny_reuse_trace], settings) if c.lengths]
    assert {c.stage for c in cases} == {"lengths-20"} and {c.max_tokens for c in cases} == {96}
    run_experiment("sustained", cases, sim_backend, tmp_path, settings=settings, log=lambda m: None)
    docs = [read_manifest(tmp_path / "trials" / f"{c.trial_id}.json") for c in cases]
    wanted = OutputLengths(median=24, sigma=0.7, high=96, seed=2).draw(len(docs[0]["records"]))
    assert len(set(wanted)) > 3  # the lengths differ from request to request
    for case, doc in zip(cases, docs):
        path = tmp_path / "trials" / f"{case.trial_id}.json"
        assert doc["verdict"]["status"] == "passed", case.system
        assert [len(r["output_token_ids"]) for r in doc["records"]] == wanted == [r["max_tokens"] for r in doc["records"]]
        assert [len(r["token_s"]) for r in doc["records"]] == wanted
        assert doc["output_lengths"]["lengths_sha256"] == lengths_sha256(wanted)
        assert doc["ran_with"]["load"]["lengths"]["seed"] == 2
        doc["records"][0]["output_token_ids"].append(7)
        assert "without exactly the output length they asked for" in " ".join(check_trial(doc, trace_of(path, doc))["reasons"])
        doc["records"][0]["max_tokens"] += 1  # a record that claims another length than its trial drew
        assert "not the ones the trial's output_lengths settings draw" in " ".join(
            check_trial(doc, trace_of(path, doc))["reasons"])
    # the other sustained cases (the study's 16) record no lengths of their own
    study = [c for c in plan.for_experiment("sustained", [tiny_reuse_trace], settings) if not c.lengths]
    assert study and all("lengths" not in c.load for c in study)
