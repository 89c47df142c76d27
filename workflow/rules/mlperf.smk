# The MLPerf Offline control (parity mlperf; LoadGen QSL/SUTs in parity.mlperf): each arm its own job,
# so its own process, as LoadGen keeps its configuration per process. An arm serves from one GPU (the
# backend's first); on one node each MLPerf job holds both GPUs, as the experiments do, so none overlaps.
# The engine, GPUs, model, load format and engine arguments come from the same `backend` as the experiments.

MLPERF_ACCURACY = MLPERF.get("accuracy", True)


if MLPERF_SYNTHETIC == "smoke":

    rule mlperf_smoke_dataset:
        """A cnn_eval.json-shaped dataset in the smoke tokenizer's IDs (synthetic, labelled so)."""
        input:
            f"{INPUTS['tokenizer']}/tokenizer.json",
        output:
            MLPERF["dataset"],
        params:
            tokenizer=lambda wildcards, input: os.path.dirname(input[0]),
            samples=MLPERF.get("samples", 64),
        log:
            f"{LOGS}/mlperf_smoke_dataset.log",
        shell:
            "parity mlperf smoke-dataset --tokenizer {params.tokenizer:q} --out {output:q}"
            " --samples {params.samples} 2> {log:q}"

elif MLPERF_SYNTHETIC == "random":

    rule mlperf_random_dataset:
        """A cnn_eval.json-shaped dataset of random Llama 3 token IDs, no text (labelled synthetic-random)."""
        output:
            MLPERF["dataset"],
        params:
            samples=MLPERF.get("samples", 64),
        log:
            f"{LOGS}/mlperf_random_dataset.log",
        shell:
            "parity mlperf random-dataset --out {output:q} --samples {params.samples} 2> {log:q}"


rule mlperf_run:
    """One arm of the Offline control in performance mode (prefix caching off)."""
    input:
        dataset=MLPERF["dataset"],
        backend=backend_inputs(),
    output:
        f"{RESULTS}/mlperf/{{arm}}/mlperf-run.json",
    wildcard_constraints:
        arm="|".join(MLPERF_RUNS),
    params:
        arm=mlperf_arm,
        backend=backend_json(),
        options=mlperf_options(),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=2,
    log:
        f"{LOGS}/mlperf_{{arm}}.log",
    shell:
        "parity mlperf run {params.arm} --dataset {input.dataset:q} --backend {params.backend:q} {params.options}"
        " --out {params.out:q} > {log:q} 2>&1"


rule mlperf_compare:
    """Standalone vs one Flame arm: the same vLLM on both, same dataset and settings, or flagged."""
    input:
        standalone=f"{RESULTS}/mlperf/standalone/mlperf-run.json",
        flame=f"{RESULTS}/mlperf/flame-{{name}}/mlperf-run.json",
    output:
        f"{RESULTS}/mlperf/compare-{{name}}.json",
    wildcard_constraints:
        name="|".join(MLPERF_FLAME),
    log:
        f"{LOGS}/mlperf_compare_{{name}}.log",
    shell:
        "parity mlperf compare --standalone {input.standalone:q} --flame {input.flame:q} --out {output:q} > {log:q} 2>&1"


if MLPERF_ACCURACY:

    rule mlperf_accuracy_run:
        """One arm in accuracy mode: every sample once, outputs saved for scoring."""
        input:
            dataset=MLPERF["dataset"],
            backend=backend_inputs(),
        output:
            f"{RESULTS}/mlperf/accuracy/{{arm}}/mlperf-run.json",
        wildcard_constraints:
            arm="|".join(MLPERF_RUNS),
        params:
            arm=mlperf_arm,
            backend=backend_json(),
            options=mlperf_options(),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        resources:
            gpu=2,
        log:
            f"{LOGS}/mlperf_accuracy_run_{{arm}}.log",
        shell:
            "parity mlperf run {params.arm} --mode accuracy --dataset {input.dataset:q} --backend {params.backend:q}"
            " {params.options} --out {params.out:q} > {log:q} 2>&1"

    rule mlperf_accuracy:
        """ROUGE-1/2/L/Lsum and the generated-length gate on an arm's saved outputs."""
        input:
            run=f"{RESULTS}/mlperf/accuracy/{{arm}}/mlperf-run.json",
            punkt="resources/nltk_data/tokenizers/punkt_tab.zip",
            tokenizer=f"{INPUTS['tokenizer']}/tokenizer.json",
        output:
            f"{RESULTS}/mlperf/accuracy/{{arm}}/accuracy.json",
        params:
            tokenizer=lambda wildcards, input: os.path.dirname(input.tokenizer),
            nltk_data=lambda wildcards, input: os.path.dirname(os.path.dirname(input.punkt)),
        log:
            f"{LOGS}/mlperf_accuracy_{{arm}}.log",
        shell:
            "parity mlperf accuracy {input.run:q} --tokenizer {params.tokenizer:q} --nltk-data {params.nltk_data:q}"
            " --out {output:q} > {log:q} 2>&1"


rule mlperf:
    """The MLPerf control table (standalone and each Flame arm of mlperf.flame_arms), and each arm's accuracy gates."""
    input:
        expand(f"{RESULTS}/mlperf/compare-{{name}}.json", name=MLPERF_FLAME),
        expand(f"{RESULTS}/mlperf/accuracy/{{arm}}/accuracy.json", arm=MLPERF_RUNS) if MLPERF_ACCURACY else [],
