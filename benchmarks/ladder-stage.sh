#!/usr/bin/env bash
# Narrow the host profile's sustained ladder to one stage, on a device only (never committed), so a device session
# runs that stage alone; the cases keep the ids and settings the committed config gives them (tests/test_ladder.py):
#   benchmarks/ladder-stage.sh STAGE [ROOT]     (ROOT: the repo root; its config/host.yaml and config/experiments.yaml,
#                                                since the host profile's file is merged over the defaults' key by key)
#   rungs                     the ladder's rungs and arms, no extra pair, no bounded arm; LADDER_RUNGS="TRACE:RATE ..."
#                             (e.g. reuse-640:8) keeps only those of its rungs, each one the committed rates names (every
#                             arm's pair at them: those run_first names first, so a call that ends early has them)
#   answers | lengths | evict that extra pair alone: every trace's rates emptied (a trace with no rungs runs only the
#                             extra pairs that name it and a rate) and the other extra pairs and the bounded arm left out
#   bounded                   the bounded arm's own ladder alone (bounded_rates: each rung's unbounded comparator and
#                             both paths bounded): every trace's rates emptied, every extra pair left out;
#                             LADDER_RUNGS="TRACE:RATE ..." (e.g. hot-640:16) keeps only those of its rungs, each one
#                             the committed bounded_rates names (a rung's three arms fit one device call: session 25
#                             ran its rungs so)
set -euo pipefail
stage=${1:-}; host=${2:-.}/config/host.yaml; defaults=${2:-.}/config/experiments.yaml
extras=(answers lengths evict)
case $stage in
  rungs) drop=("${extras[@]}" bounded bounded_rates) ;;
  answers|lengths|evict)
    drop=(bounded bounded_rates)
    for x in "${extras[@]}"; do [ "$x" = "$stage" ] || drop+=("$x"); done ;;
  bounded) drop=("${extras[@]}") ;;
  *) echo "ladder-stage.sh: STAGE must be rungs, answers, lengths, evict or bounded, not '$stage'" >&2; exit 2 ;;
esac
if [ -n "${LADDER_RUNGS:-}" ] && [ "$stage" != bounded ] && [ "$stage" != rungs ]; then
  echo "ladder-stage.sh: LADDER_RUNGS narrows the rungs or bounded stage's rungs, not the $stage stage" >&2; exit 2
fi
for file in "$host" "$defaults"; do  # both there before either is changed: never one narrowed and not the other
  [ -w "$file" ] || { echo "ladder-stage.sh: no config file to narrow at $file (give the repo root)" >&2; exit 2; }
done
narrow() {  # narrow() KEY: keep only LADDER_RUNGS of host.yaml's sustained KEY line, each one it names, or exit 2
  local key=$1 line kept
  line=$(grep -E "^    $key: \{" "$host") \
    || { echo "ladder-stage.sh: $host's sustained names no $key by trace to narrow" >&2; exit 2; }
  kept=$(python3 - "$key" "$line" "$LADDER_RUNGS" <<'PY'
import re, sys
key, line, asked = sys.argv[1], sys.argv[2], sys.argv[3].split()
committed = {t: [r.strip() for r in rates.split(",")] for t, rates in re.findall(r"([\w.-]+): \[([^]]*)\]", line)}
rungs = {}
if not asked:
    sys.exit("ladder-stage.sh: LADDER_RUNGS names no rung (TRACE:RATE ...)")
for rung in asked:
    trace, _, rate = rung.partition(":")
    if rate in rungs.get(trace, []):
        sys.exit(f"ladder-stage.sh: LADDER_RUNGS names {rung!r} twice")
    if rate not in committed.get(trace, []):
        sys.exit(f"ladder-stage.sh: LADDER_RUNGS names {rung!r}, not a rung of the committed {key} "
                 f"{line.split(': ', 1)[1].split('  #')[0]}")
    rungs.setdefault(trace, []).append(rate)
print("{" + ", ".join(f"{trace}: [{', '.join(rates)}]" for trace, rates in rungs.items()) + "}")
PY
) || exit 2
  sed -i -E "s/^    $key: \{[^}]*\}/    $key: $kept/" "$host"
}
if [ "$stage" = bounded ]; then
  grep -qE "^    bounded_rates: \{" "$host" && grep -qE "^    bounded: \{" "$host" \
    || { echo "ladder-stage.sh: $host's sustained names no bounded arm with a ladder of its own" \
              "(bounded, bounded_rates)" >&2; exit 2; }
  [ -z "${LADDER_RUNGS:-}" ] || narrow bounded_rates  # checked before anything else is changed
  sed -i -E '/^    rates: /s/\[[^]]*\]/[]/g' "$host"
elif [ "$stage" = rungs ]; then
  [ -z "${LADDER_RUNGS:-}" ] || narrow rates
else
  grep -qE "^    $stage: \{.*rate: [0-9.]+.*trace: " "$host" \
    || { echo "ladder-stage.sh: $host's sustained $stage names no rate and trace to run on alone" >&2; exit 2; }
  sed -i -E '/^    rates: /s/\[[^]]*\]/[]/g' "$host"
fi
for x in "${drop[@]}"; do sed -i "/^    $x: /d" "$host" "$defaults"; done  # the defaults' too: else they come back
echo "ladder-stage.sh: $host and $defaults narrowed to the sustained ladder's $stage"
