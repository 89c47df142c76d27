# parity: reproduce "Bringing Flame Serving Close to Standalone vLLM".
#   snakemake --cores 20 all                                  real GPUs (workflow/profiles/default)
#   snakemake --workflow-profile workflow/profiles/smoke all  CPU smoke run (what `make smoke` does)
# Each rule calls one `parity` command; the logic lives in src/parity/.

configfile: "config/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/traces.smk"


rule all:
    default_target: True
    input:
        trace_manifests(),
        f"{RESULTS}/validated.ok",
