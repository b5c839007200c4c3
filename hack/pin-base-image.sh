#!/usr/bin/env bash
# Re-pin the Containerfile's base image to the current digest of its tag.
#
# The Containerfile names the base as ARG BASE_IMAGE=<image>:<tag>@sha256:<digest>.
# This asks the registry for the digest the tag points at now (the multi-arch
# index, so the pin serves every platform) and rewrites that line. It needs one
# of skopeo, crane or docker (buildx); review the diff and rebuild after it.
set -euo pipefail
cd "$(dirname "$0")/.."

line=$(grep -E '^ARG BASE_IMAGE=' Containerfile)
ref=${line#ARG BASE_IMAGE=}
tag_ref=${ref%@sha256:*}

if command -v skopeo >/dev/null; then
    digest=$(skopeo inspect --raw "docker://${tag_ref}" | sha256sum | cut -d' ' -f1)
    digest="sha256:${digest}"
elif command -v crane >/dev/null; then
    digest=$(crane digest "${tag_ref}")
elif command -v docker >/dev/null; then
    digest=$(docker buildx imagetools inspect "${tag_ref}" --format '{{json .Manifest.Digest}}' | tr -d '"')
else
    echo "error: need skopeo, crane or docker to look up ${tag_ref}" >&2
    exit 1
fi
case "$digest" in
    sha256:????????????????????????????????????????????????????????????????) ;;
    *) echo "error: unexpected digest for ${tag_ref}: ${digest}" >&2; exit 1 ;;
esac

sed -i "s|^ARG BASE_IMAGE=.*|ARG BASE_IMAGE=${tag_ref}@${digest}|" Containerfile
echo "${tag_ref} -> ${digest}"
