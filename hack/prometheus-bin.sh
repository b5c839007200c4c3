#!/usr/bin/env bash
# Build the Prometheus server and promtool for the tests that run the chart's
# alert rules (tests/prometheus/, tests/integration/test_alerts.py) and cache
# them per version outside the repository:
#
#   hack/prometheus-bin.sh              build whatever is missing, print the bin dir
#   hack/prometheus-bin.sh --check      exit 0 (and print the bin dir) when both are cached
#   hack/prometheus-bin.sh --print-dir  print the bin dir, build nothing
#
# Where the sources come from: the Go module github.com/prometheus/prometheus
# through the Go module proxy (its go.mod has no replace directives, so
# `go install <pkg>@<version>` builds upstream's own mains, ./cmd/prometheus
# and ./cmd/promtool). Built without the `builtinassets` tag: the web UI's
# JavaScript assets are not in the module and the tests use only the HTTP API,
# so the server's UI pages answer "not found" while /api/v1 works. Built with
# upstream's `remove_all_sd` tag (plugins/plugin_*.go): no cloud service
# discovery (AWS, Azure, GCE, Kubernetes, ...), which roughly halves the build;
# static_configs and file_sd_configs, what the tests scrape with, stay.
#
# Idempotent and resumable: each binary is installed into a temporary
# directory and renamed when complete; the Go module and build caches keep
# downloaded sources and compiled packages. First build with empty Go caches:
# about 13 CPU-minutes on 2 cores (README).
set -euo pipefail

VERSION=${NMO_PROMETHEUS_VERSION:-v0.316.0}
MODULE=github.com/prometheus/prometheus
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}
BIN_DIR="$CACHE_ROOT/prometheus/$VERSION/bin"
WORK_DIR="$CACHE_ROOT/build/prometheus-$VERSION"

BINARIES=(prometheus promtool)

log() { printf '[prometheus-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

all_present() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
}

if [ "${1:-}" = "--check" ]; then
  all_present && { echo "$BIN_DIR"; exit 0; }
  exit 1
fi
if [ "${1:-}" = "--print-dir" ]; then echo "$BIN_DIR"; exit 0; fi
if all_present; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null 2>&1 \
  || die "Go is not installed or not on PATH; it is needed to build Prometheus $VERSION (install Go >= 1.21, which fetches the toolchain the module needs from the Go module proxy, and re-run)"

mkdir -p "$BIN_DIR" "$WORK_DIR"
# One build at a time per version (parallel `make test` runs share the cache);
# a run that waited here finds the binaries and is done.
exec 9>"$WORK_DIR/.lock"
flock 9
if all_present; then echo "$BIN_DIR"; exit 0; fi
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
total0=$SECONDS

log "building Prometheus $VERSION (prometheus, promtool) into $BIN_DIR (first run: several minutes on 2 cores)"
info=$(cd "$WORK_DIR" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION" 2>&1) \
  || die "could not download $MODULE@$VERSION from the Go module proxy ($(go env GOPROXY)): $(printf '%s' "$info" | grep -m1 '"Error"' || printf '%s' "$info" | tail -n1)"

# The Go the module asks for (its go.mod's `go` line, go 1.26.7 for v0.316.0):
# a local go older than that with GOTOOLCHAIN=local (Debian's go.env) refuses
# `go install`. Then the module's toolchain is asked for, which the go command
# (Go >= 1.21) fetches from the Go module proxy as golang.org/toolchain and
# verifies against the checksum database. A GOTOOLCHAIN the caller set is kept.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
gomod=$(printf '%s' "$info" | grep -o '"GoMod": *"[^"]*"' | head -n1 | sed 's/.*"\([^"]*\)"$/\1/')
need=""
[ -n "$gomod" ] && [ -f "$gomod" ] && need=$(sed -n 's/^go \([0-9][0-9.]*\)[[:space:]]*$/\1/p' "$gomod" | head -n1)
have=$(go env GOVERSION); have=${have%% *}; have=${have#go}
if [ -n "$need" ] && [ -z "${GOTOOLCHAIN:-}" ] && [ "$(go env GOTOOLCHAIN)" = local ] \
  && ! version_ge "$have" "$need"; then
  export GOTOOLCHAIN="go$need"
  log "go $have is older than the go $need that $MODULE@$VERSION needs: building with GOTOOLCHAIN=$GOTOOLCHAIN (fetched from the Go module proxy)"
fi

# The version strings `prometheus --version` prints, as upstream's release
# builds set them (github.com/prometheus/common/version).
# The Go module's v0.MMM.P is Prometheus vM.MM.P (v0.316.0: Prometheus 3.16.0).
ver=${VERSION#v}
if [[ $VERSION =~ ^v0\.([0-9])([0-9][0-9])\.([0-9]+)$ ]]; then
  ver="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"
fi
ld="-s -w -X github.com/prometheus/common/version.Version=$ver"
ld+=" -X github.com/prometheus/common/version.Revision=$VERSION"
ld+=" -X github.com/prometheus/common/version.Branch=$VERSION"
ld+=" -X github.com/prometheus/common/version.BuildUser=nmo-hack-prometheus-bin"

for b in "${BINARIES[@]}"; do
  [ -x "$BIN_DIR/$b" ] && continue
  t0=$SECONDS
  rm -rf "$WORK_DIR/gobin.tmp"; mkdir -p "$WORK_DIR/gobin.tmp"
  (cd "$WORK_DIR" && GOBIN="$WORK_DIR/gobin.tmp" go install -trimpath -tags remove_all_sd -ldflags "$ld" "$MODULE/cmd/$b@$VERSION") \
    || die "go install $MODULE/cmd/$b@$VERSION failed (see above)"
  mv "$WORK_DIR/gobin.tmp/$b" "$BIN_DIR/$b.tmp"
  mv "$BIN_DIR/$b.tmp" "$BIN_DIR/$b"
  log "$b built in $((SECONDS - t0))s"
done
rm -rf "$WORK_DIR/gobin.tmp"
all_present || die "some binaries are still missing in $BIN_DIR"
log "Prometheus $VERSION ready in $((SECONDS - total0))s: $BIN_DIR"
echo "$BIN_DIR"
