#!/usr/bin/env bash
# Issue 28's 512-token gap, diagnosed on one H200 in as few device calls as it takes (not a ladder rung):
#   benchmarks/h200-diagnose-512.sh OUTDIR ARM...
# Each ARM runs one side of the 512-token stage shortened to reuse-64 (64 measured requests at 2 requests/s, seed
# p0; config/host.yaml narrowed on the device only) through benchmarks/h200-ladder.sh, then keeps a copy of its
# trial and the run's CPU, thread and clock records in OUTDIR/ARM/:
#   vllm          the standalone side
#   vllm-load4    the standalone side with four processes shaped like the Flame path's beside it (LADDER_CPU_LOAD=4)
#   flame         the Flame side (harvest arm)
#   flame-pin     the Flame side, its engine core alone on the last CPU (LADDER_PIN_ENGINE=1)
#   vllm-pin      the standalone side, likewise
#   vllm-cpus     the standalone side with parity's own engine_cpus 2 (each engine core on two CPUs of its own, recorded
#                 in the trial: parity.cpus; LADDER_ENGINE_CPUS=2)
#   flame-cpus    the Flame side, likewise (set only in its run: config/host.yaml is restored after each arm)
# A Flame arm needs the standalone trial on disk (a vllm arm first, on this machine), which it keeps; a vllm arm
# reruns the standalone side and stops before the Flame side. Arms may go over several calls of one warm machine
# (results/ stays), after the three calls that set up a fresh one (benchmarks/h200-ladder.sh says which).
set -uo pipefail
out=$1; shift
[ $# -gt 0 ] || { echo "h200-diagnose-512.sh: name at least one ARM" >&2; exit 2; }
trials=results/host/sustained/trials
case_id=sustained-rate-2-out512-harvest-reuse-64-p0
sed -i 's/traces: \[reuse-640, hot-640\]/traces: [reuse-64]/; s/rates: {reuse-640: \[4, 8, 12\], hot-640: \[8\]}/rates: {reuse-64: []}/; s/^    repeats: 2$/    repeats: 1/; /^    evict: /d; /^    lengths: /d; s/rate: 2, trace: reuse-640}/rate: 2, trace: reuse-64}/' config/host.yaml
sed -i '/^    evict: /d; /^    lengths: /d' config/experiments.yaml
for arm in "$@"; do
  case $arm in
    vllm|vllm-load4|vllm-pin|vllm-cpus) side=vllm ;;
    flame|flame-pin|flame-cpus) side=flame ;;
    *) echo "h200-diagnose-512.sh: unknown ARM '$arm'" >&2; exit 2 ;;
  esac
  if [ $side = flame ] && [ ! -f "$trials/$case_id-vllm.json" ]; then
    echo "h200-diagnose-512.sh: $arm needs the standalone trial first (run a vllm arm before it)" >&2; exit 2
  fi
  rm -f "$trials/$case_id-$side.json"
  # and the records of earlier arms' runs, so the run neither keeps its experiment nor reruns a trial that a pair
  # recorded with another hash (a diagnosis compares arms; it is not a ladder)
  rm -rf results/host/sustained/experiment.json results/host/sustained/pairs
  mkdir -p "$out/$arm"
  load=0; pin=0; engine_cpus=
  case $arm in *-load4) load=4 ;; *-pin) pin=1 ;; *-cpus) engine_cpus=2 ;; esac
  echo "[$arm] $(date +%T)"
  cp config/host.yaml /tmp/host.yaml.diag
  # cutoff 1: the run stops once a trial is written (a vllm arm: before the Flame side begins)
  LADDER_CPU_LOAD=$load LADDER_PIN_ENGINE=$pin LADDER_ENGINE_CPUS=$engine_cpus \
    benchmarks/h200-ladder.sh "$out/$arm" 590 sustained 1 2>&1 | grep -E "req/s|rc=|rror|kernel|warmup|CPUs" | tail -8
  cp /tmp/host.yaml.diag config/host.yaml
  cp "$trials/$case_id-$side.json" "$out/$arm/" 2>/dev/null || echo "[$arm] no trial written"
  # one Triton cache back (h200-ladder.sh leaves one in each arm's folder): store it as .gl/triton-cache.tgz
  [ -f "$out/triton-cache.tgz" ] || mv "$out/$arm/triton-cache.tgz" "$out/" 2>/dev/null; rm -f "$out/$arm/triton-cache.tgz"
done
# one file back (the device returns a limited number of files per call)
(cd "$out" && tar czf diag.tgz "$@" && rm -rf "$@") && ls -la "$out"
