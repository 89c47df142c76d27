#!/usr/bin/env bash
# The host profile on an offline GPU host (Python 3.12 and torch, no snakemake, no network), from the repo root:
#   source .gpu/b/setup.sh                      # vLLM from the slim bundle (shared/gpu/README.md)
#   benchmarks/host.sh TARGET [SNAKEMAKE OPTION...]
# It installs the snakemake wheels carried in .whl/ (made here by benchmarks/host-wheels.sh) into
# /tmp/parity-snakemake once, unpacks the Flame v0.6.0 binaries carried xz'd in .flame/ into /tmp/flame-bin
# unless FLAME_BIN_DIR is set, puts this checkout's `parity` on PATH, and runs
#   snakemake --workflow-profile host TARGET ...
# TARGET: traces, offline_limit, mlperf, calibration, order, sustained, confirmation (one GPU: config/host.yaml);
# locality, admission, gc, all (two GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
site=/tmp/parity-snakemake
if [ -d .whl ] && [ ! -d "$site/snakemake" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
fi
# this checkout first; then what is already there (the vLLM bundle's /tmp/site); then snakemake's wheels
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$site PYTHONUNBUFFERED=1
python3 -c 'import snakemake' 2>/dev/null || {
  echo "benchmarks/host.sh: snakemake is not importable: carry .whl/ (benchmarks/host-wheels.sh makes it)" >&2; exit 1; }
source benchmarks/flame-bins.sh
export PATH=$PWD/benchmarks/bin:$PATH
exec python3 -m snakemake --workflow-profile host "$@"
