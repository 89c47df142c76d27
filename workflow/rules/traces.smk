# Trace inputs (smoke, host: generated offline; real: fetched and checksum-verified), the bursts, and the
# dummy-weight model folder where the config names one (inputs.model_config).

if INPUTS["generate"]:

    rule smoke_inputs:
        """A synthetic news corpus and a BPE tokenizer trained on it, for offline runs."""
        output:
            corpus=INPUTS["corpus"],
            tokenizer=f"{INPUTS['tokenizer']}/tokenizer.json",
        params:
            out=lambda wildcards, output: os.path.dirname(output.corpus),
        log:
            f"{LOGS}/smoke_inputs.log",
        shell:
            "parity smoke-inputs --out {params.out:q} 2> {log:q}"


if MODEL_CONFIG is not None:

    rule dummy_model:
        """A model folder holding the committed config.json alone: vLLM makes up weights of its shape (load_format dummy)."""
        input:
            MODEL_CONFIG,
        output:
            f"{config['backend']['model']}/config.json",
        log:
            f"{LOGS}/dummy_model.log",
        shell:
            "cp {input:q} {output:q} 2> {log:q}"


rule trace:
    """One burst in token IDs, shuffled with a recorded seed, plus its token-shifted warmup variants."""
    input:
        corpus=INPUTS["corpus"],
        tokenizer=f"{INPUTS['tokenizer']}/tokenizer.json",
    output:
        manifest=f"{TRACES}/{{name}}.json",
        tokens=f"{TRACES}/{{name}}.tokens",
    params:
        spec=lambda wildcards: TRACE_SPECS[wildcards.name],
        shifts=" ".join(f"--warmup-shift {s}" for s in config["warmup_shifts"]),
        head=lambda wildcards: f"--head-tokens {TRACE_SPECS[wildcards.name]['head_tokens']}"
        if TRACE_SPECS[wildcards.name].get("head_tokens") else "",
        zipf=lambda wildcards: f"--zipf {TRACE_SPECS[wildcards.name]['zipf']}" if TRACE_SPECS[wildcards.name].get("zipf") else "",
        blocks=lambda wildcards: f"--blocks {TRACE_SPECS[wildcards.name]['blocks']}" if TRACE_SPECS[wildcards.name].get("blocks", 1) > 1 else "",
        answers=lambda wildcards: f"--answer-tokens {TRACE_SPECS[wildcards.name]['answer_tokens']}"
        if TRACE_SPECS[wildcards.name].get("answer_tokens") else "",
        tokenizer_dir=lambda wildcards, input: os.path.dirname(input.tokenizer),
        out=lambda wildcards, output: os.path.dirname(output.manifest),
        corpus_origin=INPUTS["corpus_origin"],
        tokenizer_origin=INPUTS["tokenizer_origin"],
    log:
        f"{LOGS}/trace_{{name}}.log",
    shell:
        "parity trace --corpus {input.corpus:q} --tokenizer {params.tokenizer_dir:q} --name {wildcards.name:q}"
        " --documents {params.spec[documents]} --questions {params.spec[questions]}"
        " --prefix-tokens {params.spec[prefix_tokens]} --seed {params.spec[seed]} {params.head} {params.zipf} {params.blocks} {params.answers}"
        " {params.shifts}"
        " --corpus-origin {params.corpus_origin:q} --tokenizer-origin {params.tokenizer_origin:q}"
        " --out {params.out:q} > {log:q} 2>&1"


if MOONCAKE_NAME is not None:

    ruleorder: trace_mooncake > trace

    rule trace_mooncake:
        """Ours (issue 31): a Mooncake request trace as a parity trace, its arrivals and output lengths beside it."""
        input:
            MOONCAKE["file"],
        output:
            manifest=trace_manifest(MOONCAKE_NAME),
            replay=f"{TRACES}/{MOONCAKE_NAME}.replay.json",
        params:
            out=lambda wildcards, output: os.path.dirname(output.manifest),
            limit=f"--limit {MOONCAKE['limit']}" if MOONCAKE.get("limit") else "",
            context=f"--max-model-len {MOONCAKE['max_model_len']}" if MOONCAKE.get("max_model_len") else "",
        log:
            f"{LOGS}/trace_mooncake.log",
        shell:
            "parity trace-mooncake {input:q} --out {params.out:q} --name {MOONCAKE_NAME:q}"
            " {params.limit} {params.context} > {log:q} 2>&1"


rule traces:
    """The experiments' bursts alone (no run)."""
    input:
        trace_manifests(),
