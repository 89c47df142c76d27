#!/usr/bin/env bash
# Build the parity image from containers/parity.def and record its SHA-256 in manifests/image.json.
#
# Usage: containers/build.sh [--variant reviewers|offline] [--base-dir DIR] [--lock FILE] [--host-ca FILE]
#                            [--route build|sandbox] [--notest] [--out SIF] [--manifest JSON] [-- APPTAINER_BUILD_ARGS...]
#   --variant   reviewers (default): the digest-pinned Docker Hub bases, the image reviewers use.
#               offline: local bases made by containers/offline-base.sh DIR (Debian trixie, a pinned CPython
#               3.12, Flame v0.6.0 built from its tag), for a host without Docker Hub; labelled as such
#   --base-dir  the offline bases (OUT_DIR of containers/offline-base.sh); needed by --variant offline
#   --lock      the requirements lock to install (default containers/requirements.lock)
#   --host-ca   a CA bundle bound into %post for pip (PIP_CERT), where the network intercepts TLS; off by default
#   --route     build: one `apptainer build`. sandbox: a sandbox without %post, %post run in it with
#               `apptainer exec --writable`, %test with `apptainer test`, then the SIF built from it; for a
#               host whose root cannot give %post every capability (default: build, or sandbox when
#               this host's root lacks some, said on one line)
#   --notest    skip the image's %test; the manifest says so
#   --out       where the SIF goes (default results/image/parity.sif; results/ is not committed)
#   --manifest  where the manifest goes (default manifests/image.json)
#   after --     passed to `apptainer build`, e.g. -- --fakeroot
# The recipe is checked offline first (digest-pinned bases, fully hash-locked requirements, every sdist's
# build requirements installed first), so an unpinned recipe never reaches the builder. PYTHON overrides
# the interpreter (default .venv/bin/python).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"  # %files sources in parity.def are relative to the repository root

DEF=containers/parity.def
LOCK=containers/requirements.lock
SIF=results/image/parity.sif
MANIFEST=manifests/image.json
VARIANT=reviewers
BASE_DIR=
HOST_CA=
ROUTE=
NOTEST=0
EXTRA=()
while (($#)); do
    case "$1" in
        --variant) VARIANT="$2"; shift 2 ;;
        --base-dir) BASE_DIR="$2"; shift 2 ;;
        --lock) LOCK="$2"; shift 2 ;;
        --host-ca) HOST_CA="$2"; shift 2 ;;
        --route) ROUTE="$2"; shift 2 ;;
        --notest) NOTEST=1; shift ;;
        --out) SIF="$2"; shift 2 ;;
        --manifest) MANIFEST="$2"; shift 2 ;;
        --) shift; EXTRA+=("$@"); break ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

if ! command -v apptainer >/dev/null 2>&1; then
    echo "build.sh: apptainer is not installed (https://apptainer.org/docs/admin/main/installation.html)" >&2
    exit 1
fi

# --build-arg values: none for the reviewers' image (the recipe's defaults), local bases for the offline one.
ARGS=()
case "$VARIANT" in
    reviewers) [ -z "$BASE_DIR" ] || { echo "build.sh: --base-dir is for --variant offline" >&2; exit 2; } ;;
    offline)
        [ -n "$BASE_DIR" ] || { echo "build.sh: --variant offline needs --base-dir (made by containers/offline-base.sh)" >&2; exit 2; }
        BASE_DIR="$(cd -- "$BASE_DIR" && pwd)"
        for need in rootfs/opt/python3.12/bin/python3.12 flame/usr/local/flame/bin/flame-session-manager; do
            [ -e "$BASE_DIR/$need" ] || { echo "build.sh: $BASE_DIR/$need is missing; run containers/offline-base.sh $BASE_DIR" >&2; exit 2; }
        done
        PYTHON_SOURCE="$(sed -n 's/^PYTHON_ARTIFACT=//p' containers/offline-base.sh) sha256:$(sed -n 's/^PYTHON_JAR_SHA256=//p' containers/offline-base.sh)"
        ARGS=(BOOTSTRAP=localimage "BASE_IMAGE=$BASE_DIR/rootfs" "FSM_IMAGE=$BASE_DIR/flame" "FEM_IMAGE=$BASE_DIR/flame"
              VARIANT=offline "PYTHON_SOURCE=$PYTHON_SOURCE") ;;
    *) echo "build.sh: --variant must be reviewers or offline, got $VARIANT" >&2; exit 2 ;;
esac
if [ "$LOCK" != containers/requirements.lock ]; then ARGS+=("LOCK=$LOCK"); fi

"$PYTHON" - "$DEF" "$LOCK" "$VARIANT" "${ARGS[@]}" <<'PY'
import sys
from parity.container import definition_problems, lock_problems, read_definition, sdist_build_problems
definition, lock, variant, *args = sys.argv[1:]
text = open(lock, encoding="utf-8").read()
problems = definition_problems(read_definition(definition))  # the recipe as committed: its defaults
problems += lock_problems(text, source=lock)
problems += sdist_build_problems(text, read_definition(definition, dict(a.split("=", 1) for a in args)))
if problems:
    sys.exit("build.sh: refusing to build an unpinned recipe:\n  " + "\n  ".join(problems))
PY

# The route: `apptainer build` runs %post as `apptainer exec` giving root every capability, with no way to
# drop one; where this host's root lacks some (a VM without CAP_SYS_RESOURCE), %post cannot start.
MISSING_CAPS="$(containers/host-caps.sh)"
DROP=()
if [ -n "$MISSING_CAPS" ]; then DROP=(--drop-caps "$MISSING_CAPS"); fi
if [ -z "$ROUTE" ]; then
    ROUTE=build
    if [ -n "$MISSING_CAPS" ]; then
        ROUTE=sandbox
        echo "build.sh: root here lacks $MISSING_CAPS, which apptainer build gives %post: taking the sandbox route (%post by apptainer exec --writable --drop-caps $MISSING_CAPS; --route build to insist)" >&2
    fi
fi

BUILD_ARGS=()
for arg in "${ARGS[@]}"; do BUILD_ARGS+=(--build-arg "$arg"); done
BINDS=()
if [ -n "$HOST_CA" ]; then BINDS=(--bind "$(realpath "$HOST_CA"):/etc/parity-host-ca.crt"); fi

mkdir -p "$(dirname -- "$SIF")"
case "$ROUTE" in
    build)
        BUILD=(apptainer build --force)
        if ((NOTEST)); then BUILD+=(--notest); fi
        "${BUILD[@]}" "${BUILD_ARGS[@]}" "${BINDS[@]}" "${EXTRA[@]}" "$SIF" "$DEF" ;;
    sandbox)
        SANDBOX="$SIF.sandbox"
        STAGED="$(mktemp -d)"
        trap 'rm -rf "$STAGED"' EXIT
        # The def without its final %post (rendered with the same build arguments), and the %post alone.
        "$PYTHON" - "$DEF" "$STAGED" "${ARGS[@]}" <<'PY'
import sys
from pathlib import Path
from parity.container import render_definition, split_post
definition, staged, *args = sys.argv[1:]
text = render_definition(Path(definition).read_text(encoding="utf-8"), dict(a.split("=", 1) for a in args))
without, post = split_post(text)
Path(staged, "full.def").write_text(text, encoding="utf-8")
Path(staged, "no-post.def").write_text(without, encoding="utf-8")
Path(staged, "post.sh").write_text(post, encoding="utf-8")
PY
        rm -rf "$SANDBOX"
        apptainer build --force --notest --sandbox "${EXTRA[@]}" "$SANDBOX" "$STAGED/no-post.def"
        cp "$STAGED/post.sh" "$SANDBOX/.post.script"
        apptainer exec --writable --cleanenv --no-home --pwd / "${DROP[@]}" "${BINDS[@]}" \
            --env APPTAINER_ENVIRONMENT=/.singularity.d/env/91-environment.sh --env APPTAINER_LABELS=/.build.labels \
            "$SANDBOX" /bin/sh -ex /.post.script
        # Labels %post wrote (as apptainer build does: "name value" lines, added to the image's labels).
        "$PYTHON" - "$SANDBOX" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
extra, labels_path = root / ".build.labels", root / ".singularity.d" / "labels.json"
labels = json.loads(labels_path.read_text()) if labels_path.exists() else {}
for line in (extra.read_text().splitlines() if extra.exists() else []):
    name, _, value = line.partition(" ")
    if name:
        labels[name] = value.strip()
labels_path.write_text(json.dumps(labels, indent=2) + "\n")
extra.unlink(missing_ok=True)
(root / ".post.script").unlink()
PY
        # The def that made it, %post included (the one the sandbox got has none): wrapping the sandbox moves
        # this into /.singularity.d/bootstrap_history, where `apptainer inspect` users look.
        cp "$STAGED/full.def" "$SANDBOX/.singularity.d/Singularity"
        if ((NOTEST == 0)); then apptainer test --cleanenv "${DROP[@]}" "$SANDBOX"; fi
        apptainer build --force "$SIF" "$SANDBOX"
        rm -rf "$SANDBOX" ;;
    *) echo "build.sh: --route must be build or sandbox, got $ROUTE" >&2; exit 2 ;;
esac

SHA256="$(sha256sum "$SIF" | cut -d' ' -f1)"
"$PYTHON" - "$SIF" "$DEF" "$LOCK" "$MANIFEST" "$SHA256" "$NOTEST" "$(apptainer --version)" "$ROUTE" "${ARGS[@]}" <<'PY'
import sys
from parity.container import write_image_manifest
sif, definition, lock, out, sha256, notest, version, route, *args = sys.argv[1:]
write_image_manifest(sif, definition, lock, out, sif_sha256=sha256, tested=notest == "0",
                     apptainer_version=version, build_args=dict(a.split("=", 1) for a in args), route=route)
print(f"{out}: {sif} sha256 {sha256}")
PY
