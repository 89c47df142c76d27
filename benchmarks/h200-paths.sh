#!/usr/bin/env bash
# Each serving path's command on a real GPU (one H200; real vLLM 0.26.0, dummy Llama 3.1 8B weights): a
# functional check of the shapes every trial now runs through (parity.paths, parity.trial), not numbers.
# From the repo root after `source .gpu/b/setup.sh`, with Flame binaries in $FLAME_BIN_DIR:
#   benchmarks/h200-paths.sh OUTDIR
#   1. `parity engine run --engine vllm-sync` (the engine path) on a small trace;
#   2. `parity standalone run --replicas vllm` (one `vllm serve`, sticky placement);
#   3. `parity flame run --cluster flame --engine vllm --api async` (real Flame v0.6.0, contained);
#   4. `parity mlperf run --arm flame` on 64 random samples (the MLPerf SUT over the Flame path's cluster).
# Each prints its trial's verdict and rate; the trials and the MLPerf run manifest are left in OUTDIR.
set -uo pipefail
out=$1
source benchmarks/h200-env.sh
small_reuse_trace "$out"
engine=(--model "$model" --load-format dummy)
step() { echo "== $1"; start=$(date +%s); }
done_step() { echo "rc=$1 in $(( $(date +%s) - start )) s"; }
verdicts() {
  python3 - "$@" <<'PY'
import json, sys, pathlib
for folder in sys.argv[1:]:
    for p in sorted(pathlib.Path(folder).glob("*.json")):
        d = json.loads(p.read_text())
        if d.get("kind") == "trial":
            print(" ", p.name, d["system"], d["engine"]["name"], d["engine"]["version"], d["verdict"]["status"],
                  round(d["timing"]["requests_per_s"], 3), "req/s", "placement:", d["config"].get("placement"),
                  "schedule:", d.get("schedule", {}).get("kind"), "network:", (d.get("network") or {}).get("containment"))
PY
}
step "1. engine path: parity engine run --engine vllm-sync"
CUDA_VISIBLE_DEVICES=$gpu parity engine run --engine vllm-sync --trace "$out/traces/reuse.json" --warmup-rounds 1 \
  "${engine[@]}" --out "$out/engine" 2>&1 | tail -n 3
done_step "${PIPESTATUS[0]}"; verdicts "$out/engine"
step "2. standalone path: parity standalone run --replicas vllm"
parity standalone run --replicas vllm --gpu "$gpu" --placement sticky --trace "$out/traces/reuse.json" --warmup-rounds 1 \
  "${engine[@]}" --out "$out/standalone" 2>&1 | tail -n 3
done_step "${PIPESTATUS[0]}"; verdicts "$out/standalone"
step "3. Flame path: parity flame run --cluster flame --engine vllm --api async"
parity flame run --cluster flame --engine vllm --api async --gpu "$gpu" --placement sticky \
  --trace "$out/traces/reuse.json" --warmup-rounds 1 "${engine[@]}" --out "$out/flame" 2>&1 | tail -n 3
done_step "${PIPESTATUS[0]}"; verdicts "$out/flame"
step "4. MLPerf flame arm over the Flame path's cluster (64 random samples, non-compliant)"
parity mlperf random-dataset --out "$out/mlperf/dataset.json" --samples 64 >/dev/null
parity mlperf run --arm flame --dataset "$out/mlperf/dataset.json" --engine vllm --gpu "$gpu" "${engine[@]}" \
  --cluster flame --samples 64 --probe-samples 32 --min-duration-ms 1000 --min-query-count 64 \
  --out "$out/mlperf/flame" 2>&1 | tail -n 4
done_step "${PIPESTATUS[0]}"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['result']; print(' ', r['validity'], r['samples_per_second'], 'samples/s', r['tokens_per_second'], 'tokens/s', d['sut'], d['engine']['name'], d['path'])" \
  "$out/mlperf/flame/mlperf-run.json" 2>/dev/null || echo "  no mlperf-run.json"
