"""Offline stand-ins for the real trace inputs: a synthetic news corpus and a tokenizer trained on it.

The real profile uses CNN/DailyMail articles and the Llama 3.1 8B Instruct tokenizer, which need a
download. The smoke profile must run on a laptop or in CI with no network, so it generates both here,
deterministically: the same seed gives byte-identical files on any machine and Python version
(only `random.Random.random()` is used, whose sequence Python guarantees across versions).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from parity.errors import ParityError
from parity.manifest import atomic_write_text

CORPUS_ORIGIN = "synthetic-news"
TOKENIZER_ORIGIN = "smoke-bpe"
BOS_TOKEN = "<|begin_of_text|>"
SPECIAL_TOKENS = (BOS_TOKEN, "<|end_of_text|>", "<|eot_id|>", "<|reserved_0|>")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the special tokens, before any merge

_PEOPLE = (
    "Amara Okafor", "Jonas Lindqvist", "Priya Raman", "Mateo Alvarez", "Hana Sato", "Elena Petrova",
    "Samuel Adeyemi", "Claire Dubois", "Ravi Menon", "Lucia Romano", "Tomasz Nowak", "Aisha Karim",
    "Daniel Brennan", "Mei Lin", "Oliver Grant", "Fatima Haddad", "Kofi Mensah", "Ingrid Solberg",
    "Arjun Desai", "Sofia Costa", "Marcus Webb", "Yuki Tanaka", "Nadia Rahman", "Henrik Strand",
)
_PLACES = (
    "Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Valparaiso", "Dundee", "Auckland", "Accra",
    "Bergen", "Hyderabad", "Tucson", "Marseille", "Tallinn", "Cebu", "Halifax", "Porto Alegre",
    "Leipzig", "Mombasa", "Adelaide", "Bilbao", "Winnipeg", "Da Nang", "Galway",
)
_ORGS = (
    "the city council", "the regional health authority", "the national weather service",
    "the transport ministry", "a local university", "the port authority", "the central bank",
    "an independent watchdog", "the energy regulator", "the state prosecutor", "a farmers' union",
    "the football association", "a coalition of charities", "the environment agency",
)
_TOPICS = (
    "flood defences", "a new rail link", "rising rents", "a hospital merger", "the fishing quota",
    "a school funding plan", "wildfire preparations", "a data breach", "the harbour expansion",
    "a stadium proposal", "water shortages", "a vaccine programme", "the bus drivers' strike",
    "a solar farm", "road safety", "a museum reopening", "the budget deficit", "a bridge repair",
)
_VERBS = ("announced", "criticised", "defended", "approved", "delayed", "questioned", "welcomed",
          "reviewed", "rejected", "expanded", "postponed", "funded")
_ADJ = ("unexpected", "long-awaited", "controversial", "modest", "sweeping", "temporary", "costly",
        "ambitious", "limited", "urgent", "detailed", "preliminary")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")

_SENTENCES = (
    "{person}, a spokesperson for {org}, said the {adj} decision on {topic} would be reviewed within {n} weeks.",
    "Officials in {place} {verb} plans for {topic} on {day}, citing a budget of {money} million.",
    "According to {org}, about {n} residents of {place} have been affected since {month}.",
    "\"We have listened carefully, and we will act,\" {person} told reporters outside the offices of {org}.",
    "Critics said the {adj} measures on {topic} came too late for families in {place}.",
    "The proposal, first raised in {month}, was {verb} by {org} after a {adj} debate lasting {n} hours.",
    "{person} added that {topic} in {place} had cost an estimated {money} million over {n} years.",
    "A report published on {day} by {org} found that {pct} percent of respondents supported the change.",
    "Local businesses in {place} {verb} the move, although some warned of {adj} delays.",
    "The issue of {topic} is expected to return to {org} before the end of {month}.",
    "In a statement, {org} said it had {verb} {n} separate applications related to {topic}.",
    "{person}, who has lived in {place} for {n} years, described the situation as {adj}.",
    "Figures released on {day} show a rise of {pct} percent compared with the same period last year.",
    "Opposition members {verb} the timetable and called for an {adj} inquiry into {topic}.",
    "The work in {place} is due to begin in {month} and should take about {n} months to complete.",
    "{person} said that talks with {org} on {day} had been constructive but {adj}.",
)
_TITLES = (
    "{place} officials {verb} plan for {topic}",
    "{adj} turn in the debate over {topic} in {place}",
    "What the {topic} decision means for {place}",
    "{org} under pressure over {topic}",
)


def _pick(rng: random.Random, items: tuple[str, ...]) -> str:
    return items[int(rng.random() * len(items))]


def _fill(rng: random.Random, template: str) -> str:
    values = {
        "person": _pick(rng, _PEOPLE), "place": _pick(rng, _PLACES), "org": _pick(rng, _ORGS),
        "topic": _pick(rng, _TOPICS), "verb": _pick(rng, _VERBS), "adj": _pick(rng, _ADJ),
        "day": _pick(rng, _DAYS), "month": _pick(rng, _MONTHS),
        "n": str(2 + int(rng.random() * 58)), "pct": str(3 + int(rng.random() * 90)),
        "money": f"{1 + rng.random() * 400:.1f}",
    }
    return template.format(**values)


def synthetic_article(rng: random.Random, index: int) -> dict[str, str]:
    """One news-like article of about 450-750 words, in paragraphs, as CNN/DailyMail rows look."""
    title = _fill(rng, _pick(rng, _TITLES))
    paragraphs = []
    for _ in range(8 + int(rng.random() * 6)):
        sentences = [_fill(rng, _pick(rng, _SENTENCES)) for _ in range(2 + int(rng.random() * 3))]
        paragraphs.append(" ".join(sentences))
    dateline = f"{_pick(rng, _PLACES).upper()} -- "
    text = title[0].upper() + title[1:] + ".\n\n" + dateline + "\n\n".join(paragraphs)
    return {"id": f"synthetic-{index:06d}", "article": text}


def write_corpus(path: Path, *, articles: int = 1200, seed: int = 0) -> Path:
    """Write `articles` synthetic articles as JSONL (fields `id`, `article`), atomically."""
    if articles < 1:
        raise ParityError(f"need at least 1 article, got {articles}")
    rng = random.Random(seed)
    lines = [json.dumps(synthetic_article(rng, i), ensure_ascii=False) for i in range(articles)]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def _corpus_texts(corpus: Path, text_field: str = "article"):
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)[text_field]


def train_tokenizer(corpus: Path, out_dir: Path, *, vocab_size: int = 8192) -> Path:
    """Train a byte-level BPE tokenizer on the corpus and save it as a Hugging Face tokenizer dir.

    Byte-level BPE can encode any text, like Llama 3's tokenizer, and it prepends
    `<|begin_of_text|>` when asked for special tokens, as Llama 3's does.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < MIN_VOCAB:
        raise ParityError(f"vocabulary size must be at least {MIN_VOCAB} (bytes and special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_texts(corpus), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "tokenizer.json", tokenizer.to_str())
    config = {"bos_token": BOS_TOKEN, "eos_token": "<|end_of_text|>", "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast", "parity_origin": TOKENIZER_ORIGIN}
    atomic_write_text(out_dir / "tokenizer_config.json", json.dumps(config, indent=1, sort_keys=True) + "\n")
    return out_dir
