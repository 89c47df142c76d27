"""The simulator engine: prefix cache at vLLM's granularity, batching limits, clocks, determinism."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from parity.engine import OUTPUT_TOKENS, EngineArgs, make_engine
from parity.engine.sim import SimEngine, SimParams, SimScheduler, _Request
from parity.engine.sim_cache import PrefixCache, block_hashes
from parity.errors import ParityError

PARAMS = SimParams.load()


def doc(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 128_000, length, dtype=np.uint32)


def reuse_burst(documents=16, questions=4, prefix=2000, seed=0):
    rng = np.random.default_rng(seed)
    prompts = [np.concatenate([doc(d, prefix), rng.integers(0, 128_000, 12, dtype=np.uint32)])
               for d in range(documents) for _ in range(questions)]
    return [prompts[i] for i in rng.permutation(len(prompts))]


def test_calibrated_parameters_load():
    assert PARAMS.kv_cache_tokens == 898_784
    assert "calibrate" in PARAMS.source
    with pytest.raises(ParityError, match="not found"):
        SimParams.load("/nonexistent.yaml")


@pytest.mark.parametrize("text, says", [
    ("params:\n  fixed_s: fast\n", "simulator parameter fixed_s must be a number, got 'fast'"),
    ("params:\n  kv_cache_tokens: 1.5\n", "simulator parameter kv_cache_tokens must be an integer, got 1.5"),
    ("params:\n  decode_seq_s: true\n", "simulator parameter decode_seq_s must be a number, got True"),
    ("params:\n  speed: 3\n", "unknown simulator parameter(s) speed: known are fixed_s, "),
    ("params:\n  kv_cache_tokens: -5\n", "simulator parameter kv_cache_tokens must be at least 256, got -5"),
    # outsiders', 2026-12-07: a cache under one router block gave a traceback under `bench routing --explain`; a key
    # given twice ran its last value; 2e-2 is text to YAML 1.1
    ("params:\n  kv_cache_tokens: 255\n", "simulator parameter kv_cache_tokens must be at least 256, got 255"),
    ("params:\n  fixed_s: 0.02\n  fixed_s: 5.0\n", "not YAML: duplicate key 'fixed_s' at line 3"),
    ("params:\n  fixed_s: 2e-2\n", "fixed_s must be a number, got '2e-2' (YAML reads 2e-2 as text: write 2.0e-2)"),
    ("params:\n  fixed_s: -0.1\n", "simulator parameter fixed_s must be at least 0, got -0.1"),
    # an outside tester's: 1e308 overflowed to inf (a JSON traceback; a paced sleep's OverflowError that hung
    # a standalone replica), 1e300 "passed" at 5e-301 req/s
    ("params:\n  fixed_s: 1.0e+308\n", "simulator parameter fixed_s must be at most 3600.0 s a step (a sane"),
    ("params:\n  attention_pair_s: 2\n", "attention_pair_s must be at most 1.0 s a token pair"),
    ("params:\n  vocab_size: 4294967296\n", "vocab_size must be at most 2147483648"),
    ("- 1\n- 2\n", "simulator parameters must be a mapping, got list"),
    ("", "simulator parameters must be a mapping, got an empty file"),
    ("params:\n  - 1\n", "`params` must be a mapping, got list"),
    ("params: {fixed_s: [1\n", "not YAML: expected ',' or ']', but got '<stream end>' at line 2"),
    # an outside evaluator's (2026-12-05): a file of something else ran on the defaults, said nowhere
    ("a: 1\n", "unknown key(s) a: a simulator parameter file has fit_report, measurements, params, source"),
    ("source: x\n", "no `params` mapping (the simulator parameters)"),
])
def test_bad_parameter_file_is_one_line_naming_file_and_key(tmp_path, text, says):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ParityError) as err:
        SimParams.load(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value) and "\n" not in str(err.value)


def test_parameter_file_takes_integers_for_numbers(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("params:\n  fixed_s: 0\n  decode_seq_s: 1\n")
    params = SimParams.load(path)
    assert params.fixed_s == 0.0 and isinstance(params.decode_seq_s, float) and params.source == str(path)


def test_parameters_that_make_every_step_take_no_time_are_refused(tmp_path):
    """All step costs 0: every duration was 0, and `bench routing` and `bench order` divided by it after their trials
    ran (a ZeroDivisionError traceback: an outsider's, 2026-12-07)."""
    path = tmp_path / "zero.yaml"
    path.write_text("params:\n  fixed_s: 0\n  prefill_token_s: 0\n  decode_seq_s: 0\n  attention_pair_s: 0\n")
    with pytest.raises(ParityError, match="cannot all be 0: every engine step would take no time"):
        SimParams.load(path)


@pytest.mark.parametrize("values, says", [
    ({"max_num_seqs": "abc"}, "engine argument max_num_seqs must be an integer, got 'abc'"),
    ({"max_num_seqs": 2.5}, "engine argument max_num_seqs must be an integer, got 2.5"),
    ({"max_num_seqs": True}, "engine argument max_num_seqs must be an integer, got True"),
    ({"enable_prefix_caching": "maybe"}, "engine argument enable_prefix_caching must be true or false, got 'maybe'"),
    ({"model": [1, 2]}, "engine argument model must be a string, got [1, 2]"),
    ({"revision": 3}, "engine argument revision must be a string or null, got 3"),
    ({"gpu_memory_utilization": float("nan")}, "engine argument gpu_memory_utilization must be a number, got nan"),
    ({"gpu_memory_utilization": 1.5}, "engine argument gpu_memory_utilization must be in (0, 1], got 1.5"),
    ({"block_size": 0}, "engine argument block_size must be at least 1, got 0"),
    ({"max_tokens": -1}, "engine argument max_tokens must be at least 1, got -1"),
    ({"max_num_seq": 4}, "unknown engine argument(s) max_num_seq: known are model, "),
    ([("max_num_seqs", 4)], "engine arguments: expected a mapping of KEY: VALUE, got list"),
])
def test_bad_engine_arguments_are_one_line(values, says):
    with pytest.raises(ParityError) as err:
        EngineArgs.from_dict(values)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_engine_arguments_take_integers_for_numbers_and_null_where_allowed():
    args = EngineArgs.from_dict({"gpu_memory_utilization": 1, "revision": None, "seed": -3})
    assert args.gpu_memory_utilization == 1.0 and isinstance(args.gpu_memory_utilization, float)
    assert args.revision is None and args.seed == -3
    assert EngineArgs.from_dict(None) == EngineArgs() == EngineArgs.from_dict(EngineArgs().to_dict())


def test_cache_hits_count_whole_blocks_capped_at_prompt_minus_one():
    engine = SimEngine()
    prompt = doc(1, 8004)
    first, again = engine.generate([prompt])[0], engine.generate([prompt])[0]
    assert first.cached_tokens == 0
    assert again.cached_tokens == 8000  # 500 whole blocks; 8,004 − 1 caps at 8,003 → 8,000
    exact = doc(2, 1600)
    engine.generate([exact])
    assert engine.generate([exact])[0].cached_tokens == 1584  # 1,600 − 1 → 99 whole blocks


def test_shared_prefix_hits_up_to_the_divergence():
    engine = SimEngine()
    base = doc(3, 1000)
    engine.generate([np.concatenate([base, doc(4, 50)])])
    other = engine.generate([np.concatenate([base, doc(5, 50)])])[0]
    assert other.cached_tokens == 992  # the block holding token 1,000 differs


def test_reuse_burst_gives_the_expected_cached_share():
    prompts = reuse_burst()
    out = SimEngine().generate(prompts)
    share = sum(c.cached_tokens for c in out) / sum(c.prompt_tokens for c in out)
    expected = 3 * 1984 / 4 / 2012  # three of four questions reuse the document's whole blocks
    assert share == pytest.approx(expected, abs=0.01)


def test_no_reuse_burst_has_no_hits():
    out = SimEngine().generate([doc(i, 3000) for i in range(20)])
    assert all(c.cached_tokens == 0 for c in out)


def test_eviction_when_capacity_is_small():
    small = dataclasses.replace(PARAMS, kv_cache_tokens=4 * 2048)
    engine = SimEngine(params=small)
    first = doc(7, 2000)
    engine.generate([first])
    for i in range(8):
        engine.generate([doc(100 + i, 2000)])
    assert engine.stats()["evictions"] > 0
    assert engine.generate([first])[0].cached_tokens == 0  # evicted
    roomy = SimEngine()
    roomy.generate([first])
    for i in range(8):
        roomy.generate([doc(100 + i, 2000)])
    assert roomy.generate([first])[0].cached_tokens == 1984


def test_lru_evicts_least_recently_used_first():
    cache = PrefixCache(4, block_size=16)
    a, b = cache.allocate(2), cache.allocate(2)
    for block, h in zip(a + b, [b"a0", b"a1", b"b0", b"b1"]):
        cache.register(block, h)
    cache.release(a)
    cache.release(b)
    assert cache.hit_blocks([b"a0", b"a1"], 100) == a
    cache.allocate(2)  # takes a's blocks: released first, so least recently used
    assert cache.hit_blocks([b"a0", b"a1"], 100) == []
    assert cache.hit_blocks([b"b0", b"b1"], 100) == b


@pytest.mark.parametrize("max_num_seqs,budget", [(4, 8192), (64, 1000), (8, 300)])
def test_batching_limits_are_respected(max_num_seqs, budget):
    args = EngineArgs(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    scheduler = SimScheduler(args, PARAMS)
    for i, prompt in enumerate(reuse_burst(documents=6, questions=3, prefix=900)):
        scheduler.add(_Request(prompt, block_hashes(prompt, 16), 0.0))
    chunked = False
    while not scheduler.idle:
        scheduled = scheduler.plan()
        assert scheduled
        assert len(scheduler.running) <= max_num_seqs
        assert sum(n for _, n in scheduled) <= budget
        chunked |= any(req.computed + n < req.prompt.size for req, n in scheduled)
        scheduler.apply(scheduled)
    assert chunked == (budget < max_num_seqs * 912)  # prefill beyond the budget is split across steps


def test_outputs_are_deterministic_and_in_input_order():
    prompts = [doc(i, 500 + i) for i in range(10)]
    a, b = SimEngine().generate(prompts), SimEngine().generate(list(reversed(prompts)))
    assert [c.output_token_ids for c in a] == [c.output_token_ids for c in reversed(b)]
    assert all(len(c.output_token_ids) == OUTPUT_TOKENS for c in a)
    assert [c.prompt_tokens for c in a] == [p.size for p in prompts]
    assert len({tuple(c.output_token_ids) for c in a}) == 10


def test_virtual_clock_takes_no_wall_time_and_paced_sleeps_the_model():
    prompts = [doc(i, 4000) for i in range(8)]
    start = time.monotonic()
    virtual = SimEngine().generate(prompts)
    assert time.monotonic() - start < 1.0 < max(c.complete_s for c in virtual)
    fast = dataclasses.replace(PARAMS, fixed_s=0.01, prefill_token_s=0.0, attention_pair_s=0.0)
    model = SimEngine(params=fast).generate(prompts[:2])  # the virtual clock: the model's time alone
    modelled = max(c.complete_s for c in model) - min(c.submit_s for c in model)
    assert modelled == pytest.approx(16 * 0.01, rel=0.05)  # 1 prefill step + 15 decode steps
    engine = SimEngine(params=fast, clock="paced")
    start = time.monotonic()
    paced = engine.generate(prompts[:2])
    spent = max(c.complete_s for c in paced) - min(c.submit_s for c in paced)
    assert spent >= modelled * 0.99  # at least the model; a loaded machine's late wake-ups only add to it
    assert time.monotonic() - start >= spent * 0.95


def test_submit_admits_requests_as_they_arrive():
    fast = dataclasses.replace(PARAMS, fixed_s=0.002, prefill_token_s=0.0, attention_pair_s=0.0)
    engine = SimEngine(params=fast, clock="paced", mode="async")
    try:
        first = engine.submit(doc(1, 100))
        deadline = time.monotonic() + 5
        while not engine.scheduler.steps and time.monotonic() < deadline:  # its first step done, not a guessed sleep
            time.sleep(0.001)
        second = engine.submit(doc(2, 100))
        a, b = first.result(timeout=5), second.result(timeout=5)
        assert a.submit_s < b.submit_s and a.complete_s < b.complete_s
        assert len(b.output_token_ids) == OUTPUT_TOKENS
    finally:
        engine.close()
    with pytest.raises(ParityError, match="closed"):
        engine.submit(doc(3, 10))


def test_a_dead_stepping_thread_fails_requests_rather_than_hanging():
    """An outside tester's: a paced sleep's OverflowError killed the thread and a standalone replica hung."""
    huge = dataclasses.replace(PARAMS, fixed_s=1e300)  # past the loader's bounds, as a hand-built SimParams may be
    engine = SimEngine(params=huge, clock="paced", mode="async")
    try:
        with pytest.raises(ParityError, match="simulator engine failed: OverflowError"):
            engine.submit(doc(1, 100)).result(timeout=5)
        with pytest.raises(ParityError, match="simulator engine failed"):
            engine.submit(doc(2, 100))
    finally:
        engine.close()


def test_closing_fails_the_requests_it_has_not_finished_at_once():
    """A standalone replica stopped by SIGTERM served its whole queue first, then was killed 10 s later (outside pass
    J's nit): closing now fails what is running or waiting, and nothing sets a result on it after."""
    slow = dataclasses.replace(PARAMS, fixed_s=0.5)
    engine = SimEngine(params=slow, clock="paced", mode="async")
    futures = [engine.submit(doc(i, 100)) for i in range(8)]
    deadline = time.monotonic() + 5
    while not engine.scheduler.steps and time.monotonic() < deadline:  # a step under way
        time.sleep(0.001)
    started = time.monotonic()
    engine.close()
    for future in futures:
        with pytest.raises(ParityError, match="closed before this request finished"):
            future.result(timeout=2)
    assert time.monotonic() - started < 2


def test_reset_prefix_cache_starts_cold():
    engine = SimEngine()
    prompt = doc(9, 600)
    engine.generate([prompt])
    engine.reset_prefix_cache()
    assert engine.generate([prompt])[0].cached_tokens == 0


def test_async_mode_admits_while_stepping():
    slow_front = dataclasses.replace(PARAMS, frontend_request_s=0.05)
    prompts = [doc(i, 2000) for i in range(16)]
    sync = SimEngine(params=slow_front, mode="sync").generate(prompts)
    overlap = SimEngine(params=slow_front, mode="async").generate(prompts)
    assert max(c.complete_s for c in overlap) < max(c.complete_s for c in sync)


def test_bad_input():
    with pytest.raises(ParityError, match="empty prompt"):
        SimEngine().generate([[]])
    with pytest.raises(ParityError, match="max_model_len"):
        SimEngine(EngineArgs(max_model_len=100)).generate([doc(0, 200)])
    with pytest.raises(ParityError, match="clock"):
        SimEngine(clock="sundial")
    with pytest.raises(ParityError, match="unknown engine"):
        make_engine("tgi")
    with pytest.raises(ParityError, match="unknown engine argument"):
        EngineArgs.from_dict({"max_num_seq": 4})


def test_describe_says_simulated():
    d = SimEngine().describe()
    assert d["simulated"] is True and d["gpu_uuid"].startswith("sim-")
    assert d["args"]["max_num_seqs"] == 64 and d["args"]["attention_backend"] == "TRITON_ATTN"


def test_the_simulators_answers_are_told_from_an_engines_by_their_content_alone():
    """An outside evaluator's (2026-12-05, second pass): a simulated tree relabelled a measurement on real GPUs
    (labels, GPU names and engine names edited, then report and seal re-run) validated. The simulator's answers are
    a function of the prompt alone, so a trial's outputs say whether it was simulated, whatever the vocabulary."""
    from parity.engine.sim import answers_like_the_simulator, output_tokens

    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1800, 300, dtype=np.uint32) for _ in range(8)]
    for vocab in (300, 1800, 128_256):
        assert answers_like_the_simulator(prompts, [output_tokens(p, vocab, n) for p, n in zip(prompts, range(4, 40, 5))])
    answers = [output_tokens(p, 1800) for p in prompts]
    assert not answers_like_the_simulator(prompts, [[int(t) for t in rng.integers(0, 1800, 16)] for _ in prompts])
    assert not answers_like_the_simulator(prompts, [[0] * 16 for _ in prompts])  # one token repeated: dummy weights
    assert not answers_like_the_simulator(prompts, [answers[0][:1]])  # too little to judge
    assert not answers_like_the_simulator(prompts, answers[:-1] + [answers[-1][:15] + [answers[-1][15] ^ 1]])
