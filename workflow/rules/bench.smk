# Engine-only runs beside the study (config `bench`; the host profile names them): the real-engine runs the
# simulator is calibrated against (target calibration), and each sticky shard in arrival vs prefix order on one
# engine (target order). Neither is a claim of the study; each run is its own job, holding the node's GPUs as an
# experiment does, with the backend's model, load format and engine arguments. The engine takes the first GPU.

CALIBRATION = BENCH.get("calibration", {})
ORDER = BENCH.get("order", {})


if CALIBRATION:

    rule calibration_run:
        """One engine (vllm-sync: LLM.generate; vllm-async: AsyncLLM) over its traces, warmed up first."""
        input:
            traces=lambda wildcards: [trace_manifest(name) for name in CALIBRATION["runs"][wildcards.run]["traces"]],
            backend=backend_inputs(),
        output:
            f"{RESULTS}/calibration/{{run}}/summary.jsonl",
        wildcard_constraints:
            run="|".join(CALIBRATION["runs"]),
        params:
            engine=lambda wildcards: CALIBRATION["runs"][wildcards.run]["engine"],
            batch=lambda wildcards: CALIBRATION["runs"][wildcards.run].get("batch", 0),
            traces=trace_options,
            backend=backend_json(warmup_rounds=CALIBRATION.get("warmup_rounds", config["backend"].get("warmup_rounds", 2))),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        resources:
            gpu=2,
        log:
            f"{LOGS}/calibration_{{run}}.log",
        shell:
            "parity engine run --engine {params.engine:q} {params.traces} --batch {params.batch}"
            " --backend {params.backend:q} --out {params.out:q} > {log:q} 2>&1"

    rule calibration:
        """Every calibration run: a trial manifest per trace and a summary.jsonl per run."""
        input:
            expand(f"{RESULTS}/calibration/{{run}}/summary.jsonl", run=CALIBRATION["runs"]),


if ORDER:

    rule order_run:
        """One engine runs each chosen sticky shard in arrival and in prefix order, interleaved."""
        input:
            trace=lambda wildcards: trace_manifest(ORDER[wildcards.run]["trace"]),
            backend=backend_inputs(),
        output:
            f"{RESULTS}/order/{{run}}/order.json",
        wildcard_constraints:
            run="|".join(ORDER),
        params:
            engine=lambda wildcards: ORDER[wildcards.run]["engine"],
            repeats=lambda wildcards: ORDER[wildcards.run].get("repeats", 2),
            shards=lambda wildcards: " ".join(f"--shard {s}" for s in ORDER[wildcards.run].get("shards", [])),
            backend=backend_json(),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        resources:
            gpu=2,
        log:
            f"{LOGS}/order_{{run}}.log",
        shell:
            "parity bench order --engine {params.engine:q} --trace {input.trace:q} {params.shards}"
            " --repeats {params.repeats} --backend {params.backend:q} --out {params.out:q} > {log:q} 2>&1"

    rule order:
        """Every admission-order run (order.json each)."""
        input:
            expand(f"{RESULTS}/order/{{run}}/order.json", run=ORDER),
