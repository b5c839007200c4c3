#!/usr/bin/env bash
# Re-prove that the README's two commands work on a fresh machine: run them in
# new clones of a commit with every cache nmo, Go, pip and buildah/podman use
# pointed at new empty directories, and time each step.
#
#   hack/cold-walk.sh                  make demo, then make test, each from nothing
#   hack/cold-walk.sh --only test      just one of them (demo or test)
#   hack/cold-walk.sh --rev REV        walk another commit (default HEAD)
#   hack/cold-walk.sh --root DIR       keep the caches and logs in DIR
#                                      (default: a new directory under $TMPDIR)
#   hack/cold-walk.sh --clean          delete the caches when done (logs stay)
#
# What "nothing" means, per command: a new `git clone` of the commit (so only
# committed files, no .venv), every NMO_* variable unset, XDG_CACHE_HOME (nmo's
# caches and pip's), GOPATH, GOMODCACHE and GOCACHE in new empty directories,
# and a containers-storage of its own (CONTAINERS_STORAGE_CONF), so the base
# image and localhost/nmo:dev are built again. The machine's own caches are
# neither read nor changed. Host packages (`make host-deps`) are the machine's:
# the walk says whether any had to be installed.
#
# The clones are made beside this repository, as the repository itself is, so
# ../shared/third_party resolves for them exactly as for a developer's clone;
# they are deleted at the end. Each step's output is in DIR/<command>/<step>.log
# and the times in DIR/summary.txt. Exit status: 0 only when every step passed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
only=""
root=""
rev=HEAD
clean=false
while (($#)); do
    case "$1" in
        --only) only=${2:?--only takes demo or test}; shift 2 ;;
        --rev) rev=${2:?--rev takes a commit}; shift 2 ;;
        --root) root=${2:?--root takes a directory}; shift 2 ;;
        --clean) clean=true; shift ;;
        -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "usage: $0 [--only demo|test] [--rev REV] [--root DIR] [--clean]" >&2; exit 2 ;;
    esac
done
case "$only" in
    "") commands=(demo test) ;;
    demo | test) commands=("$only") ;;
    *) echo "error: --only takes demo or test, not '$only'" >&2; exit 2 ;;
esac

log() { printf '[cold-walk %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

commit=$(git -C "$REPO" rev-parse --verify "$rev^{commit}") || die "no commit $rev in $REPO"
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
    log "note: $REPO has uncommitted changes; the walk uses only the commit $commit"
fi
if [ -z "$root" ]; then
    root=$(mktemp -d "${TMPDIR:-/tmp}/nmo-cold-walk.XXXXXX")
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
    die "$root is not empty; a cold walk needs new directories (omit --root for a new one)"
fi
mkdir -p "$root"
root=$(cd "$root" && pwd)
summary="$root/summary.txt"
: >"$summary"
clones=()
cleanup() {
    local c
    for c in "${clones[@]}"; do rm -rf "$c"; done
}
trap cleanup EXIT

# The system's storage driver, in a storage.conf of the walk's own.
driver=$(sed -n 's/^[[:space:]]*driver[[:space:]]*=[[:space:]]*"\(.*\)".*/\1/p' \
    /etc/containers/storage.conf 2>/dev/null | head -1 || true)
driver=${driver:-overlay}

hostdeps_before=$("$REPO/hack/host-deps.sh" --check >/dev/null 2>&1 && echo present || echo missing)

record() { printf '%-8s %-18s %8s s wall %8s CPU-s  %s\n' "$@" | tee -a "$summary" >&2; }

walk() { # command targets...
    local name=$1 dir clone target rc t0 cpu0 cpu1 status=0 total0 totalcpu0; shift
    dir="$root/$name"
    clone="$(dirname "$REPO")/.nmo-cold-walk-$(basename "$root")-$name"
    mkdir -p "$dir/cache" "$dir/go" "$dir/gocache" "$dir/containers/graph" "$dir/containers/run"
    printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' \
        "$driver" "$dir/containers/graph" "$dir/containers/run" >"$dir/storage.conf"
    rm -rf "$clone"
    clones+=("$clone")
    git clone --quiet --no-local --no-checkout "$REPO" "$clone"
    git -C "$clone" checkout --quiet --detach "$commit"
    log "$name: a new clone of ${commit:0:12} in $clone, caches in $dir"
    local -a env_args=(env)
    local var
    for var in $(compgen -e); do
        [[ "$var" == NMO_* ]] && env_args+=(-u "$var")
    done
    env_args+=(XDG_CACHE_HOME="$dir/cache" GOPATH="$dir/go" GOMODCACHE="$dir/go/pkg/mod"
        GOCACHE="$dir/gocache" CONTAINERS_STORAGE_CONF="$dir/storage.conf")
    total0=$SECONDS
    cpu_now
    totalcpu0=$CPU
    for target in "$@"; do
        log "$name: make $target (log: $dir/$target.log)"
        t0=$SECONDS
        cpu_now
        cpu0=$CPU
        rc=0
        (cd "$clone" && "${env_args[@]}" make "$target") >"$dir/$target.log" 2>&1 || rc=$?
        cpu_now
        cpu1=$CPU
        record "$name" "make $target" "$((SECONDS - t0))" "$(cpu_diff "$cpu0" "$cpu1")" \
            "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc; tail of the log below)")"
        if [ "$rc" != 0 ]; then
            tail -n 30 "$dir/$target.log" >&2
            status=1
            break
        fi
    done
    cpu_now
    record "$name" "total" "$((SECONDS - total0))" "$(cpu_diff "$totalcpu0" "$CPU")" \
        "$([ "$status" = 0 ] && echo "make $name from nothing" || echo FAILED)"
    return "$status"
}

# CPU-seconds (user + system) of every child this shell has waited for, into
# $CPU. `times` runs in this shell, never in a subshell: a subshell's children
# are its own.
cpu_now() {
    times >"$root/.times"
    CPU=$(tail -n 1 "$root/.times" | sed 's/[ms]/ /g' |
        awk '{ printf "%.1f", $1 * 60 + $2 + $3 * 60 + $4 }')
}
cpu_diff() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

log "walking ${commands[*]} for ${commit:0:12} on $(nproc) cores; host packages $hostdeps_before before the walk"
printf 'commit %s, %s cores, host packages %s before the walk, %s\n' \
    "$commit" "$(nproc)" "$hostdeps_before" "$(date -u +%FT%TZ)" >>"$summary"
failed=0
for c in "${commands[@]}"; do
    case "$c" in
        # make demo as a newcomer runs it: the one command, every build inside it.
        demo) walk demo demo || failed=1 ;;
        # make test split at its prerequisites, so the summary shows where the
        # time goes; the sum is one cold make test.
        test) walk test venv sandbox-bin cert-manager-bin prometheus-bin bundle-validator go-e2e-bin image test || failed=1 ;;
    esac
done
if $clean; then
    chmod -R u+w "$root" 2>/dev/null || true
    find "$root" -mindepth 2 -maxdepth 2 ! -name '*.log' -exec rm -rf {} + 2>/dev/null || true
fi
log "summary ($summary):"
cat "$summary" >&2
$clean || log "caches kept in $root ($(du -sh "$root" 2>/dev/null | cut -f1)); delete with: chmod -R u+w $root && rm -rf $root"
exit "$failed"
