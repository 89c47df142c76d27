#!/usr/bin/env bash
# Flame path vs standalone on a 2-GPU H200 host (dummy Llama 3.1 8B weights), reuse trace:
# sticky standalone vLLM, then the Flame service with synchronous and asynchronous admission
# (batch 128, 10 ms window, 4 MiB budget; async with zlib inputs). The Flame side runs through the
# in-process stand-in unless CLUSTER=flame and FLAME_BIN_DIR name real v0.6.0 binaries.
# From the repo root after `source .gpu/b/setup.sh` and `benchmarks/h200-engines.sh traces`:
#   benchmarks/h200-flame.sh OUTDIR
set -euo pipefail
out=$1
source benchmarks/h200-env.sh
common=(--model $model --load-format dummy --trace /tmp/parity-traces/reuse.json "${gpus[@]}")
python3 -m parity native run --replicas vllm --routing sticky --experiment flame-vs-vllm "${common[@]}" --out "$out/native"
tuned=(--cluster "${CLUSTER:-standin}" --placement sticky --batch-limit 128 --window-ms 10 --budget-mib 4)
python3 -m parity flame run "${tuned[@]}" --engine vllm-sync --raw --experiment flame-sync "${common[@]}" --out "$out/flame-sync"
python3 -m parity flame run "${tuned[@]}" --engine vllm-async --compress --gc-freeze --experiment flame-async \
  "${common[@]}" --out "$out/flame-async"
