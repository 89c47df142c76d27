#!/usr/bin/env bash
# Print the capabilities root lacks here (e.g. CAP_SYS_RESOURCE on some VMs), comma-separated; nothing
# when root has them all or this is not root. Apptainer gives root in a container every capability by
# default, and fails to start where root lacks one ("Requesting capability set ... while permitted
# capability set is ..."): containers/build.sh then takes its sandbox route, and the missing ones are
# passed as --drop-caps to `apptainer exec`. Needs capsh (libcap2-bin) to name them.
set -euo pipefail
[ "$(id -u)" = 0 ] && [ -r /proc/sys/kernel/cap_last_cap ] || exit 0
have=$((16#$(awk '/^CapPrm:/ {print $2}' /proc/self/status)))
all=$(( (1 << ($(cat /proc/sys/kernel/cap_last_cap) + 1)) - 1 ))
missing=$(( all & ~have ))
(( missing )) || exit 0
command -v capsh >/dev/null || { echo "host-caps.sh: root lacks capabilities $(printf '%#x' "$missing"); install capsh (libcap2-bin) to name them" >&2; exit 1; }
capsh --decode="$(printf '%#x' "$missing")" | cut -d= -f2 | tr '[:lower:]' '[:upper:]'
