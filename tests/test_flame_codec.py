"""Flame task payloads: lossless round trips, the decoded budget, Flame's 4 MiB cap, corrupt input."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.flame import codec
from parity.flame.codec import PayloadError, Prompt

MiB = 1024 * 1024


def prompts(n: int, length: int = 8035, vocab: int = 128_256, seed: int = 0) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    return [Prompt(f"reuse-d{i:04d}-q0", rng.integers(0, vocab, length, dtype=np.uint32)) for i in range(n)]


def same(a: list[Prompt], b: list[Prompt]) -> bool:
    return [p.request_id for p in a] == [p.request_id for p in b] and all(
        np.array_equal(x.tokens, y.tokens) for x, y in zip(a, b))


@settings(max_examples=30, deadline=None)
@given(batch=st.lists(st.tuples(st.text(max_size=20), st.lists(st.integers(0, 2**32 - 1), max_size=50)), max_size=8),
       compress=st.booleans())
def test_round_trip_is_lossless(batch, compress):
    items = [Prompt(rid, np.array(tokens, dtype=np.uint32)) for rid, tokens in batch]
    assert same(codec.decode(codec.encode(items, compress=compress), budget=MiB), items)


def test_narrowest_token_width():
    assert codec.token_width(prompts(1, vocab=8192)) == 2
    assert codec.token_width(prompts(1, vocab=128_256)) == 3
    assert codec.token_width([Prompt("x", np.array([2**31], dtype=np.uint32))]) == 4


def test_a_raw_128_prompt_batch_is_about_3_1_mb():
    size = len(codec.encode(prompts(128), compress=False))
    assert 3.0e6 < size < 3.2e6


def test_zlib_shrinks_repeated_prefixes():
    doc = prompts(1)[0].tokens
    rng = np.random.default_rng(1)
    batch = [Prompt(f"q{i}", np.concatenate([doc, rng.integers(0, 128_256, 20, dtype=np.uint32)])) for i in range(4)]
    raw, packed = codec.encode(batch, compress=False), codec.encode(batch, compress=True)
    assert len(packed) < 0.5 * len(raw)  # the 8K prefix repeats inside zlib's 32 KiB window
    assert same(codec.decode(packed, budget=MiB), batch)


def test_over_budget_is_refused_before_decompressing():
    data = codec.encode(prompts(128), compress=True)
    with pytest.raises(PayloadError, match="over the payload budget of 2097152"):
        codec.decode(data, budget=2 * MiB)


def test_split_respects_budget_and_cap_and_keeps_order():
    batch = prompts(128)
    for compress, budget in ((False, 2 * MiB), (False, 4 * MiB), (True, 4 * MiB)):
        tasks = codec.split(batch, compress=compress, budget=budget)
        assert all(len(t.data) <= codec.FLAME_MESSAGE_CAP - codec.RESERVED_FOR_OUTPUT for t in tasks)
        decoded = [p for t in tasks for p in codec.decode(t.data, budget=budget)]
        assert [t.count for t in tasks] == [len(codec.decode(t.data, budget=budget)) for t in tasks]
        assert same(decoded, batch)
    assert len(codec.split(batch, compress=False, budget=2 * MiB)) == 2


def test_raw_batch_over_the_cap_is_halved():
    batch = prompts(128, vocab=2**31)  # 4-byte tokens: 128 prompts encode to ~4.1 MB, over the cap
    tasks = codec.split(batch, compress=False, budget=8 * MiB)
    assert len(tasks) == 2 and same([p for t in tasks for p in codec.decode(t.data, budget=8 * MiB)], batch)


def test_a_prompt_that_can_never_fit_is_an_error():
    with pytest.raises(PayloadError, match="alone"):
        codec.split(prompts(1), compress=False, budget=1000)


@pytest.mark.parametrize("mangle", [
    lambda d: d[:5],
    lambda d: b"XXXX" + d[4:],
    lambda d: d[:-10],
    lambda d: d + b"trailing",
])
def test_corrupt_input_is_refused(mangle):
    data = codec.encode(prompts(2, length=100), compress=False)
    with pytest.raises(PayloadError):
        codec.decode(mangle(data), budget=MiB)


def test_corrupt_zlib_is_refused():
    data = bytearray(codec.encode(prompts(2, length=100), compress=True))
    data[20] ^= 0xFF
    with pytest.raises(PayloadError):
        codec.decode(bytes(data), budget=MiB)
    header = data[: codec.HEADER.size]
    bomb = bytes(header) + zlib.compress(b"\0" * (10 * MiB), 1)
    with pytest.raises(PayloadError):
        codec.decode(bomb, budget=MiB)
