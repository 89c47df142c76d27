#!/usr/bin/env bash
# A SHORTENED MLPerf Offline control on an H200 host (vLLM 0.26.0, dummy Llama 3.1 8B weights): both arms
# under real LoadGen 5.1.1, one after the other on the same GPU, each in its own process, prefix caching
# off, up to 128 new tokens. The dataset is random token IDs in cnn_eval.json's shape (labelled
# synthetic-random), the pool 256 samples and min_duration 60 s (MIN_MS=...): every manifest says non-compliant.
# The Flame arms (batch 32 and 64) use the stand-in unless CLUSTER=flame (with FLAME_BIN_DIR). About 6 minutes.
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
for batch in 32 64; do  # the study's two Flame arms
  parity mlperf run --arm flame --batch-limit $batch --cluster "${CLUSTER:-standin}" "${common[@]}" \
    --out "$out/flame-b$batch" || status=1
  if [ -f "$out/standalone/mlperf-run.json" ] && [ -f "$out/flame-b$batch/mlperf-run.json" ]; then
    parity mlperf compare --standalone "$out/standalone/mlperf-run.json" --flame "$out/flame-b$batch/mlperf-run.json" \
      --out "$out/compare-b$batch.json" || status=1
  fi
done
parity validate "$out" || status=1
exit $status
