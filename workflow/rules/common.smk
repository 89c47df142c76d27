# Config validation and the paths every rule shares.
from snakemake.utils import validate

validate(config, schema="../../schemas/config.schema.yaml")

RESULTS = config["results"]
TRACES = f"{RESULTS}/traces"


def trace_manifests():
    return [f"{TRACES}/{name}.json" for name in config["traces"]]


rule validate_manifests:
    """Every manifest of the run, schema-valid and hash-linked (parity validate)."""
    input:
        trace_manifests(),
    output:
        touch(f"{RESULTS}/validated.ok"),
    log:
        f"{RESULTS}/logs/validate.log",
    shell:
        "parity validate {RESULTS} 2> {log}"
