#!/usr/bin/env bash
# The SHORTENED, synthetic MLPerf Offline control on an H200 host (config/host.yaml mlperf: non-compliant).
exec "$(dirname "$0")/host.sh" mlperf "$@"
