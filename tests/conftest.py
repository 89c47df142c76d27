"""Shared fixtures: small offline inputs, and small traces built from them."""

from __future__ import annotations

import pytest

from parity import smoke_inputs
from parity.trace import TraceSpec, build_trace


@pytest.fixture(scope="session")
def small_inputs(tmp_path_factory):
    """A 200-article synthetic corpus and a 2,048-token BPE tokenizer trained on it."""
    out = tmp_path_factory.mktemp("small-inputs")
    corpus = smoke_inputs.write_corpus(out / "corpus.jsonl", articles=200, seed=5)
    return corpus, smoke_inputs.train_tokenizer(corpus, out / "tok", vocab_size=2048)


@pytest.fixture(scope="session")
def small_reuse_trace(small_inputs, tmp_path_factory):
    """16 documents x 4 questions, 1,500-token prefixes: the reuse trace's shape, small."""
    corpus, tok = small_inputs
    spec = TraceSpec("reuse", documents=16, questions_per_document=4, prefix_tokens=1500, seed=2)
    return build_trace(spec, corpus, tok, tmp_path_factory.mktemp("small-traces"))


@pytest.fixture(scope="session")
def tiny_reuse_trace(small_inputs, tmp_path_factory):
    """3 documents x 2 questions, 300-token prefixes: a confirmation pair in seconds."""
    corpus, tok = small_inputs
    spec = TraceSpec("reuse", documents=3, questions_per_document=2, prefix_tokens=300, seed=1)
    return build_trace(spec, corpus, tok, tmp_path_factory.mktemp("tiny-traces"))


@pytest.fixture(scope="session")
def sim_backend():
    """The simulator with the committed H200 parameters, no warmup rounds."""
    from pathlib import Path

    from parity.backend import Backend

    params = Path(__file__).resolve().parents[1] / "config/sim/h200-llama31-8b.yaml"
    return Backend.from_dict({"engine": "sim", "sim_params": str(params), "warmup_rounds": 0})


@pytest.fixture
def python_sigint():
    """Ctrl-C as Python sets it up at start (KeyboardInterrupt), whatever the test run inherited: a shell
    starting `make test` in the background (`&`, as a CI runner or a second suite beside the first may)
    leaves SIGINT ignored, and Python then keeps it ignored, so a test of Ctrl-C would see nothing."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    """A Flame service called in-process (`ParityService`, as flamepy would): its GPU locks in this test's
    folder, two simulated GPUs to lease from, and executor id `exec-7` (from the socket flamepy names)."""
    import flamepy

    monkeypatch.setenv("PARITY_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("PARITY_GPUS", "sim-0,sim-1")
    monkeypatch.setenv(flamepy.FLAME_INSTANCE_ENDPOINT, str(tmp_path / "exec-7.sock"))
    return tmp_path / "locks"


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """A minisign key pair (parity.key, parity.pub) and another public key (other.pub), for signed trees."""
    minisign = pytest.importorskip("minisign")
    pair = minisign.KeyPair.generate()
    folder = tmp_path_factory.mktemp("keys")
    (folder / "parity.key").write_bytes(bytes(pair.secret_key))
    (folder / "parity.pub").write_bytes(bytes(pair.public_key))
    other = minisign.KeyPair.generate()
    (folder / "other.pub").write_bytes(bytes(other.public_key))
    return folder
