"""Mooncake's published request traces (FAST'25, kvcache-ai/Mooncake) as parity traces: real sharing, real arrivals.

A Mooncake trace is JSON lines, one request each: `timestamp` (ms), `input_length`, `output_length` and
`hash_ids`, the prompt's 512-token blocks in order (the last may be partial); equal hash ids are equal
content. It carries no text, so each distinct hash id becomes a deterministic block of 512 token IDs,
hashed from (seed, hash id, position) over the tokenizer's ordinary IDs (or 0..vocab_size-1): requests
that share k leading hash ids share exactly k x 512 leading tokens, and no others do but by chance.
A request that does not fit the context is counted, listed by line and excluded, never cut.
Timestamps become arrivals in seconds from the first, written as a replay schedule's file; one more than a week
after the first is refused (a replay runs in real time: that is a unit slip, not a trace).
Malformed input is refused in one line naming the line; nothing is written before the whole file is read (with a
limit, up to its last kept request: the lines after it are not read, and the summary says so).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.manifest import all_or_nothing, atomic_write_bytes, dumps, file_ref, header, strict_loads, write_manifest
from parity.study import MAX_MODEL_LEN, OUTPUT_TOKENS
from parity.trace import (
    TOKEN_FILE_FORMAT,
    VLLM_BLOCK_TOKENS,
    TokenShift,
    TraceError,
    TraceSpec,
    TraceTokenizer,
    encode_token_file,
    check_unseen,
    json_line_error,
    token_sha256,
    trace_files,
    trace_path,
    utf8_line,
)

BLOCK_TOKENS = 512  # what one Mooncake hash id names
DOCUMENT_BLOCKS = 2  # a request's "document" for the hindsight bound: its first two blocks (a head, then its own)
DEFAULT_VOCAB = 128_000  # Llama 3.1's ordinary token IDs (its special tokens lie above)
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_SPAN_MS = 7 * 24 * 3600 * 1000  # a replay runs in real time: a longer span is a unit slip (us, an epoch), not a trace
JSON_SPACE = " \t\r\n"  # what JSON calls whitespace: a line of only these is blank, any other character is read
EXCLUSION = (f"a request whose input_length plus max(output_length, {OUTPUT_TOKENS}) exceeds context_tokens is "
             "excluded from the trace, counted in over_context and listed by line in over_context_lines; none is cut")


@dataclass(frozen=True)
class MooncakeRequest:
    """One line of a Mooncake trace, checked."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class MooncakeTrace:
    """A Mooncake file read: the requests that fit the context, in file order, and what was left out."""

    path: Path
    requests: tuple[MooncakeRequest, ...]
    lines_read: int
    requests_read: int
    over_context_lines: tuple[int, ...]
    context_tokens: int


def _shown(value) -> str:
    """A bad value as an error quotes it: whole when short, its head and length when not (a line is one line)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _parse_line(text: str, number: int, where: str) -> MooncakeRequest:
    try:
        row = strict_loads(text)  # a key given twice is refused, not read as its last value
    except ValueError as exc:
        raise json_line_error(where, number, exc) from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}:{number}: expected a JSON object, got {type(row).__name__}")
    for field in FIELDS:
        if field not in row:
            raise TraceError(f"{where}:{number}: missing field {field!r}")
    for field in FIELDS[:3]:
        value = row[field]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TraceError(f"{where}:{number}: {field} must be an integer, got {_shown(value)}")
        if value < (1 if field == "input_length" else 0):
            raise TraceError(f"{where}:{number}: {field} must be >= {1 if field == 'input_length' else 0}, got {value}")
        if value >= 2**63:  # as hash ids: a timestamp past int64 overflowed the arrivals' float division
            raise TraceError(f"{where}:{number}: {field} must be below 2**63, got {_shown(value)}")
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not ids:
        raise TraceError(f"{where}:{number}: hash_ids must be a non-empty list of integers, got {_shown(ids)}")
    for value in ids:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:  # kept as int64
            raise TraceError(f"{where}:{number}: hash_ids must be integers from 0 to 2**63 - 1, got {_shown(value)}")
    blocks = -(-row["input_length"] // BLOCK_TOKENS)
    if blocks != len(ids):
        raise TraceError(f"{where}:{number}: input_length {row['input_length']} is {blocks} blocks of {BLOCK_TOKENS} "
                         f"tokens, hash_ids names {len(ids)}")
    return MooncakeRequest(number, row["timestamp"], row["input_length"], row["output_length"], tuple(ids))


MAX_CONTEXT_TOKENS = 2**21  # past the longest context models serve: a larger one only let a 2 MB line (one request
# of 262,144 blocks) become 1.5 GB of token IDs in memory (outside pass Q)
MAX_TRACE_TOKENS = 2**28  # the kept requests' tokens together: 1 GiB of token IDs, held at once while writing


def read_mooncake(path: Path, *, context_tokens: int = MAX_MODEL_LEN, limit: int | None = None) -> MooncakeTrace:
    """Every line checked, in order (timestamps never decrease); those over the context set aside; at most
    `limit` requests kept (the first that fit), reading stops there."""
    if not 1 <= context_tokens <= MAX_CONTEXT_TOKENS:
        raise TraceError(f"max model len must be 1 to {MAX_CONTEXT_TOKENS:,} tokens, got {context_tokens}")
    if limit is not None and limit < 1:
        raise TraceError(f"limit must be >= 1, got {limit}")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceError(f"Mooncake trace not found: {path}") from None
    except OSError as exc:  # a loop of links, a name too long: named as what it is, not as missing
        raise TraceError(f"Mooncake trace {path}: {exc.strerror or errno.errorcode.get(exc.errno, exc)}") from None
    if not stat.S_ISREG(mode):  # a folder, /dev/null, a pipe: there, but no trace file
        raise TraceError(f"Mooncake trace is not a regular file: {path}")
    kept: list[MooncakeRequest] = []
    over: list[int] = []
    try:
        with path.open("rb") as handle:
            lines = _read_lines(path, handle, limit, context_tokens, kept, over)
    except OSError as exc:  # a read the device fails (EIO) names no file by itself: named here
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    read = len(kept) + len(over)
    if not kept:
        raise TraceError(f"{path}: no request fits a context of {context_tokens} tokens "
                         f"({read} read, {len(over)} over it)" if read else f"{path}: holds no requests")
    return MooncakeTrace(path, tuple(kept), lines, read, tuple(over), context_tokens)


def _read_lines(path: Path, handle, limit: int | None, context_tokens: int, kept: list, over: list) -> int:
    """Each line checked into `kept` (fits the context) or `over` (its line number); the lines read."""
    first, last, lines, tokens = None, None, 0, 0
    for number, raw in enumerate(handle, start=1):
        if limit is not None and len(kept) >= limit:
            break
        lines = number
        text = utf8_line(path, number, raw)
        if not text.strip(JSON_SPACE):
            continue
        request = _parse_line(text, number, str(path))
        if last is not None and request.timestamp_ms < last:
            raise TraceError(f"{path}:{number}: timestamp {request.timestamp_ms} is before the previous "
                             f"request's {last} (arrivals must never decrease)")
        first = request.timestamp_ms if first is None else first
        if request.timestamp_ms - first > MAX_SPAN_MS:
            raise TraceError(f"{path}:{number}: timestamp {request.timestamp_ms} is "
                             f"{(request.timestamp_ms - first) / 86_400_000:.3g} days after the first request's "
                             f"{first}, past the {MAX_SPAN_MS // 86_400_000} days a replay may span (timestamps are ms)")
        last = request.timestamp_ms
        if request.input_length + max(request.output_length, OUTPUT_TOKENS) > context_tokens:
            over.append(number)
        else:
            kept.append(request)
            tokens += request.input_length
            if tokens > MAX_TRACE_TOKENS:
                raise TraceError(f"{path}:{number}: the requests kept so far hold {tokens:,} tokens, over the "
                                 f"{MAX_TRACE_TOKENS:,} a converted trace holds in memory: give --limit {len(kept) - 1}")
    return lines


def block_tokens(hash_ids: np.ndarray, seed: int, ordinary: np.ndarray) -> np.ndarray:
    """The 512 token IDs of each hash id, one row each: SplitMix64 of (seed, hash id, position), taken
    modulo the ordinary IDs. Plain integer arithmetic, so the same in every process and numpy version."""
    ids = np.asarray(hash_ids, dtype=np.uint64)[:, None]
    position = np.arange(BLOCK_TOKENS, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0xD1342543DE82EF95) + ids * np.uint64(0x9E3779B97F4A7C15)
             + position * np.uint64(0xBF58476D1CE4E5B9))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return ordinary[(x % np.uint64(ordinary.size)).astype(np.int64)].astype("<u4")


def prompts(trace: MooncakeTrace, *, seed: int = 0, ordinary: np.ndarray | None = None) -> list[np.ndarray]:
    """Each kept request's token IDs: its blocks in order, cut to input_length (the last block may be partial)."""
    ordinary = np.arange(DEFAULT_VOCAB, dtype=np.int64) if ordinary is None else ordinary
    distinct = np.unique(np.fromiter((h for r in trace.requests for h in r.hash_ids), dtype=np.int64))
    table = block_tokens(distinct, seed, ordinary)
    out = []
    for r in trace.requests:
        rows = table[np.searchsorted(distinct, np.asarray(r.hash_ids, dtype=np.int64))]
        out.append(rows.reshape(-1)[: r.input_length].copy())
    return out


def documents(trace: MooncakeTrace) -> list[int]:
    """Each kept request's document, numbered in order of first sight: its first DOCUMENT_BLOCKS hash ids."""
    seen: dict[tuple[int, ...], int] = {}
    return [seen.setdefault(r.hash_ids[:DOCUMENT_BLOCKS], len(seen)) for r in trace.requests]


def output_files(source: Path, out_dir: Path, name: str | None = None,
                 warmup_shifts: tuple[int, ...] = TraceSpec.warmup_shifts) -> list[Path]:
    """The files `convert` writes into `out_dir` for `source`: a parity trace with its replay file."""
    return trace_files(out_dir, default_name(source) if name is None else name, len(warmup_shifts), replay=True)


def default_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", path.stem) or "mooncake"


def convert(source: Path, out_dir: Path, *, name: str | None = None, context_tokens: int = MAX_MODEL_LEN,
            limit: int | None = None, seed: int = 0, tokenizer_dir: Path | None = None, vocab_size: int | None = None,
            warmup_shifts: tuple[int, ...] = TraceSpec.warmup_shifts) -> Path:
    """Write NAME.tokens, its warmup variants (token-shifted, as the study's), NAME.replay.json (arrivals) and,
    last, the manifest NAME.json; returns the manifest's path. The whole file is read and checked first."""
    name = default_name(source) if name is None else name  # an empty --name is refused, not the default
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise TraceError(f"trace name {name!r} must be letters, digits, '-' or '_'")
    if seed < 0:
        raise TraceError(f"seed must be >= 0, got {seed}")
    if len(set(warmup_shifts)) != len(warmup_shifts) or any(s <= 0 for s in warmup_shifts):
        raise TraceError(f"warmup shifts must be distinct positive integers, got {list(warmup_shifts)}")
    if tokenizer_dir is not None and vocab_size is not None:
        raise TraceError("give a tokenizer or a vocab size, not both")
    if tokenizer_dir is not None:
        tokenizer = TraceTokenizer(tokenizer_dir)
        vocab, specials = tokenizer.vocab_size, tokenizer.special_ids
        tok_doc = {"file": None, "origin": "tokenizer.json"}
    else:
        vocab, specials = vocab_size or DEFAULT_VOCAB, set()
        if vocab < 2:
            raise TraceError(f"vocab size must be >= 2, got {vocab}")
        tok_doc = {"origin": "vocab-size"}
    trace = read_mooncake(source, context_tokens=context_tokens, limit=limit)
    shift = TokenShift(vocab, specials)
    ordinary = np.array(sorted(set(range(vocab)) - specials), dtype=np.int64)
    measured = prompts(trace, seed=seed, ordinary=ordinary)
    # every warmup round's first cache blocks unseen in the measured prompts and the other rounds, as `parity trace`
    # checks its own (two shifts a multiple of a small vocabulary apart wrote the same round twice: an outsider's);
    # the shift is tokenwise, so the first blocks alone say it
    heads = [p[:VLLM_BLOCK_TOKENS] for p in measured]
    check_unseen(heads, [[shift.apply(h, s) for h in heads] for s in warmup_shifts], warmup_shifts, shift.period,
                 advice=f"{shift.period} ordinary token IDs are too few to keep the warm-up rounds apart: a tokenizer "
                        f"with more")
    docs, asked = documents(trace), {}
    requests = []
    for position, (r, doc, prompt) in enumerate(zip(trace.requests, docs, measured)):
        asked[doc] = asked.get(doc, -1) + 1
        requests.append({"id": f"{name}-l{r.line:06d}", "position": position, "document": doc,
                         "question": asked[doc], "tokens": int(prompt.size), "sha256": token_sha256(prompt)})

    manifest_path = trace_path(out_dir, name)
    with all_or_nothing(manifest_path):  # a full disk leaves no half trace
        out_dir.mkdir(parents=True, exist_ok=True)
        tokens_path = trace_path(out_dir, name, "tokens")
        atomic_write_bytes(tokens_path, encode_token_file(measured))
        warmups = []
        for round_index, s in enumerate(warmup_shifts, start=1):
            path = trace_path(out_dir, name, f"warmup{round_index}")
            atomic_write_bytes(path, encode_token_file([shift.apply(p, s) for p in measured]))
            warmups.append({"round": round_index, "shift": s, "tokens": file_ref(path, out_dir)})
        first = trace.requests[0].timestamp_ms
        replay_path = trace_path(out_dir, name, "replay")
        atomic_write_bytes(replay_path, dumps({
            "arrivals": [(r.timestamp_ms - first) / 1000 for r in trace.requests],
            "output_lengths": [r.output_length for r in trace.requests]}).encode())
        if tokenizer_dir is not None:
            tok_doc["file"] = file_ref(tokenizer.path, out_dir)
        tokens_ref = file_ref(tokens_path, out_dir)
        doc = header("trace", simulated=False) | {
            "name": name,
            "spec": {"source": "mooncake", "block_tokens": BLOCK_TOKENS, "seed": seed,
                     "warmup_shifts": list(warmup_shifts), "document_blocks": DOCUMENT_BLOCKS,
                     **({"limit": limit} if limit is not None else {})},
            "inputs": {
                "mooncake": {"file": file_ref(source, out_dir), "name": source.name, "lines_read": trace.lines_read,
                             "requests_read": trace.requests_read,
                             "distinct_blocks": len({h for r in trace.requests for h in r.hash_ids}),
                             "over_context": len(trace.over_context_lines),
                             "over_context_lines": list(trace.over_context_lines), "exclusion": EXCLUSION},
                "tokenizer": tok_doc | {"vocab_size": vocab, "special_token_ids": sorted(specials)},
            },
            "format": TOKEN_FILE_FORMAT,
            "tokens": tokens_ref,
            "trace_sha256": tokens_ref["sha256"],
            "num_requests": len(measured),
            "total_tokens": int(sum(p.size for p in measured)),
            "warmups": warmups,
            "context_tokens": context_tokens,
            "replay": file_ref(replay_path, out_dir),
            "requests": requests,
        }
        write_manifest(manifest_path, doc)
    return manifest_path
