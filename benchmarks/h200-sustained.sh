#!/usr/bin/env bash
# Issue 17's and 20's one-GPU checks on a real H200 (real vLLM 0.26.0, dummy Llama 3.1 8B weights, real Flame
# v0.6.0), from the repo root after `source .gpu/b/setup.sh`, with .flame/ and .whl/ carried:
#   benchmarks/h200-sustained.sh OUTDIR [STEPS] [LIMIT_S]   (STEPS: 12 by default, or 1, 2 or 3)
#   1. KV cache events from vLLM inside Flame workers: `parity flame run --engine vllm --api async --placement
#      prefix` on the checks' small trace; the trial's kv_events (counts, the map beside the engine's blocks);
#   2. the sustained ladder through the workflow's host profile (`benchmarks/host.sh sustained`): on one GPU a
#      shard per path, each rate a streamed pair under the same Poisson arrivals, plus the `gathered` arm; killed
#      at LIMIT_S (default 540) so a device call ends in time: a rerun keeps every finished trial and goes on.
#   3. the cases beyond the ladder, at 8 requests/s (the one-GPU limit is about 9): hot documents (Zipf 1.0) with
#      the study's 16 tokens; and on the reuse shape 512-token answers, a 4,000-block KV cache
#      (eviction) and output lengths per request (parity.lengths); two `parity experiment run sustained` runs on
#      the host profile's traces and backend, killed at LIMIT_S; a rerun keeps every finished trial.
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
if [[ $steps == *3* ]]; then
  echo "== 3. beyond the ladder: hot documents, 512-token answers, eviction, output lengths per request"
  benchmarks/host.sh results/host/traces/reuse-64.json results/host/traces/hot-64.json \
    results/host/model/llama31-8b-dummy/config.json > "$out/beyond-inputs.log" 2>&1 || { tail -n 20 "$out/beyond-inputs.log"; exit 1; }
  source benchmarks/flame-bins.sh  # FLAME_BIN_DIR: host.sh set it in its own process only
  backend='{"cluster":"flame","engine":"vllm","flame_bin_dir":null,"gpus":["auto"],"load_format":"dummy",'
  backend+='"model":"'$PWD'/results/host/model/llama31-8b-dummy","warmup_rounds":2}'
  common='"flame":{"api":"async","batch_limit":256,"budget_mib":4,"compress":true,"gc_freeze":true,"order":"prefix",'
  common+='"window_ms":10},"objective":{"itl_s":0.1,"ttft_s":2.0},"rates":[8],"repeats":1,"schedule":{"kind":"poisson","seed":0}'
  start=$(date +%s)
  for run in ${RUNS:-hot more}; do  # RUNS: a subset, e.g. "more"
    if [ $run = hot ]; then trace=hot-64; settings='{'$common',"output_tokens":[16],"traces":["hot-64"]}'
    else trace=reuse-64  # the Flame side with the gathered arm's inflight 1: without it, one task at a time of single
      # prompts under these arrivals takes 512 decode steps per prompt (the first GPU try ran past 8 minutes)
      settings='{'${common/'"window_ms":10'/'"window_ms":10,"inflight":1'}',"output_tokens":[512],"traces":["reuse-64"],'
      settings+='"evict":{"cache_blocks":4000},"lengths":{"median":64,"sigma":0.8,"high":512,"seed":5}}'; fi
    left=$(( limit - ($(date +%s) - start) ))
    (( left > 60 )) || { echo "no time left for $run"; break; }
    PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} timeout "$left" python3 -m parity experiment run sustained \
      --trace results/host/traces/$trace.json --backend "$backend" --settings "$settings" \
      --out results/host/sustained-$run > "results/host/logs/experiment_sustained-$run.log" 2>&1
    echo "$run: rc=$? at $(( $(date +%s) - start )) s"
    mkdir -p "$out/sustained-$run"
    cp -r results/host/sustained-$run/trials results/host/sustained-$run/experiment.json "$out/sustained-$run/" 2>/dev/null
    cp "results/host/logs/experiment_sustained-$run.log" "$out/sustained-$run/"
    grep -E "passed|failed|Error|error" "results/host/logs/experiment_sustained-$run.log" | tail -n 12
  done
fi
