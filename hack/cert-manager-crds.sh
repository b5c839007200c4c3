#!/usr/bin/env bash
# Print a directory holding cert-manager's CRDs (deploy/crds/*.yaml of its Go
# module), for testing the chart's cert-manager mode against the sandbox:
#
#   kubectl apply --server-side -f "$(hack/cert-manager-crds.sh)"
#
# The CRDs are fetched through the Go module proxy (`go mod download`) and
# cached under ~/.cache/nmo/cert-manager/<version>/crds; nothing is written
# into the repository.
set -euo pipefail

# The version hack/cert-manager-bin.sh builds (see there why not v1.21.2).
VERSION=${NMO_CERT_MANAGER_VERSION:-v1.21.1}
MODULE=github.com/cert-manager/cert-manager
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}
OUT="$CACHE_ROOT/cert-manager/$VERSION/crds"

die() { printf '[cert-manager-crds] ERROR: %s\n' "$*" >&2; exit 1; }

if [ -f "$OUT/.complete" ]; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null 2>&1 \
  || die "Go is not installed or not on PATH; it is needed to fetch $MODULE@$VERSION through the Go module proxy (install Go >= 1.22 and re-run)"

# Outside any module, so no go.mod around us changes what is downloaded.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if ! info=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION" 2>&1); then
  die "could not download $MODULE@$VERSION from the Go module proxy ($(go env GOPROXY)): $(printf '%s' "$info" | grep -m1 '"Error"' || printf '%s' "$info" | tail -n1)"
fi
dir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$dir" ] && [ -d "$dir/deploy/crds" ] || die "$MODULE@$VERSION has no deploy/crds directory (looked in '${dir:-?}')"

mkdir -p "$OUT"
cp "$dir"/deploy/crds/*.yaml "$OUT"/
chmod -R u+w "$OUT"
count=$(find "$OUT" -name '*.yaml' | wc -l)
[ "$count" -gt 0 ] || die "no CRD files found in $dir/deploy/crds"
touch "$OUT/.complete"
echo "$OUT"
