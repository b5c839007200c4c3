# nmo developer entry points. `make test` and `make demo` work on a fresh
# machine with Python 3.11 and Go: they create .venv, install the pinned
# dependencies and build the sandbox binaries (cached in ~/.cache/nmo) first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SANDBOX_BIN := hack/sandbox-bin.sh
CERT_MANAGER_BIN := hack/cert-manager-bin.sh
PROMETHEUS_BIN := hack/prometheus-bin.sh
BUNDLE_VALIDATE := hack/bundle-validate.sh
GO_NMO_BIN := hack/go-nmo-bin.sh
# make bundle: where the OLM bundle goes, and the operator image its CSV runs.
OLM_OUT ?= build/olm
IMAGE ?=
# make image: the base image (default: the Containerfile's pinned
# python:3.11-slim, or a Debian-built one where that cannot be pulled).
BASE_IMAGE ?=

.PHONY: all venv sandbox-bin cert-manager-bin prometheus-bin host-deps image lint lint-containerfile typecheck layers unit integration test demo bench bench-scale bench-webhook clean lock-image pin-base-image bundle-validator bundle go-e2e-bin go-nmo-bin

all: test

$(STAMP): pyproject.toml sandbox/pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]' -e ./sandbox
	touch $(STAMP)

venv: $(STAMP)

sandbox-bin:
	$(SANDBOX_BIN)

# The host tools real nodes and the image build need (containerd, runc, CNI
# plugins, buildah, podman, mmdebstrap, iptables, ip, gcc, libc6-dev): installed with apt-get
# on Debian/Ubuntu as root, else one line saying what is missing.
host-deps:
	hack/host-deps.sh

# localhost/nmo:dev in containers-storage (buildah); skipped when current.
image: host-deps
	BASE_IMAGE='$(BASE_IMAGE)' hack/image.sh

# cert-manager's controller and cainjector for `nmo-sandbox up --cert-manager`,
# built from its Go module into ~/.cache/nmo/cert-manager/<version>/bin (README).
cert-manager-bin:
	$(CERT_MANAGER_BIN)

# The Prometheus server and promtool that prove the chart's alert rules
# (tests/prometheus/, tests/integration/test_alerts.py), built from the Go
# module github.com/prometheus/prometheus into
# ~/.cache/nmo/prometheus/<version>/bin (README).
prometheus-bin:
	$(PROMETHEUS_BIN)

# The operator-framework bundle validator, built from its Go modules into
# ~/.cache/nmo/build (first build: 330 CPU-seconds with empty Go caches; README).
bundle-validator:
	$(BUNDLE_VALIDATE)

# The Go NMO's own e2e suite (its test/e2e, unchanged) as a test binary, built
# from ../shared/third_party's snapshot into ~/.cache/nmo/build (README), for
# tests/e2e/test_go_e2e.py (hack/go-nmo-bin.sh e2e, or hack/go-e2e-bin.sh).
go-e2e-bin:
	$(GO_NMO_BIN) e2e

# The Go NMO's manager (its ./cmd, unchanged) as go-nmo-manager, built from
# the same snapshot into the same cache directory, for the drain benchmarks
# (make bench, make bench-scale: the gonmo tool).
go-nmo-bin:
	$(GO_NMO_BIN) manager

# The OLM bundle, generated from the chart (hack/olm_bundle.py) and validated.
bundle: $(STAMP) sandbox-bin bundle-validator
	$(BIN)/python hack/olm_bundle.py --out $(OLM_OUT) $(if $(IMAGE),--image $(IMAGE))
	"$$($(BUNDLE_VALIDATE) --print-path)" $(OLM_OUT)/bundle

lint: $(STAMP) lint-containerfile
	$(BIN)/ruff check src sandbox tests benchmarks hack
	$(BIN)/ruff format --check src sandbox tests benchmarks hack

lint-containerfile: $(STAMP)
	$(BIN)/hadolint Containerfile

# The image's hashed locks (requirements-image.lock, requirements-build.lock),
# from pyproject.toml and requirements.lock, resolved by pip against PyPI.
lock-image: $(STAMP)
	$(BIN)/python hack/lock-image.py

# Re-pin the Containerfile's base image to the current digest of its tag.
pin-base-image:
	hack/pin-base-image.sh

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) bundle-validator
	$(BIN)/pytest tests/unit -q

integration: $(STAMP) sandbox-bin cert-manager-bin prometheus-bin go-e2e-bin image
	$(BIN)/pytest tests/integration tests/e2e -q

# Two phases: every test not marked `solo` on TEST_WORKERS (3) pytest-xdist
# workers (one sandbox each, whole files per worker), then the `solo` tests
# (they bound wall-clock time or load) alone. Together they run every test.
TEST_WORKERS ?= 3
test: $(STAMP) sandbox-bin cert-manager-bin prometheus-bin bundle-validator go-e2e-bin image lint typecheck layers
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not solo"
	$(BIN)/pytest -q -p no:cacheprovider -m solo tests/integration tests/e2e

# The in-cluster story: the image, a real node, cert-manager, the chart.
demo: $(STAMP) sandbox-bin cert-manager-bin image
	$(BIN)/nmo-sandbox demo

bench: $(STAMP) sandbox-bin go-nmo-bin
	$(BIN)/python benchmarks/drain_bench.py

bench-scale: $(STAMP) sandbox-bin go-nmo-bin
	$(BIN)/python benchmarks/scale_bench.py

bench-webhook: $(STAMP) sandbox-bin
	$(BIN)/python benchmarks/webhook_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info src/*.egg-info
