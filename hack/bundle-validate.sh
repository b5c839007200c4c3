#!/usr/bin/env bash
# Build the OLM bundle validator (hack/bundle-validate: the operator-framework
# api and operator-registry libraries, pinned by its go.mod and go.sum) and
# cache it per version outside the repository, as hack/sandbox-bin.sh does.
#
#   hack/bundle-validate.sh               build it when missing, print its path
#   hack/bundle-validate.sh --check       exit 0 (and print the path) when cached
#   hack/bundle-validate.sh --print-path  print where it is or will be
#
# Beside the binary: OLM's ClusterServiceVersion CRD from the same api module,
# for tests that let a real API server check a CSV against OLM's schema.
#
# Resumable: the binary is written under a temporary name and renamed when
# complete; the Go module cache keeps downloaded sources between runs. The
# directory name carries the library versions and a digest of the module's
# files, so a change to any of them builds a new validator. A first build
# with empty Go caches costs about 330 CPU-seconds and 570 MB of module cache.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC="$HERE/bundle-validate"
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}

log() { printf '[bundle-validate %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

version_of() { sed -n "s#^[[:space:]]*$1 \(v[^ ]*\).*#\1#p" "$SRC/go.mod" | head -1; }
API_VERSION=$(version_of github.com/operator-framework/api)
REGISTRY_VERSION=$(version_of github.com/operator-framework/operator-registry)
[ -n "$API_VERSION" ] && [ -n "$REGISTRY_VERSION" ] || die "cannot read the library versions from $SRC/go.mod"
DIGEST=$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-12)
OUT_DIR="$CACHE_ROOT/build/bundle-validate-api-$API_VERSION-registry-$REGISTRY_VERSION-$DIGEST"
BIN="$OUT_DIR/bundle-validate"
CSV_CRD="$OUT_DIR/operators.coreos.com_clusterserviceversions.yaml"

case "${1:-}" in
  --print-path) echo "$BIN"; exit 0 ;;
  --check) [ -x "$BIN" ] && [ -f "$CSV_CRD" ] && { echo "$BIN"; exit 0; }; exit 1 ;;
  "") ;;
  *) die "unknown argument $1" ;;
esac

copy_crd() {
  local dir
  dir=$(cd "$SRC" && go list -mod=readonly -m -f '{{.Dir}}' github.com/operator-framework/api)
  cp "$dir/crds/$(basename "$CSV_CRD")" "$CSV_CRD.tmp"
  chmod u+w "$CSV_CRD.tmp"
  mv "$CSV_CRD.tmp" "$CSV_CRD"
}

if [ -x "$BIN" ] && [ -f "$CSV_CRD" ]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.26 and re-run"
mkdir -p "$OUT_DIR"
t0=$SECONDS
if [ ! -x "$BIN" ]; then
  log "building the validator (operator-framework/api $API_VERSION, operator-registry $REGISTRY_VERSION) into $OUT_DIR"
  (
    cd "$SRC"
    CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
  )
  mv "$BIN.tmp" "$BIN"
fi
copy_crd
log "built in $((SECONDS - t0))s: $BIN"
echo "$BIN"
