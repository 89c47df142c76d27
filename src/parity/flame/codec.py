"""Flame task payloads: a batch of token-ID prompts, raw or zlib level 1, within Flame's 4 MiB cap;
and what a worker returns for one (`encode_output`/`decode_output`): both sides of a task, in one place.

Every gRPC hop that carries a Flame v0.6.0 task receives at most 4 MiB, and the replies to
CreateTask, WatchTask and GetTask carry input and output together, so a task's encoded input plus its
output must stay under the cap: each task keeps room for its outputs, sized by their lengths (at least
RESERVED_FOR_OUTPUT, what the study's 16-token outputs and framing were given). A batch is also held to a decoded payload budget (the study: 2 MiB,
then 4 MiB), checked from the header before anything is decompressed. `split` cuts a batch into
tasks that respect both, so no prompt is ever truncated or dropped.

Layout (little-endian): magic "PFB1", flags (bit 0: zlib; bit 1: lengths), token width in bytes,
decoded size (u32), then the body: count (u32); per prompt its id length (u16) and id (UTF-8); per
prompt its token count (u32); with bit 1 (ours, parity.lengths), per prompt its exact output length
(u32); then every prompt's tokens, back to back (one pack, one unpack). The study's batches never
set bit 1: a prompt without its own length gets the worker engine's max_tokens.
Tokens take the narrowest width that holds the batch's largest ID: 2 bytes for a small vocabulary,
3 for Llama 3's 128,256 (a 128-prompt raw batch of ~8K tokens is then about 3.1 MB, as in the
study), which also keeps a repeated 8K-token prefix inside zlib's 32 KiB window.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from parity.errors import ParityError

MAGIC = b"PFB1"
FLAG_ZLIB = 1
FLAG_LENGTHS = 2
HEADER = struct.Struct("<4sBBI")
FLAME_MESSAGE_CAP = 4 * 1024 * 1024  # tonic and Python gRPC defaults, not configurable in v0.6.0
RESERVED_FOR_OUTPUT = 256 * 1024  # the least kept for outputs and framing (the study's: 16 tokens per prompt)
OUTPUT_BYTES_PER_PROMPT = 512  # an output's JSON beside its tokens: request id, input hash, counts
OUTPUT_BYTES_PER_TOKEN = 28  # a token ID (up to 6 digits) and its time (up to 20 characters), with separators


class PayloadError(ParityError):
    """A batch that would break Flame's message cap or the decoded payload budget, or a corrupt one."""


@dataclass(frozen=True)
class Task:
    """One encoded task input and how many prompts (the next ones, in order) it carries."""

    count: int
    data: bytes


@dataclass(frozen=True)
class Prompt:
    request_id: str
    tokens: np.ndarray
    max_tokens: int | None = None  # its exact output length (parity.lengths); None: the worker engine's


def output_reserve(prompts: list[Prompt], default_tokens: int) -> int:
    """Bytes a task of these prompts keeps under the cap for its output (each prompt's length, else
    `default_tokens`): never less than RESERVED_FOR_OUTPUT."""
    tokens = sum(default_tokens if p.max_tokens is None else p.max_tokens for p in prompts)
    return max(RESERVED_FOR_OUTPUT, 64 * 1024 + OUTPUT_BYTES_PER_PROMPT * len(prompts) + OUTPUT_BYTES_PER_TOKEN * tokens)


def token_width(prompts: list[Prompt]) -> int:
    top = max((int(np.max(p.tokens)) for p in prompts if len(p.tokens)), default=0)
    return 2 if top < 1 << 16 else 3 if top < 1 << 24 else 4


def _lengths(prompts: list[Prompt]) -> bool:
    """Whether the prompts carry their own output lengths: all of them, or none."""
    given = sum(p.max_tokens is not None for p in prompts)
    if given not in (0, len(prompts)):
        raise PayloadError(f"{given} of {len(prompts)} prompts carry an output length: a batch gives all or none")
    return bool(given)


def decoded_size(prompts: list[Prompt], width: int = 4) -> int:
    """Bytes of the body before compression: what the decoded payload budget limits."""
    return 4 + sum(2 + len(p.request_id.encode()) + 4 + (4 if p.max_tokens is not None else 0) + width * len(p.tokens)
                   for p in prompts)


_DTYPES = {2: np.dtype("<u2"), 3: np.dtype([("low", "<u2"), ("high", "u1")]), 4: np.dtype("<u4")}


def _pack(tokens, width: int) -> bytes:
    tokens = np.asarray(tokens, dtype="<u4")
    if width != 3:
        return tokens.astype(_DTYPES[width]).tobytes()
    packed = np.empty(tokens.size, dtype=_DTYPES[3])
    packed["low"] = tokens & 0xFFFF
    packed["high"] = tokens >> 16
    return packed.tobytes()


def _unpack(body: bytes, offset: int, count: int, width: int) -> np.ndarray:
    packed = np.frombuffer(body, dtype=_DTYPES[width], count=count, offset=offset)
    if width != 3:
        return packed.astype("<u4")
    return packed["low"].astype("<u4") | (packed["high"].astype("<u4") << 16)


def encode(prompts: list[Prompt], *, compress: bool) -> bytes:
    width = token_width(prompts)
    ids = b"".join(struct.pack("<H", len(rid)) + rid for rid in (p.request_id.encode() for p in prompts))
    counts = np.array([len(p.tokens) for p in prompts], dtype="<u4")
    lengths = _lengths(prompts)
    if lengths and any(p.max_tokens < 1 for p in prompts):
        raise PayloadError("an output length must be at least 1 token")
    own = np.array([p.max_tokens for p in prompts], dtype="<u4").tobytes() if lengths else b""
    tokens = np.concatenate([np.asarray(p.tokens, dtype="<u4") for p in prompts]) if prompts else np.zeros(0, "<u4")
    body = struct.pack("<I", len(prompts)) + ids + counts.tobytes() + own + _pack(tokens, width)
    payload = zlib.compress(body, 1) if compress else body
    flags = (FLAG_ZLIB if compress else 0) | (FLAG_LENGTHS if lengths else 0)
    return HEADER.pack(MAGIC, flags, width, len(body)) + payload


# A control task (ours): not a batch but one named operation on the session's engine, between trials of a
# shared start (`reset_prefix_cache`: the next rung starts cold, as a fresh engine would).
CONTROL_MAGIC = b"PFC1"
CONTROLS = ("reset_prefix_cache",)


def encode_control(op: str) -> bytes:
    if op not in CONTROLS:
        raise PayloadError(f"unknown control operation {op!r}: use one of {', '.join(CONTROLS)}")
    return CONTROL_MAGIC + op.encode()


def control_of(data: bytes) -> str | None:
    """The operation a control task names; None for a batch; PayloadError for an unknown one."""
    if not data.startswith(CONTROL_MAGIC):
        return None
    op = bytes(data[len(CONTROL_MAGIC):]).decode(errors="replace")
    if op not in CONTROLS:
        raise PayloadError(f"unknown control operation {op[:40]!r}: use one of {', '.join(CONTROLS)}")
    return op


def decode(data: bytes, *, budget: int) -> list[Prompt]:
    """Prompts from a task input; over-budget or corrupt input is refused before it is expanded."""
    if len(data) < HEADER.size:
        raise PayloadError("task input too short for a batch header")
    magic, flags, width, size = HEADER.unpack_from(data)
    if magic != MAGIC or width not in (2, 3, 4):
        raise PayloadError("task input is not a parity batch (bad magic or token width)")
    if size > budget:
        raise PayloadError(f"batch decodes to {size} bytes, over the payload budget of {budget}")
    payload = memoryview(data)[HEADER.size:]
    if flags & FLAG_ZLIB:
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(payload, size + 1)
        except zlib.error as exc:
            raise PayloadError(f"corrupt zlib batch: {exc}") from None
        if not inflater.eof or inflater.unconsumed_tail:
            raise PayloadError("zlib batch longer than its header says")
    else:
        body = bytes(payload)
    if len(body) != size:
        raise PayloadError(f"batch body has {len(body)} bytes, its header says {size}")
    try:
        (count,) = struct.unpack_from("<I", body)
        offset, ids = 4, []
        for _ in range(count):
            (id_len,) = struct.unpack_from("<H", body, offset)
            ids.append(body[offset + 2:offset + 2 + id_len].decode())
            offset += 2 + id_len
        counts = np.frombuffer(body, dtype="<u4", count=count, offset=offset).astype(np.int64)
        offset += 4 * count
        lengths = [None] * count
        if flags & FLAG_LENGTHS:
            lengths = np.frombuffer(body, dtype="<u4", count=count, offset=offset).astype(int).tolist()
            offset += 4 * count
        total = int(counts.sum())
        if offset + width * total != len(body):
            raise ValueError("token block does not match the counts")
        tokens = _unpack(body, offset, total, width)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"corrupt batch body: {exc}") from None
    if any(n is not None and n < 1 for n in lengths):
        raise PayloadError("corrupt batch body: an output length of 0 tokens")
    ends = np.cumsum(counts)
    return [Prompt(rid, tokens[end - n:end], length) for rid, n, end, length in zip(ids, counts, ends, lengths)]


def split(prompts: list[Prompt], *, compress: bool, budget: int, cap: int = FLAME_MESSAGE_CAP,
          output_tokens: int = 16) -> list[Task]:
    """Encode prompts, in order, as tasks within the decoded budget and Flame's cap (`cap`: input and output
    together; each task keeps `output_reserve` of it, `output_tokens` for a prompt without its own length).

    Greedy by decoded size (no encoding needed), then each chunk is encoded once; a chunk whose
    encoding still exceeds the cap (raw batches near 4 MiB) is halved until it fits.
    """
    _lengths(prompts)
    width = token_width(prompts)  # a chunk's own width is never wider, so its size never exceeds this
    chunks, current, size = [], [], 4
    for prompt in prompts:
        need = decoded_size([prompt], width) - 4
        if 4 + need > budget:
            raise PayloadError(f"prompt {prompt.request_id} alone ({4 + need} bytes) exceeds the payload budget of {budget}")
        if current and size + need > budget:
            chunks.append(current)
            current, size = [], 4
        current.append(prompt)
        size += need
    if current:
        chunks.append(current)
    return [task for chunk in chunks for task in _fit(chunk, compress, cap, output_tokens)]


def _fit(chunk: list[Prompt], compress: bool, cap: int, output_tokens: int) -> list[Task]:
    data = encode(chunk, compress=compress)
    room = cap - output_reserve(chunk, output_tokens)
    if len(data) <= room:
        return [Task(len(chunk), data)]
    if len(chunk) == 1:
        raise PayloadError(f"prompt {chunk[0].request_id} alone encodes to {len(data)} bytes, over the {room} that "
                           f"Flame's cap of {cap} leaves beside its output")
    middle = len(chunk) // 2
    return _fit(chunk[:middle], compress, cap, output_tokens) + _fit(chunk[middle:], compress, cap, output_tokens)


def encode_output(outputs: list[dict], worker: dict, timings: dict, events: list[dict] | None = None) -> bytes:
    """What the service returns for a task: outputs in input order, the worker's identity, timings; in harvest
    mode (parity.flame.harvest) the outputs are the completions the task harvested, and `events` its token events."""
    doc = {"outputs": outputs, "worker": worker, "timings": timings} | ({} if events is None else {"events": events})
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_output(data: bytes) -> dict:
    try:
        doc = json.loads(data)
        doc["outputs"], doc["worker"]
    except (ValueError, TypeError, KeyError):
        raise ParityError(f"task output is not a parity result: {bytes(data[:80])!r}") from None
    return doc
