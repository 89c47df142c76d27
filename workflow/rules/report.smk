# The report (parity report; tables and plots in parity.report), then every manifest validated.


rule report:
    """Markdown tables shaped like the study's, the study's numbers beside ours, PNG plots."""
    input:
        experiments=[experiment_manifest(name) for name in EXPERIMENTS],
        mlperf=rules.mlperf.input,
        reference="config/study-reference.yaml",
    output:
        markdown=f"{RESULTS}/report/report.md",
        manifest=f"{RESULTS}/report/report.json",
    params:
        results=lambda wildcards, input: os.path.dirname(os.path.dirname(input.experiments[0])),
        mlperf=lambda wildcards, input: os.path.join(os.path.dirname(os.path.dirname(input.experiments[0])), "mlperf"),
        out=lambda wildcards, output: os.path.dirname(output.manifest),
    log:
        f"{LOGS}/report.log",
    shell:
        "parity report --results {params.results:q} --mlperf {params.mlperf:q} --reference {input.reference:q}"
        " --out {params.out:q} > {log:q} 2>&1"


rule validate_manifests:
    """Every manifest of the run, schema-valid and hash-linked (parity validate): it vouches for each input."""
    input:
        traces=trace_manifests(),
        experiments=[experiment_manifest(name) for name in EXPERIMENTS],
        mlperf=rules.mlperf.input,
        report=rules.report.output.manifest,
    output:
        touch(f"{RESULTS}/validated.ok"),
    params:
        results=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        f"{LOGS}/validate.log",
    shell:
        "parity validate {params.results:q} 2> {log:q}"
