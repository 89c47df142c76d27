"""Accuracy of an accuracy-mode run, as the reference `evaluation.py` computes it, offline.

Outputs are read from `mlperf_log_accuracy.json` (int32 token IDs in hex, one entry per sample, kept
once per `qsl_idx`), decoded with the given tokenizer (special tokens skipped), stripped and split into
sentences with NLTK's punkt, one per line; ROUGE-1/2/L/Lsum come from `rouge_score` with the stemmer
(what `evaluate`'s rouge wraps, without its download), each `round(mean(F) * 100, 4)`; `gen_len` is
the total characters of the processed outputs. Gates are the v5.1.1 checker's for llama3.1-8b; on a
subset, the `gen_len` bounds are scaled by samples / 13,368 and the scores are not comparable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from parity.errors import ParityError
from parity.manifest import (atomic_write_text, file_ref, header, read_manifest, sha256_bytes, sha256_file,
                             validate_document, write_manifest)
from parity.mlperf import DATASET_SAMPLES
from parity.mlperf.dataset import load_dataset
from parity.record import package_versions

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
ROUGE_GATES = {"rouge1": 38.3914, "rouge2": 15.7484, "rougeL": 24.2507, "rougeLsum": 35.4351}  # 99% of reference
GEN_LEN_REFERENCE = 8_167_644
GEN_LEN_BOUNDS = (7_350_880, 8_984_408)  # 90% and 110% of the reference, over all 13,368 samples
PUNKT_HELP = ("NLTK's punkt_tab is not available offline: stage it once with `python -m nltk.downloader -d DIR "
              "punkt_tab` and pass --nltk-data DIR (or set NLTK_DATA)")


@dataclass(frozen=True)
class Splitter:
    """A sentence splitter and what to record about it; only punkt is the reference's."""

    split: Callable[[str], list[str]]
    name: str
    reference: bool


def punkt_splitter(nltk_data: Path | None = None) -> Splitter:
    """NLTK's pretrained English punkt (punkt_tab), from staged data; never downloads."""
    import nltk

    if nltk_data is not None:
        nltk.data.path.insert(0, str(nltk_data))
    try:
        nltk.sent_tokenize("Data check. Two sentences.")
    except LookupError:
        raise ParityError(PUNKT_HELP) from None
    return Splitter(nltk.sent_tokenize, f"nltk-{nltk.__version__}-punkt", True)


def untrained_punkt_splitter() -> Splitter:
    """Punkt's algorithm without the pretrained English parameters: a labelled stand-in for CPU
    tests and the smoke workflow, where the data cannot be fetched. Never the reference."""
    import nltk
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return Splitter(PunktSentenceTokenizer().tokenize, f"nltk-{nltk.__version__}-punkt-untrained (stand-in)", False)


def read_accuracy_log(path: Path) -> dict[int, np.ndarray]:
    """qsl_idx -> int32 output token IDs; a sample logged twice keeps its first entry."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ParityError(f"cannot read the accuracy log {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ParityError(f"the accuracy log {path} is not a JSON list but {type(entries).__name__}")
    outputs: dict[int, np.ndarray] = {}
    for n, entry in enumerate(entries):
        try:  # LoadGen writes {"qsl_idx": int, "data": hex of int32s, ...}
            outputs.setdefault(int(entry["qsl_idx"]), np.frombuffer(bytes.fromhex(entry["data"]), dtype="<i4"))
        except (TypeError, KeyError, ValueError) as exc:
            raise ParityError(f"the accuracy log {path}: entry {n} is not LoadGen's "
                              f"{{qsl_idx, data}} ({type(exc).__name__}: {exc})") from None
    return outputs


def decode(tokenizer_dir: Path, outputs: list[np.ndarray]) -> tuple[list[str], int]:
    """Texts with special tokens skipped, and how many IDs lay outside the tokenizer's vocabulary
    (dropped: the simulator's IDs span Llama 3's vocabulary, not the smoke tokenizer's)."""
    from tokenizers import Tokenizer

    file = Path(tokenizer_dir) / "tokenizer.json"
    if not file.is_file():
        raise ParityError(f"no tokenizer.json in {tokenizer_dir}")
    tokenizer = Tokenizer.from_file(str(file))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    kept = [[int(t) for t in ids if 0 <= t < size] for ids in outputs]
    dropped = sum(len(ids) for ids in outputs) - sum(len(ids) for ids in kept)
    return tokenizer.decode_batch(kept, skip_special_tokens=True), dropped


def postprocess(texts: list[str], splitter: Splitter) -> list[str]:
    return ["\n".join(splitter.split(text.strip())) for text in texts]


def rouge(predictions: list[str], references: list[str]) -> dict:
    """ROUGE F-measures as the reference reports them, and gen_len / gen_num."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    out = {kind: round(float(np.mean([s[kind].fmeasure for s in scores])) * 100, 4) for kind in ROUGE_TYPES}
    return out | {"gen_len": int(sum(len(p) for p in predictions)), "gen_num": len(predictions)}


def gates(scores: dict, samples: int) -> tuple[dict, str]:
    """Each gate's value, bounds and verdict; the basis is official only over all 13,368 samples."""
    out = {kind: {"value": scores[kind], "min": bound, "passed": scores[kind] >= bound}
           for kind, bound in ROUGE_GATES.items()}
    scale = samples / DATASET_SAMPLES
    low, high = GEN_LEN_BOUNDS[0] * scale, GEN_LEN_BOUNDS[1] * scale
    out["gen_len"] = {"value": scores["gen_len"], "min": round(low, 1), "max": round(high, 1),
                      "passed": low <= scores["gen_len"] <= high}
    return out, "official" if samples == DATASET_SAMPLES else "scaled-subset"


def evaluate_run(run_manifest: Path, tokenizer_dir: Path, out: Path, splitter: Splitter) -> dict:
    """Score an accuracy-mode run; write its outputs (JSONL) and the accuracy manifest at `out`."""
    run = read_manifest(run_manifest)
    if run.get("kind") != "mlperf" or run.get("step") != "run" or run.get("mode") != "accuracy":
        raise ParityError(f"{run_manifest} is not an accuracy-mode `parity mlperf run` manifest")
    problems = validate_document(run, path=run_manifest)
    if problems:  # a tampered or truncated run: say where, rather than fail on a missing key below
        raise ParityError(f"not a valid run manifest: {problems[0]}")
    ref = run["logs"].get("mlperf_log_accuracy.json")
    if ref is None:
        raise ParityError(f"{run_manifest} links no mlperf_log_accuracy.json")
    log = run_manifest.parent / ref["path"]
    if log.is_file() and (actual := sha256_file(log)) != ref["sha256"]:
        raise ParityError(f"{log} changed since the run (SHA-256 {actual}, the run recorded {ref['sha256']})")
    recorded = run["dataset"]["file"]
    dataset = load_dataset(run_manifest.parent / recorded["path"], run["dataset"]["samples"])
    if dataset.sha256 != recorded["sha256"]:
        raise ParityError(f"{dataset.path} changed since the run (SHA-256 {dataset.sha256}, "
                          f"the run recorded {recorded['sha256']})")
    by_index = read_accuracy_log(log)
    missing = sorted(set(range(len(dataset.prompts))) - set(by_index))
    if missing:
        raise ParityError(f"{log} lacks {len(missing)} of {len(dataset.prompts)} samples, e.g. qsl_idx {missing[0]}")
    indices = sorted(by_index)
    texts, dropped = decode(tokenizer_dir, [by_index[i] for i in indices])
    predictions = postprocess(texts, splitter)
    references = postprocess([dataset.references[i] for i in indices], splitter)
    scores = rouge(predictions, references) | {"out_of_vocab_tokens": dropped}
    verdicts, basis = gates(scores, len(indices))

    outputs = out.parent / f"{out.stem}.outputs.jsonl"
    lines = [json.dumps({"qsl_idx": i, "token_ids_sha256": sha256_bytes(by_index[i].astype("<i4").tobytes()),
                         "token_ids": by_index[i].tolist(), "text": text}, ensure_ascii=False)
             for i, text in zip(indices, predictions)]
    atomic_write_text(outputs, "\n".join(lines) + "\n")
    reasons = []
    if basis != "official":
        reasons.append(f"{len(indices)} samples, not all {DATASET_SAMPLES:,}: gen_len bounds scaled")
    if dataset.synthetic:
        reasons.append(f"synthetic dataset ({dataset.origin})")
    if run["simulated"]:
        reasons.append("simulated engine")
    if not splitter.reference:
        reasons.append(f"sentence splitter {splitter.name} is not the reference's punkt")
    if dropped:
        reasons.append(f"{dropped} output token IDs outside the tokenizer's vocabulary were dropped")
    doc = header("mlperf", simulated=run["simulated"]) | {
        "step": "accuracy", "run": file_ref(run_manifest, out.parent), "arm": run["arm"],
        "dataset": dataset.describe(out.parent),
        "tokenizer": {"file": file_ref(Path(tokenizer_dir) / "tokenizer.json", out.parent)},
        "sentence_splitter": {"name": splitter.name, "reference": splitter.reference},
        "outputs": file_ref(outputs, out.parent), "accuracy_log": file_ref(log, out.parent),
        "scores": scores, "gates": verdicts, "gates_basis": basis,
        "passed": all(g["passed"] for g in verdicts.values()), "comparable": not reasons, "reasons": reasons,
        "versions": package_versions() | {"rouge_score": _version("rouge-score"), "nltk": _version("nltk")},
    }
    write_manifest(out, doc)
    return doc


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
