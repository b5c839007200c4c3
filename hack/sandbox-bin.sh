#!/usr/bin/env bash
# Build the sandbox binaries (a real Kubernetes control plane without Docker,
# plus the kubelet of its real nodes) from their Go modules and cache them per
# version outside the repository.
#
#   hack/sandbox-bin.sh            build whatever is missing, print the bin dir
#   hack/sandbox-bin.sh --check    exit 0 when every binary is cached
#
# Idempotent and resumable: each binary is built into a temporary name and
# renamed when complete, so an interrupted run simply resumes at the first
# missing binary; the Go module cache keeps downloaded sources between runs.
# Nothing here is written into the repository.
set -euo pipefail

K8S_VERSION=${NMO_K8S_VERSION:-v1.35.4}
ETCD_VERSION=${NMO_ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${NMO_KWOK_VERSION:-v0.8.0}
HELM_VERSION=${NMO_HELM_VERSION:-v3.20.2}
CACHE_ROOT=${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmo}
BIN_DIR="$CACHE_ROOT/sandbox/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin"
WORK_DIR="$CACHE_ROOT/build"

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd kwok helm)

log() { printf '[sandbox-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

all_present() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
  [ -d "$BIN_DIR/../kwok-stage" ] || return 1
  [ -f "$BIN_DIR/.helm-k8s-$K8S_VERSION" ] || return 1
  return 0
}

if [ "${1:-}" = "--check" ]; then
  all_present && { echo "$BIN_DIR"; exit 0; }
  exit 1
fi
if [ "${1:-}" = "--print-dir" ]; then echo "$BIN_DIR"; exit 0; fi

if all_present; then
  log "all binaries cached in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; install Go >= 1.25 (https://go.dev/dl/) and re-run"
GOPROXY_URL=$(go env GOPROXY | cut -d, -f1)
if [ "$GOPROXY_URL" != "off" ] && [ "$GOPROXY_URL" != "direct" ]; then
  if ! curl -fsS --max-time 20 -o /dev/null "$GOPROXY_URL/k8s.io/kubernetes/@v/$K8S_VERSION.mod"; then
    die "the Go module proxy $GOPROXY_URL does not answer for k8s.io/kubernetes@$K8S_VERSION; check the network or GOPROXY"
  fi
fi

mkdir -p "$BIN_DIR" "$WORK_DIR"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

step() {
  local name=$1; shift
  local t0=$SECONDS
  log "step $name: start"
  "$@"
  log "step $name: done in $((SECONDS - t0))s"
}

k8s_module() {
  local dir="$WORK_DIR/k8s-$K8S_VERSION"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local patch=${K8S_VERSION##*.}
  local staging="v0.$minor.$patch"
  mkdir -p "$dir"; cd "$dir"
  if [ ! -f go.mod.done ]; then
    rm -f go.mod go.sum
    go mod init nmo.local/sandbox-k8s >/dev/null 2>&1
    local upstream
    upstream=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -f "$upstream" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    local m
    for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\) => ./staging/.*#\1#p' "$upstream"); do
      go mod edit -replace "$m=$m@$staging"
    done
    local gv; gv=$(sed -n 's/^go \(.*\)/\1/p' "$upstream")
    go mod edit -go="$gv"
    local godebug; godebug=$(grep '^godebug ' "$upstream" || true)
    [ -n "$godebug" ] && printf '\n%s\n' "$godebug" >> go.mod
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION"
    go mod tidy
    touch go.mod.done
  fi
  # A module made before the kubelet joined: add it (only additions to go.mod).
  if ! grep -q '^[[:space:]]*k8s.io/kubernetes/cmd/kubelet$' go.mod; then
    go get -tool "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION"
  fi
}

k8s_build() { # the commands to build, e.g. kube-apiserver kubelet
  cd "$WORK_DIR/k8s-$K8S_VERSION"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w" pkg b
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date -X $pkg.gitCommit=nmo-sandbox"
  done
  local out="$WORK_DIR/k8s-out"; rm -rf "$out"; mkdir -p "$out"
  local pkgs=()
  for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$out/" "${pkgs[@]}"
  for b in "$@"; do mv "$out/$b" "$BIN_DIR/$b"; done
}

etcd_build() {
  local dir="$WORK_DIR/etcd-$ETCD_VERSION"
  mkdir -p "$dir"; cd "$dir"
  if [ ! -f go.mod.done ]; then
    rm -f go.mod go.sum
    go mod init nmo.local/sandbox-etcd >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
    touch go.mod.done
  fi
  go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
}

go_install() { # name module@version
  local gobin="$WORK_DIR/gobin-$1"; mkdir -p "$gobin"
  GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "$2"
  mv "$gobin/$1" "$BIN_DIR/$1"
}

kwok_build() {
  go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # kwok >= 0.8 ships no built-in stages; keep its stage sets beside the binary.
  local src; src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  rm -rf "$BIN_DIR/../kwok-stage"; cp -r "$src" "$BIN_DIR/../kwok-stage"; chmod -R u+w "$BIN_DIR/../kwok-stage"
}

helm_build() {
  local GOBIN="$WORK_DIR/gobin-helm"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ld="$ld -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  # Without these helm assumes Kubernetes v1.20 for `helm template` and lint.
  ld="$ld -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  ld="$ld -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  mkdir -p "$GOBIN"
  GOBIN="$GOBIN" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$GOBIN/helm" "$BIN_DIR/helm"
  touch "$BIN_DIR/.helm-k8s-$K8S_VERSION"
}

total0=$SECONDS
log "building sandbox binaries into $BIN_DIR (first run: tens of minutes on 2 cores)"
# One `go build` for every missing Kubernetes command (they share most packages);
# a cache from before the kubelet joined builds only the kubelet (about 45 s warm).
k8s_missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  [ -x "$BIN_DIR/$b" ] || k8s_missing+=("$b")
done
if [ "${#k8s_missing[@]}" -gt 0 ]; then
  step "k8s-module ($K8S_VERSION)" k8s_module
  step "k8s-build (${k8s_missing[*]})" k8s_build "${k8s_missing[@]}"
fi
[ -x "$BIN_DIR/etcd" ] || step "etcd ($ETCD_VERSION)" etcd_build
{ [ -x "$BIN_DIR/kwok" ] && [ -d "$BIN_DIR/../kwok-stage" ]; } || step "kwok ($KWOK_VERSION)" kwok_build
{ [ -x "$BIN_DIR/helm" ] && [ -f "$BIN_DIR/.helm-k8s-$K8S_VERSION" ]; } || step "helm ($HELM_VERSION)" helm_build
all_present || die "some binaries are still missing in $BIN_DIR"
log "all binaries ready in $((SECONDS - total0))s: $BIN_DIR"
echo "$BIN_DIR"
