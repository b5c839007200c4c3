#!/usr/bin/env bash
# The Go NMO's own e2e suite (its test/e2e, unchanged) as a cached test
# binary, for tests/e2e/test_go_e2e.py: hack/go-nmo-bin.sh e2e (which see).
#
#   hack/go-e2e-bin.sh               build it when missing, print its path
#   hack/go-e2e-bin.sh --check       exit 0 (and print the path) when cached
#   hack/go-e2e-bin.sh --print-path  print where it is or will be
exec "$(dirname "$0")/go-nmo-bin.sh" e2e "$@"
