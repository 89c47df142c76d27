#!/usr/bin/env bash
# The real-engine runs the simulator is calibrated against (config/host.yaml bench.calibration), on one H200.
exec "$(dirname "$0")/host.sh" calibration "$@"
