#!/usr/bin/env bash
# The study's final experiment on a 2-GPU H200 host (real vLLM 0.26.0, dummy Llama 3.1 8B weights):
# confirmation pairs (sticky standalone vLLM vs the final Flame configuration on a real Flame v0.6.0
# cluster, or the stand-in with CLUSTER=standin) and the engine's offline limit.
# From the repo root after `source .gpu/b/setup.sh`, with Flame binaries in $FLAME_BIN_DIR:
#   benchmarks/h200-experiments.sh traces                       the two full-size bursts (smoke inputs)
#   benchmarks/h200-experiments.sh confirmation RESULTS N TRACE...   pairs 0..N-1 per trace; kept pairs are not rerun
#   benchmarks/h200-experiments.sh offline-limit RESULTS TRACE...
#     (on a one-GPU host: GPUS=one SHARDS=2 ... runs the two shards one after another on the first GPU)
#   benchmarks/h200-experiments.sh order RESULTS ENGINE REPEATS TRACE [SHARD...]   admission order on one engine, first GPU
set -euo pipefail
source benchmarks/h200-env.sh
traces=/tmp/parity-gpu/traces  # beside the results, so their relative links survive a copy
parity() { python3 -m parity "$@"; }
gpus='["auto"]'
if [ "${GPUS:-}" = one ]; then gpus="[\"$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)\"]"; fi
backend=$(printf '{"engine": "vllm", "gpus": %s, "cluster": "%s", "flame_bin_dir": "%s", "model": "%s", "load_format": "dummy", "warmup_rounds": 2}' \
  "$gpus" "${CLUSTER:-flame}" "${FLAME_BIN_DIR:-}" "$model")
# the final Flame configuration as committed (config/experiments.yaml), never a copy of it
final=$(python3 -c 'import json, yaml; print(json.dumps(yaml.safe_load(open("config/experiments.yaml"))["experiments"]["confirmation"]["flame"]))')
case $1 in
stop)  # whatever an interrupted run left behind
  for pattern in '^/tmp/flame-bin/' '-m vllm.entrypoints' '^vllm serve' '-m parity (flame worker|engine run|native sim-server)'; do
    pkill -f -- "$pattern" || true
  done
  sleep 3
  # vLLM's engine cores rename themselves (VLLM::EngineCore): free the GPUs by what holds them
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do kill -9 "$pid" || true; done
  sleep 2 ;;
traces)
  parity smoke-inputs --out /tmp/parity-inputs
  for spec in "no-reuse 64 1 8000 0" "reuse 64 4 8000 1"; do
    set -- $spec
    parity trace --corpus /tmp/parity-inputs/corpus.jsonl --tokenizer /tmp/parity-inputs/tokenizer \
      --corpus-origin synthetic-news --tokenizer-origin smoke-bpe --out $traces \
      --name "$1" --documents "$2" --questions "$3" --prefix-tokens "$4" --seed "$5"
  done ;;
confirmation)
  out=$2; pairs=$3; shift 3
  args=(); for t in "$@"; do args+=(--trace $traces/$t.json); done
  parity experiment run confirmation "${args[@]}" --backend "$backend" \
    --settings "{\"pairs\": $pairs, \"flame\": $final}" --out "$out/confirmation" ;;
offline-limit)
  out=$2; shift 2
  args=(); for t in "$@"; do args+=(--trace $traces/$t.json); done
  parity experiment run offline-limit "${args[@]}" --backend "$backend" \
    --settings "{\"shards\": ${SHARDS:-2}}" --out "$out/offline-limit" ;;
order)  # each shard in arrival and in prefix order on one engine (vllm-async: Flame's; vllm-sync: LLM.generate)
  out=$2; engine=$3; repeats=$4; trace=$5; shift 5
  only=(); for s in "$@"; do only+=(--shard "$s"); done
  CUDA_VISIBLE_DEVICES=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1) \
    parity bench order --engine "$engine" --trace $traces/$trace.json "${only[@]}" --repeats "$repeats" \
    --model "$model" --load-format dummy --out "$out/order-$engine-$trace" ;;
esac
