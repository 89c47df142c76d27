"""Token traces: the study's finite bursts, built from news text and a tokenizer, in token IDs.

A trace is a binary token file plus a manifest. The manifest is written last, so a trace exists only
once it is complete; it lists every request with its SHA-256 (of its token IDs as little-endian
uint32) and names the warmup variants, whose token IDs are shifted within the vocabulary so the
measured prefixes are unseen during warmup while lengths and prefix relationships are kept.
Nothing here knows about engines or routing, but what every engine refuses: a token ID outside the
vocabulary, and a prompt longer than the study's context.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from parity.errors import ParityError, first_problem
from parity.manifest import (
    all_or_nothing,
    atomic_write_bytes,
    dumps,
    file_ref,
    first_difference,
    header,
    loads,
    one_line,
    sha256_file,
    write_manifest,
)
from parity.study import MAX_MODEL_LEN, OUTPUT_TOKENS

TOKEN_FILE_MAGIC = b"PARITYT1"
TOKEN_FILE_FORMAT = "parity-tokens-v1"
VLLM_BLOCK_TOKENS = 16  # vLLM's prefix-cache block: a differing first block makes every block differ
QUESTIONS = (
    "What is the main subject of the article above?",
    "Which people or organisations are named, and what did they say?",
    "Where and when do the events described take place?",
    "What happens next, according to the text?",
    "What figures or amounts are reported?",
    "Who criticised the decision, and why?",
    "What reasons are given for the change?",
    "Summarise the article in one sentence.",
)
# Ours, for rungs long enough for a steady state (`blocks`): block k of a trace is its first block's documents and
# questions with every ordinary token ID shifted by k x BLOCK_SHIFT, as the warmups are shifted. Each block so has
# the first one's shape exactly (lengths, shared prefixes, order) and prefixes new to every cache: a stream of
# document sets, each asked for a while, in place of a corpus many times larger.
BLOCK_SHIFT = 3001
QUESTION_TEMPLATE = "\n\nQuestion: {question}\nAnswer:"
ARTICLE_SEPARATOR = "\n\n"


class TraceError(ParityError):
    """Bad trace input or a trace file that does not match its manifest."""


def json_line_error(where, number: int, exc: ValueError) -> TraceError:
    """Line `number` of the JSONL file `where` is not JSON (as `parity.manifest.loads` fails): where in it, and why
    ("Invalid control character at" ends where its column would follow). A line cut short fails past its end
    (`exc.colno` would call it column 1 of a next line): said as its end. JSON that Python cannot hold (nested too
    deeply, a number of too many digits) has no place in the line: why alone."""
    if not isinstance(exc, json.JSONDecodeError):
        return TraceError(f"{where}:{number}: not valid JSON ({one_line(str(exc))})")
    reason = exc.msg.removesuffix(" at")
    end = len(exc.doc.rstrip(" \t\r\n"))  # JSON's whitespace: a no-break space is a character here
    at = "the end of the line" if exc.pos >= end else f"column {exc.pos + 1}"
    return TraceError(f"{where}:{number}: not valid JSON at {at} ({reason})")


@dataclass(frozen=True)
class TraceSpec:
    """What a trace is: how many documents, questions per document, prefix length, seed, warmups."""

    name: str
    documents: int
    questions_per_document: int
    prefix_tokens: int = 8000
    seed: int = 0
    warmup_shifts: tuple[int, ...] = (1009, 2027)
    pack_articles: bool = True
    head_tokens: int = 0  # a head shared by every document (a system prompt), within prefix_tokens
    zipf: float = 0.0  # hot documents: each request's document drawn from a Zipf law of this exponent (0: uniform)
    blocks: int = 1  # ours: the trace is this many blocks of the shape above, one after another (BLOCK_SHIFT)
    answer_tokens: int = 0  # ours, conversations: each document's questions are one chat's turns, a turn's prompt
    # carrying the earlier turns, each question followed by an answer of this many tokens (conversation_prompt)

    def check(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise TraceError(f"trace name {self.name!r} must be letters, digits, '-' or '_'")
        if self.documents < 1:
            raise TraceError(f"documents must be >= 1, got {self.documents}")
        if not 1 <= self.questions_per_document <= len(QUESTIONS):
            raise TraceError(f"questions per document must be 1..{len(QUESTIONS)}, got {self.questions_per_document}")
        if self.prefix_tokens < 2 * VLLM_BLOCK_TOKENS:
            raise TraceError(f"prefix tokens must be >= {2 * VLLM_BLOCK_TOKENS}, got {self.prefix_tokens}")
        if not 0 <= self.head_tokens <= self.prefix_tokens - 2 * VLLM_BLOCK_TOKENS:
            raise TraceError(f"head tokens must be 0..{self.prefix_tokens - 2 * VLLM_BLOCK_TOKENS} (leaving each "
                             f"document two cache blocks of its own), got {self.head_tokens}")
        if not (self.zipf == 0 or 0 < self.zipf <= 4):
            raise TraceError(f"zipf must be 0 (every document asked alike) or an exponent in (0, 4], got {self.zipf}")
        if self.blocks < 1:
            raise TraceError(f"blocks must be >= 1, got {self.blocks}")
        if not 0 <= self.answer_tokens <= self.prefix_tokens - self.head_tokens:
            raise TraceError(f"answer tokens must be 0..{self.prefix_tokens - self.head_tokens} (taken from a "
                             f"document's own text), got {self.answer_tokens}")
        if self.answer_tokens and self.zipf:
            raise TraceError("answer tokens (conversations: a document's questions are its turns, in order) and zipf "
                             "(each request's document drawn at random) do not go together")
        if len(set(self.warmup_shifts)) != len(self.warmup_shifts) or any(s <= 0 for s in self.warmup_shifts):
            raise TraceError(f"warmup shifts must be distinct positive integers, got {list(self.warmup_shifts)}")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a burst, in burst order."""

    id: str
    position: int
    document: int
    question: int
    tokens: int
    sha256: str


@dataclass(frozen=True)
class Trace:
    """A loaded, hash-verified trace variant: request metadata and the prompts' token IDs."""

    name: str
    variant: str
    sha256: str
    requests: tuple[TraceRequest, ...]
    prompts: tuple[np.ndarray, ...]
    manifest_path: Path
    manifest_sha256: str
    replay: dict | None = None  # a recorded trace's arrivals and output lengths, checked (read_replay)


# ---- token IDs ---------------------------------------------------------------------------------

def token_sha256(tokens) -> str:
    """SHA-256 of token IDs as little-endian uint32: the identity every check compares."""
    return hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes()).hexdigest()


def out_of_vocab(tokens, vocab_size: int) -> int | None:
    """A token ID outside 0..vocab_size-1 (the largest, as vLLM names it), or None: what engines refuse."""
    ids = np.asarray(tokens)
    if ids.size == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    return high if high >= vocab_size else low if low < 0 else None


def encode_token_file(prompts: list[np.ndarray]) -> bytes:
    """Magic, request count, per-request token counts, then all token IDs; all little-endian uint32."""
    counts = np.array([len(p) for p in prompts], dtype="<u4")
    body = np.concatenate([np.asarray(p, dtype="<u4") for p in prompts]) if prompts else np.zeros(0, "<u4")
    return TOKEN_FILE_MAGIC + struct.pack("<I", len(prompts)) + counts.tobytes() + body.tobytes()


def decode_token_file(data: bytes) -> list[np.ndarray]:
    if data[:8] != TOKEN_FILE_MAGIC or len(data) < 12:
        raise TraceError("not a parity token file (bad magic)")
    (n,) = struct.unpack_from("<I", data, 8)
    if len(data) < 12 + 4 * n or (len(data) - 12) % 4:
        raise TraceError(f"token file of {len(data)} bytes cannot hold the {n} requests its header names")
    counts = np.frombuffer(data, dtype="<u4", count=n, offset=12)
    body = np.frombuffer(data, dtype="<u4", offset=12 + 4 * n)
    if int(counts.sum()) != body.size:
        raise TraceError(f"token file holds {body.size} tokens, its header says {int(counts.sum())}")
    ends = np.cumsum(counts.astype(np.int64))
    return [body[end - count:end] for count, end in zip(counts.astype(np.int64), ends)]


class TokenShift:
    """A bijection on the vocabulary's ordinary token IDs; special tokens map to themselves.

    Applied tokenwise, it keeps lengths and every equality between positions, hence every shared
    prefix, while changing every ordinary token, so shifted prompts share no cache block with the
    originals.
    """

    def __init__(self, vocab_size: int, special_ids: set[int]):
        ordinary = np.array([i for i in range(vocab_size) if i not in special_ids], dtype=np.int64)
        self._ordinary = ordinary
        self._position = np.full(vocab_size, -1, dtype=np.int64)
        self._position[ordinary] = np.arange(ordinary.size)

    @property
    def period(self) -> int:
        return int(self._ordinary.size)

    def apply(self, tokens: np.ndarray, shift: int) -> np.ndarray:
        position = self._position[tokens.astype(np.int64)]
        out = tokens.astype("<u4").copy()
        ordinary = position >= 0
        # the shift reduced first: the same shift, and no int64 overflow for one past 2**63 (an outsider's, 2026-12-07)
        out[ordinary] = self._ordinary[(position[ordinary] + shift % self.period) % self.period]
        return out


# ---- inputs ------------------------------------------------------------------------------------

def utf8_line(path: Path, number: int, raw: bytes) -> str:
    """Line `number` of the text file `path`, decoded; one that is not UTF-8 is named by file and number."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def not_a_folder(corpus: Path) -> None:
    """A folder given as the corpus is named as such (the CLI asks as it reads --corpus, before --out is checked)."""
    if corpus.is_dir():
        raise TraceError(f"corpus {corpus} is a folder: give its JSONL file")


def load_articles(corpus: Path, text_field: str = "article") -> list[str]:
    """Article texts from a JSONL corpus, in file order; each bad line is named."""
    not_a_folder(corpus)
    if not corpus.is_file():
        raise TraceError(f"corpus {'is not a regular file' if corpus.exists() else 'not found'}: {corpus}")
    texts = []
    with corpus.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = utf8_line(corpus, number, raw)
            if not line.strip():
                continue
            try:
                row = loads(line)
            except ValueError as exc:
                raise json_line_error(corpus, number, exc) from None
            text = row.get(text_field) if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise TraceError(f"{corpus}:{number}: no non-empty text field {text_field!r}")
            texts.append(text)
    if not texts:
        raise TraceError(f"corpus {corpus} holds no articles")
    return texts


class TraceTokenizer:
    """A Hugging Face tokenizer directory (its `tokenizer.json`), as the trace builder needs it."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise TraceError(f"tokenizer {'is not a regular file' if path.exists() else 'not found'}: {path} (expected a "
                             "Hugging Face tokenizer directory)")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises plain Exceptions on bad files
            raise TraceError(f"cannot load tokenizer {path}: {exc}") from None
        self.path = path
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        if self.vocab_size - len(self.special_ids) < 2:  # the warm-ups shift ordinary IDs: they need two at least
            raise TraceError(f"tokenizer {path} has {self.vocab_size - len(self.special_ids)} ordinary token IDs "
                             "(its vocabulary less its special tokens): a trace needs two at least")
        self.leading_special = self._tok.encode("", add_special_tokens=True).ids
        unk = getattr(self._tok.model, "unk_token", None)
        self._unk_id = self._tok.token_to_id(unk) if unk else None

    def encode(self, texts: list[str], what: str) -> list[np.ndarray]:
        """Token IDs without special tokens; text the tokenizer cannot represent is an error."""
        try:
            encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        except Exception as exc:
            raise TraceError(f"tokenizer {self.path} cannot encode {what}: {exc}") from None
        out = []
        for index, (text, enc) in enumerate(zip(texts, encodings)):
            ids = np.asarray(enc.ids, dtype="<u4")
            unknown = int(np.count_nonzero(ids == self._unk_id)) if self._unk_id is not None else 0
            if (text and ids.size == 0) or unknown:
                raise TraceError(
                    f"tokenizer {self.path} cannot encode {what} {index}: "
                    f"{unknown} unknown tokens in {ids.size}")
            if ids.size and int(ids.max()) >= self.vocab_size:
                raise TraceError(f"tokenizer {self.path} produced id {int(ids.max())} >= vocab size {self.vocab_size}")
            out.append(ids)
        return out


def build_documents(articles: list[np.ndarray], separator: np.ndarray, leading: list[int],
                    spec: TraceSpec) -> tuple[list[np.ndarray], int]:
    """Exactly `prefix_tokens`-token document prefixes, taken from the corpus in order.

    Packed: consecutive articles joined by a separator until the prefix is full (CNN/DailyMail
    articles are far shorter than 8K tokens). Unpacked: one article per document, which must be
    long enough. With `head_tokens`, one more prefix is built first and its first `head_tokens`
    tokens open every document (a shared system prompt), each document's own text filling the rest.
    Returns the prefixes and how many articles were used.
    """
    need = spec.prefix_tokens - len(leading)
    documents, cursor = [], 0
    for doc in range(spec.documents + (1 if spec.head_tokens else 0)):
        parts, have = [np.asarray(leading, dtype="<u4")], 0
        while have < need:
            if cursor >= len(articles):
                raise TraceError(
                    f"corpus ran out at document {doc} of {spec.documents}: {len(articles)} articles "
                    f"cannot fill {spec.documents} prefixes of {spec.prefix_tokens} tokens")
            article = articles[cursor]
            cursor += 1
            if not spec.pack_articles and article.size < need:
                raise TraceError(
                    f"document {doc} (article {cursor - 1}) has {article.size + len(leading)} tokens, "
                    f"shorter than the requested prefix of {spec.prefix_tokens}")
            if have:
                parts.append(separator)
                have += separator.size
            parts.append(article)
            have += article.size
            if not spec.pack_articles:
                break
        documents.append(np.concatenate(parts)[: spec.prefix_tokens].astype("<u4"))
    if spec.head_tokens:
        head, own = documents[0][: spec.head_tokens], spec.prefix_tokens - spec.head_tokens
        documents = [np.concatenate([head, d[len(leading): len(leading) + own]]) for d in documents[1:]]
    return documents, cursor


def asked(spec: TraceSpec) -> list[tuple[int, int, int]]:
    """(document, question, repeat) of each request. The study's: every document, questions 0..N-1. With
    `zipf` (hot documents): as many requests, each one's document drawn (seeded) with probability
    proportional to 1/rank^zipf; a document's k-th request asks question k mod 8, and past the eighth the
    same questions again (repeat k // 8), so a hot document queues many requests on one prefix."""
    if not spec.zipf:
        return [(d, q, 0) for d in range(spec.documents) for q in range(spec.questions_per_document)]
    weights = 1.0 / np.arange(1, spec.documents + 1) ** spec.zipf
    drawn = np.random.default_rng(spec.seed).choice(spec.documents, spec.documents * spec.questions_per_document,
                                                     p=weights / weights.sum())
    seen = [0] * spec.documents
    out = []
    for d in (int(x) for x in drawn):
        out.append((d, seen[d] % len(QUESTIONS), seen[d] // len(QUESTIONS)))
        seen[d] += 1
    return out


def burst_order(spec: TraceSpec, request_ids: list[str], turns: dict[str, int] | None = None) -> list[str]:
    """Shuffle by SHA-256 of (seed, id): recorded, version-independent, and blind to other requests. Conversations
    (`turns`: each request's turn): every chat's first turn, then every second turn, each turn's requests shuffled
    so: a turn is asked after the answer before it."""
    return sorted(request_ids, key=lambda rid: ((turns or {}).get(rid, 0),
                                                hashlib.sha256(f"{spec.seed}:{rid}".encode()).digest()))


def conversation_prompt(documents: list[np.ndarray], questions: list[np.ndarray], d: int, q: int,
                        answer_tokens: int) -> np.ndarray:
    """Turn `q` of document `d`'s chat: the document, each earlier question with its answer, then question `q`.
    An answer is `answer_tokens` of real text, the end of another document (the one `j + 1` after it for turn
    `j`), so a chat's prompt grows by a question and an answer a turn and its earlier turns are its prefix."""
    parts = [documents[d]]
    for j in range(q):
        parts += [questions[j], documents[(d + 1 + j) % len(documents)][-answer_tokens:]]
    return np.concatenate([*parts, questions[q]])


# ---- building ----------------------------------------------------------------------------------

def trace_path(out_dir: Path, name: str, part: str = "manifest") -> Path:
    """Where a trace named `name` keeps `part` in `out_dir`, the one home of these names (build_trace, write_subset,
    trace_mooncake.convert and the commands' checks): the manifest NAME.json, the prompts NAME.tokens ("tokens"),
    a warm-up round's NAME.warmupK.tokens ("warmupK"), its recorded arrivals NAME.replay.json ("replay")."""
    suffix = {"manifest": "json", "tokens": "tokens", "replay": "replay.json"}.get(part, f"{part}.tokens")
    return out_dir / f"{name}.{suffix}"


def trace_files(out_dir: Path, name: str, warmups: int, *, replay: bool = False) -> list[Path]:
    """Every file a trace named `name` is written as in `out_dir` (`trace_path`), with `warmups` rounds and, with
    `replay`, recorded arrivals. A command checks them before it writes (none may be one of its inputs)."""
    parts = ["manifest", "tokens", *(f"warmup{k}" for k in range(1, warmups + 1)), *(["replay"] if replay else [])]
    return [trace_path(out_dir, name, part) for part in parts]


def build_trace(spec: TraceSpec, corpus: Path, tokenizer_dir: Path, out_dir: Path, *,
                text_field: str = "article", corpus_origin: str = "other",
                tokenizer_origin: str = "other", context_tokens: int | None = None) -> Path:
    """Build the measured burst and its warmup variants; write token files, then the manifest.

    A burst whose prompts do not fit the study's context is refused before anything is written;
    `context_tokens` names a larger (or smaller) engine context, recorded in the manifest, to build for.
    """
    spec.check()
    if context_tokens is not None and context_tokens < 1:
        raise TraceError(f"context tokens must be >= 1, got {context_tokens}")
    tokenizer = TraceTokenizer(tokenizer_dir)
    shift = TokenShift(tokenizer.vocab_size, tokenizer.special_ids)
    _check_block_shifts(spec.blocks, shift.period)
    texts = load_articles(corpus, text_field)
    separator = tokenizer.encode([ARTICLE_SEPARATOR], "the article separator")[0]
    articles = tokenizer.encode(texts, "article")
    documents, articles_used = build_documents(articles, separator, tokenizer.leading_special, spec)
    questions = tokenizer.encode(
        [QUESTION_TEMPLATE.format(question=q) for q in QUESTIONS[: spec.questions_per_document]], "question")

    prompts_by_id = {}
    if spec.zipf:
        questions = tokenizer.encode([QUESTION_TEMPLATE.format(question=q) for q in QUESTIONS], "question")
    for d, q, n in asked(spec):
        prompts_by_id[f"{spec.name}-d{d:04d}-q{q}" + (f"-n{n}" if n else "")] = (
            d, q, conversation_prompt(documents, questions, d, q, spec.answer_tokens) if spec.answer_tokens
            else np.concatenate([documents[d], questions[q]]))
    order = burst_order(spec, list(prompts_by_id),
                        {rid: q for rid, (_, q, _) in prompts_by_id.items()} if spec.answer_tokens else None)
    prompts = [prompts_by_id[rid][2] for rid in order]

    asked_as = [(rid, *prompts_by_id[rid][:2]) for rid in order]
    if spec.blocks > 1:  # BLOCK_SHIFT: the first block again, shifted, as many times as asked
        first = list(zip(asked_as, prompts))
        for block in range(1, spec.blocks):
            asked_as += [(f"{rid}-b{block}", d + block * spec.documents, q) for (rid, d, q), _ in first]
            prompts += [shift.apply(p, block * BLOCK_SHIFT) for _, p in first]
    variants = [[shift.apply(p, s) for p in prompts] for s in spec.warmup_shifts]
    check_unseen(prompts, variants, spec.warmup_shifts, shift.period, len(order) if spec.blocks > 1 else None)
    order = [rid for rid, _, _ in asked_as]
    requests = [{"id": rid, "position": pos, "document": d, "question": q,
                 "tokens": int(prompt.size), "sha256": token_sha256(prompt)}
                for pos, ((rid, d, q), prompt) in enumerate(zip(asked_as, prompts))]
    context = {} if context_tokens is None else {"context_tokens": context_tokens}
    _check_fits([TraceRequest(**r) for r in requests], *trace_context(context), f"trace {spec.name}")

    manifest_path = trace_path(out_dir, spec.name)
    with all_or_nothing(manifest_path):  # a full disk leaves no half trace
        out_dir.mkdir(parents=True, exist_ok=True)
        tokens_path = trace_path(out_dir, spec.name, "tokens")
        atomic_write_bytes(tokens_path, encode_token_file(prompts))
        warmups = []
        for round_index, (s, variant) in enumerate(zip(spec.warmup_shifts, variants), start=1):
            path = trace_path(out_dir, spec.name, f"warmup{round_index}")
            atomic_write_bytes(path, encode_token_file(variant))
            warmups.append({"round": round_index, "shift": s, "tokens": file_ref(path, out_dir)})

        tokens_ref = file_ref(tokens_path, out_dir)
        doc = header("trace", simulated=False) | {
            "name": spec.name,
            "spec": {"documents": spec.documents, "questions_per_document": spec.questions_per_document,
                     "prefix_tokens": spec.prefix_tokens, "seed": spec.seed,
                     "warmup_shifts": list(spec.warmup_shifts), "pack_articles": spec.pack_articles,
                     "head_tokens": spec.head_tokens, **({"zipf": spec.zipf} if spec.zipf else {}),
                     **({"blocks": spec.blocks, "block_shift": BLOCK_SHIFT} if spec.blocks > 1 else {}),
                     **({"answer_tokens": spec.answer_tokens} if spec.answer_tokens else {})},
            "inputs": {
                "corpus": {"file": file_ref(corpus, out_dir), "origin": corpus_origin,
                           "text_field": text_field, "articles": len(texts), "articles_used": articles_used},
                "tokenizer": {"file": file_ref(tokenizer.path, out_dir), "origin": tokenizer_origin,
                              "vocab_size": tokenizer.vocab_size, "special_token_ids": sorted(tokenizer.special_ids)},
            },
            "format": TOKEN_FILE_FORMAT,
            "tokens": tokens_ref,
            "trace_sha256": tokens_ref["sha256"],
            "num_requests": len(prompts),
            "total_tokens": int(sum(p.size for p in prompts)),
            "warmups": warmups,
            **context,
            "requests": requests,
        }
        write_manifest(manifest_path, doc)
    return manifest_path


def _check_block_shifts(blocks: int, period: int) -> None:
    """Before anything is built: blocks whose shifts (BLOCK_SHIFT each) meet again in the vocabulary's period would
    reproduce one another's cache blocks, which `check_unseen` finds only once every block is built (a billion blocks
    filled the memory first: an outsider's, 2026-12-07)."""
    if blocks > 1 and len({block * BLOCK_SHIFT % period for block in range(min(blocks, period + 1))}) < blocks:
        raise TraceError(f"blocks: {blocks} blocks shifted by {BLOCK_SHIFT} meet again within the vocabulary's period "
                         f"({period} ordinary token IDs), reproducing one another's cache blocks: fewer blocks")


def check_unseen(prompts, variants, shifts, period, block_size: int | None = None,
                 advice: str = "choose another shift") -> None:
    """Every warmup prompt's first cache block differs from every measured and other-round one; with blocks of
    `block_size` measured prompts (BLOCK_SHIFT), every block's from every other block's. `advice` ends the refusal
    of a shift that repeats a block (what the caller can change)."""
    seen = {}
    for index, p in enumerate(prompts):
        label = "the measured burst" if not block_size else f"block {index // block_size} of the measured burst"
        key = bytes(p[:VLLM_BLOCK_TOKENS].tobytes())
        if seen.get(key, label) != label:
            raise TraceError(f"{label} reproduces a first cache block of {seen[key]}; BLOCK_SHIFT meets the "
                             f"vocabulary's period ({period} ordinary token IDs): fewer blocks")
        seen[key] = label
    for s, variant in zip(shifts, variants):
        if s % period == 0:
            raise TraceError(f"warmup shift {s} is a multiple of the {period} ordinary token IDs: no shift at all")
        label = f"warmup shift {s}"
        for p in variant:
            key = bytes(p[:VLLM_BLOCK_TOKENS].tobytes())
            if key in seen and seen[key] != label:
                raise TraceError(f"{label} reproduces a first cache block of {seen[key]}; {advice}")
        seen.update({bytes(p[:VLLM_BLOCK_TOKENS].tobytes()): label for p in variant})


# ---- loading -----------------------------------------------------------------------------------

def read_replay(manifest: dict, manifest_path: Path) -> dict:
    """A recorded trace's arrivals and output lengths (NAME.replay.json, `parity trace-mooncake`), checked before any
    run or subset uses them: the file its manifest names, with the SHA-256 it records, JSON holding one arrival (s,
    finite, >= 0) and one output length (an integer >= 0) per request. An edited file would replay other arrivals
    and lengths than the trace records, and be copied into each shard's trace under a fresh hash."""
    import math

    ref = manifest["replay"]
    path = manifest_path.parent / ref["path"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"replay file missing: {path} (named by {manifest_path})") from None
    except OSError as exc:
        raise TraceError(f"replay file {path} cannot be read ({exc.strerror or exc}; named by {manifest_path})") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref["sha256"]:
        raise TraceError(f"replay file {path} has SHA-256 {actual}, its manifest {manifest_path} says {ref['sha256']}")
    try:
        doc = loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"replay file {path}: not valid JSON ({one_line(str(exc))})") from None
    count = len(manifest["requests"])
    arrivals = doc.get("arrivals") if isinstance(doc, dict) else None
    lengths = doc.get("output_lengths") if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or set(doc) != {"arrivals", "output_lengths"} or not isinstance(arrivals, list)
            or not isinstance(lengths, list) or len(arrivals) != count or len(lengths) != count
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
                       for t in arrivals)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths)):
        raise TraceError(f"replay file {path}: expected {{\"arrivals\": [...], \"output_lengths\": [...]}}, one "
                         f"arrival (seconds, >= 0) and one output length (an integer >= 0) for each of the {count} "
                         f"requests of {manifest_path}")
    return doc


def load_trace(manifest_path: Path, variant: str = "measured") -> Trace:
    """Load a trace variant ("measured", "warmup1", "warmup2", ...) and verify it against its manifest.

    Refused, in one line naming the file and the request: a manifest that is not a valid trace (no
    requests, a repeated request id, counts that disagree), a token file that does not match it, and
    a token ID outside the vocabulary the manifest records (an engine would fail on it, or worse).
    """
    from parity.manifest import ManifestError, read_manifest

    try:
        manifest = read_manifest(manifest_path)
    except ManifestError as exc:
        raise TraceError(str(exc)) from None
    if manifest.get("kind") != "trace":
        raise TraceError(f"{manifest_path} is not a trace manifest (kind {manifest.get('kind')!r})")
    manifest_sha256 = sha256_file(manifest_path)
    if manifest_sha256 not in _CHECKED_MANIFESTS:  # a trace is loaded per round of every trial: check it once
        _check_manifest(manifest, manifest_path)
        _CHECKED_MANIFESTS.add(manifest_sha256)
    trace = _load_variant(manifest, manifest_path, variant, manifest_sha256)
    if "replay" in manifest:  # by hash, as its token files are: before a run replays it or a subset copies it
        trace = replace(trace, replay=read_replay(manifest, manifest_path))
    return trace


def engine_problems(manifest_path: Path, doc: dict) -> list[str]:
    """Why an engine would refuse this trace, one line each; [] when none (`parity validate` reports them).

    The checks `load_trace` makes before a run (valid manifest, request ids listed once, every variant's
    token file matching it, token IDs inside the recorded vocabulary, measured requests matching their
    SHA-256), and `check_context`'s: every prompt, with the study's new tokens, fits the context. The
    context is the one the manifest records (`context_tokens`, `parity trace --context-tokens`), else the
    study's engines' max_model_len (EngineArgs' default; no config of the study changes it). Not the
    model's max_position_embeddings (131,072 for Llama 3.1): a 40,000-token prompt fits that, yet every
    engine of the study, at 32,768, refuses it. Bad content gives reasons, never an exception.
    """
    if not isinstance(doc, dict):
        return [f"{manifest_path}: not a JSON object"]
    try:
        _check_manifest(doc, manifest_path)
        manifest_sha256 = sha256_file(manifest_path)
    except (TraceError, OSError) as exc:
        return [str(exc)]
    problems = []
    for variant in ["measured", *(f"warmup{w['round']}" for w in doc["warmups"])]:
        try:
            _load_variant(doc, manifest_path, variant, manifest_sha256)
        except (TraceError, OSError) as exc:
            problems.append(str(exc))
    if "replay" in doc:
        try:
            read_replay(doc, manifest_path)
        except TraceError as exc:
            problems.append(str(exc))
    try:
        requests = tuple(TraceRequest(**r) for r in doc["requests"])
        _check_fits(requests, *trace_context(doc), f"trace {manifest_path}")
    except TraceError as exc:
        problems.append(str(exc))
    return problems


def derived_problems(manifest_path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for what a trace manifest states that its content and inputs do not give (`parity.rederive`):
    `engine_problems`, then, where those pass, the trace built again (`build_trace`, into a scratch folder) from
    the corpus and tokenizer it links (by hash, checked before this) with the spec it states: its spec, requests
    (document, question, length, hash, order), warm-up shifts, token files and counts must come out the same. A
    forged prefix length, seed or shift so disagrees with the tokens. Recorded as given: the inputs' origins. A
    trace of another source (`parity trace-mooncake`) is not built here."""
    import tempfile

    found = [("", why) for why in engine_problems(manifest_path, doc)]
    folder = Path(manifest_path).parent
    if found:
        return found
    if "parent" in doc:  # a subset (`write_subset`): its parent's requests at its positions
        return _subset_problems(folder, doc)
    if "source" in doc["spec"]:
        return []
    spec, inputs = doc["spec"], doc["inputs"]
    try:
        wanted = TraceSpec(name=doc["name"], documents=spec["documents"],
                           questions_per_document=spec["questions_per_document"], prefix_tokens=spec["prefix_tokens"],
                           seed=spec["seed"], warmup_shifts=tuple(spec["warmup_shifts"]),
                           pack_articles=spec["pack_articles"], head_tokens=spec["head_tokens"],
                           zipf=spec.get("zipf", 0.0), blocks=spec.get("blocks", 1),
                           answer_tokens=spec.get("answer_tokens", 0))
        with tempfile.TemporaryDirectory(prefix="parity-trace-") as scratch:
            corpus, tokenizer = folder / inputs["corpus"]["file"]["path"], folder / inputs["tokenizer"]["file"]["path"]
            built = json.loads(build_trace(
                wanted, corpus, tokenizer.parent, Path(scratch), text_field=inputs["corpus"]["text_field"],
                corpus_origin=inputs["corpus"]["origin"], tokenizer_origin=inputs["tokenizer"]["origin"],
                context_tokens=doc.get("context_tokens")).read_text())
    except (ParityError, KeyError, TypeError, ValueError, OSError) as exc:
        return [("/spec", f"cannot be built again from its inputs and spec: {' '.join(str(exc).split())}")]
    for part in ("corpus", "tokenizer"):  # where the scratch build found them is not where the trace lies
        built["inputs"][part]["file"]["path"] = inputs[part]["file"]["path"]
    for key in sorted(set(built) | set(doc)):
        if key not in ("parity_version", "schema_version") and built.get(key) != doc.get(key):
            pointer, stated, given = first_difference(f"/{key}", doc.get(key), built.get(key))
            found.append((pointer, f"states {one_line(repr(stated), 100)}, the trace built again from its inputs "
                                   f"and spec gives {one_line(repr(given), 100)}"))
            break  # one forged number moves many after it: the first says where
    return found


def _subset_problems(folder: Path, doc: dict) -> list[tuple[str, str]]:
    """A subset trace against the parent it links (by hash, checked before this; the parent is derived in turn):
    the same spec and warm-up shifts, and the parent's requests at its positions."""
    try:
        parent = json.loads((folder / doc["parent"]["manifest"]["path"]).read_text(encoding="utf-8"))
        positions = doc["parent"]["positions"]
        derived = {"spec": parent["spec"], "warmups": [w["shift"] for w in parent["warmups"]],
                   "requests": [dict(parent["requests"][i], position=new) for new, i in enumerate(positions)]}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return [("/parent", f"its parent cannot be read again: {' '.join(str(exc).split())}")]
    stated = {"spec": doc["spec"], "warmups": [w["shift"] for w in doc["warmups"]], "requests": doc["requests"]}
    if stated == derived:
        return []
    pointer, was, given = first_difference("", stated, derived)
    return [(pointer, f"states {one_line(repr(was), 100)}, its parent trace at its positions gives "
                      f"{one_line(repr(given), 100)}")]


def trace_context(doc: dict) -> tuple[int, int, str]:
    """(context tokens, new tokens, its name) a trace's prompts must fit: the one it records, else the study's."""
    if "context_tokens" in doc:
        return doc["context_tokens"], OUTPUT_TOKENS, "its recorded context_tokens"
    return MAX_MODEL_LEN, OUTPUT_TOKENS, "the study's max_model_len"


def _load_variant(manifest: dict, manifest_path: Path, variant: str, manifest_sha256: str) -> Trace:
    """One variant of a checked manifest: its token file, by hash, then every prompt's token IDs."""
    if variant == "measured":
        ref = manifest["tokens"]
    else:
        rounds = {f"warmup{w['round']}": w["tokens"] for w in manifest["warmups"]}
        if variant not in rounds:
            raise TraceError(f"{manifest_path} has no variant {variant!r}; it has measured, {', '.join(rounds)}")
        ref = rounds[variant]
    path = manifest_path.parent / ref["path"]
    if not path.is_file():
        raise TraceError(f"trace file missing: {path} (named by {manifest_path})")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref["sha256"]:
        raise TraceError(f"trace file {path} has SHA-256 {actual}, its manifest {manifest_path} says {ref['sha256']}")
    try:
        prompts = decode_token_file(data)
    except TraceError as exc:
        raise TraceError(f"trace file {path}: {exc}") from None
    requests = tuple(TraceRequest(**r) for r in manifest["requests"])
    if len(prompts) != len(requests) or any(p.size != r.tokens for p, r in zip(prompts, requests)):
        raise TraceError(f"trace file {path} does not hold the requests its manifest lists")
    vocab = manifest["inputs"]["tokenizer"]["vocab_size"]
    for prompt, request in zip(prompts, requests):
        outside = out_of_vocab(prompt, vocab)
        if outside is not None:
            raise TraceError(f"trace file {path}: request {request.id} holds token ID {outside}, outside "
                             f"the vocabulary of {vocab} that {manifest_path} records")
    if variant == "measured":
        for prompt, request in zip(prompts, requests):
            if token_sha256(prompt) != request.sha256:
                raise TraceError(f"request {request.id} in {path} does not match its SHA-256 in {manifest_path}")
    return Trace(name=manifest["name"], variant=variant, sha256=actual, requests=requests,
                 prompts=tuple(prompts), manifest_path=manifest_path, manifest_sha256=manifest_sha256)


_CHECKED_MANIFESTS: set[str] = set()  # SHA-256 of trace manifests that passed _check_manifest


def _check_manifest(manifest: dict, manifest_path: Path) -> None:
    """A trace manifest that is schema-valid and agrees with itself: requests listed once each, in burst order."""
    from parity.manifest import validate_document

    if manifest.get("requests") == [] or manifest.get("num_requests") == 0:
        raise TraceError(f"trace {manifest_path} holds no requests")
    problems = validate_document(manifest, path=manifest_path)
    if problems:
        raise TraceError(f"not a valid trace manifest: {first_problem(problems)}")
    seen = set()
    for index, request in enumerate(manifest["requests"]):
        if request["id"] in seen:
            raise TraceError(f"trace {manifest_path}: request id {request['id']} is listed more than once")
        seen.add(request["id"])
        if request["position"] != index:
            raise TraceError(f"trace {manifest_path}: request {request['id']} is listed at {index} with position "
                             f"{request['position']}")
    if manifest["trace_sha256"] != manifest["tokens"]["sha256"]:
        raise TraceError(f"trace {manifest_path}: trace_sha256 is not the SHA-256 of its measured token file")
    counts = {"num_requests": len(manifest["requests"]), "total_tokens": sum(r["tokens"] for r in manifest["requests"])}
    for key, value in counts.items():
        if manifest[key] != value:
            raise TraceError(f"trace {manifest_path}: {key} is {manifest[key]}, its requests give {value}")


def check_context(trace: Trace, context_tokens: int, new_tokens: int | list[int], context_name: str) -> None:
    """Every prompt with the new tokens it asks for (the same for all, or each its own in burst order) fits a
    context of `context_tokens` (the engine's, named)."""
    _check_fits(trace.requests, context_tokens, new_tokens, context_name, f"trace {trace.manifest_path}")


def _check_fits(requests, context_tokens: int, new_tokens: int | list[int], context_name: str, where: str) -> None:
    if isinstance(new_tokens, list):  # each its own: the first that does not fit
        longest, new_tokens = next(((r, n) for r, n in zip(requests, new_tokens) if r.tokens + n > context_tokens),
                                   (requests[0], 0))
    else:
        longest = max(requests, key=lambda r: r.tokens)
    if longest.tokens + new_tokens > context_tokens:
        raise TraceError(f"{where}: request {longest.id} has {longest.tokens} prompt tokens; with "
                         f"{new_tokens} new tokens it does not fit {context_name} {context_tokens}")


# ---- subsets -----------------------------------------------------------------------------------

def write_subset(manifest_path: Path, positions: list[int], name: str, out_dir: Path) -> Path:
    """A trace of some of a trace's requests (e.g. one shard's), in burst order, with the same warmups.

    Token files and hashes are rewritten for the subset; `parent` links the original by hash, so a
    shard's offline run is checked against exactly the prompts the shard would have received.
    """
    from parity.manifest import file_ref, read_manifest, rebase, write_manifest

    if not positions:
        raise TraceError(f"an empty subset of {manifest_path}")
    measured = load_trace(manifest_path)  # the manifest checked, and its replay: before anything is written
    parent, recorded = read_manifest(manifest_path), measured.replay
    out = trace_path(out_dir, name)
    with all_or_nothing(out):  # a full disk leaves no half trace
        out_dir.mkdir(parents=True, exist_ok=True)
        tokens_path = trace_path(out_dir, name, "tokens")
        atomic_write_bytes(tokens_path, encode_token_file([measured.prompts[i] for i in positions]))
        warmups = []
        for warm in parent["warmups"]:
            variant = _load_variant(parent, manifest_path, f"warmup{warm['round']}", measured.manifest_sha256)
            path = trace_path(out_dir, name, f"warmup{warm['round']}")
            atomic_write_bytes(path, encode_token_file([variant.prompts[i] for i in positions]))
            warmups.append({"round": warm["round"], "shift": warm["shift"], "tokens": file_ref(path, out_dir)})
        tokens_ref = file_ref(tokens_path, out_dir)
        requests = [dict(parent["requests"][i], position=new) for new, i in enumerate(positions)]
        inputs = {key: value | ({"file": rebase(value["file"], manifest_path.parent, out_dir)} if "file" in value else {})
                  for key, value in parent["inputs"].items()}  # the corpus (or source) and tokenizer, linked from here
        doc = dict(parent) | {
            "name": name, "inputs": inputs, "tokens": tokens_ref, "trace_sha256": tokens_ref["sha256"], "warmups": warmups,
            "num_requests": len(requests), "total_tokens": sum(r["tokens"] for r in requests), "requests": requests,
            "parent": {"manifest": file_ref(manifest_path, out_dir), "name": parent["name"], "positions": list(positions)},
        }
        if recorded is not None:  # a Mooncake trace's arrivals (parity.trace_mooncake): the subset's own, in its order
            replay = trace_path(out_dir, name, "replay")
            atomic_write_bytes(replay, dumps({key: [values[i] for i in positions] for key, values in recorded.items()}).encode())
            doc["replay"] = file_ref(replay, out_dir)
        write_manifest(out, doc)
    return out
