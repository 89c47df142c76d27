#!/usr/bin/env bash
# Real vLLM engines on one H200 (dummy Llama 3.1 8B weights): the offline runs the simulator is
# calibrated against. Run on the device host from the repo root after `source .gpu/b/setup.sh`.
#   benchmarks/h200-engines.sh sync|async OUTDIR
# Traces are rebuilt there from the deterministic smoke inputs (same bytes as here).
set -euo pipefail
which=$1; out=$2
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
parity() { python3 -m parity "$@"; }
traces=/tmp/parity-traces
if [ ! -f $traces/short.json ]; then
  parity smoke-inputs --out /tmp/parity-inputs
  t() { parity trace --corpus /tmp/parity-inputs/corpus.jsonl --tokenizer /tmp/parity-inputs/tokenizer \
          --corpus-origin synthetic-news --tokenizer-origin smoke-bpe --out $traces "$@"; }
  t --name no-reuse --documents 64 --questions 1 --seed 0
  t --name reuse --documents 64 --questions 4 --seed 1
  t --name u2k --documents 64 --questions 1 --prefix-tokens 2000 --seed 2
  t --name u4k --documents 64 --questions 1 --prefix-tokens 4000 --seed 3
  t --name short --documents 256 --questions 1 --prefix-tokens 64 --seed 4
fi
model=/tmp/llama31-8b-dummy
mkdir -p $model && cp .gpu/b/llama31-8b-config.json $model/config.json
mkdir -p "$out"
run() { parity engine run --model $model --load-format dummy --warmup-rounds 1 --out "$out" "$@"; }
if [ "$which" = sync ]; then
  run --engine vllm-sync --trace $traces/no-reuse.json --trace $traces/reuse.json --trace $traces/u2k.json \
      --trace $traces/u4k.json --trace $traces/short.json
  run --engine vllm-sync --trace $traces/reuse.json --batch 32
else
  run --engine vllm-async --trace $traces/no-reuse.json --trace $traces/reuse.json --batch 0 --batch 32
fi
