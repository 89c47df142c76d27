# The MLPerf Offline control (parity mlperf; LoadGen QSL/SUTs in parity.mlperf): each arm its own job,
# so its own process, as LoadGen keeps its configuration per process.

MLPERF = config["mlperf"]
MLPERF_ARMS = {"standalone": "--arm standalone", "flame-b32": "--arm flame --batch-limit 32",
               "flame-b64": "--arm flame --batch-limit 64"}


def mlperf_options():
    """The run options this profile sets (engine, lengths, durations), as `parity mlperf run` flags."""
    b, m = config["backend"], MLPERF
    options = [f"--engine {m.get('engine', 'vllm')}", f"--max-tokens {m.get('max_tokens', 128)}",
               f"--cluster {b['cluster']}"]
    for key in ("target_qps", "min_duration_ms", "min_query_count", "samples"):
        if m.get(key) is not None:
            options.append(f"--{key.replace('_', '-')} {m[key]}")
    if b.get("sim_params"):
        options.append(f"--sim-params {b['sim_params']}")
    if b.get("model"):
        options.append(f"--model {b['model']}")
    if b.get("flame_bin_dir"):
        options.append(f"--flame-bin-dir {b['flame_bin_dir']}")
    gpu = b["gpus"][0]
    options.append("--gpu $(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)" if gpu == "auto"
                   else f"--gpu {gpu}")
    return " ".join(options)


if config["inputs"]["generate"]:

    rule mlperf_smoke_dataset:
        """A cnn_eval.json-shaped dataset in the smoke tokenizer's IDs (synthetic, labelled so)."""
        input:
            f"{config['inputs']['tokenizer']}/tokenizer.json",
        output:
            MLPERF["dataset"],
        params:
            tokenizer=config["inputs"]["tokenizer"],
            samples=MLPERF.get("samples", 64),
        log:
            f"{RESULTS}/logs/mlperf_smoke_dataset.log",
        shell:
            "parity mlperf smoke-dataset --tokenizer {params.tokenizer} --out {output} --samples {params.samples} 2> {log}"


rule mlperf_run:
    """One arm of the Offline control in performance mode (prefix caching off)."""
    input:
        MLPERF["dataset"],
    output:
        f"{RESULTS}/mlperf/{{arm}}/mlperf-run.json",
    wildcard_constraints:
        arm="|".join(MLPERF_ARMS),
    params:
        arm=lambda wildcards: MLPERF_ARMS[wildcards.arm],
        options=mlperf_options(),
        out=lambda wildcards: f"{RESULTS}/mlperf/{wildcards.arm}",
    resources:
        gpu=2,
    log:
        f"{RESULTS}/logs/mlperf_{{arm}}.log",
    shell:
        "parity mlperf run {params.arm} --dataset {input} {params.options} --out {params.out} > {log} 2>&1"


rule mlperf_compare:
    """Standalone vs one Flame arm: the same vLLM on both, same dataset and settings, or flagged."""
    input:
        standalone=f"{RESULTS}/mlperf/standalone/mlperf-run.json",
        flame=f"{RESULTS}/mlperf/flame-b{{batch}}/mlperf-run.json",
    output:
        f"{RESULTS}/mlperf/compare-b{{batch}}.json",
    log:
        f"{RESULTS}/logs/mlperf_compare_b{{batch}}.log",
    shell:
        "parity mlperf compare --standalone {input.standalone} --flame {input.flame} --out {output} > {log} 2>&1"


MLPERF_ACCURACY = MLPERF.get("accuracy", True)

if MLPERF_ACCURACY:

    rule mlperf_accuracy_run:
        """One arm in accuracy mode: every sample once, outputs saved for scoring."""
        input:
            MLPERF["dataset"],
        output:
            f"{RESULTS}/mlperf/accuracy/{{arm}}/mlperf-run.json",
        wildcard_constraints:
            arm="|".join(MLPERF_ARMS),
        params:
            arm=lambda wildcards: MLPERF_ARMS[wildcards.arm],
            options=mlperf_options(),
            out=lambda wildcards: f"{RESULTS}/mlperf/accuracy/{wildcards.arm}",
        resources:
            gpu=2,
        log:
            f"{RESULTS}/logs/mlperf_accuracy_run_{{arm}}.log",
        shell:
            "parity mlperf run {params.arm} --mode accuracy --dataset {input} {params.options} --out {params.out} > {log} 2>&1"

    rule mlperf_accuracy:
        """ROUGE-1/2/L/Lsum and the generated-length gate on an arm's saved outputs."""
        input:
            run=f"{RESULTS}/mlperf/accuracy/{{arm}}/mlperf-run.json",
            punkt="resources/nltk_data/tokenizers/punkt_tab.zip",
        output:
            f"{RESULTS}/mlperf/accuracy/{{arm}}/accuracy.json",
        params:
            tokenizer=config["inputs"]["tokenizer"],
        log:
            f"{RESULTS}/logs/mlperf_accuracy_{{arm}}.log",
        shell:
            "parity mlperf accuracy {input.run} --tokenizer {params.tokenizer} --nltk-data resources/nltk_data"
            " --out {output} > {log} 2>&1"


rule mlperf:
    """The MLPerf control table (standalone, Flame batch 32 and 64), and each arm's accuracy gates."""
    input:
        expand(f"{RESULTS}/mlperf/compare-b{{batch}}.json", batch=[32, 64]),
        expand(f"{RESULTS}/mlperf/accuracy/{{arm}}/accuracy.json", arm=MLPERF_ARMS) if MLPERF_ACCURACY else [],
