# The study's experiments (parity experiment run NAME; cases in parity.experiments.plan).
# Each holds both GPUs for its whole run, so no two ever overlap (profiles set resources: gpu=2).
# A rerun keeps every trial already run and checked: only what is missing or invalid is redone.


rule experiment:
    """One experiment: fresh engines per case, every trial checked, pairs, OUT/experiment.json."""
    input:
        trace_manifests(),
    output:
        f"{RESULTS}/{{experiment}}/experiment.json",
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS),
    params:
        traces=" ".join(f"--trace {t}" for t in trace_manifests()),
        settings=lambda wildcards: experiment_settings(wildcards.experiment),
        backend=BACKEND_JSON,
        out=lambda wildcards: f"{RESULTS}/{wildcards.experiment}",
    resources:
        gpu=2,
    log:
        f"{RESULTS}/logs/experiment_{{experiment}}.log",
    shell:
        "parity experiment run {wildcards.experiment} {params.traces} --backend '{params.backend}'"
        " --settings '{params.settings}' --out {params.out} > {log} 2>&1"


rule locality:
    """Prefix affinity: alternating vs sticky, vLLM vs Flame, three interleaved repetitions."""
    input:
        experiment_manifest("locality"),


rule admission:
    """Batch x window screening, API x codec screening, and the paired admission stages."""
    input:
        experiment_manifest("admission"),


rule confirmation:
    """The final Flame configuration against sticky vLLM: fresh pairs per trace, GPU-pinned shards."""
    input:
        experiment_manifest("confirmation"),
        experiment_manifest("offline-limit"),


rule gc:
    """Normal collection vs startup-heap freeze in the Flame workers."""
    input:
        experiment_manifest("gc"),
