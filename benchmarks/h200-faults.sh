#!/usr/bin/env bash
# Faults on a real GPU (one H200 is enough; real vLLM 0.26.0, dummy Llama 3.1 8B weights): what the CPU
# tests check with the simulator, against `vllm serve`, its engine core and a real Flame v0.6.0 cluster.
# From the repo root after `source .gpu/b/setup.sh`, with Flame binaries in $FLAME_BIN_DIR:
#   benchmarks/h200-faults.sh OUTDIR [STEPS]   (STEPS: 12 by default, or 1 or 2)
#   1. one confirmation pair through real Flame (network: auto, so contained in a network namespace) on
#      small traces: the vLLM path inside the namespace, the binaries' version and hash recorded;
#   2. SIGTERM, then SIGKILL, of `parity standalone run` once its `vllm serve` is healthy: no process of the
#      run may hold the GPU afterwards, and SIGTERM leaves a cleanup receipt.
set -uo pipefail
out=$1
steps=${2:-12}
source benchmarks/h200-env.sh
small_reuse_trace "$out"
backend=$(printf '{"engine": "vllm", "gpus": ["%s"], "cluster": "flame", "flame_bin_dir": "%s", "model": "%s", "load_format": "dummy", "warmup_rounds": 1}' \
  "$gpu" "${FLAME_BIN_DIR:-}" "$model")
final=$(python3 -c 'import json, yaml; print(json.dumps(yaml.safe_load(open("config/experiments.yaml"))["experiments"]["confirmation"]["flame"]))')
if [[ $steps == *1* ]]; then
echo "== 1. one confirmation pair through real Flame v0.6.0 (contained)"
start=$(date +%s)
parity experiment run confirmation --trace "$out/traces/reuse.json" --backend "$backend" \
  --settings "{\"pairs\": 1, \"flame\": $final}" --out "$out/confirmation" 2>&1 | tail -n 12
echo "rc=${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"
python3 - "$out/confirmation" <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1], "trials").glob("*.json")):
    d = json.loads(p.read_text())
    print(p.name, d["verdict"]["status"], round(d["timing"]["requests_per_s"], 3), "req/s",
          "network:", (d.get("network") or {}).get("containment"),
          "flame:", {k: v["version"] for k, v in (d.get("flame_binaries") or {}).items()})
PY
fi
gpu_users() { nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader; }
[[ $steps == *2* ]] || exit 0
for signal in TERM KILL; do
  echo "== 2. SIG$signal of parity standalone run once vllm serve is healthy"
  run="$out/native-$signal"
  python3 -m parity standalone run --replicas vllm --gpu "$gpu" --model "$model" --load-format dummy --placement sticky \
    --trace "$out/traces/reuse.json" --repeats 50 --warmup-rounds 0 --out "$run" > "$run.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do grep -q "sticky-reuse-r0:" "$run.log" 2>/dev/null && break; sleep 1; done
  sleep 3  # inside the first trial
  echo "GPU users while running: $(gpu_users | tr '\n' ';')"
  kill -s $signal $pid; wait $pid; echo "exit status $? (parity pid $pid)"
  for _ in $(seq 1 30); do [ -z "$(gpu_users)" ] && break; sleep 1; done
  echo "GPU users 30 s later at most: '$(gpu_users | tr '\n' ';')'"
  echo "processes of the run left: '$(pgrep -af 'vllm|parity standalone' | grep -v pgrep | tr '\n' ';')'"
  ls "$run" | tr '\n' ' '; echo
  [ -f "$run/cleanup-replicas.json" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('receipt: clean', d['clean'], 'ended_by', d.get('ended_by'))" "$run/cleanup-replicas.json"
  tail -n 3 "$run.log"
done
