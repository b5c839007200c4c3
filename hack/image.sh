#!/usr/bin/env bash
# Build nmo's image, localhost/nmo:dev, into containers-storage (buildah).
#
#   hack/image.sh              build it, or say it is current
#   hack/image.sh --print-ref  print the ref (localhost/nmo:dev)
#
# The base: $BASE_IMAGE if set (`make image BASE_IMAGE=...`); otherwise the
# Containerfile's pinned python:3.11-slim when it is in containers-storage or
# its registry answers (one manifest request, at most 5 s; then it is
# pulled), else a base built here from Debian packages (hack/base-image.sh),
# with one line saying so.
#
# The image is labelled with a hash of everything the build reads (the
# Containerfile, .dockerignore, the locks, pyproject.toml, README.md,
# must-gather's script, every file under src/, and the base image's id); when
# localhost/nmo:dev already carries the same hash the build is skipped.
# buildah runs with --layers, so a change to src/ reuses the dependency layer.
# pip's CA bundle ($PIP_CERT, e.g. a proxy's CA) goes in as a build secret,
# mounted for the download step only and never stored in the image.
set -euo pipefail
cd "$(dirname "$0")/.."

REF=${NMO_IMAGE_REF:-localhost/nmo:dev}
LABEL=io.github.nmo.inputs

if [[ "${1:-}" == "--print-ref" ]]; then
    echo "$REF"
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--print-ref]" >&2
    exit 2
fi

missing=()
for tool in buildah podman; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "error: ${missing[*]} not found; run hack/host-deps.sh (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
fi

# One build at a time (make image and a test may race); the second finds the
# first's image current.
lock_dir=${NMO_IMAGE_CACHE:-${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}/images}
mkdir -p "$lock_dir"
exec 9>"${lock_dir}/.nmo-image.lock"
flock 9

base=${BASE_IMAGE:-}
if [[ -z "$base" ]]; then
    base=$(sed -n 's/^ARG BASE_IMAGE=//p' Containerfile)
    # Ask the registry for the manifest first (seconds at most), so that a
    # real pull, which may take longer, is never cut short. podman takes a
    # reference with a digest but no tag here.
    probe=$base
    if [[ "$base" == *@* ]]; then
        name=${base%@*}
        probe="${name%:*}@${base#*@}"
    fi
    if podman image exists "$base"; then
        :
    elif timeout 5 podman manifest inspect "$probe" >/dev/null 2>&1; then
        podman pull --quiet "$base" >/dev/null
    else
        echo "image: ${base%@*} cannot be pulled; using a base built from Debian packages (hack/base-image.sh)" >&2
        base=$(hack/base-image.sh)
    fi
elif ! podman image exists "$base"; then
    podman pull --quiet "$base" >/dev/null
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base")

inputs=$(
    {
        printf 'base %s %s\n' "$base" "$base_id"
        find Containerfile .dockerignore requirements-build.lock requirements-image.lock \
            pyproject.toml README.md must-gather/collection-scripts/gather src \
            -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 |
            LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
)

previous=$(podman image inspect --format "{{.Id}} {{index .Labels \"${LABEL}\"}}" "$REF" 2>/dev/null || true)
if [[ "${previous#* }" == "$inputs" ]]; then
    echo "image ${REF} is current (inputs ${inputs})"
    exit 0
fi

build=(buildah bud --isolation chroot --layers
    --build-arg "BASE_IMAGE=${base}" --label "${LABEL}=${inputs}" -f Containerfile -t "$REF")
if [[ -n "${PIP_CERT:-}" && -f "${PIP_CERT}" ]]; then
    build+=(--secret "id=pipcert,src=${PIP_CERT}")
fi
echo "image: building ${REF} on ${base} (inputs ${inputs})" >&2
start=$SECONDS
"${build[@]}" . >&2
# The image this one replaces is untagged now; drop it unless something uses it.
if [[ -n "$previous" && "${previous%% *}" != "$(podman image inspect --format '{{.Id}}' "$REF")" ]]; then
    podman rmi "${previous%% *}" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$REF")
echo "image ${REF} built in $((SECONDS - start)) s ($((size / 1000000)) MB, inputs ${inputs})"
