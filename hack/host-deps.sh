#!/usr/bin/env bash
# The host tools the sandbox's real nodes and the image build need, installed
# when missing.
#
#   hack/host-deps.sh          (make host-deps; `make image` and `make test` run it)
#   hack/host-deps.sh --check  only check: never installs
#
# Checked: containerd and ctr, runc, the CNI plugins bridge, host-local and
# loopback in /usr/lib/cni, buildah, podman, mmdebstrap, iptables, ip, and
# gcc with the C library's headers and static archive (libc6-dev) for the
# sandbox's pause image (sandbox/src/nmo_sandbox/images.py). When all
# are present it prints nothing and takes a few milliseconds. On Debian or
# Ubuntu as root it installs the missing packages with apt-get (running
# `apt-get update` once if the install fails without package lists); anywhere
# else it stops with one line naming what is missing and how to get it.
set -euo pipefail

check_only=false
case "${1:-}" in
    "") ;;
    --check) check_only=true ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# what to look for -> the Debian/Ubuntu package that provides it
checks=(
    "containerd containerd"
    "ctr containerd"
    "runc runc"
    "/usr/lib/cni/bridge containernetworking-plugins"
    "/usr/lib/cni/host-local containernetworking-plugins"
    "/usr/lib/cni/loopback containernetworking-plugins"
    "buildah buildah"
    "podman podman"
    "mmdebstrap mmdebstrap"
    "iptables iptables"
    "ip iproute2"
    "gcc gcc"
    "/usr/include/stdio.h libc6-dev"
)

# iptables and ip live in sbin, which a non-root PATH may lack.
search_path="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

find_missing() {
    missing_tools=()
    missing_packages=()
    local check what package
    for check in "${checks[@]}"; do
        what=${check% *}
        package=${check#* }
        if [[ "$what" == /* ]]; then
            [[ -e "$what" ]] && continue
        else
            PATH=$search_path command -v "$what" >/dev/null && continue
        fi
        missing_tools+=("$what")
        [[ " ${missing_packages[*]} " == *" ${package} "* ]] || missing_packages+=("$package")
    done
}

find_missing
((${#missing_tools[@]})) || exit 0

debian_like=false
if [[ -r /etc/os-release ]]; then
    # shellcheck disable=SC1091
    os_id=$(. /etc/os-release && echo "${ID:-} ${ID_LIKE:-}")
    [[ " $os_id " == *" debian "* || " $os_id " == *" ubuntu "* ]] && debian_like=true
fi

if [[ "$check_only" == true || "$debian_like" != true || "$(id -u)" != 0 ]] ||
    ! command -v apt-get >/dev/null; then
    why="not root"
    [[ "$debian_like" == true ]] || why="not Debian/Ubuntu"
    [[ "$check_only" != true ]] || why="--check"
    echo "error: missing host tools: ${missing_tools[*]} (${why}, so not installed here); install the packages ${missing_packages[*]} (Debian/Ubuntu: sudo apt-get install -y --no-install-recommends ${missing_packages[*]}; elsewhere your distribution's equivalents)" >&2
    exit 1
fi

echo "host-deps: installing ${missing_packages[*]} (missing: ${missing_tools[*]})" >&2
install=(apt-get install -y --no-install-recommends "${missing_packages[@]}")
export DEBIAN_FRONTEND=noninteractive
if ! "${install[@]}" >&2; then
    echo "host-deps: install failed; running apt-get update once and retrying" >&2
    apt-get update >&2
    "${install[@]}" >&2 || {
        echo "error: apt-get could not install ${missing_packages[*]} (see above); install them by hand" >&2
        exit 1
    }
fi
find_missing
if ((${#missing_tools[@]})); then
    echo "error: still missing after installing: ${missing_tools[*]}" >&2
    exit 1
fi
