# The config, validated whole, and the helpers every rule shares (functions only; rules live beside).
# The profile names its config file (profiles/<name>/profile.yaml: configfile); Snakemake merges it deeply
# over config/experiments.yaml, and the merged result is validated here: a missing, misspelt or mistyped key
# stops the run with its name before any job starts, and no profile falls back to another's values.
import json
import logging
import os
import shlex
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

if "profile" not in config:  # also where --workflow-profile names no folder of profiles/ (Snakemake loads nothing)
    raise WorkflowError(
        "no profile config: run with a profile (bare `snakemake` loads profiles/default; "
        "`--workflow-profile smoke` for the CPU run; a profile is one of "
        + ", ".join(sorted(p.parent.name for p in Path(workflow.basedir).glob("profiles/*/profile.yaml")))
        + ") or pass --configfile config/<profile>.yaml"
    )


def _typed_overrides(config):
    """Snakemake reads a nested --config value (fetch='{record_pins: true}') with YAML's BaseLoader, so every number
    and boolean in it arrives as a string the schema refuses; each such leaf is read again as a config file's would
    be (a string stays a string), before validation. Only --config's values (config_settings.config): its
    overwrite_config holds the --configfile files too, whose quoted strings ("2024", "null") stay strings (an outside
    tester's, 2026-12-06)."""
    import yaml
    from snakemake.utils import update_config

    def typed(value):
        if isinstance(value, dict):
            return {key: typed(child) for key, child in value.items()}
        if isinstance(value, list):
            return [typed(child) for child in value]
        if isinstance(value, str) and value:
            try:
                read = yaml.safe_load(value)
            except yaml.YAMLError:
                return value
            return read if isinstance(read, (bool, int, float)) or read is None else value
        return value

    overrides = getattr(getattr(workflow, "config_settings", None), "config", None) or {}
    update_config(config, {key: typed(value) for key, value in overrides.items() if isinstance(value, (dict, list))})


_typed_overrides(config)


def _validated(config):
    """The config checked against schemas/config.schema.yaml; refused in one line that names the key and where
    it is (Snakemake's own error also prints the whole schema and config: about 2,000 lines; an outsider, 2026-12-05)."""
    try:
        validate(config, schema="../../schemas/config.schema.yaml", set_default=False)
    except WorkflowError as e:
        lines = str(e).splitlines()
        what = next((line.split("ValidationError: ", 1)[1] for line in lines if "ValidationError: " in line), None)
        if what is None:
            raise
        where = next((line.strip().rstrip(":") for line in lines if line.startswith("On instance")), "On instance")
        from parity.workflow_config import reworded

        raise WorkflowError(f"the workflow config is refused: {reworded(what)} (at {where.replace('On instance', 'config', 1)}; "
                            "schemas/config.schema.yaml says what each key takes)") from None


def _refuse_traces_that_cannot_be_made():
    """Each trace's spec as `parity trace` checks it (parity.trace.TraceSpec.check: a head or answers past its prefix),
    and its prompts, at least its prefix long, within the study's context: the trace job refused them, after the
    inputs were fetched (an outsider's, 2026-12-07)."""
    from parity.errors import ParityError
    from parity.study import MAX_MODEL_LEN, OUTPUT_TOKENS
    from parity.trace import TraceSpec

    for name, spec in TRACE_SPECS.items():
        where = f"{'bench.traces' if name in BENCH.get('traces', {}) else 'traces'}.{name}"
        try:
            TraceSpec(name, spec["documents"], spec["questions"], spec["prefix_tokens"], spec["seed"],
                      tuple(config["warmup_shifts"]), head_tokens=spec.get("head_tokens", 0),
                      zipf=spec.get("zipf", 0.0), blocks=spec.get("blocks", 1),
                      answer_tokens=spec.get("answer_tokens", 0)).check()
        except ParityError as exc:
            raise WorkflowError(f"{where}: {exc}") from None
        if spec["prefix_tokens"] + OUTPUT_TOKENS > MAX_MODEL_LEN:
            raise WorkflowError(f"{where}: prefix_tokens {spec['prefix_tokens']} and {OUTPUT_TOKENS} new tokens do not "
                                f"fit the study's max_model_len {MAX_MODEL_LEN}")


def _refuse_duplicate_keys():
    """Snakemake reads a config file keeping the last of a key given twice (`engine: sim`, then `engine: vllm`, ran
    vLLM: an outsider's); each is read again as parity reads a workflow config (parity.workflow_config.load), which
    refuses it, naming the file, the key and where."""
    from parity.errors import ParityError
    from parity.workflow_config import load

    try:
        load(workflow.configfiles)
    except ParityError as exc:
        raise WorkflowError(str(exc)) from None


_refuse_duplicate_keys()
_validated(config)


def _refuse_what_the_schema_lets_by(config):
    """What Snakemake's validation lets by (parity.workflow_config.check): a float where an integer goes (64.0: the job's
    command refused it) and a number that is not finite; a WorkflowError names the key, before any job starts."""
    from parity.errors import ParityError
    from parity.workflow_config import check, schema

    try:
        check(schema(), config, "the workflow config:")
    except ParityError as exc:
        raise WorkflowError(str(exc)) from None


_refuse_what_the_schema_lets_by(config)


def _refuse_unknown_stages(config):
    """The confirmation's `stages` against the stages its arms make (parity.experiments.plan.confirmation_stages, their
    one home; an arm named twice is refused there), before any job starts: the plan refuses such a name too, but only
    when the confirmation's job runs, after every experiment before it (hours on a GPU host; an outsider)."""
    from parity.errors import ParityError
    from parity.experiments.plan import confirmation_stages

    confirmation = config.get("experiments", {}).get("confirmation", {})
    try:
        planned = confirmation_stages(tuple(confirmation.get("arms", [])), confirmation.get("flame_arms"))
    except ParityError as exc:
        raise WorkflowError(f"experiments.{exc}") from None
    for stage in confirmation.get("stages", []):
        if stage not in planned:
            raise WorkflowError(f"experiments.confirmation.stages names {stage!r}, not a stage of this plan "
                                f"({', '.join(planned)})")


_refuse_unknown_stages(config)

UNLOCK_HINT = ("this folder is locked: if no other Snakemake runs here (one killed by SIGKILL or a power loss leaves "
               "its lock) and no job of a killed one still runs (`ps`), run `snakemake --unlock` (same profile), then "
               "this command again; Snakemake's own message:")


class UnlockHint(logging.Filter):
    """Snakemake's refusal of a locked folder names its remedy (--unlock) only on its fourth line, after
    "Another Snakemake instance is running" in a dry run: put the remedy first; its own message follows whole.
    Where a later Snakemake words it otherwise, its own message is shown as it is."""

    def filter(self, record):
        if isinstance(record.msg, str) and "Directory cannot be locked" in record.msg and UNLOCK_HINT not in record.msg:
            record.msg = f"{UNLOCK_HINT}\n{record.msg}"
        return True


_snakemake_log = logging.getLogger("snakemake.logging")
if not any(type(f).__name__ == "UnlockHint" for f in _snakemake_log.filters):  # once, however often this is read
    _snakemake_log.addFilter(UnlockHint())

RESULTS = config["results"]
TRACES = f"{RESULTS}/traces"
LOGS = f"{RESULTS}/logs"
EXPERIMENTS = list(config["experiments"])
INPUTS = config["inputs"]
MLPERF = config["mlperf"]
FETCH_PINS = "manifests/pins"
FETCH_RECORD = "--record-pins" if config.get("fetch", {}).get("record_pins", False) else ""
BENCH = config.get("bench", {})
# Every trace the workflow may build: the experiments' (`traces`) and the engine-only runs' (`bench.traces`).
TRACE_SPECS = {**BENCH.get("traces", {}), **config["traces"]}
# Ours (issue 31): a Mooncake request trace (mooncake.file; none by default, and then nothing of it runs), made a
# trace (parity trace-mooncake) that the sustained experiment replays as one more pair (experiments.sustained.replay).
MOONCAKE = config.get("mooncake") or {}
MOONCAKE_NAME = MOONCAKE.get("name", "mooncake") if MOONCAKE.get("file") else None
# A model folder the workflow makes from a config.json alone (inputs.model_config), for dummy weights.
MODEL_CONFIG = INPUTS.get("model_config")
MLPERF_SYNTHETIC = MLPERF.get("synthetic", "smoke") if INPUTS["generate"] else None
# MLPerf's arms: standalone, and one Flame arm per entry of mlperf.flame_arms (config/experiments.yaml), its settings there.
MLPERF_FLAME = MLPERF["flame_arms"]
MLPERF_RUNS = ["standalone", *(f"flame-{name}" for name in MLPERF_FLAME)]


def _check_results_folder():
    """What the schema cannot say: `results` and the folders the workflow makes in it (traces, logs, one per
    experiment, ...) must be folders where they exist; a file at any of them (or above it) otherwise ends in
    Snakemake's traceback once it makes its output folders. A WorkflowError names it, before any job starts."""
    above, path = [], RESULTS
    while path:
        above, path = [path, *above], os.path.dirname(path)
    made = ("mlperf", "report", "calibration", "order", *EXPERIMENTS)  # the rules' own folders, beside TRACES and LOGS
    inside = [TRACES, LOGS, *(f"{RESULTS}/{name}" for name in made)]
    for path in [*above, *inside]:
        if os.path.lexists(path) and not os.path.isdir(path):
            what = "a file, not a folder" if os.path.isfile(path) else "not a folder"
            where = "" if len(path) <= len(RESULTS) else f" (where the workflow makes its {path[len(RESULTS) + 1:]} folder)"
            raise WorkflowError(f"results: {path} is {what}{where}")


_check_results_folder()


def _refuse_unless_a_file(key, path):
    """A WorkflowError naming `key` unless `path` is a regular file (a folder, a pipe, a device or nothing is
    refused at parse time, not by the job that reads it)."""
    if not os.path.isfile(path):
        what = ("a folder, not a file" if os.path.isdir(path) else
                "not a regular file" if os.path.exists(path) else "no such file")
        raise WorkflowError(f"{key}: {what}: {path}")


def _check_references():
    """What the schema cannot say: one key's value against another's; a WorkflowError names both."""
    backend = config["backend"]
    shared = sorted(set(BENCH.get("traces", {})) & set(config["traces"]))
    if shared:
        raise WorkflowError(f"bench.traces: {', '.join(shared)} is already in traces; give it another name")
    named = [(f"bench.calibration.runs.{run}.traces", name)
             for run, spec in BENCH.get("calibration", {}).get("runs", {}).items() for name in spec["traces"]]
    named += [(f"bench.order.{run}.trace", spec["trace"]) for run, spec in BENCH.get("order", {}).items()]
    for experiment in ("routing", "sustained"):
        named += [(f"experiments.{experiment}.traces", name) for name in config["experiments"][experiment].get("traces", [])]
    for key, name in named:
        if name not in TRACE_SPECS:
            raise WorkflowError(f"{key}: no trace {name!r} in traces or bench.traces ({', '.join(TRACE_SPECS)})")
    _refuse_traces_that_cannot_be_made()
    if MOONCAKE_NAME in TRACE_SPECS:
        raise WorkflowError(f"mooncake.name: {MOONCAKE_NAME!r} is already in traces or bench.traces; "
                            "give it another name")
    if MOONCAKE_NAME is not None:  # else Snakemake's rule `trace` is tried
        _refuse_unless_a_file("mooncake.file", MOONCAKE["file"])
    shifts = len(config["warmup_shifts"])
    if MOONCAKE_NAME is not None:  # parity trace-mooncake makes TraceSpec's warm-up variants (its rule names no shifts)
        from parity.trace import TraceSpec

        shifts = min(shifts, len(TraceSpec.warmup_shifts))
    if backend.get("warmup_rounds", 2) > shifts:  # a trial's warm-up round k replays the trace's warmup variant k
        raise WorkflowError(f"backend.warmup_rounds: {backend['warmup_rounds']} warm-up rounds, but each trace has "
                            f"{shifts} warm-up variant(s) (one per warmup_shifts entry"
                            f"{'; a Mooncake trace: two' if MOONCAKE_NAME is not None else ''})")
    if backend["engine"] == "sim" and backend.get("sim_params"):
        _refuse_unless_a_file("backend.sim_params", backend["sim_params"])
    if MODEL_CONFIG is not None:  # copied by its job: a pipe there hung it, a folder failed in it (an outsider's)
        _refuse_unless_a_file("inputs.model_config", MODEL_CONFIG)
        from parity.manifest import strict_loads

        try:
            model = strict_loads(Path(MODEL_CONFIG).read_bytes())
        except (OSError, ValueError) as exc:
            raise WorkflowError(f"inputs.model_config: not a readable JSON file ({exc}): {MODEL_CONFIG}") from None
        if not isinstance(model, dict):
            raise WorkflowError(f"inputs.model_config: a model's config.json is a JSON object: {MODEL_CONFIG}")
        if not backend.get("model") or backend.get("load_format") != "dummy":
            raise WorkflowError("inputs.model_config makes a model folder of a config.json alone: it needs "
                                "backend.model (the folder) and backend.load_format: dummy")
        if os.path.normpath(backend["model"]) == os.path.normpath(INPUTS["tokenizer"]):
            raise WorkflowError(f"inputs.model_config: backend.model {backend['model']} is the tokenizer's folder; "
                                "give the dummy model a folder of its own")
    if INPUTS["generate"]:  # the smoke_inputs rule's `parity smoke-inputs --out DIR` writes DIR/corpus.jsonl and DIR/tokenizer
        corpus, tokenizer = os.path.normpath(INPUTS["corpus"]), os.path.normpath(INPUTS["tokenizer"])
        folder = os.path.dirname(corpus)
        if not folder or os.path.basename(corpus) != "corpus.jsonl" or tokenizer != os.path.join(folder, "tokenizer"):
            raise WorkflowError(f"inputs: generated inputs (generate: true) are DIR/corpus.jsonl and DIR/tokenizer, one "
                                f"folder (parity smoke-inputs --out DIR writes both); got corpus {INPUTS['corpus']!r}, "
                                f"tokenizer {INPUTS['tokenizer']!r}")
    if "synthetic" in MLPERF and not INPUTS["generate"]:
        raise WorkflowError("mlperf.synthetic needs inputs.generate: true (otherwise MLPerf's cnn_eval.json is fetched)")


_check_references()


def q(value):
    """One shell word, whatever the value holds (spaces, quotes, JSON)."""
    return shlex.quote(str(value))


def as_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def trace_manifest(name):
    return f"{TRACES}/{name}.json"


def trace_manifests():
    """The experiments' traces (an engine-only run names its own, from traces or bench.traces)."""
    return [trace_manifest(name) for name in config["traces"]]


def experiment_traces(wildcards):
    """An experiment's traces: those its settings name (the routing and sustained experiments'), else the study's;
    the sustained experiment's, with a Mooncake file given, and its trace."""
    names = config["experiments"][wildcards.experiment].get("traces")
    traces = [trace_manifest(name) for name in names] if isinstance(names, list) else trace_manifests()
    replayed = wildcards.experiment == "sustained" and MOONCAKE_NAME is not None
    return traces + [trace_manifest(MOONCAKE_NAME)] if replayed else traces


def trace_options(wildcards, input):
    return " ".join(f"--trace {q(path)}" for path in input.traces)


def experiment_settings(wildcards):
    """The merged config's settings of one experiment, as the JSON `parity experiment run` records; the sustained
    experiment's, with a Mooncake file given and no replay of its own, replay that trace."""
    settings = config["experiments"][wildcards.experiment]
    if wildcards.experiment == "sustained" and MOONCAKE_NAME is not None and "replay" not in settings:
        settings = settings | {"replay": {"trace": MOONCAKE_NAME}}
    return as_json(settings)


def _refuse_what_jobs_would():
    """Each experiment's settings as its job receives them, planned on its traces' names before any job starts
    (parity.experiments.plan.check_experiment): its job would otherwise refuse them hours into a GPU run, some after
    trials ran (an outside tester, 2026-12-06). One line, naming the experiment."""
    from types import SimpleNamespace

    from parity.backend import Backend
    from parity.errors import ParityError
    from parity.experiments.plan import check_experiment

    try:
        engine = Backend.from_dict(config["backend"])  # once: it reads the simulator's file
    except ParityError as exc:
        raise WorkflowError(f"backend: {str(exc).removeprefix('backend: ')}") from None
    requests = {name: spec["documents"] * spec["questions"] * spec.get("blocks", 1) for name, spec in TRACE_SPECS.items()}
    for name in EXPERIMENTS:
        wildcards = SimpleNamespace(experiment=name)
        names = [Path(path).stem for path in experiment_traces(wildcards)]
        try:  # a Mooncake trace's requests are its file's: one at least
            check_experiment(name, json.loads(experiment_settings(wildcards)),
                             {trace: requests.get(trace, 1) for trace in names}, engine)
        except ParityError as exc:
            raise WorkflowError(f"experiments.{name}: {str(exc).removeprefix(f'{name}: ')}") from None


_refuse_what_jobs_would()


def experiment_manifest(name):
    return f"{RESULTS}/{name}/experiment.json"


def vouched_manifests():
    """The top of every hash-linked tree `parity validate` checks at the end of `all`: each manifest it
    vouches for is an input of `all`, which Snakemake always makes, even when what follows is up to date."""
    return trace_manifests() + [experiment_manifest(name) for name in EXPERIMENTS] + rules.mlperf.input


def backend_json(**changes):
    """Where jobs run (engine, GPUs, cluster, model, load format, engine args): one object for every rule,
    passed whole (`--backend`); `changes` replace a key for one rule (a calibration run's warmup rounds).

    A model folder the workflow makes goes by its absolute path: Flame's workers run in folders of their own."""
    backend = dict(config["backend"]) | changes
    if MODEL_CONFIG is not None:
        backend["model"] = os.path.abspath(backend["model"])
    return as_json(backend)


def backend_inputs():
    """What the backend reads that the workflow makes: the dummy model's config.json, if made here."""
    return [f"{config['backend']['model']}/config.json"] if MODEL_CONFIG is not None else []


def pinned_files(pins_file, section="files"):
    """The file names a pins file lists (read at parse time: a local file, no network)."""
    with open(f"{FETCH_PINS}/{pins_file}") as handle:
        return list(json.load(handle).get(section, {}))


def mlperf_options():
    """This profile's MLPerf run options (lengths, durations) as `parity mlperf run` flags."""
    options = [f"--max-tokens {MLPERF['max_tokens']}"]
    for key in ("target_qps", "min_duration_ms", "min_query_count", "samples", "probe_samples"):
        if MLPERF.get(key) is not None:
            options.append(f"--{key.replace('_', '-')} {q(MLPERF[key])}")
    return " ".join(options)


def mlperf_arm(wildcards):
    """`parity mlperf run`'s arm: standalone, or flame with its arm's Flame settings as options (--batch-limit 32)."""
    if wildcards.arm == "standalone":
        return "--arm standalone"
    settings = MLPERF_FLAME[wildcards.arm.removeprefix("flame-")]
    return " ".join(["--arm flame", *(f"--{key.replace('_', '-')} {q(value)}" for key, value in settings.items())])


def image_option():
    """`--image PATH` for parity bundle where this run's jobs ran in the Apptainer image (its hash goes into the
    crate); nothing where the profile runs on the host (smoke, host), whose bundle names no image."""
    settings = workflow.deployment_settings
    methods = settings.deployment_method if settings else set()
    if any(m.name == "APPTAINER" for m in methods):
        return f"--image {q(config['container'])}"
    return ""


def image_check():
    """Why this profile's jobs cannot run in the image (None if they can, or the profile runs on the host).

    Snakemake refuses even a dry run when apptainer is missing; a dry run needs no image, so it goes on
    without the Apptainer deployment (a warning says so) and a real run stops at start (`onstart`).
    """
    settings = workflow.deployment_settings
    methods = settings.deployment_method if settings else set()
    apptainer = next((m for m in methods if m.name == "APPTAINER"), None)
    if apptainer is None:
        return None
    if shutil.which("apptainer") or shutil.which("singularity"):
        if os.path.exists(config["container"]):
            return None
        return f"the image {config['container']} is not built: run containers/build.sh first"
    methods.discard(apptainer)
    problem = "this profile runs every job in the pinned Apptainer image, but apptainer is not installed"
    logger.warning(f"{problem}: only a dry run (-n) can go on")
    return problem


def drop_bundle():
    """The bundle an earlier `all` made of the tree, and the staging folder a killed `parity bundle` left (a whole,
    valid bag of an older tree: outside pass P), removed (a link unlinked; never a folder outside results/)."""
    for bundle in (f"{RESULTS}-bundle", f"{RESULTS}-bundle.partial"):
        if os.path.islink(bundle):
            os.unlink(bundle)
        elif os.path.realpath(bundle).startswith(os.path.realpath("results") + os.sep):
            shutil.rmtree(bundle, ignore_errors=True)

