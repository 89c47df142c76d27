"""Inputs: the offline smoke corpus and tokenizer, the traces built from a corpus, and the pinned downloads
(`parity fetch`)."""

from __future__ import annotations

from pathlib import Path

import click

from parity.cli import options
from parity.cli.app import echo, main
from parity.cli.errors import friendly_errors
from parity.study import VOCAB_LIMIT
from parity.trace import TraceError, TraceSpec, not_a_folder  # `parity trace`'s defaults are TraceSpec's
from parity.trace_mooncake import MAX_CONTEXT_TOKENS


@main.command("smoke-inputs")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=options.out_folder,
              help="Directory for corpus.jsonl and tokenizer/.")
@click.option("--articles", default=1200, show_default=True, type=click.IntRange(min=1),
              help="Synthetic articles to generate.")
@click.option("--seed", default=0, show_default=True, help="Seed of the article generator.")
@click.option("--vocab-size", default=8192, show_default=True, type=click.IntRange(max=VOCAB_LIMIT),
              help="BPE vocabulary size (token IDs are int32: at most 2**31).")
@friendly_errors
def smoke_inputs_cmd(out_dir: Path, articles: int, seed: int, vocab_size: int):
    """Generate the offline smoke inputs: a synthetic news corpus and a BPE tokenizer trained on it."""
    from parity import smoke_inputs
    from parity.manifest import all_or_nothing

    if vocab_size < smoke_inputs.MIN_VOCAB:  # checked before the corpus is written
        raise click.BadParameter(f"{vocab_size} is smaller than the {smoke_inputs.MIN_VOCAB} bytes and special tokens.",
                                 param_hint="'--vocab-size'")
    # Both or neither: the inner block removes the corpus and tokenizer.json should the training fail (and
    # tokenizer/ where it made it), the outer one --out where it made it.
    with all_or_nothing(out_dir / "corpus.jsonl"), all_or_nothing(out_dir / "tokenizer" / "tokenizer.json"):
        corpus = smoke_inputs.write_corpus(out_dir / "corpus.jsonl", articles=articles, seed=seed)
        tokenizer = smoke_inputs.train_tokenizer(corpus, out_dir / "tokenizer", vocab_size=vocab_size)
    echo(f"wrote {corpus} ({articles} synthetic articles) and {tokenizer}/tokenizer.json")


def _trace_files(kw: dict) -> list[Path]:
    """The files `parity trace` writes into --out: the trace's name decides them."""
    from parity.trace import trace_files

    return trace_files(kw["out_dir"], kw["name"], len(kw["warmup_shifts"]))


def _mooncake_files(kw: dict) -> list[Path]:
    """The files `parity trace-mooncake` writes into --out: named by --name, else by the source's stem."""
    from parity.trace_mooncake import output_files

    return output_files(kw["source"], kw["out_dir"], kw["name"])


def _corpus_file(ctx, param, corpus: Path) -> Path:
    """A folder given as --corpus is named as such as the command line is read, before --out is checked against
    it (an --out in it would be refused as lying in an input, which hides the cause)."""
    try:
        not_a_folder(corpus)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    return corpus


@main.command("trace")
@click.option("--corpus", type=click.Path(path_type=Path), required=True, callback=_corpus_file,
              help="JSONL of news articles.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path), required=True,
              help="Hugging Face tokenizer directory (with tokenizer.json).")
@click.option("--name", required=True, help="Trace name, e.g. no-reuse or reuse.")
@click.option("--documents", type=click.IntRange(min=1), required=True, help="Distinct document prefixes.")
@click.option("--questions", type=click.IntRange(min=1), required=True, help="Questions per document.")
@click.option("--prefix-tokens", default=TraceSpec.prefix_tokens, show_default=True, type=click.IntRange(min=1),
              help="Exact document prefix length.")
@click.option("--seed", default=TraceSpec.seed, show_default=True, help="Seed of the burst order.")
@click.option("--head-tokens", default=TraceSpec.head_tokens, show_default=True, type=click.IntRange(min=0),
              help="A head of this many tokens shared by every document (a system prompt), within the prefix.")
@click.option("--zipf", default=TraceSpec.zipf, show_default=True, type=options.Finite(min=0, max=4),
              help="Hot documents: each request's document drawn from a Zipf law of this exponent (0: uniform).")
@click.option("--blocks", default=TraceSpec.blocks, show_default=True, type=click.IntRange(min=1),
              help="This many blocks of the shape above, one after another, each block's prefixes its own "
                   "(the first block token-shifted): a long rung of the same shape.")
@click.option("--answer-tokens", default=TraceSpec.answer_tokens, show_default=True, type=click.IntRange(min=0),
              help="Conversations: each document's questions are one chat's turns, a turn's prompt carrying the "
                   "earlier questions, each with an answer of this many tokens (0: each question alone).")
@click.option("--warmup-shift", "warmup_shifts", type=int, multiple=True, default=TraceSpec.warmup_shifts,
              show_default=True, help="Token-ID shift of each warmup round (repeat the option).")
@click.option("--pack/--no-pack", "pack_articles", default=TraceSpec.pack_articles, show_default=True,
              help="Join consecutive articles to fill a prefix, or take one article per document.")
@click.option("--text-field", default="article", show_default=True, help="JSONL field holding the text.")
@click.option("--corpus-origin", default="other", show_default=True,
              help="Recorded in the manifest: synthetic-news, cnn_dailymail, ...")
@click.option("--tokenizer-origin", default="other", show_default=True,
              help="Recorded in the manifest: smoke-bpe, llama-3.1-8b-instruct, ...")
@click.option("--context-tokens", type=options.CONTEXT_TOKENS, default=None,
              help="Build for an engine context (max_model_len) of this many tokens, recorded in the manifest "
                   "[default: the study's max_model_len, not recorded].")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=options.out_folder,
              help="Directory for NAME.json, NAME.tokens and NAME.warmupK.tokens.")
@friendly_errors
@options.out_apart_from("corpus", "tokenizer_dir", out="out_dir", writes=_trace_files)
def trace_cmd(corpus, tokenizer_dir, name, documents, questions, prefix_tokens, seed, head_tokens, zipf, blocks,
              answer_tokens, warmup_shifts, pack_articles, text_field, corpus_origin, tokenizer_origin, context_tokens,
              out_dir):
    """Build one burst (token IDs, shuffled) and its warmup variants, with a trace manifest."""
    from parity.trace import build_trace, load_trace

    spec = TraceSpec(name=name, documents=documents, questions_per_document=questions,
                     prefix_tokens=prefix_tokens, seed=seed, warmup_shifts=tuple(warmup_shifts),
                     pack_articles=pack_articles, head_tokens=head_tokens, zipf=zipf, blocks=blocks,
                     answer_tokens=answer_tokens)
    manifest = build_trace(spec, corpus, tokenizer_dir, out_dir, text_field=text_field,
                           corpus_origin=corpus_origin, tokenizer_origin=tokenizer_origin,
                           context_tokens=context_tokens)
    trace = load_trace(manifest)
    tokens = sum(r.tokens for r in trace.requests)
    click.echo(f"{manifest}: {len(trace.requests)} requests, {tokens} tokens, "
               f"{len(spec.warmup_shifts)} warmup variants, trace sha256 {trace.sha256}")


@main.command("trace-mooncake")
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              callback=options.out_folder,
              help="Directory for NAME.json, NAME.tokens, NAME.warmupK.tokens and NAME.replay.json.")
@click.option("--name", default=None, help="Trace name [default: the file's stem].")
@click.option("--max-model-len", type=click.IntRange(1, MAX_CONTEXT_TOKENS), default=None,
              help="The context: a request longer (with its output) is counted and excluded, never cut "
                   "[default: the study's max_model_len].")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Keep the first this many requests that fit; reading stops there (the lines after are not read).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Seed of the blocks' token IDs.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Draw token IDs from this tokenizer's ordinary IDs [default: 0..127,999, Llama 3.1's].")
@friendly_errors
@options.out_apart_from("source", "tokenizer_dir", out="out_dir", writes=_mooncake_files)
def trace_mooncake_cmd(source, out_dir, name, max_model_len, limit, seed, tokenizer_dir):
    """A Mooncake request trace (JSONL: timestamp, input_length, output_length, hash_ids) as a parity trace:
    each 512-token block a seeded block of token IDs, sharing kept exactly, arrivals as a replay file."""
    from parity.manifest import read_manifest
    from parity.study import MAX_MODEL_LEN
    from parity.trace_mooncake import convert

    manifest = convert(source, out_dir, name=name, context_tokens=max_model_len or MAX_MODEL_LEN, limit=limit,
                       seed=seed, tokenizer_dir=tokenizer_dir)
    doc = read_manifest(manifest)
    read = doc["inputs"]["mooncake"]
    click.echo(f"{manifest}: {doc['num_requests']} requests, {doc['total_tokens']} tokens; {read['over_context']} of "
               f"{read['requests_read']} read over the context of {doc['context_tokens']}, excluded; "
               + (f"--limit {limit}: reading stopped at line {read['lines_read']}, the lines after it not read; "
                  if limit is not None else "") + f"trace sha256 {doc['trace_sha256']}")


# ---- fetch: pinned, checksum-verified inputs (parity.fetch) -------------------------------------

@main.group("fetch")
def fetch_group():
    """Download inputs, each verified against its SHA-256 pin in manifests/pins/, with a receipt."""


def _fetch_command(name: str, default_pins: str | None, summary: str):
    """One `parity fetch NAME` command: the pins file says what to fetch and from where."""

    @fetch_group.command(name, help=summary)
    @click.option("--pins", "pins_path", type=click.Path(path_type=Path, dir_okay=False), default=default_pins,
                  required=default_pins is None, show_default=True, help="Pins file (JSON) naming source and files.")
    @click.option("--dest", type=click.Path(path_type=Path, file_okay=False), required=True,
                  help="Destination folder; files already there and matching their pins are kept.")
    @click.option("--record-pins", is_flag=True,
                  help="Fill in missing (null) pins from this download: only on a trusted network. "
                       "Existing pins are never changed.")
    @click.option("--receipt", type=click.Path(path_type=Path, dir_okay=False), default=None,
                  help="Receipt manifest path [default: DEST/fetch-receipt.json].")
    @friendly_errors
    @options.out_apart_from("pins_path", "dest", out="receipt")
    def command(pins_path, dest, record_pins, receipt):
        from parity.fetch import fetch_pinned

        out = fetch_pinned(pins_path, dest, record_pins=record_pins, receipt=receipt,
                           log=echo)
        click.echo(f"wrote {out}")

    return command


fetch_model_cmd = _fetch_command(
    "model", "manifests/pins/llama-3.1-8b-instruct.json",
    "The model at its pinned commit from the Hugging Face Hub (token from HF_TOKEN or `hf auth login`).")
fetch_dataset_cmd = _fetch_command(
    "dataset", "manifests/pins/cnn_dailymail.json",
    "The CNN/DailyMail news parquet at its pinned commit from the Hugging Face Hub.")
fetch_mlperf_cmd = _fetch_command(
    "mlperf-dataset", "manifests/pins/mlperf-cnn-eval.json",
    "MLPerf's cnn_eval.json from the MLCommons R2 bucket (MD5 from the bucket and the SHA-256 pin both checked).")
fetch_url_cmd = _fetch_command(
    "url", None, "Any files a pins file lists, from a Hugging Face repo or an http(s) base URL.")


@fetch_group.command("articles")
@click.option("--pins", "pins_path", type=click.Path(path_type=Path, dir_okay=False),
              default="manifests/pins/cnn_dailymail.json", show_default=True,
              help="Pins file with the parquet (files) and the converted output (derived).")
@click.option("--dest", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder holding the fetched parquet; the articles.jsonl is written there.")
@click.option("--record-pins", is_flag=True, help="Record the output's pin if it is still null.")
@click.option("--receipt", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Receipt manifest path [default: DEST/articles.receipt.json].")
@friendly_errors
@options.out_apart_from("pins_path", "dest", out="receipt")
def fetch_articles_cmd(pins_path, dest, record_pins, receipt):
    """Convert the verified parquet to articles.jsonl (deterministic; its SHA-256 is pinned too)."""
    from parity.fetch import Pins
    from parity.fetch.articles import derive

    out = derive(Pins.load(pins_path), dest, receipt=receipt, record_pins=record_pins,
                 log=echo)
    click.echo(f"wrote {out}")


@fetch_group.command("pins-status")
@click.argument("pins_files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@friendly_errors
def fetch_pins_status_cmd(pins_files):
    """Each pin: published (with its source), recorded on first download, or missing.

    PINS_FILES default to manifests/pins/*.json.
    """
    from parity.fetch import FetchError, Pins

    paths = pins_files or sorted(Path("manifests/pins").glob("*.json"))
    if not paths:
        raise FetchError("manifests/pins: no pins files (*.json) found; name the pins files to list")
    for path in paths:
        click.echo("\n".join(Pins.load(path).status_lines()))


