#!/usr/bin/env bash
# Issue 28's one-GPU ladder on a real H200 (real vLLM 0.26.0, dummy Llama 3.1 8B weights, real Flame v0.6.0),
# through the workflow's host profile, from the repo root:
#   benchmarks/h200-ladder.sh OUTDIR [LIMIT_S] [EXPERIMENT] [CUTOFF_S]
# EXPERIMENT is sustained (the default: the ladder) or confirmation (the study's bursts, with the harvest arm;
# only its experiment manifest is made, not the offline-limit run the whole `confirmation` target also needs).
# The run's deadline is LIMIT_S less 15 s (PARITY_DEADLINE, `parity experiment run --deadline`): no trial is begun
# that is predicted to end past it (from its schedule, then from the trials like it this call has run:
# parity.experiments.deadline), so a call ends between trials, not inside one its limit kills.
# CUTOFF_S (a backstop, rarely needed now): start no trial after that many seconds: the run is stopped as soon as a
# trial finishes past it (default: no cutoff).
# A fresh machine takes three calls, each carry under 64 MiB with the tracked tree (and shared/; where .gpu/a no longer
# fits beside them, split c.so.xz in two and carry the halves in two calls, as session 19 did; where .gpu/b no longer
# fits beside the tracked archives, 25 MiB of benchmarks/measured/*.tar.xz by session 41, move those out of the working
# tree for the device calls, which do not read them, and back after, as session 41 did): .gpu/a (unpacked to /tmp/v),
# then .flame and .gl (`source benchmarks/flame-bins.sh`; .gl/t.tar.xz, the earlier trials, untarred at the repo
# root by that call's command), then .gpu/b, .whl and .gl running this script (.gl/triton-cache.tgz, if an earlier
# session brought one back, this script untars into ~/.triton when that has no cache yet; carry .gl in this call too:
# on 2026-12-06, carried only a call before, it was not loaded and the first trial compiled its kernels; .gpu/a
# and .gpu/b are the slim vLLM bundle's two halves: shared/gpu/README.md); later calls of the same warm machine reuse
# what they left in /tmp. Without a carried Triton cache the first trial compiles vLLM's Triton kernels in its
# warm-ups (about a minute more); OUTDIR/triton-cache.tgz brings the cache back for the next session (the same
# kernels of the same versions, loaded from disk instead of compiled: a later trial on one machine has always
# started so). Runs `benchmarks/host.sh sustained` (config/host.yaml: 640-request rungs, each path's rungs on one engine
# start), killed at LIMIT_S (default 540) so a device call ends in time: a rerun keeps every finished trial and
# goes on. Leaves OUTDIR/ladder.tgz (trials, experiment manifest, engine logs and JIT records, cleanup receipts)
# OUTDIR/gpu.txt and OUTDIR/facts.tgz: workflow.txt (the workflow's output), cpu.txt (each process's CPU every 10 s), gpu-clocks.txt, engine-threads.txt and engine-facts.txt. A session's
# record is derived from the last call's trials (`python benchmarks/ladder_record.py derive DIR`: trials, pairs, rungs) and
# checked against its archive (`... check RECORD.json`), which `python benchmarks/ladder_archive.py OUT.tar.xz EXPERIMENT
# CALL_DIR...` builds from the calls' OUTDIRs. A later session continues the ladder from the trials an earlier one archived
# (benchmarks/measured/h200-ladder-*-trials*.tar.xz): extract them at the repo root in the order they were made,
# a later archive over an earlier one (its pair replaces one that failed), and carry results/host/sustained
# (results/host/confirmation/trials for the confirmation bursts) in the first call; the run keeps each one whose
# ran_with is what it would run now (the same traces, generated again from the same seeds, and the same bundle),
# a pair or a bounded rung (its three arms) that ran whole on an earlier session's GPU included.
set -uo pipefail
out=$1
limit=${2:-540}
experiment=${3:-sustained}
cutoff=${4:-}
case $experiment in
  sustained) target=sustained ;;
  confirmation) target=results/host/confirmation/experiment.json ;;
  *) echo "h200-ladder.sh: EXPERIMENT must be sustained or confirmation, not '$experiment'" >&2; exit 2 ;;
esac
if [ -d /tmp/site/vllm ] && [ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ]; then  # set up by an earlier call
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
else
  # a machine without /tmp/site is a fresh one (a warm one goes back after its idle release): its setup calls first
  [ -f .gpu/b/setup.sh ] || { echo "h200-ladder.sh: no vLLM on this machine and no .gpu/b carried: a fresh machine (the warm one went back?) needs its setup calls first, .gpu/a, then .flame and .gl, then .gpu/b and .whl with this script" >&2; exit 2; }
  source .gpu/b/setup.sh || exit 1
fi
[ -x /tmp/flame-bin/flame-session-manager ] || source benchmarks/flame-bins.sh
if [ -f .gl/triton-cache.tgz ] && [ ! -d ~/.triton/cache ]; then  # the kernels an earlier session compiled, loaded
  # whole or not at all: unpacked beside ~/.triton/cache and moved in only once it unpacked in full
  rm -rf ~/.triton/carried && mkdir -p ~/.triton/carried
  if tar xzf .gl/triton-cache.tgz -C ~/.triton/carried 2>/dev/null && [ -d ~/.triton/carried/cache ]; then
    mv ~/.triton/carried/cache ~/.triton/cache && echo "Triton cache from .gl/triton-cache.tgz"
  else
    echo "h200-ladder.sh: .gl/triton-cache.tgz is not a whole Triton cache (cache/...): not loaded, the first trial compiles its kernels" >&2
  fi
  rm -rf ~/.triton/carried
elif [ -d ~/.triton/cache ]; then
  echo "Triton cache: ~/.triton/cache is already here (an earlier call of this machine), kept"
else  # session 32's first trial compiled its kernels: .gl, carried a call before this script's, was not loaded
  echo "Triton cache: none carried (carry .gl with the call that runs this script): the first trial compiles its kernels"
fi
export FLAME_BIN_DIR=/tmp/flame-bin
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
cat "$out/gpu.txt"
# LADDER_CPU_LOAD=N (a diagnosis, not a ladder setting): N background processes beside the run, each busy 2 ms of
# every 7 (about 28% of a core, 140 wake-ups/s: the Flame path's own processes look like this beside its engine),
# to see whether the standalone engine steps slower with them; said in OUTDIR/cpu-load.txt.
burners=()
for _ in $(seq 1 "${LADDER_CPU_LOAD:-0}"); do
  python3 -c 'import time
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.002: pass
    time.sleep(0.005)' &
  burners+=($!)
done
echo "LADDER_CPU_LOAD=${LADDER_CPU_LOAD:-0}: ${#burners[@]} processes busy 2 ms of every 7" > "$out/cpu-load.txt"
# LADDER_PIN_ENGINE=1 (a diagnosis too): every vLLM engine core (all its threads) on the last CPU alone, everything
# this script starts on the others, to see whether an engine core with a core of its own steps as fast on both
# paths; each pinning is said in OUTDIR/cpu-load.txt.
pinner=
if [ "${LADDER_PIN_ENGINE:-0}" = 1 ]; then
  last=$(( $(nproc) - 1 ))
  for pid in $$ "${burners[@]}"; do taskset -cp "0-$(( last - 1 ))" "$pid" >/dev/null; done
  ( while sleep 2; do
      for pid in $(pgrep -f EngineCore 2>/dev/null); do
        [ "$(taskset -cp "$pid" 2>/dev/null | awk '{print $NF}')" = "$last" ] && continue
        taskset -a -cp "$last" "$pid" >/dev/null 2>&1 && echo "$(date +%s) engine core $pid pinned to CPU $last"
      done
    done ) >> "$out/cpu-load.txt" 2>&1 &
  pinner=$!
fi
# LADDER_ENGINE_CPUS=N (not a diagnosis: parity's own setting, recorded in every trial): backend.engine_cpus N in
# config/host.yaml on the device, so parity puts each vLLM engine core on N CPUs of its own (parity.cpus).
if [ -n "${LADDER_ENGINE_CPUS:-}" ]; then
  sed -i -E "s/^  (# )?engine_cpus: [0-9]*  #/  engine_cpus: ${LADDER_ENGINE_CPUS}  #/" config/host.yaml
  grep -q "^  engine_cpus: ${LADDER_ENGINE_CPUS} " config/host.yaml || { echo "h200-ladder.sh: could not set engine_cpus" >&2; exit 2; }
fi
# LADDER_STAGE=rungs|answers|lengths|evict|bounded: the sustained ladder's one stage alone (benchmarks/ladder-stage.sh narrows
# the config on the device; the cases keep their committed ids), e.g. one side of the 512-token pair per call; with
# LADDER_STAGE=bounded, LADDER_RUNGS="hot-640:16 ..." runs only those rungs of the bounded ladder (one rung's three
# arms fit a call).
if [ -n "${LADDER_STAGE:-}" ]; then
  [ "$experiment" = sustained ] || { echo "h200-ladder.sh: LADDER_STAGE is a stage of the sustained ladder" >&2; exit 2; }
  benchmarks/ladder-stage.sh "$LADDER_STAGE" || exit 2
fi
# CONFIRMATION_STAGES="final-express3 ...": the confirmation's named stages alone (settings stages, plan.confirmation;
# on the device only: an earlier session's pairs of the other stages ran on other Flame binaries and would run again)
if [ -n "${CONFIRMATION_STAGES:-}" ]; then
  [ "$experiment" = confirmation ] || { echo "h200-ladder.sh: CONFIRMATION_STAGES narrows the confirmation" >&2; exit 2; }
  stages=$(echo $CONFIRMATION_STAGES | sed 's/ /, /g')
  sed -i -E "s/^(  confirmation: \{.*)\}$/\1, stages: [$stages]}/" config/host.yaml
  grep -qF "stages: [$stages]}" config/host.yaml \
    || { echo "h200-ladder.sh: could not narrow config/host.yaml's confirmation to $stages" >&2; exit 2; }
  echo "h200-ladder.sh: the confirmation's stages $stages alone"
fi
start=$(date +%s)
trials=results/host/$experiment/trials
# Every call runs the experiment (its runner keeps each finished trial): an experiment manifest untarred from
# .gl/t.tar.xz (an earlier session's archive has one) made snakemake find the target up to date and run nothing
# (2026-12-05, session 25: rc 0 in 8 s). The workflow's whole output goes to OUTDIR/workflow.txt too, with
# snakemake's own times: there the seconds before the experiment begins (about 85 s a call in session 25) show.
rm -f "results/host/$experiment/experiment.json"
export PARITY_DEADLINE=$(( start + limit - 15 ))  # leaves the run's end and this script's archive in the limit
timeout "$limit" benchmarks/host.sh "$target" > >(tee "$out/workflow.txt") 2>&1 &
run=$!
[ -n "$cutoff" ] && benchmarks/cutoff.sh "$run" "$trials" "$start" "$cutoff" &  # a trial written past it ends the run
# Each process's CPU beside the run (issue 28: on 2026-12-03 the Flame side's engine stepped ~30% slower than
# standalone's at the same load; its own processes' CPU or a busier host may be why): the host's CPU quota, then
# top's busiest 25 lines every 10 s (interval %CPU), into OUTDIR/cpu.txt.
( echo "nproc $(nproc); cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"
  if command -v top >/dev/null; then
    top -b -d 10 -w 220 -c -o %CPU | awk '/^top -/{n=0} n++<25 {print; fflush()}'
  else
    while sleep 10; do date +%s; ps -eo pid,ppid,pcpu,cputime,rss,args --sort=-pcpu | head -20 | cut -c1-220; done
  fi ) > "$out/cpu.txt" 2>&1 &
sampler=$!
# The GPU's clocks, power and use every 5 s (a busier or hotter host slows every step alike), and every 10 s the
# threads of each vLLM engine core (VLLM::EngineCore; eager steps are bound by its main thread's CPU), into
# OUTDIR/gpu-clocks.txt and OUTDIR/engine-threads.txt.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu \
  --format=csv -l 5 > "$out/gpu-clocks.txt" 2>&1 &
clocks=$!
( while sleep 10; do
    for pid in $(pgrep -f 'EngineCore' 2>/dev/null); do
      date +%s; top -H -b -n 2 -d 1 -w 160 -p "$pid" 2>/dev/null | awk '/^ *PID /{h++} h==2 && n++<8'
    done
  done ) > "$out/engine-threads.txt" 2>&1 &
threads=$!
# Once per engine core, what it runs with (affinity, nice, scheduling policy, cgroup, its parent, the environment's
# vLLM/CUDA/thread/allocator/Python settings, every thread): OUTDIR/engine-facts.txt. With py-spy installed
# (LADDER_PYSPY=1: .gl/py_spy-*.whl into /tmp/pyspy), each engine core's stacks sampled for 20 s, 5 s after each
# paced warm-up ends (the measured phase), as collapsed stacks into OUTDIR/pyspy-PID-N.txt: where its CPU goes.
spy=
[ "${LADDER_PYSPY:-0}" = 1 ] && { [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps \
  --target /tmp/pyspy .gl/py_spy-*.whl; } && spy=/tmp/pyspy/bin/py-spy
( declare -A known; marks=$(grep -c "paced" "results/host/logs/experiment_$experiment.log" 2>/dev/null); marks=${marks:-0}
  while sleep 3; do
    for pid in $(pgrep -f 'EngineCore' 2>/dev/null); do
      [ -n "${known[$pid]:-}" ] && continue; known[$pid]=1
      { echo "== engine core $pid $(date +%s)"; taskset -cp "$pid"; chrt -p "$pid"; ps -o pid,ppid,ni,pri,psr,args -p "$pid" | cut -c1-200
        echo "parent: $(tr '\0' ' ' < /proc/$(ps -o ppid= -p "$pid" | tr -d ' ')/cmdline | cut -c1-200)"
        cat /proc/$pid/cgroup; tr '\0' '\n' < /proc/$pid/environ | grep -E '^(VLLM|CUDA|OMP|MKL|TORCH|NCCL|LD_|PYTHON|MALLOC|TRITON|HOME|TMPDIR)' | sort
        ls /proc/$pid/task | while read -r t; do echo "thread $t $(cat /proc/$pid/task/$t/comm)"; done; } >> "$out/engine-facts.txt" 2>&1
    done
    if [ -n "$spy" ]; then
      now=$(grep -c "paced" "results/host/logs/experiment_$experiment.log" 2>/dev/null)
      [ "${now:-0}" -lt "$marks" ] && marks=${now:-0}  # the log began anew
      if [ "${now:-0}" -gt "$marks" ]; then
        marks=$now; sleep 5
        for pid in $(pgrep -f 'EngineCore' 2>/dev/null); do
          "$spy" record --nonblocking --threads -r 200 -d 20 -f raw -o "$out/pyspy-$pid-$marks.txt" --pid "$pid" \
            >> "$out/pyspy.log" 2>&1 &
        done
      fi
    fi
  done ) &
facts=$!
wait "$run"
rc=$?
kids=$(pgrep -P $sampler 2>/dev/null; pgrep -P $threads 2>/dev/null; pgrep -P $facts 2>/dev/null); kill $sampler $clocks $threads $facts $kids 2>/dev/null
[ ${#burners[@]} -gt 0 ] && kill "${burners[@]}" 2>/dev/null
[ -n "$pinner" ] && kill "$pinner" $(pgrep -P "$pinner" 2>/dev/null) 2>/dev/null
echo "rc=$rc in $(( $(date +%s) - start )) s"
log=results/host/logs/experiment_$experiment.log
grep -hE "^\[|req/s|kernel compilations|started|deadline|Error|error:" "$log" | tail -n 60
dir=results/host/$experiment
tar czf "$out/ladder.tgz" $dir/trials $dir/experiment.json $dir/pairs $dir/cleanup "$log" \
  $(find $dir/logs -name '*.jit' -o -name '*.vllm.log' -o -name 'replica-*.log' -o -name '*.txt' 2>/dev/null) 2>/dev/null
[ -d ~/.triton/cache ] && tar czf "$out/triton-cache.tgz" -C ~/.triton cache
# The device brings back at most 8 files from OUTDIR (2026-12-05, session 26: a ninth, workflow.txt, was left out),
# so the samples and logs beside the archives travel as one: OUTDIR/facts.tgz (cpu.txt, cpu-load.txt, gpu-clocks.txt,
# engine-threads.txt, engine-facts.txt, workflow.txt, any py-spy stacks); gpu.txt stays a file of its own.
for _ in $(seq 50); do pgrep -xf "tee $out/workflow.txt" >/dev/null || break; sleep 0.1; done  # its last lines written
small=$(cd "$out" && ls | grep -v -x -e ladder.tgz -e triton-cache.tgz -e gpu.txt -e facts.tgz)
[ -n "$small" ] && (cd "$out" && tar czf facts.tgz $small && rm -f $small)
ls -la "$out"
