#!/usr/bin/env bash
# Build the Go medik8s Node Maintenance Operator (NMO) from its upstream
# sources and cache the result per upstream commit outside the repository:
#
#   hack/go-nmo-bin.sh e2e|manager               build it when missing, print its path
#   hack/go-nmo-bin.sh e2e|manager --check       exit 0 (and print the path) when cached
#   hack/go-nmo-bin.sh e2e|manager --print-path  print where it is or will be
#
# What:
#   e2e      its own e2e suite (its test/e2e, unchanged) as a test binary, for
#            tests/e2e/test_go_e2e.py (hack/go-e2e-bin.sh, `make go-e2e-bin`);
#            the build is what upstream's `make cluster-functest` compiles,
#            offline: `GOFLAGS=-mod=vendor go test -c ./test/e2e`. The binary
#            is run the way its hack/functest.sh runs the suite (OPERATOR_NS,
#            TEST_NAMESPACE, ginkgo's --vv and --no-color).
#   manager  the operator itself (its ./cmd, unchanged, upstream's /manager),
#            for the drain benchmarks (`make go-nmo-bin`, benchmarks/benchlib.py's
#            GoNmo). Named go-nmo-manager: controller-runtime's User-Agent is
#            the basename of argv[0] + "/" + version, so the benchmarks find
#            its requests in the audit log as `go-nmo-manager/...`.
#
# The sources: the Go NMO's whole tree with vendor/ (the module proxy refuses
# the module), the `git archive` snapshot node-maintenance-operator-<commit>.tar.gz
# in ../shared/third_party (NMO_THIRD_PARTY_DIR overrides where), checked
# against that directory's SHA256SUMS as hack/cert-manager-bin.sh checks its
# snapshots, and unpacked into the cache, never into the repository. Both
# builds share that one unpacked tree. Offline: -mod=vendor, exactly the
# dependencies upstream vendored; CGO_ENABLED=0, -trimpath, -buildvcs=false.
#
# Resumable: the tree is unpacked into a temporary directory and renamed when
# complete, each binary is written under a temporary name and renamed; one
# build at a time per commit (flock). First build with an empty Go build cache:
# see README ("the Go NMO's e2e suite", "Benchmarks").
set -euo pipefail

COMMIT=3a54cd157723cd555ebd792c52e8d363d9df6dd3
SHORT=${COMMIT:0:8}
ARCHIVE=node-maintenance-operator-$SHORT.tar.gz
THIRD_PARTY=${NMO_THIRD_PARTY_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared/third_party}
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}
WORK_DIR="$CACHE_ROOT/build/go-nmo-$SHORT"
SRC="$WORK_DIR/src"

usage="usage: $0 e2e|manager [--check|--print-path]"
WHAT=${1:-}
case "$WHAT" in
  e2e) BIN="$WORK_DIR/e2e.test"; WHAT_LONG="the Go NMO's test/e2e" ;;
  manager) BIN="$WORK_DIR/go-nmo-manager"; WHAT_LONG="the Go NMO's manager (./cmd)" ;;
  *) printf '%s\n' "$usage" >&2; exit 2 ;;
esac
TAG="go-nmo-bin $WHAT"

log() { printf '[%s %s] %s\n' "$TAG" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "${2:-}" in
  --print-path) echo "$BIN"; exit 0 ;;
  --check) [ -x "$BIN" ] && { echo "$BIN"; exit 0; }; exit 1 ;;
  "") ;;
  *) die "unknown argument $2 ($usage)" ;;
esac

if [ -x "$BIN" ]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null 2>&1 \
  || die "Go is not installed or not on PATH; it is needed to build $WHAT_LONG (install Go >= 1.26 from https://go.dev/dl/ and re-run)"

mkdir -p "$WORK_DIR"
# Parallel `make test` / benchmark runs share the cache: a run that waited here finds the binary.
exec 9>"$WORK_DIR/.lock"
flock 9
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
total0=$SECONDS

unpack() { # the checksummed snapshot, as hack/cert-manager-bin.sh's snapshot()
  local archive="$THIRD_PARTY/$ARCHIVE" want got
  [ -f "$archive" ] \
    || die "$archive is missing: the Go NMO's tree (with vendor/) comes from ../shared/third_party (NMO_THIRD_PARTY_DIR says where else)"
  [ -f "$THIRD_PARTY/SHA256SUMS" ] \
    || die "$THIRD_PARTY has $ARCHIVE but no SHA256SUMS to check it against"
  want=$(awk -v f="$ARCHIVE" '$2 == f || $2 == "*" f { print $1 }' "$THIRD_PARTY/SHA256SUMS")
  [ -n "$want" ] || die "$THIRD_PARTY/SHA256SUMS has no checksum for $ARCHIVE"
  got=$(sha256sum "$archive" | cut -d' ' -f1)
  [ "$got" = "$want" ] \
    || die "checksum mismatch for $archive: SHA256SUMS says $want, the file is $got; the archive is damaged or not the one released with the checksums (copy ../shared/third_party again)"
  rm -rf "$SRC.tmp"; mkdir -p "$SRC.tmp"
  # git archive snapshots hold one top directory (<project>-<commit>/).
  tar -xzf "$archive" -C "$SRC.tmp" --strip-components=1 || die "could not unpack $archive"
  [ -f "$SRC.tmp/test/e2e/e2e_suite_test.go" ] && [ -f "$SRC.tmp/cmd/main.go" ] && [ -d "$SRC.tmp/vendor" ] \
    || die "$archive holds no test/e2e suite, no cmd/main.go or no vendor/ directory"
  touch "$SRC.tmp/.complete"
  rm -rf "$SRC"; mv "$SRC.tmp" "$SRC"
  log "sources: $archive (checksum verified) unpacked into $SRC"
}

[ -f "$SRC/.complete" ] || unpack
log "building $WHAT_LONG ($SHORT) into $BIN (first build: minutes on 2 cores)"
t0=$SECONDS
(
  cd "$SRC"
  export CGO_ENABLED=0 GOFLAGS="-mod=vendor -buildvcs=false"
  case "$WHAT" in
    e2e) go test -c -trimpath -o "$BIN.tmp" ./test/e2e ;;
    manager) go build -trimpath -o "$BIN.tmp" ./cmd ;;
  esac
) || die "building $WHAT_LONG failed in $SRC"
mv "$BIN.tmp" "$BIN"
log "built in $((SECONDS - t0))s (total $((SECONDS - total0))s): $BIN"
echo "$BIN"
