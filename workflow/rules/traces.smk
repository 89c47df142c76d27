# Trace inputs (smoke: generated offline; real: fetched and checksum-verified) and the two bursts.

INPUTS = config["inputs"]


if INPUTS["generate"]:

    rule smoke_inputs:
        """A synthetic news corpus and a BPE tokenizer trained on it, for offline runs."""
        output:
            corpus=INPUTS["corpus"],
            tokenizer=f"{INPUTS['tokenizer']}/tokenizer.json",
        params:
            out=lambda wildcards, output: os.path.dirname(output.corpus),
        log:
            f"{RESULTS}/logs/smoke_inputs.log",
        shell:
            "parity smoke-inputs --out {params.out} 2> {log}"


rule trace:
    """One burst in token IDs, shuffled with a recorded seed, plus its token-shifted warmup variants."""
    input:
        corpus=INPUTS["corpus"],
        tokenizer=f"{INPUTS['tokenizer']}/tokenizer.json",
    output:
        manifest=f"{TRACES}/{{name}}.json",
        tokens=f"{TRACES}/{{name}}.tokens",
    params:
        spec=lambda wildcards: config["traces"][wildcards.name],
        shifts=" ".join(f"--warmup-shift {s}" for s in config["warmup_shifts"]),
        tokenizer_dir=INPUTS["tokenizer"],
    log:
        f"{RESULTS}/logs/trace_{{name}}.log",
    shell:
        "parity trace --corpus {input.corpus} --tokenizer {params.tokenizer_dir} --name {wildcards.name}"
        " --documents {params.spec[documents]} --questions {params.spec[questions]}"
        " --prefix-tokens {params.spec[prefix_tokens]} --seed {params.spec[seed]} {params.shifts}"
        " --corpus-origin {INPUTS[corpus_origin]} --tokenizer-origin {INPUTS[tokenizer_origin]}"
        " --out {TRACES} > {log} 2>&1"
