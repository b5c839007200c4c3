#!/usr/bin/env bash
# A Python 3.11 base image made from Debian packages, for building nmo's image
# where no container registry is reachable (python:3.11-slim cannot be pulled).
#
#   hack/base-image.sh              build (or reuse) it; prints its ref on stdout
#   hack/base-image.sh --print-ref  prints the ref it would build, builds nothing
#
# The root filesystem comes from mmdebstrap (--variant=minbase plus the
# packages below) and is cached as a tar under ~/.cache/nmo/images/ (written
# under a temporary name, then renamed, so an interrupted run leaves nothing
# half-made); `podman import` brings it into containers-storage only when the
# ref is missing there. The tag names the Debian suite, the Python version and
# a short hash of the mmdebstrap arguments (package list, suite, excludes), so
# a change to any of them is a new image, and the same arguments reuse the
# cached one. Debian's packages move with point releases: delete the tar and
# the image (podman rmi) to refresh.
#
# What it holds: python3.11 (/usr/bin/python3.11, and `python3`), ensurepip
# and its wheels (python3.11-venv: the Containerfile's build stage makes its
# build virtualenv with them; the runtime stage deletes them), CA
# certificates. No pip is installed system-wide (Debian's would be
# externally managed, PEP 668).
set -euo pipefail

SUITE=${NMO_BASE_SUITE:-bookworm}
PY=3.11
PACKAGES=(python3.11 python3.11-venv python3-minimal ca-certificates)
# Documentation, manual pages and translations are not needed in an image.
EXCLUDES=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')
CACHE=${NMO_IMAGE_CACHE:-${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}/images}

# merged /usr by symlinks (mmdebstrap's hook), not the usrmerge package, which
# would pull in perl (55 MB).
args=(--variant=minbase --format=tar --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    "--include=$(IFS=,; echo "${PACKAGES[*]}")")
for pattern in "${EXCLUDES[@]}"; do
    args+=("--dpkgopt=path-exclude=${pattern}")
done
args+=("--dpkgopt=path-include=/usr/share/doc/*/copyright" "$SUITE")
hash=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-10)
tag="${SUITE}-py${PY}-${hash}"
ref="localhost/nmo-base:${tag}"

if [[ "${1:-}" == "--print-ref" ]]; then
    echo "$ref"
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--print-ref]" >&2
    exit 2
fi

missing=()
for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "error: ${missing[*]} not found; run hack/host-deps.sh (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
fi

if podman image exists "$ref"; then
    echo "$ref"
    exit 0
fi

# One builder at a time (make image and a test may race); the second reuses.
mkdir -p "$CACHE"
exec 9>"${CACHE}/.nmo-base.lock"
flock 9
if podman image exists "$ref"; then
    echo "$ref"
    exit 0
fi

tar="${CACHE}/nmo-base-${tag}.tar"
if [[ ! -s "$tar" ]]; then
    tmp="${tar}.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    echo "base image: mmdebstrap ${SUITE} with ${PACKAGES[*]} -> ${tar}" >&2
    start=$SECONDS
    mmdebstrap "${args[@]}" "$tmp" >&2
    mv "$tmp" "$tar"
    trap - EXIT
    echo "base image: root filesystem built in $((SECONDS - start)) s" >&2
fi

podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3.11"]' \
    --message "Debian ${SUITE} minbase: ${PACKAGES[*]} (hack/base-image.sh)" \
    "$tar" "$ref" >/dev/null
echo "base image: imported ${ref}" >&2
echo "$ref"
