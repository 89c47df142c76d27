# parity: reproduce "Bringing Flame Serving Close to Standalone vLLM".
#   snakemake --cores 20 all                       real GPUs: profiles/default (found beside this file), jobs in the image
#   snakemake --workflow-profile smoke all         CPU smoke run (what `make smoke` does)
#   snakemake --workflow-profile slurm_<site> all  a SLURM cluster (copy profiles/slurm first)
# Add -n to any of them for a dry run: it works on any machine, without GPUs, Apptainer or sbatch.
# Each rule calls one `parity` command; the logic lives in src/parity/. Targets per claim:
#   locality, admission, confirmation, gc, mlperf, report, all.
# Every profile names its own config file; config/experiments.yaml (the study's settings) lies under all.

configfile: "config/experiments.yaml"


include: "workflow/rules/common.smk"

# Every job names the pinned image; a profile that deploys with Apptainer runs it there. Where the image
# cannot run (no apptainer, image not built) a dry run still shows every job, and a real run stops at start.
IMAGE_PROBLEM = image_check()


container: config["container"]


include: "workflow/rules/fetch.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/mlperf.smk"
include: "workflow/rules/report.smk"


onstart:
    if IMAGE_PROBLEM:
        raise WorkflowError(IMAGE_PROBLEM)


rule all:
    """The report and the validated evidence. Every manifest validation vouches for is listed here too:
    Snakemake does not remake a deleted intermediate file when what follows is up to date, but it always
    makes this rule's inputs, and the report and validation then follow from the newer file."""
    default_target: True
    input:
        rules.validate_manifests.input,
        rules.report.output,
        rules.validate_manifests.output,
