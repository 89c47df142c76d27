"""The MLPerf dataset, `cnn_eval.json`: a JSON list of {input, tok_input, output, instruction}.

Only `tok_input` (prompt token IDs, BOS included) and `output` (the reference highlights) are used,
as the reference `dataset.py` does. Datasets generated here carry `parity_origin` on every entry, so
a synthetic file can never pass for the real one: `smoke` (articles of the synthetic corpus, the MLPerf
prompt, the smoke tokenizer) and `random` (random token IDs of plausible lengths, no text at all).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from parity.errors import ParityError
from parity.manifest import atomic_write_text, file_ref, sha256_file
from parity.study import VOCAB_LIMIT

PROMPT = ("Summarize the following news article in 128 tokens. Please output the summary only, without any "
          "other text.\n\nArticle:\n{input}\n\nSummary:")  # download_cnndm.py, no chat template
REAL_ORIGIN = "cnn_dailymail-3.0.0-validation"
LLAMA3_BOS = 128000
LLAMA3_VOCAB = 128256


@dataclass(frozen=True)
class Dataset:
    prompts: list[np.ndarray]  # tok_input, as int32 arrays
    references: list[str]  # output
    sha256: str
    path: Path
    origins: tuple[str, ...]  # each entry's parity_origin: REAL_ORIGIN unless the entry says otherwise

    @property
    def origin(self) -> str:
        return "+".join(sorted(set(self.origins)))

    def first(self, count: int) -> "Dataset":
        """Its first `count` entries (a run's samples), of the same file (whose SHA-256 stays the whole file's)."""
        return replace(self, prompts=self.prompts[:count], references=self.references[:count],
                       origins=self.origins[:count])

    @property
    def synthetic(self) -> bool:
        return self.origin != REAL_ORIGIN

    def describe(self, relative_to: Path) -> dict:
        """What a manifest in `relative_to` records: the file by path (from there) and SHA-256."""
        return {"file": file_ref(self.path, relative_to, sha256=self.sha256), "samples": len(self.prompts),
                "origin": self.origin, "synthetic": self.synthetic,
                "prompt_tokens": int(sum(p.size for p in self.prompts))}


def load_dataset(path: Path | str, limit: int | None = None) -> Dataset:
    """The first `limit` entries (all by default); the SHA-256 is always of the whole file."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ParityError(f"dataset not found: {path}") from None
    except ValueError as exc:
        raise ParityError(f"{path}: not JSON ({exc})") from None
    if not isinstance(entries, list) or not entries:
        raise ParityError(f"{path}: expected a non-empty JSON list of cnn_eval entries")
    if limit and limit > len(entries):  # was cut silently to what there is, the count asked recorded nowhere
        raise ParityError(f"{path}: {limit} samples asked for, the dataset holds {len(entries)}")
    entries = entries[:limit] if limit else entries
    prompts = [_token_ids(path, index, entry) for index, entry in enumerate(entries)]
    references = [str(e.get("output", "")) for e in entries]
    origins = tuple(str(e.get("parity_origin", REAL_ORIGIN)) for e in entries)
    return Dataset(prompts, references, sha256_file(path), path, origins)


def _token_ids(path: Path, index: int, entry) -> np.ndarray:
    """An entry's tok_input as int32, refused in one line unless a non-empty flat list of integers
    (no bools, floats or nesting) in 0..2**31-1: numpy would truncate 1.5, take true, overflow on 2**31,
    or make a scalar or a 2-D array that fails only its sample, late, inside the SUT."""
    ids = entry.get("tok_input") if isinstance(entry, dict) else None
    if not isinstance(ids, list) or not ids:
        got = "no tok_input" if ids is None else f"tok_input {str(ids)[:60]}"
        raise ParityError(f"{path}: entry {index}: tok_input must be a non-empty list of token IDs, got {got}")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB_LIMIT:
            raise ParityError(f"{path}: entry {index}: tok_input must hold integer token IDs in 0..2**31-1, "
                              f"got {str(token)[:60]}")
    return np.asarray(ids, dtype=np.int32)


def _write(out: Path, entries: list[dict]) -> Path:
    atomic_write_text(out, json.dumps(entries, ensure_ascii=False) + "\n")
    return out


def write_smoke_dataset(tokenizer_dir: Path, out: Path, *, samples: int, seed: int = 0) -> Path:
    """Synthetic articles in the MLPerf prompt, tokenized with the smoke tokenizer (BOS included);
    the reference summary is the article's first two sentences. Labelled `synthetic-smoke`."""
    from tokenizers import Tokenizer

    from parity.smoke_inputs import synthetic_article

    file = Path(tokenizer_dir) / "tokenizer.json"
    if not file.is_file():
        raise ParityError(f"no tokenizer.json in {tokenizer_dir} (make one with `parity smoke-inputs`)")
    tokenizer = Tokenizer.from_file(str(file))
    rng = random.Random(seed)
    entries = []
    for index in range(samples):
        article = synthetic_article(rng, index)["article"]
        body = article.split("\n\n", 1)[1].replace("\n\n", " ")
        reference = ". ".join(body.split(". ")[:2]).rstrip(".") + "."
        prompt = PROMPT.format(input=article)
        entries.append({"input": article, "instruction": PROMPT.split("\n\n")[0], "output": reference,
                        "tok_input": tokenizer.encode(prompt).ids, "parity_origin": "synthetic-smoke"})
    return _write(out, entries)


def write_random_dataset(out: Path, *, samples: int, seed: int = 0, median_tokens: int = 750,
                         min_tokens: int = 100, max_tokens: int = 2000) -> Path:
    """Random Llama 3 token IDs, no text: for a GPU throughput run where the real dataset is absent.

    Lengths are log-normal around `median_tokens`, clipped to [min_tokens, max_tokens] (CNN/DailyMail
    prompts run from a few hundred to about 2K tokens; this distribution is an assumption, not a fit).
    Every prompt starts with BOS and one shared 28-token instruction, as the real prompts share theirs.
    References are empty: such a run has no accuracy. Labelled `synthetic-random`.
    """
    rng = np.random.default_rng(seed)
    instruction = rng.integers(1000, 100_000, size=28).tolist()
    lengths = np.clip(rng.lognormal(np.log(median_tokens), 0.45, size=samples), min_tokens, max_tokens).astype(int)
    entries = []
    for length in lengths:
        body = rng.integers(1000, 120_000, size=int(length) - 1 - len(instruction)).tolist()
        entries.append({"input": "", "instruction": "", "output": "", "parity_origin": "synthetic-random",
                        "tok_input": [LLAMA3_BOS, *instruction, *body]})
    return _write(out, entries)
