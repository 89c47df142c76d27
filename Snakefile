# parity: reproduce "Bringing Flame Serving Close to Standalone vLLM".
#   snakemake --cores 20 all                                  real GPUs (workflow/profiles/default, loaded automatically)
#   snakemake --workflow-profile workflow/profiles/smoke all  CPU smoke run (what `make smoke` does)
# Each rule calls one `parity` command; the logic lives in src/parity/. Targets per claim:
#   locality, admission, confirmation, gc, mlperf, report, all.

configfile: "config/experiments.yaml"
configfile: "config/default.yaml"


container: config.get("container") or None


include: "workflow/rules/common.smk"
include: "workflow/rules/fetch.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/mlperf.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        f"{RESULTS}/validated.ok",
