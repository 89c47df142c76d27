#!/usr/bin/env bash
# Build the parity image from containers/parity.def and record its SHA-256 in manifests/image.json.
#
# Usage: containers/build.sh [--notest] [--out SIF] [--manifest JSON] [-- APPTAINER_BUILD_ARGS...]
#   --notest    skip the image's %test (for build hosts without a GPU); the manifest says so
#   --out       where the SIF goes (default results/image/parity.sif; results/ is not committed)
#   --manifest  where the manifest goes (default manifests/image.json)
#   after --     passed to `apptainer build`, e.g. -- --fakeroot
# The recipe is checked offline first (digest-pinned bases, fully hash-locked requirements), so an
# unpinned recipe never reaches the builder. PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"  # %files sources in parity.def are relative to the repository root

DEF=containers/parity.def
LOCK=containers/requirements.lock
SIF=results/image/parity.sif
MANIFEST=manifests/image.json
NOTEST=0
EXTRA=()
while (($#)); do
    case "$1" in
        --notest) NOTEST=1; shift ;;
        --out) SIF="$2"; shift 2 ;;
        --manifest) MANIFEST="$2"; shift 2 ;;
        --) shift; EXTRA+=("$@"); break ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

if ! command -v apptainer >/dev/null 2>&1; then
    echo "build.sh: apptainer is not installed (https://apptainer.org/docs/admin/main/installation.html)" >&2
    exit 1
fi

"$PYTHON" - "$DEF" "$LOCK" <<'PY'
import sys
from parity.container import definition_problems, lock_problems, read_definition
definition, lock = sys.argv[1:]
problems = definition_problems(read_definition(definition))
problems += lock_problems(open(lock, encoding="utf-8").read(), source=lock)
if problems:
    sys.exit("build.sh: refusing to build an unpinned recipe:\n  " + "\n  ".join(problems))
PY

mkdir -p "$(dirname -- "$SIF")"
BUILD=(apptainer build --force)
if ((NOTEST)); then BUILD+=(--notest); fi
"${BUILD[@]}" "${EXTRA[@]}" "$SIF" "$DEF"

SHA256="$(sha256sum "$SIF" | cut -d' ' -f1)"
"$PYTHON" - "$SIF" "$DEF" "$LOCK" "$MANIFEST" "$SHA256" "$NOTEST" "$(apptainer --version)" <<'PY'
import sys
from parity.container import write_image_manifest
sif, definition, lock, out, sha256, notest, version = sys.argv[1:]
write_image_manifest(sif, definition, lock, out, sif_sha256=sha256, tested=notest == "0",
                     apptainer_version=version)
print(f"{out}: {sif} sha256 {sha256}")
PY
