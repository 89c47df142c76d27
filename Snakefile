# parity: reproduce "Bringing Flame Serving Close to Standalone vLLM".
#   snakemake --cores 20 all                       real GPUs: profiles/default (found beside this file), jobs in the image
#   snakemake --workflow-profile smoke all         CPU smoke run (what `make smoke` does)
#   snakemake --workflow-profile slurm_<site> all  a SLURM cluster (copy profiles/slurm first)
#   snakemake --workflow-profile host TARGET       real GPUs with vLLM and Flame on the host, no container (benchmarks/host.sh)
# Add -n to any of them for a dry run: it works on any machine, without GPUs, Apptainer or sbatch.
# Each rule that runs a step calls one `parity` command (the experiments' all through the rule `experiment`:
# `parity experiment run NAME`; `all` seals, bundles and validates); the logic lives in src/parity/. Targets per claim:
#   locality, admission, confirmation, gc, routing, sustained, mlperf, report, all; and traces, offline_limit.
# After a run, `snakemake --workflow-profile PROFILE --report report.html` gives one self-contained page.
# Engine-only targets where the profile's config has `bench` (host): calibration, order.
# Every profile names its own config file; config/experiments.yaml (the study's settings) lies under all.

configfile: "config/experiments.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"

# Every job names the pinned image; a profile that deploys with Apptainer runs it there. Where the image
# cannot run (no apptainer, image not built) a dry run still shows every job, and a real run stops at start.
IMAGE_PROBLEM = image_check()


container: config["container"]


include: "workflow/rules/fetch.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/mlperf.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"


onstart:
    if IMAGE_PROBLEM:
        raise WorkflowError(IMAGE_PROBLEM)
    # a run that will change the tree first removes the bundle an earlier `all` made of it: were a job killed or to
    # fail, that bundle would stand beside a tree it no longer describes (`all` makes it again; a run with nothing
    # to do never gets here). --touch changes only times, which no bundle holds: it keeps the bundle unless it fails
    # (Snakemake then removes the failed job's outputs: onerror)
    if not workflow.touch:
        drop_bundle()


onerror:
    drop_bundle()


rule all:
    """The report, then every manifest of the run validated and the tree sealed (parity seal: RESULTS/run.json
    links every kept file no other manifest links, and the fetch receipts), then the run's evidence bundle
    (parity bundle: the results, the inputs they link, the workflow, an RO-Crate of what ran, in a BagIt bag at
    RESULTS-bundle), checked once written (parity validate --bundle: the bag, the crate, the manifests inside).
    Neither has an output on purpose: they run each time `all` is asked for, so a file changed, added or
    deleted since the last run is caught even when nothing needs remaking, and the bundle holds what is there now
    (where any of the three fails no bundle is left, an earlier run's included, as a failed seal leaves no
    run.json). Every manifest it vouches for is an input: Snakemake does not remake a deleted intermediate when
    what follows is up to date, but it always makes the inputs of `all`."""
    default_target: True
    input:
        vouched=vouched_manifests(),
        report=rules.report.output.manifest,
        page=rules.report.output.html,  # what snakemake --report shows: made also where an older run lacks it
        receipts=FETCH_RECEIPTS,
    params:
        results=lambda wildcards, input: os.path.dirname(os.path.dirname(input.report)),
        inputs=lambda wildcards, input: " ".join(f"--input {shlex.quote(r)}" for r in input.receipts),
        bundle=f"{RESULTS}-bundle",
        image=image_option(),
    log:
        f"{RESULTS}-bundle.log",  # outside the tree it seals: a log still being written cannot be linked by hash
    shell:
        "{{ parity seal {params.results:q} {params.inputs}"
        " && parity bundle {params.results:q} --out {params.bundle:q} {params.image}"
        " && parity validate --bundle {params.bundle:q}; }} > {log:q} 2>&1"
        " || {{ rm -rf {params.bundle:q}; tail -n 20 {log:q} >&2; exit 1; }}"
