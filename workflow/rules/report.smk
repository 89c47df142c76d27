# The report (parity report; tables and plots in parity.report), then every manifest validated.


rule report:
    """Markdown tables shaped like the study's, the study's numbers beside ours, PNG plots."""
    input:
        [experiment_manifest(name) for name in EXPERIMENTS],
        rules.mlperf.input,
        reference="config/study-reference.yaml",
    output:
        markdown=f"{RESULTS}/report/report.md",
        manifest=f"{RESULTS}/report/report.json",
    params:
        out=f"{RESULTS}/report",
    log:
        f"{RESULTS}/logs/report.log",
    shell:
        "parity report --results {RESULTS} --mlperf {RESULTS}/mlperf --reference {input.reference}"
        " --out {params.out} > {log} 2>&1"


rule validate_manifests:
    """Every manifest of the run, schema-valid and hash-linked (parity validate)."""
    input:
        rules.report.output.manifest,
    output:
        touch(f"{RESULTS}/validated.ok"),
    log:
        f"{RESULTS}/logs/validate.log",
    shell:
        "parity validate {RESULTS} 2> {log}"
