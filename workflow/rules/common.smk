# Config validation and the paths every rule shares.
import json

from snakemake.utils import validate

validate(config, schema="../../schemas/config.schema.yaml")

RESULTS = config["results"]
TRACES = f"{RESULTS}/traces"
EXPERIMENTS = ["locality", "admission", "confirmation", "gc", "offline-limit"]
BACKEND_JSON = json.dumps(config["backend"], sort_keys=True)


def trace_manifests():
    return [f"{TRACES}/{name}.json" for name in config["traces"]]


def experiment_settings(name):
    """config/experiments.yaml's settings for one experiment, with this profile's overrides applied."""
    return json.dumps(config["experiments"][name] | config.get("overrides", {}).get(name, {}), sort_keys=True)


def experiment_manifest(name):
    return f"{RESULTS}/{name}/experiment.json"
