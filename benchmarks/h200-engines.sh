#!/usr/bin/env bash
# Real vLLM engines on one H200 (dummy Llama 3.1 8B weights): the offline runs the simulator is
# calibrated against. On the device host, from the repo root, after `source .gpu/b/setup.sh`:
#   benchmarks/h200-engines.sh traces            rebuild the traces from the deterministic smoke inputs
#   benchmarks/h200-engines.sh sync|async OUTDIR one engine over the calibration traces
set -euo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
parity() { python3 -m parity "$@"; }
traces=/tmp/parity-traces
case $1 in
traces)
  parity smoke-inputs --out /tmp/parity-inputs
  for spec in "no-reuse 64 1 8000 0" "reuse 64 4 8000 1" "u2k 64 1 2000 2" "u4k 64 1 4000 3" "short 256 1 64 4"; do
    set -- $spec
    parity trace --corpus /tmp/parity-inputs/corpus.jsonl --tokenizer /tmp/parity-inputs/tokenizer \
      --corpus-origin synthetic-news --tokenizer-origin smoke-bpe --out $traces \
      --name "$1" --documents "$2" --questions "$3" --prefix-tokens "$4" --seed "$5"
  done
  exit 0 ;;
esac
which=$1; out=$2
model=/tmp/llama31-8b-dummy
mkdir -p $model "$out" && cp .gpu/b/llama31-8b-config.json $model/config.json
run() { parity engine run --model $model --load-format dummy --warmup-rounds 1 --out "$out" "$@"; }
if [ "$which" = sync ]; then
  run --engine vllm-sync --trace $traces/no-reuse.json --trace $traces/reuse.json --trace $traces/u2k.json \
      --trace $traces/u4k.json --trace $traces/short.json
  run --engine vllm-sync --trace $traces/reuse.json --batch 32
else
  run --engine vllm-async --trace $traces/no-reuse.json --trace $traces/reuse.json --trace $traces/u2k.json \
      --trace $traces/short.json --batch 0
  run --engine vllm-async --trace $traces/reuse.json --batch 32
fi
