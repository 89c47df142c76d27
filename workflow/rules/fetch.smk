# Real inputs, fetched and checksum-verified against manifests/pins/ (parity fetch); nothing is generated here.
# A null pin (no public hash) is recorded on the first download: run that `parity fetch ... --record-pins` once
# on a trusted network (or set `fetch: {record_pins: true}` in the config for that one run), then commit the pins.
# Pins files are params, not inputs: recording a pin rewrites the file, which must not make finished fetches stale.

if not INPUTS["generate"]:
    MODEL_DIR = INPUTS["tokenizer"]
    CORPUS_DIR = os.path.dirname(INPUTS["corpus"])
    if os.path.basename(INPUTS["corpus"]) not in pinned_files("cnn_dailymail.json", "derived"):
        raise WorkflowError(f"inputs.corpus must end in one of {pinned_files('cnn_dailymail.json', 'derived')}")

    rule fetch_model:
        """The model at its pinned commit (config, tokenizer, weights); the gated repo needs HF_TOKEN."""
        output:
            [f"{MODEL_DIR}/{name}" for name in pinned_files("llama-3.1-8b-instruct.json")],
            receipt=f"{MODEL_DIR}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/llama-3.1-8b-instruct.json",
            dest=lambda wildcards, output: os.path.dirname(output.receipt),
            record=FETCH_RECORD,
        log:
            f"{LOGS}/fetch_model.log",
        shell:
            "parity fetch model --pins {params.pins:q} --dest {params.dest:q} {params.record} 2> {log:q}"

    rule fetch_corpus_source:
        """The CNN/DailyMail validation parquet at its pinned commit."""
        output:
            [f"{CORPUS_DIR}/{name}" for name in pinned_files("cnn_dailymail.json")],
            receipt=f"{CORPUS_DIR}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/cnn_dailymail.json",
            dest=lambda wildcards, output: os.path.dirname(output.receipt),
            record=FETCH_RECORD,
        log:
            f"{LOGS}/fetch_corpus_source.log",
        shell:
            "parity fetch dataset --pins {params.pins:q} --dest {params.dest:q} {params.record} 2> {log:q}"

    rule corpus_articles:
        """articles.jsonl from the verified parquet: a deterministic conversion whose hash is pinned too."""
        input:
            rules.fetch_corpus_source.output,
        output:
            corpus=INPUTS["corpus"],
            receipt=f"{CORPUS_DIR}/articles.receipt.json",
        params:
            pins=f"{FETCH_PINS}/cnn_dailymail.json",
            dest=lambda wildcards, output: os.path.dirname(output.corpus),
            record=FETCH_RECORD,
        log:
            f"{LOGS}/corpus_articles.log",
        shell:
            "parity fetch articles --pins {params.pins:q} --dest {params.dest:q} {params.record} 2> {log:q}"

    rule fetch_mlperf_dataset:
        """MLPerf's cnn_eval.json from the MLCommons R2 bucket (the bucket's MD5 and our SHA-256 pin both checked)."""
        output:
            dataset=MLPERF["dataset"],
            receipt=f"{os.path.dirname(MLPERF['dataset'])}/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/mlperf-cnn-eval.json",
            dest=lambda wildcards, output: os.path.dirname(output.dataset),
            record=FETCH_RECORD,
        log:
            f"{LOGS}/fetch_mlperf_dataset.log",
        shell:
            "parity fetch mlperf-dataset --pins {params.pins:q} --dest {params.dest:q} {params.record} 2> {log:q}"

    rule fetch_nltk_punkt:
        """NLTK's punkt_tab (read inside its zip) for the MLPerf accuracy check's sentence splitting."""
        output:
            zip="resources/nltk_data/tokenizers/punkt_tab.zip",
            receipt="resources/nltk_data/tokenizers/fetch-receipt.json",
        params:
            pins=f"{FETCH_PINS}/nltk-punkt-tab.json",
            dest=lambda wildcards, output: os.path.dirname(output.zip),
            record=FETCH_RECORD,
        log:
            f"{LOGS}/fetch_nltk_punkt.log",
        shell:
            "parity fetch url --pins {params.pins:q} --dest {params.dest:q} {params.record} 2> {log:q}"

    # the run's inputs from outside its results, by their receipts: `parity seal` links them from the run manifest
    FETCH_RECEIPTS = [getattr(rules, name).output.receipt for name in
                      ("fetch_model", "fetch_corpus_source", "corpus_articles", "fetch_mlperf_dataset", "fetch_nltk_punkt")]
else:
    FETCH_RECEIPTS = []  # generated inputs lie in the results and are linked by the manifests that read them
