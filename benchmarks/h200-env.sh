# Sourced by the GPU checks outside the workflow (h200-faults.sh, h200-paths.sh, before h200_kv_events.py):
# the package on PYTHONPATH, the dummy-weight model folder (the committed Llama 3.1 8B config.json alone;
# config/models/README.md), the GPU, and small_reuse_trace OUT: the checks' 32-request trace in OUT/traces
# (8 documents x 4 questions, 2,000-token prefixes).
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=/tmp/llama31-8b-dummy
mkdir -p $model && cp config/models/llama31-8b-config.json $model/config.json
parity() { python3 -m parity "$@"; }
gpu=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -1)
small_reuse_trace() {
  mkdir -p "$1"
  parity smoke-inputs --out /tmp/parity-inputs --articles 300 >/dev/null 2>&1
  parity trace --corpus /tmp/parity-inputs/corpus.jsonl --tokenizer /tmp/parity-inputs/tokenizer --out "$1/traces" \
    --name reuse --documents 8 --questions 4 --prefix-tokens 2000 --seed 1 >/dev/null
}
