#!/usr/bin/env bash
# A SHORTENED MLPerf Offline control on an H200 host (vLLM 0.26.0, dummy Llama 3.1 8B weights): both arms
# under real LoadGen 5.1.1, one after the other on the same GPU, each in its own process, prefix caching
# off, up to 128 new tokens. The dataset is random token IDs in cnn_eval.json's shape (labelled
# synthetic-random), the pool 256 samples and min_duration 60 s (MIN_MS=...): every manifest says non-compliant.
# The Flame arm uses the stand-in unless CLUSTER=flame (with FLAME_BIN_DIR). About 5 minutes.
# From the repo root after `source .gpu/b/setup.sh`:   benchmarks/h200-mlperf.sh OUTDIR
set -euo pipefail
out=$1
source benchmarks/h200-env.sh
parity() { python3 -m parity "$@"; }
mkdir -p "$out"
parity mlperf random-dataset --out "$out/cnn_eval-random.json" --samples 256 --seed 0
common=(--dataset "$out/cnn_eval-random.json" --engine vllm "${gpus[@]:0:2}" --model $model --load-format dummy
        --min-duration-ms "${MIN_MS:-60000}" --min-query-count 256 --probe-samples 64 --startup-timeout 300)
status=0
parity mlperf run --arm standalone "${common[@]}" --out "$out/standalone" || status=1
parity mlperf run --arm flame --batch-limit 64 --cluster "${CLUSTER:-standin}" "${common[@]}" --out "$out/flame" || status=1
if [ -f "$out/standalone/mlperf-run.json" ] && [ -f "$out/flame/mlperf-run.json" ]; then
  parity mlperf compare --standalone "$out/standalone/mlperf-run.json" --flame "$out/flame/mlperf-run.json" \
    --out "$out/compare.json" || status=1
fi
parity validate "$out" || status=1
exit $status
