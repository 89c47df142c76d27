# Real inputs, fetched and checksum-verified against manifests/pins/ (parity fetch); nothing is generated here.
# A null pin makes a rule fail with a hint: run that `parity fetch ... --record-pins` once on a trusted network
# (or set `fetch: {record_pins: true}` in the config for that one run), then commit the pins. Pins files are
# params, not inputs: recording a pin rewrites the file, which must not make finished fetches look stale.
import json

FETCH_PINS = "manifests/pins"
FETCH_LOGS = f"{config['results']}/logs"
FETCH_RECORD = "--record-pins" if config.get("fetch", {}).get("record_pins", False) else ""
MLPERF_DATASET = config.get("mlperf", {}).get("dataset", "resources/mlperf/cnn_eval.json")


def pinned_files(pins_file, section="files"):
    """The file names a pins file lists (read at parse time: a local file, no network)."""
    with open(f"{FETCH_PINS}/{pins_file}") as handle:
        return list(json.load(handle).get(section, {}))


if not config["inputs"]["generate"]:
    MODEL_DIR = config["inputs"]["tokenizer"]
    CORPUS_DIR = os.path.dirname(config["inputs"]["corpus"])
    if os.path.basename(config["inputs"]["corpus"]) not in pinned_files("cnn_dailymail.json", "derived"):
        raise ValueError(f"inputs.corpus must end in one of {pinned_files('cnn_dailymail.json', 'derived')}")

    rule fetch_model:
        """The model at its pinned commit (config, tokenizer, weights); the gated repo needs HF_TOKEN."""
        output:
            [f"{MODEL_DIR}/{name}" for name in pinned_files("llama-3.1-8b-instruct.json")],
            receipt=f"{MODEL_DIR}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/llama-3.1-8b-instruct.json",
            dest=MODEL_DIR,
            record=FETCH_RECORD,
        log:
            f"{FETCH_LOGS}/fetch_model.log",
        shell:
            "parity fetch model --pins {params.pins} --dest {params.dest} {params.record} 2> {log}"

    rule fetch_corpus_source:
        """The CNN/DailyMail validation parquet at its pinned commit."""
        output:
            [f"{CORPUS_DIR}/{name}" for name in pinned_files("cnn_dailymail.json")],
            receipt=f"{CORPUS_DIR}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/cnn_dailymail.json",
            dest=CORPUS_DIR,
            record=FETCH_RECORD,
        log:
            f"{FETCH_LOGS}/fetch_corpus_source.log",
        shell:
            "parity fetch dataset --pins {params.pins} --dest {params.dest} {params.record} 2> {log}"

    rule corpus_articles:
        """articles.jsonl from the verified parquet: a deterministic conversion whose hash is pinned too."""
        input:
            rules.fetch_corpus_source.output,
        output:
            corpus=config["inputs"]["corpus"],
            receipt=f"{CORPUS_DIR}/articles.receipt.json",
        params:
            pins=f"{FETCH_PINS}/cnn_dailymail.json",
            dest=CORPUS_DIR,
            record=FETCH_RECORD,
        log:
            f"{FETCH_LOGS}/corpus_articles.log",
        shell:
            "parity fetch articles --pins {params.pins} --dest {params.dest} {params.record} 2> {log}"


if not config["inputs"]["generate"]:

    rule fetch_mlperf_dataset:
        """MLPerf's cnn_eval.json from the MLCommons R2 bucket (the bucket's MD5 and our SHA-256 pin both checked)."""
        output:
            dataset=MLPERF_DATASET,
            receipt=f"{os.path.dirname(MLPERF_DATASET)}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/mlperf-cnn-eval.json",
            dest=os.path.dirname(MLPERF_DATASET),
            record=FETCH_RECORD,
        log:
            f"{FETCH_LOGS}/fetch_mlperf_dataset.log",
        shell:
            "parity fetch mlperf-dataset --pins {params.pins} --dest {params.dest} {params.record} 2> {log}"

    rule fetch_nltk_punkt:
        """NLTK's punkt_tab (read inside its zip) for the MLPerf accuracy check's sentence splitting."""
        output:
            "resources/nltk_data/tokenizers/punkt_tab.zip",
        params:
            pins=f"{FETCH_PINS}/nltk-punkt-tab.json",
            record=FETCH_RECORD,
        log:
            f"{FETCH_LOGS}/fetch_nltk_punkt.log",
        shell:
            "parity fetch url --pins {params.pins} --dest resources/nltk_data/tokenizers {params.record} 2> {log}"
