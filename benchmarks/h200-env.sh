# Sourced by benchmarks/h200-faults.sh (a fault check, outside the workflow): the package on PYTHONPATH and
# the dummy-weight model folder (the committed Llama 3.1 8B config.json alone; config/models/README.md).
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=/tmp/llama31-8b-dummy
mkdir -p $model && cp config/models/llama31-8b-config.json $model/config.json
