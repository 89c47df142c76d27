# The study's experiments (parity experiment run NAME; cases in parity.experiments.plan).
# Each holds both GPUs for its whole run, so no two ever overlap (profiles set resources: gpu=2).
# A rerun keeps every trial already run and checked: only what is missing, invalid or stale is redone.


rule experiment:
    """One experiment: fresh engines per case, every trial checked, pairs, OUT/experiment.json."""
    input:
        traces=experiment_traces,
        backend=backend_inputs(),
    output:
        f"{RESULTS}/{{experiment}}/experiment.json",
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS),
    params:
        traces=trace_options,
        settings=experiment_settings,
        backend=backend_json(),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=2,
    log:
        f"{LOGS}/experiment_{{experiment}}.log",
    shell:
        "parity experiment run {wildcards.experiment:q} {params.traces} --backend {params.backend:q}"
        " --settings {params.settings:q} --out {params.out:q} > {log:q} 2>&1"


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


rule offline_limit:
    """The engine's offline limit alone: each sticky shard's whole burst handed to LLM.generate at once."""
    input:
        experiment_manifest("offline-limit"),


rule gc:
    """Normal collection vs startup-heap freeze in the Flame workers."""
    input:
        experiment_manifest("gc"),


rule routing:
    """Ours, beyond the study: its sticky router vs the prefix router, standalone and Flame, on its reuse burst
    and a burst whose documents share a system prompt."""
    input:
        experiment_manifest("routing"),


rule sustained:
    """Ours, the study's named next step: a rate ladder of streamed pairs, standalone vLLM and Flame under the
    same seeded Poisson arrivals, every latency from the scheduled arrival on the host's clock."""
    input:
        experiment_manifest("sustained"),
