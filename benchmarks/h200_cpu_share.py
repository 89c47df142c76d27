"""Does CPU load beside an eager vLLM engine slow its steps on this host? (issue 28's 512-token gap; a diagnosis)

usage, on a GPU host after `source .gpu/b/setup.sh`:  python3 benchmarks/h200_cpu_share.py [--layers N] [--rounds R]
One engine (dummy Llama 3.1 8B shape, N layers, eager, Triton attention, as the trials run it) decodes the same
decode-bound batch (32 prompts of 2,000 unique tokens, 256 tokens each) in rounds of four phases: alone; with four
processes shaped like the Flame path's own beside it (each busy 2 ms of every 7: about 28% of a core, 140 wake-ups
a second); with the same four while the engine core (every thread) has the last CPU to itself (the others pinned
off it); and with the engine core on the last two CPUs, as `backend.engine_cpus: 2` places it (parity.cpus).
Prints one JSON line per phase (its mean time per decode step) and a summary line. Not a measurement of either
path: the same engine, the same work, only what runs beside it differs.
"""
import argparse, json, os, random, shutil, subprocess, sys, tempfile, time

BURN = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.002: pass\n    time.sleep(0.005)\n"

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
model = tempfile.mkdtemp(prefix="llama31-8b-dummy-")
cfg = json.load(open(os.path.join(here, "..", "config", "models", "llama31-8b-config.json")))  # tracked
cfg["num_hidden_layers"] = args.layers
json.dump(cfg, open(os.path.join(model, "config.json"), "w"))

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
          attention_config={"backend": "TRITON_ATTN"}, max_model_len=32768, max_num_seqs=64,
          max_num_batched_tokens=8192, enable_prefix_caching=False, seed=0)
STEPS = 256
params = SamplingParams(max_tokens=STEPS, min_tokens=STEPS, ignore_eos=True, temperature=0.0, detokenize=False)
rng = random.Random(0)
last = os.cpu_count() - 1


def engine_cores() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "EngineCore"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def pin(pids: list[int], cpus: str) -> None:
    for pid in pids:
        subprocess.run(["taskset", "-a", "-cp", cpus, str(pid)], capture_output=True)


def phase(name: str) -> float:
    prompts = [[rng.randrange(1000, 128000) for _ in range(2000)] for _ in range(32)]
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == STEPS for o in outs)
    print(json.dumps({"phase": name, "seconds": round(dt, 3), "ms_per_step": round(dt / STEPS * 1000, 3)}), flush=True)
    return dt / STEPS


cores = engine_cores()
print(json.dumps({"engine_cores": cores, "cpus": os.cpu_count(), "layers": args.layers}), flush=True)
phase("warmup")
phase("warmup")
results = {"alone": [], "load4": [], "load4-pinned": [], "load4-cpus2": []}
for _ in range(args.rounds):
    results["alone"].append(phase("alone"))
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(4)]
    try:
        results["load4"].append(phase("load4"))
        pin([b.pid for b in burners] + [os.getpid()], f"0-{last - 1}")
        pin(cores, str(last))
        results["load4-pinned"].append(phase("load4-pinned"))
        pin([b.pid for b in burners] + [os.getpid()], f"0-{last - 2}")  # as backend.engine_cpus 2 places them
        pin(cores, f"{last - 1}-{last}")
        results["load4-cpus2"].append(phase("load4-cpus2"))
    finally:
        for b in burners:
            b.kill()
        pin(cores + [os.getpid()], f"0-{last}")
summary = {k: round(1000 * sorted(v)[len(v) // 2], 3) for k, v in results.items()}
print(json.dumps({"median_ms_per_step": summary, "rounds": args.rounds,
                  "load4_over_alone": round(summary["load4"] / summary["alone"], 4),
                  "pinned_over_alone": round(summary["load4-pinned"] / summary["alone"], 4),
                  "cpus2_over_alone": round(summary["load4-cpus2"] / summary["alone"], 4)}), flush=True)
shutil.rmtree(model, ignore_errors=True)
