# Sourced by benchmarks/host.sh and the GPU checks: unless FLAME_BIN_DIR is set, unpack the Flame v0.6.0
# binaries carried xz'd in .flame/ into /tmp/flame-bin (once) and point FLAME_BIN_DIR there.
if [ -z "${FLAME_BIN_DIR:-}" ] && compgen -G ".flame/flame-*.xz" >/dev/null; then
  mkdir -p /tmp/flame-bin
  for packed in .flame/flame-*.xz; do
    binary=/tmp/flame-bin/$(basename "$packed" .xz)
    [ -x "$binary" ] || { xz -dc "$packed" > "$binary.part" && chmod +x "$binary.part" && mv "$binary.part" "$binary"; }
  done
  export FLAME_BIN_DIR=/tmp/flame-bin
fi
