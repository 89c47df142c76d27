"""`parity mlperf`: the MLPerf Offline control, one arm per process, its accuracy and its comparison; the
options' defaults are `RunSpec`'s (its `Backend` and `FlameSettings` included) and the registries of `parity.mlperf`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from parity.cli import options
from parity.cli.app import echo, main
from parity.cli.errors import friendly_errors, writable_folder
from parity.mlperf import ARMS, MODES
from parity.backend import Backend
from parity.mlperf.run import ENGINES, PLACEMENTS, RunSpec, arm_backend


@main.group("mlperf")
def mlperf_group():
    """The MLPerf v5.1.1 Llama 3.1 8B Offline control (real LoadGen), one arm per process."""


@mlperf_group.command("run")
@click.option("--arm", type=click.Choice(ARMS), required=True)
@click.option("--dataset", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="cnn_eval.json (or a synthetic one from smoke-dataset / random-dataset).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=options.out_folder,
              help="Run folder: mlperf-run.json, user.conf, loadgen/ logs, replica/worker logs, cleanup receipt.")
@click.option("--mode", type=click.Choice(MODES), default=RunSpec.mode, show_default=True)
@click.option("--engine", type=click.Choice(ENGINES), default=RunSpec.backend.engine,
              show_default=True, help="sim on a CPU; vllm: `vllm serve` (standalone) or vllm-async (Flame).")
@options.gpus("GPU UUID per replica or worker (repeat); default sim-0.")
@options.engine_options
@click.option("--max-tokens", default=RunSpec.max_tokens, show_default=True, type=click.IntRange(min=1),
              help="Up to this many new tokens (MLPerf: 128).")
@options.sim_params
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Use only the first N dataset entries (non-compliant).")
@click.option("--target-qps", type=options.Finite(min=0, min_open=True), default=None,
              help="Offline target_qps; default: estimate with a probe.")
@click.option("--probe-samples", default=RunSpec.probe_samples, show_default=True, type=click.IntRange(min=1),
              help="Samples the target_qps probe sends.")
@click.option("--warmup-samples", default=RunSpec.warmup_samples, show_default=True, type=click.IntRange(min=0),
              help="Samples run untimed first (worker start-up, kernel JIT); 0: none.")
@click.option("--qps-margin", default=RunSpec.qps_margin, show_default=True, type=options.Finite(min=0, min_open=True),
              help="target_qps = probe samples/s x this.")
@click.option("--min-duration-ms", type=click.IntRange(min=0), default=None,
              help="Override min_duration (rules: 600000).")
@click.option("--min-query-count", type=click.IntRange(min=1), default=None,
              help="Override min_query_count (rules: 13368).")
@click.option("--performance-sample-count", type=click.IntRange(min=1), default=None,
              help="Override the performance pool.")
@click.option("--max-in-flight", default=RunSpec.max_in_flight, show_default=True, type=click.IntRange(min=1),
              help="Standalone: open requests at most.")
@click.option("--batch-limit", default=RunSpec.flame.batch_limit, show_default=True, type=click.IntRange(min=1),
              help="Flame: prompts per task (the workflow's arms: mlperf.flame_arms).")
@click.option("--window-ms", default=RunSpec.flame.window_ms, show_default=True, type=options.Finite(min=0),
              help="Flame: batch window.")
@click.option("--placement", type=click.Choice(PLACEMENTS), default=RunSpec.placement, show_default=True)
@options.cluster(RunSpec.backend.cluster)
@options.flame_bin_dir
@click.option("--startup-timeout", default=float(RunSpec.backend.startup_timeout_s), show_default=True, type=options.Finite(min=0, min_open=True),
              help="Seconds to wait for replicas.")
@options.backend("Where to run, as the experiments do (JSON or a YAML file): engine, GPUs (the first serves), "
                 "cluster, model, load format, engine args. Replaces the options it covers.")
@friendly_errors
@options.out_apart_from("dataset", "sim_params", out="out_dir")
def mlperf_run(arm, dataset, out_dir, mode, engine, gpus, model, load_format, engine_args, max_tokens, sim_params,
               samples, target_qps, probe_samples, warmup_samples, qps_margin, min_duration_ms, min_query_count,
               performance_sample_count, max_in_flight, batch_limit, window_ms, placement, cluster, flame_bin_dir,
               startup_timeout, backend_text):
    """One arm under LoadGen in this process (prefix caching off); writes OUT/mlperf-run.json."""
    from parity.mlperf.run import run_arm

    backend = options.backend_or_options(backend_text, "engine", "gpus", "model", "load_format", "engine_args", "sim_params",
                                         "cluster", "flame_bin_dir", "startup_timeout")
    if backend is not None:
        backend = arm_backend(backend)
    else:
        backend = Backend(engine=engine, gpus=tuple(gpus), cluster=cluster, startup_timeout_s=startup_timeout,
                          flame_bin_dir=str(flame_bin_dir) if flame_bin_dir else None,
                          sim_params=str(sim_params) if sim_params else None,
                          engine_args=options.engine_values(model, load_format, engine_args))
    from parity import netns

    # Real Flame listens on 0.0.0.0: contain the whole arm first (this may re-execute the command).
    netns.contain(backend.network, needed=arm == "flame" and backend.cluster == "flame", log=echo)
    spec = RunSpec(arm=arm, dataset=dataset, out=out_dir, mode=mode, backend=backend,
                   flame=dataclasses.replace(RunSpec.flame, batch_limit=batch_limit, window_ms=window_ms),
                   max_tokens=max_tokens, samples=samples, target_qps=target_qps, probe_samples=probe_samples,
                   warmup_samples=warmup_samples, qps_margin=qps_margin, min_duration_ms=min_duration_ms,
                   min_query_count=min_query_count, performance_sample_count=performance_sample_count,
                   max_in_flight=max_in_flight, placement=placement)
    from parity import run_lock

    writable_folder(out_dir / "loadgen")  # before any engine starts: LoadGen that could not write there segfaulted
    with run_lock.holding(out_dir):  # one run per folder
        summary = run_arm(spec, log=echo)
    click.echo(json.dumps(summary, sort_keys=True))


@mlperf_group.command("accuracy")
@click.argument("run_manifest", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              required=True, help="Tokenizer directory (tokenizer.json): Llama 3.1's, or the smoke one.")
@click.option("--out", type=click.Path(path_type=Path), required=True, callback=options.out_file,
              help="Accuracy manifest to write.")
@click.option("--nltk-data", type=click.Path(path_type=Path), default=None, help="Staged NLTK data (punkt_tab).")
@click.option("--stand-in-splitter", is_flag=True,
              help="Use punkt without its English data (labelled, never comparable) where punkt_tab is absent.")
@friendly_errors
@options.out_apart_from("run_manifest", "tokenizer_dir")
def mlperf_accuracy(run_manifest, tokenizer_dir, out, nltk_data, stand_in_splitter):
    """ROUGE and generated-length gates of an accuracy-mode run; outputs kept with their hashes."""
    from parity.mlperf import accuracy

    splitter = accuracy.untrained_punkt_splitter() if stand_in_splitter else accuracy.punkt_splitter(nltk_data)
    doc = accuracy.evaluate_run(run_manifest, tokenizer_dir, out, splitter)
    s = doc["scores"]
    click.echo(f"rouge1 {s['rouge1']} rouge2 {s['rouge2']} rougeL {s['rougeL']} rougeLsum {s['rougeLsum']} "
               f"gen_len {s['gen_len']} gen_num {s['gen_num']}: gates {'passed' if doc['passed'] else 'FAILED'} "
               f"({doc['gates_basis']}){'' if doc['comparable'] else ' - not comparable: ' + '; '.join(doc['reasons'])}")


@mlperf_group.command("compare")
@click.option("--standalone", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--flame", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, callback=options.out_file)
@friendly_errors
@options.out_apart_from("standalone", "flame")
def mlperf_compare(standalone, flame, out):
    """Both arms' run manifests side by side; flags a vLLM version mismatch and any other difference."""
    from parity.mlperf.compare import compare

    doc = compare(standalone, flame, out)
    click.echo(f"flame/standalone samples/s: {doc['flame_to_standalone_samples_per_second']}, tokens/s: "
               f"{doc['flame_to_standalone_tokens_per_second']}; "
               f"vLLM versions match: {doc['vllm_versions_match']}" +
               "".join(f"\n  flag: {f}" for f in doc["flags"]))


@mlperf_group.command("smoke-dataset")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              required=True, help="The smoke tokenizer (parity smoke-inputs).")
@click.option("--out", type=click.Path(path_type=Path), required=True, callback=options.out_file)
@click.option("--samples", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@friendly_errors
@options.out_apart_from("tokenizer_dir")
def mlperf_smoke_dataset(tokenizer_dir, out, samples, seed):
    """A synthetic cnn_eval.json (MLPerf prompt, smoke tokenizer), labelled synthetic-smoke."""
    from parity.mlperf.dataset import write_smoke_dataset

    write_smoke_dataset(tokenizer_dir, out, samples=samples, seed=seed)
    click.echo(f"wrote {out} ({samples} synthetic samples)")


@mlperf_group.command("random-dataset")
@click.option("--out", type=click.Path(path_type=Path), required=True, callback=options.out_file)
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@friendly_errors
def mlperf_random_dataset(out, samples, seed):
    """A cnn_eval-shaped file of random Llama 3 token IDs (no text), labelled synthetic-random."""
    from parity.mlperf.dataset import write_random_dataset

    write_random_dataset(out, samples=samples, seed=seed)
    click.echo(f"wrote {out} ({samples} random-token samples)")
