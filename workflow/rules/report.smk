# The report (parity report; tables and plots in parity.report). `all` validates every manifest (Snakefile).


rule report:
    """Markdown tables shaped like the study's, the study's numbers beside ours, PNG plots; the same as one
    self-contained HTML page, which `snakemake --report` shows."""
    input:
        experiments=[experiment_manifest(name) for name in EXPERIMENTS],
        mlperf=rules.mlperf.input,
        reference="config/study-reference.yaml",
    output:
        markdown=f"{RESULTS}/report/report.md",
        html=report(f"{RESULTS}/report/report.html", caption="../report/report.rst", category="Report",
                    labels={"page": "the study beside ours"}),
        manifest=f"{RESULTS}/report/report.json",
    params:
        results=lambda wildcards, input: os.path.dirname(os.path.dirname(input.experiments[0])),
        mlperf=lambda wildcards, input: os.path.dirname(input.mlperf[0]),
        out=lambda wildcards, output: os.path.dirname(output.manifest),
    log:
        f"{LOGS}/report.log",
    shell:
        "parity report --results {params.results:q} --mlperf {params.mlperf:q} --reference {input.reference:q}"
        " --out {params.out:q} > {log:q} 2>&1"
