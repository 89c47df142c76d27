#!/usr/bin/env bash
# The standalone path on a 2-GPU H200 host: one `vllm serve` per GPU (dummy Llama 3.1 8B weights),
# alternating vs sticky routing on both study traces. From the repo root after `source .gpu/b/setup.sh`
# and `benchmarks/h200-engines.sh traces`:   benchmarks/h200-native.sh OUTDIR
set -euo pipefail
out=$1
source benchmarks/h200-env.sh
if [ ${#gpus[@]} -lt 4 ]; then  # one GPU: both replicas share it, each with about 0.45 of its memory
  gpus=(--gpu "${gpus[1]}" --gpu "${gpus[1]}" --engine-arg gpu_memory_utilization=0.45)
fi
python3 -m parity native run --replicas vllm "${gpus[@]}" --model $model --load-format dummy \
  --trace /tmp/parity-traces/no-reuse.json --trace /tmp/parity-traces/reuse.json --out "$out"
