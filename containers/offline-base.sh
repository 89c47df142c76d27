#!/usr/bin/env bash
# Local bases for the offline variant of the image (containers/build.sh --variant offline), for a host
# that cannot reach Docker Hub. NOT the reviewers' image: that one is built from the digest-pinned bases.
#
# Usage: containers/offline-base.sh OUT_DIR
#   OUT_DIR/rootfs  Debian trixie (debootstrap minbase, from the host's apt mirror) with CPython 3.12 in
#                   /opt/python3.12 and python3/python3.12 wrappers in /usr/local/bin; the final stage's base
#   OUT_DIR/flame   /usr/local/flame/bin/flame-{session,executor}-manager; the Flame stages' base
# Needs root, debootstrap, mvn (Maven Central), unzip. Environment:
#   FLAME_BIN       folder holding flame-session-manager and flame-executor-manager built from Flame's
#                   v0.6.0 tag (the commit parity.def's labels name); required
#   DEBIAN_MIRROR   apt mirror for debootstrap (default: the first deb line of the host's apt sources)
# Why these: Debian has no Python 3.12 (bookworm 3.11, trixie 3.13); the one reachable 3.12 build is the
# JavaCPP presets' CPython on Maven Central, pinned here by SHA-256. trixie's glibc (2.41) runs the
# lock's manylinux_2_39 wheels.
set -euo pipefail

PYTHON_ARTIFACT=org.bytedeco:cpython:3.12.1-1.5.10:jar:linux-x86_64
PYTHON_JAR_SHA256=a135fcf4dc01adebf7ea439252276fc3196db80f7e0dd3da0b61f1ec489b68bd
SUITE=trixie

OUT="${1:?usage: containers/offline-base.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd -- "$OUT" && pwd)"
: "${FLAME_BIN:?offline-base.sh: set FLAME_BIN to a folder with flame-session-manager and flame-executor-manager (Flame v0.6.0)}"
for tool in debootstrap mvn unzip; do
    command -v "$tool" >/dev/null || { echo "offline-base.sh: $tool is not installed" >&2; exit 1; }
done
if [ -z "${DEBIAN_MIRROR:-}" ]; then
    DEBIAN_MIRROR="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' || true)"
    [ -n "$DEBIAN_MIRROR" ] || DEBIAN_MIRROR="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '$1 == "URIs:" {print $2; exit}' || true)"
fi
[ -n "$DEBIAN_MIRROR" ] || { echo "offline-base.sh: no apt mirror found; set DEBIAN_MIRROR" >&2; exit 1; }

# 1. CPython 3.12 from Maven Central, checked against the pinned SHA-256, laid out as a prefix.
mvn -q -B -Dmaven.repo.local="$OUT/m2" dependency:get -Dartifact="$PYTHON_ARTIFACT" -Dtransitive=false
JAR="$OUT/m2/org/bytedeco/cpython/3.12.1-1.5.10/cpython-3.12.1-1.5.10-linux-x86_64.jar"
echo "$PYTHON_JAR_SHA256  $JAR" | sha256sum -c --quiet -
rm -rf "$OUT/jar" "$OUT/python" && mkdir -p "$OUT/jar" "$OUT/python"
unzip -q "$JAR" 'org/bytedeco/cpython/linux-x86_64/*' -d "$OUT/jar"
P="$OUT/jar/org/bytedeco/cpython/linux-x86_64"
cp -a "$P/bin" "$P/lib" "$P/include" "$OUT/python/"
cp -a "$P/libpython3.12.so.1.0" "$P/libffi.so.7" "$OUT/python/lib/"     # bin/python3.12: RUNPATH $ORIGIN/../lib/
cp -a "$P/libffi.so.7" "$OUT/python/lib/python3.12/lib-dynload/"        # _ctypes: RUNPATH $ORIGIN/
chmod +x "$OUT/python/bin/"*
rm -rf "$OUT/python/lib/python3.12/test" "$OUT/jar"

# 2. Debian trixie, minimal, with the interpreter at /opt/python3.12.
rm -rf "$OUT/rootfs"
debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$OUT/rootfs" "$DEBIAN_MIRROR"
cp -a "$OUT/python" "$OUT/rootfs/opt/python3.12"
# Wrappers, not symlinks: a venv made through a symlink in /usr/local/bin records home = /usr/local/bin
# and its python then cannot find the standard library.
for name in python3 python3.12; do
    printf '#!/bin/sh\nexec /opt/python3.12/bin/python3.12 "$@"\n' > "$OUT/rootfs/usr/local/bin/$name"
    chmod 755 "$OUT/rootfs/usr/local/bin/$name"
done

# 3. The Flame binaries, where the published images keep them.
rm -rf "$OUT/flame" && mkdir -p "$OUT/flame/usr/local/flame/bin"
cp "$FLAME_BIN/flame-session-manager" "$FLAME_BIN/flame-executor-manager" "$OUT/flame/usr/local/flame/bin/"

sha256sum "$JAR" "$OUT/flame/usr/local/flame/bin/"flame-* | sed "s|$OUT/||"
echo "offline-base.sh: $OUT/rootfs (Debian $SUITE, CPython 3.12.1 from $PYTHON_ARTIFACT) and $OUT/flame"
