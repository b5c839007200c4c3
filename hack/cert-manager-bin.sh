#!/usr/bin/env bash
# Build cert-manager's controller and cainjector for the sandbox
# (`nmo-sandbox up --cert-manager`) and cache them per version outside the
# repository:
#
#   hack/cert-manager-bin.sh            build whatever is missing, print the bin dir
#   hack/cert-manager-bin.sh --check    exit 0 (and print the bin dir) when both are cached
#
# Beside bin/ it leaves crds/ (deploy/crds of the same version, the layout
# hack/cert-manager-crds.sh caches), which the sandbox applies.
#
# Where the sources come from: cert-manager's library packages are the Go
# module github.com/cert-manager/cert-manager, fetched through the Go module
# proxy. Its two mains (cmd/controller, cmd/cainjector) are separate modules
# named .../controller-binary and .../cainjector-binary that reach the library
# through `replace ../../`, so they are not on any module proxy; they are read
# from cert-manager's git repository at the same tag (NMO_CERT_MANAGER_GIT:
# a URL, default GitHub, or a local clone for machines without GitHub). The
# build is then upstream's own: `go build` in cmd/<binary> of that tree.
# A dependency the module proxy refuses (this machine's proxy serves no
# github.com/Venafi/vcert/v5 >= v5.13) is taken from its git repository at the
# required tag (NMO_CERT_MANAGER_VCERT_GIT) through a directory `replace`.
#
# Idempotent and resumable: each binary is built into a temporary name and
# renamed when complete; the Go module cache keeps downloaded sources.
set -euo pipefail

# v1.21.1, not v1.21.2: the cmd/ sources come from git at the tag, and the only
# cert-manager repository this machine reaches (no GitHub here) is a snapshot
# from before v1.21.2; the two releases' CRDs are byte-identical. With GitHub
# access NMO_CERT_MANAGER_VERSION=v1.21.2 builds the same way.
VERSION=${NMO_CERT_MANAGER_VERSION:-v1.21.1}
MODULE=github.com/cert-manager/cert-manager
GIT_SOURCE=${NMO_CERT_MANAGER_GIT:-https://github.com/cert-manager/cert-manager.git}
VCERT_GIT=${NMO_CERT_MANAGER_VCERT_GIT:-https://github.com/Venafi/vcert.git}
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}
BIN_DIR="$CACHE_ROOT/cert-manager/$VERSION/bin"
CRD_DIR="$CACHE_ROOT/cert-manager/$VERSION/crds" # what hack/cert-manager-crds.sh caches
WORK_DIR="$CACHE_ROOT/build/cert-manager-$VERSION"

BINARIES=(controller cainjector)

log() { printf '[cert-manager-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

all_present() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/cert-manager-$b" ] || return 1; done
  [ -f "$CRD_DIR/.complete" ]
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
  || die "Go is not installed or not on PATH; it is needed to build cert-manager $VERSION (install Go >= 1.26 from https://go.dev/dl/ and re-run)"
command -v git >/dev/null 2>&1 \
  || die "git is not installed; it is needed to read cert-manager's cmd/ sources at $VERSION (apt-get install git)"

mkdir -p "$BIN_DIR" "$WORK_DIR"
# One build at a time per version (parallel `make test` runs share the cache);
# a run that waited here finds the binaries and is done.
exec 9>"$WORK_DIR/.lock"
flock 9
if all_present; then echo "$BIN_DIR"; exit 0; fi
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
total0=$SECONDS
SRC="$WORK_DIR/src"

library() { # the root module, from the Go module proxy
  local info dir
  if ! info=$(cd "$WORK_DIR" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION" 2>&1); then
    die "could not download $MODULE@$VERSION from the Go module proxy ($(go env GOPROXY)): $(printf '%s' "$info" | grep -m1 '"Error"' || printf '%s' "$info" | tail -n1)"
  fi
  dir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$dir" ] && [ -f "$dir/go.mod" ] || die "$MODULE@$VERSION: no module directory in the go mod download answer"
  rm -rf "$SRC.tmp"; cp -r "$dir" "$SRC.tmp"; chmod -R u+w "$SRC.tmp"
}

git_archive() { # source tag outdir path... : files of a git tag, from a URL or a local clone
  local src=$1 tag=$2 out=$3 clone; shift 3
  mkdir -p "$out"
  if [ -d "$src" ]; then
    git --git-dir="$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null || echo "$src")" \
      archive "$tag" "$@" | tar -x -C "$out"
  else
    clone="$WORK_DIR/git.tmp"; rm -rf "$clone"
    git clone --quiet --bare --depth 1 --filter=blob:none --branch "$tag" "$src" "$clone" || return 1
    git --git-dir="$clone" archive "$tag" "$@" | tar -x -C "$out"
    rm -rf "$clone"
  fi
}

mains() { # cmd/controller and cmd/cainjector, from git at the same tag
  git_archive "$GIT_SOURCE" "$VERSION" "$SRC.tmp" cmd/controller cmd/cainjector \
    || die "could not read cmd/controller and cmd/cainjector at $VERSION from $GIT_SOURCE; without GitHub access set NMO_CERT_MANAGER_GIT to a local clone of cert-manager that has the tag $VERSION"
  grep -q '^replace github.com/cert-manager/cert-manager => ../../' "$SRC.tmp/cmd/controller/go.mod" \
    || die "$VERSION's cmd/controller/go.mod does not build against ../../ as expected; this script knows cert-manager >= v1.12"
}

from_git_if_refused() { # module giturl
  local mod=$1 url=$2 ver rel=".nmo-git/${1//\//_}" m
  ver=$(cd "$SRC.tmp/cmd/controller" && go list -m -f '{{.Version}}' "$mod") \
    || die "cannot resolve $mod in cmd/controller/go.mod"
  (cd "$SRC.tmp/cmd/controller" && go mod download "$mod@$ver") >/dev/null 2>&1 && return 0
  log "WARNING: the Go module proxy refuses $mod@$ver; taking it from $url at the tag $ver"
  git_archive "$url" "$ver" "$SRC.tmp/$rel" \
    || die "the Go module proxy refuses $mod@$ver and $url has no tag $ver; set NMO_CERT_MANAGER_VCERT_GIT to a clone that has it"
  for m in cmd/controller cmd/cainjector; do
    (cd "$SRC.tmp/$m" && go mod edit -replace "$mod=../../$rel")
  done
}

build() { # binary
  local ld="-s -w -X $MODULE/pkg/util.AppVersion=$VERSION -X $MODULE/pkg/util.AppGitState=clean"
  (cd "$SRC/cmd/$1" && go build -trimpath -ldflags "$ld" -o "$BIN_DIR/cert-manager-$1.tmp" .)
  mv "$BIN_DIR/cert-manager-$1.tmp" "$BIN_DIR/cert-manager-$1"
}

log "building cert-manager $VERSION into $BIN_DIR (first run: several minutes on 2 cores)"
if [ ! -f "$SRC/.complete" ]; then
  t0=$SECONDS
  library
  mains
  from_git_if_refused github.com/Venafi/vcert/v5 "$VCERT_GIT"
  touch "$SRC.tmp/.complete"
  rm -rf "$SRC"; mv "$SRC.tmp" "$SRC"
  log "sources ready in $((SECONDS - t0))s"
fi
if [ ! -f "$CRD_DIR/.complete" ]; then
  rm -rf "$CRD_DIR.tmp"; mkdir -p "$CRD_DIR.tmp"
  cp "$SRC"/deploy/crds/*.yaml "$CRD_DIR.tmp"/
  touch "$CRD_DIR.tmp/.complete"
  rm -rf "$CRD_DIR"; mv "$CRD_DIR.tmp" "$CRD_DIR"
fi
for b in "${BINARIES[@]}"; do
  [ -x "$BIN_DIR/cert-manager-$b" ] && continue
  t0=$SECONDS
  build "$b"
  log "cert-manager-$b built in $((SECONDS - t0))s"
done
all_present || die "some binaries are still missing in $BIN_DIR"
log "cert-manager $VERSION ready in $((SECONDS - total0))s: $BIN_DIR"
echo "$BIN_DIR"
