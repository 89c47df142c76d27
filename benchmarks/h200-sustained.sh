#!/usr/bin/env bash
# Issue 17's and 20's one-GPU checks on a real H200 (real vLLM 0.26.0, dummy Llama 3.1 8B weights, real Flame
# v0.6.0), from the repo root after `source .gpu/b/setup.sh`, with .flame/ and .whl/ carried:
#   benchmarks/h200-sustained.sh OUTDIR [STEPS] [LIMIT_S]   (STEPS: 12 by default, or 1 or 2)
#   1. KV cache events from vLLM inside Flame workers: `parity flame run --engine vllm --api async --placement
#      prefix` on the checks' small trace; the trial's kv_events (counts, the map beside the engine's blocks);
#   2. the sustained ladder through the workflow's host profile (`benchmarks/host.sh sustained`): on one GPU a
#      shard per path, each rate a streamed pair under the same Poisson arrivals, plus the `gathered` arm; killed
#      at LIMIT_S (default 540) so a device call ends in time: a rerun keeps every finished trial and goes on.
# Copies the trials, the experiment manifest and its log to OUTDIR.
set -uo pipefail
out=$1
steps=${2:-12}
limit=${3:-540}
source benchmarks/h200-env.sh
if [[ $steps == *1* ]]; then
  echo "== 1. KV cache events from vLLM inside real Flame workers"
  small_reuse_trace "$out"
  source benchmarks/flame-bins.sh
  start=$(date +%s)
  parity flame run --cluster flame --engine vllm --api async --gpu "$gpu" --placement prefix \
    --trace "$out/traces/reuse.json" --warmup-rounds 1 --model "$model" --load-format dummy --out "$out/flame-prefix" 2>&1 | tail -n 4
  echo "rc=${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"
  python3 - "$out/flame-prefix" <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(p.read_text())
    if d.get("kind") == "trial":
        r = d["router"]
        print(" ", p.name, d["engine"]["name"], d["engine"]["version"], d["verdict"]["status"], "kv_events:",
              json.dumps(d.get("kv_events")), "expected/realized cached:", r["expected_cached_tokens"],
              r["realized_cached_tokens"])
PY
fi
if [[ $steps == *2* ]]; then
  echo "== 2. the sustained ladder (host profile, one GPU)"
  start=$(date +%s)
  timeout "$limit" benchmarks/host.sh sustained
  echo "rc=$? in $(( $(date +%s) - start )) s"
  mkdir -p "$out/sustained"
  cp -r results/host/sustained/trials "$out/sustained/" 2>/dev/null
  cp results/host/sustained/experiment.json "$out/sustained/" 2>/dev/null
  cp results/host/logs/experiment_sustained.log "$out/sustained/" 2>/dev/null
  tail -n 30 results/host/logs/experiment_sustained.log
fi
