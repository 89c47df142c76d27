#!/usr/bin/env bash
# The device ladder's cutoff (benchmarks/h200-ladder.sh): stop run PID once a trial manifest in TRIALS is written
# CUTOFF_S or more seconds after START (epoch seconds), so no trial is begun that the call's limit would kill:
#   benchmarks/cutoff.sh PID TRIALS START CUTOFF_S
# Written, not counted: a rerun overwrites a stale trial of the same name, and on 2026-12-04 a count of the trials
# never grew, so the run went on into a trial the limit killed. Returns when the run ends.
set -uo pipefail
[ $# -eq 4 ] || { echo "cutoff.sh: usage: cutoff.sh PID TRIALS START CUTOFF_S" >&2; exit 2; }
run=$1 trials=$2 start=$3 cutoff=$4
mark=$(mktemp)
trap 'rm -f "$mark"' EXIT
touch -d "@$(( start + cutoff ))" "$mark" || exit 2
while kill -0 "$run" 2>/dev/null; do
  sleep "${CUTOFF_POLL_S:-2}"
  if [ -n "$(find "$trials" -maxdepth 1 -name '*.json' -newer "$mark" 2>/dev/null | head -n 1)" ]; then
    echo "cutoff: a trial finished $(( $(date +%s) - start )) s in, past ${cutoff} s: no trial begun after it"
    kill -TERM "$run"; exit 0
  fi
done
