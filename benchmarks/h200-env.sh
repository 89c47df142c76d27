# Sourced by the H200 benchmark scripts: the package on PYTHONPATH, the dummy-weight model directory
# (a config.json alone), and the host's GPUs as repeated --gpu options in the array `gpus`.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=/tmp/llama31-8b-dummy
mkdir -p $model && cp .gpu/b/llama31-8b-config.json $model/config.json
gpus=()
for uuid in $(nvidia-smi --query-gpu=uuid --format=csv,noheader); do gpus+=(--gpu "$uuid"); done
