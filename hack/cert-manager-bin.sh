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
# through `replace ../../`, so they are not on any module proxy. They come
# from, in this order:
#   1. NMO_CERT_MANAGER_GIT when set: a git URL or a local clone with the tag;
#   2. the `git archive` snapshot cert-manager-<version>-cmd.tar.gz in
#      ../shared/third_party (NMO_THIRD_PARTY_DIR overrides where), checked
#      against that directory's SHA256SUMS and extracted into the build
#      directory under the cache, never into the repository;
#   3. GitHub at the tag.
# One log line says which. The build is then upstream's own: `go build` in
# cmd/<binary> of that tree. A dependency the module proxy refuses (this
# machine's proxy serves no github.com/Venafi/vcert/v5 >= v5.13) is taken the
# same way (NMO_CERT_MANAGER_VCERT_GIT, then vcert-<version>.tar.gz, then
# GitHub) through a directory `replace`.
#
# Idempotent and resumable: each binary is built into a temporary name and
# renamed when complete; the Go module cache keeps downloaded sources.
set -euo pipefail

# v1.21.1, not v1.21.2: the cmd/ sources without GitHub are
# ../shared/third_party's snapshot of v1.21.1; the two releases' CRDs are
# byte-identical. With GitHub access NMO_CERT_MANAGER_VERSION=v1.21.2 builds
# the same way.
VERSION=${NMO_CERT_MANAGER_VERSION:-v1.21.1}
MODULE=github.com/cert-manager/cert-manager
CERT_MANAGER_GITHUB=https://github.com/cert-manager/cert-manager.git
VCERT_GITHUB=https://github.com/Venafi/vcert.git
THIRD_PARTY=${NMO_THIRD_PARTY_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared/third_party}
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
  command -v git >/dev/null 2>&1 || die "git is not installed; it is needed to read $src (apt-get install git)"
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

snapshot() { # archive var outdir path... : a third_party snapshot, checksum verified, unpacked
  local archive=$1 var=$2 out=$3 name want got; shift 3
  name=$(basename "$archive")
  [ -f "$THIRD_PARTY/SHA256SUMS" ] \
    || die "$THIRD_PARTY has $name but no SHA256SUMS to check it against"
  want=$(awk -v f="$name" '$2 == f || $2 == "*" f { print $1 }' "$THIRD_PARTY/SHA256SUMS")
  [ -n "$want" ] || die "$THIRD_PARTY/SHA256SUMS has no checksum for $name"
  got=$(sha256sum "$archive" | cut -d' ' -f1)
  [ "$got" = "$want" ] \
    || die "checksum mismatch for $archive: SHA256SUMS says $want, the file is $got; the archive is damaged or not the one released with the checksums (copy ../shared/third_party again, or set $var to a git clone that has the tag)"
  mkdir -p "$out"
  # git archive snapshots hold one top directory (<project>-<tag>/).
  tar -xzf "$archive" -C "$out" --strip-components=1 --wildcards "${@/#/*/}" \
    || die "could not unpack ${*:-everything} from $archive"
}

fetch_source() { # what variable default_url archive tag outdir path... : from git, a snapshot or GitHub
  local what=$1 var=$2 url=$3 archive=$4 tag=$5 out=$6; shift 6
  if [ -n "${!var:-}" ]; then
    log "$what: $tag from ${!var} ($var)"
    git_archive "${!var}" "$tag" "$out" "$@" \
      || die "could not read ${*:-the tree} at $tag from ${!var} ($var): it needs the tag $tag"
  elif [ -f "$THIRD_PARTY/$archive" ]; then
    snapshot "$THIRD_PARTY/$archive" "$var" "$out" "$@"
    log "$what: $tag from $THIRD_PARTY/$archive (checksum verified)"
  else
    log "$what: $tag from $url (no $archive in $THIRD_PARTY)"
    git_archive "$url" "$tag" "$out" "$@" \
      || die "could not read ${*:-the tree} at $tag from $url and $THIRD_PARTY has no $archive; without GitHub access put the archive there (NMO_THIRD_PARTY_DIR) or set $var to a local clone that has the tag $tag"
  fi
}

mains() { # cmd/controller and cmd/cainjector, at the same tag
  fetch_source "cert-manager's cmd/ sources" NMO_CERT_MANAGER_GIT "$CERT_MANAGER_GITHUB" \
    "cert-manager-$VERSION-cmd.tar.gz" "$VERSION" "$SRC.tmp" cmd/controller cmd/cainjector
  grep -q '^replace github.com/cert-manager/cert-manager => ../../' "$SRC.tmp/cmd/controller/go.mod" \
    || die "$VERSION's cmd/controller/go.mod does not build against ../../ as expected; this script knows cert-manager >= v1.12"
}

from_source_if_refused() { # module var default_url archive_prefix
  local mod=$1 var=$2 url=$3 prefix=$4 ver rel=".nmo-git/${1//\//_}" m
  ver=$(cd "$SRC.tmp/cmd/controller" && go list -m -f '{{.Version}}' "$mod") \
    || die "cannot resolve $mod in cmd/controller/go.mod"
  (cd "$SRC.tmp/cmd/controller" && go mod download "$mod@$ver") >/dev/null 2>&1 && return 0
  log "the Go module proxy refuses $mod@$ver; taking it from its sources"
  fetch_source "$mod" "$var" "$url" "$prefix-$ver.tar.gz" "$ver" "$SRC.tmp/$rel"
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
  from_source_if_refused github.com/Venafi/vcert/v5 NMO_CERT_MANAGER_VCERT_GIT "$VCERT_GITHUB" vcert
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
