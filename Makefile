# Tollgate's Makefile is the CI contract: .ci/run calls `make test`.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
BIN := bin
FUZZTIME ?= 30s
BENCHTIME ?= 2s
GOTEST_FLAGS ?= -race -timeout 9m

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/tollgate and bin/tollgate-load.
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/tollgate ./cmd/tollgate
	$(GO) build -o $(BIN)/tollgate-load ./cmd/tollgate-load

# ARGS are more flags for `make run`; a flag given twice takes the last value.
ARGS ?=

.PHONY: run
run: build ## Serve the config/ examples (rules, and ext_authz with demo keys) on :8081 (gRPC) and :8080 (admin) with the in-memory store; more serve flags in ARGS='--grpc-addr :9081 --redis-url redis://localhost:6379'.
	$(BIN)/tollgate serve --config config --authz-config config/authz/authz.yaml \
	  --pressure-token-file config/authz/pressure.token --log-format console $(ARGS)

.PHONY: redis
redis: ## Install redis-server when it is missing (tests start their own servers).
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server; }
	@# Debian's package starts a system service on :6379; tests never use it.

.PHONY: prometheus
prometheus: ## Install prometheus when it is missing (test/prometheus starts its own on a free port).
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "prometheus not found: installing it with apt-get"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }
	@# Under systemd Debian's package starts a service on :9090; tests never use it.

# grpcurl, which the README's commands use: test/newcomer runs them. Installed like golangci-lint, into bin/.
GRPCURL_VERSION ?= v1.9.4

.PHONY: grpcurl
grpcurl: ## Install grpcurl (GRPCURL_VERSION) into bin/ when missing: the README's examples use it, and test/newcomer runs them.
	@v=$$($(GO) version -m $(BIN)/grpcurl 2>/dev/null | awk '$$1 == "mod" {print $$3}'); [ "$$v" = "$(GRPCURL_VERSION)" ] || { \
	  echo "installing grpcurl $(GRPCURL_VERSION) into $(BIN)/ (found: $${v:-none})"; \
	  GOBIN=$(abspath $(BIN)) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION); }

.PHONY: test
test: redis prometheus grpcurl ## Vet, then run every test (with the race detector) against real redis-server and prometheus processes.
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) test $(GOTEST_FLAGS) ./...

.PHONY: test-short
test-short: redis ## Unit tests without the race detector: `go test -short`, where the slow tests skip (they still run in make test).
	$(GO) test -short -count=1 ./...

# golangci-lint for `make lint`, installed like helm: into bin/, checked against the pinned version.
GOLANGCI_LINT_VERSION ?= v2.15.0

.PHONY: lint
lint: ## Run golangci-lint (GOLANGCI_LINT_VERSION, installed into bin/ when missing) with .golangci.yml: bug linters and the layering's import rules.
	@v=$$($(BIN)/golangci-lint version --short 2>/dev/null || true); [ "v$${v#v}" = "$(GOLANGCI_LINT_VERSION)" ] || { \
	  echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into $(BIN)/ (found: $${v:-none})"; \
	  GOBIN=$(abspath $(BIN)) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); }
	$(BIN)/golangci-lint run ./...

.PHONY: bench
bench: redis ## Go benchmarks of the decision path on memstore and Redis (ns/op, allocs/op).
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./pkg/...

# The closed-loop scenarios of issue 13 (test/closedloop, docs/closed-loop.md).
E2E_OUT ?= test/closedloop/out
TOLLGATE_E2E_SCALE ?= 1
TOLLGATE_E2E_ONLY ?=

.PHONY: e2e
e2e: redis ## Closed-loop scenarios (3 replicas, one Redis): CSVs, PNGs and laws.md into E2E_OUT; TOLLGATE_E2E_SCALE=0.5 halves durations, TOLLGATE_E2E_ONLY=spike,steady picks.
	TOLLGATE_E2E=1 TOLLGATE_E2E_SCALE='$(TOLLGATE_E2E_SCALE)' TOLLGATE_E2E_ONLY='$(TOLLGATE_E2E_ONLY)' E2E_OUT='$(abspath $(E2E_OUT))' \
	  $(GO) test -run '^TestScenarios$$' -count=1 -v -timeout 20m ./test/closedloop

.PHONY: test-e2e
test-e2e: e2e ## Alias of e2e.

# bench-compare, bench-ghz, bench-memory, bench-redis and bench-reference: see scripts/ and docs/benchmarks.md.
BASE ?= HEAD
HEAD ?= WORKTREE
STORE ?= memory
RUNS ?= 3
DURATION ?= 10s
LOAD_ARGS ?=
TENANTS ?= 1000000
RATE ?=
GHZ_VERSION ?= v0.121.0

.PHONY: bench-compare
bench-compare: redis ## Load-test two builds in alternating runs, print HEAD/BASE: BASE=rev HEAD=rev|WORKTREE STORE=memory|redis RUNS=3 DURATION=10s.
	BASE='$(BASE)' HEAD='$(HEAD)' STORE='$(STORE)' RUNS='$(RUNS)' DURATION='$(DURATION)' LOAD_ARGS='$(LOAD_ARGS)' \
	  scripts/bench-compare.sh

.PHONY: bench-redis
bench-redis: redis ## CPU per decision (Redis, server) of Tollgate's algorithms, leases on and off, against a plain INCRBY+PEXPIRE baseline: RUNS=3 DURATION=10s, RATE=N paces every config at N/s (~13 min; RUNS=1 DURATION=3s for a quick look).
	RUNS='$(RUNS)' DURATION='$(DURATION)' RATE='$(RATE)' scripts/bench-redis.sh

.PHONY: bench-reference
bench-reference: redis ## Server + Redis CPU per decision against envoyproxy/ratelimit itself, built from the module proxy: RUNS=3 DURATION=10s RATE=10000 (~9 min; RATE=0 uncapped).
	RUNS='$(RUNS)' DURATION='$(DURATION)' RATE='$(RATE)' scripts/bench-reference.sh

.PHONY: bench-targets
bench-targets: redis ## Issue 5's load targets on the working tree, medians of RUNS=3 runs of DURATION=10s (quiet machine).
	RUNS='$(RUNS)' DURATION='$(DURATION)' scripts/bench-targets.sh

$(BIN)/ghz:
	GOBIN=$(abspath $(BIN)) $(GO) install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

.PHONY: ghz
ghz: $(BIN)/ghz ## Install ghz (GHZ_VERSION) as bin/ghz.

.PHONY: bench-ghz
bench-ghz: redis $(BIN)/ghz ## Cross-check: ghz, then tollgate-load, same ShouldRateLimit shape on one Tollgate: STORE=memory|redis DURATION=10s.
	STORE='$(STORE)' DURATION='$(DURATION)' GHZ='$(abspath $(BIN))/ghz' scripts/bench-ghz.sh

.PHONY: bench-memory
bench-memory: redis ## Memory per live sliding-window key: memstore (Go benchmark), then Redis through Tollgate (TENANTS=1000000).
	$(GO) test -run '^$$' -bench MemoryPerKey -benchtime 1x ./pkg/store/memstore
	TENANTS='$(TENANTS)' scripts/bench-redis-memory.sh

SOAK ?= 3m

.PHONY: soak
soak: redis ## Soak (SOAK=3m): mixed tenants against memstore and Redis side by side; RSS and goroutines must stay flat.
	TOLLGATE_SOAK='$(SOAK)' $(GO) test -run '^TestSoak$$' -count=1 -v -timeout 60m ./test/lifecycle

LAUNCH_ARGS ?=

.PHONY: launch
launch: ## Start `tollgate serve` 1,000 times, report exec-to-port and exec-to-/readyz times and every start over 2s (LAUNCH_ARGS='-redis -parallel 8'); docs/security.md, finding 9.
	$(GO) run ./test/launch $(LAUNCH_ARGS)

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 30s).
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

# helm for `make validate`, built from source: go install leaves helm's version and its default Kubernetes
# version (used by lint's deprecation check and .Capabilities) unset, so they are passed as in helm's own
# Makefile; HELM_KUBE_MINOR is the minor of k8s.io/client-go in that helm's go.mod (v0.37 -> 1.37).
HELM_VERSION ?= v3.22.0
HELM_KUBE_MINOR ?= 37
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_KUBE_MINOR) \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_KUBE_MINOR)

$(BIN)/helm:
	GOBIN=$(abspath $(BIN)) $(GO) install -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

.PHONY: validate
validate: $(BIN)/helm actionlint ## Check the example rules, the Istio manifests (test/istio), the Helm chart (lint, render, test/helm), the workflows and the image tool, each test dir its own module.
	$(GO) run ./cmd/tollgate validate config
	cd test/istio && $(GO) vet ./... && $(GO) test -race ./...
	@v=$$($(BIN)/helm version --short); [ "$${v%%+*}" = "$(HELM_VERSION)" ] || { \
	  echo "$(BIN)/helm is $$v, want $(HELM_VERSION): rm $(BIN)/helm and run make validate again"; exit 1; }
	$(BIN)/helm lint --strict charts/tollgate
	@set -e; for f in charts/tollgate/ci/*.yaml; do \
	  echo "$(BIN)/helm lint --strict charts/tollgate -f $$f && $(BIN)/helm template ... -f $$f"; \
	  $(BIN)/helm lint --strict --quiet charts/tollgate -f $$f; \
	  $(BIN)/helm template tollgate charts/tollgate -n tollgate -f $$f >/dev/null; \
	done
	@# -count=1: these tests read the chart through helm and build tollgate and run make in
	@# subprocesses, which go test's cache does not see: a cached pass could hide a change.
	cd test/helm && $(GO) vet ./... && HELM=$(abspath $(BIN))/helm $(GO) test -race -count=1 ./...
	cd tools/image && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# The image's version and name come from the chart (appVersion,
# image.repository), so the chart's default pulls what `make image` builds
# and the release workflow pushes; tools/image's TestReleaseSource checks
# these lines read the chart as a YAML parser does.
IMAGE_VERSION := $(shell awk -F'"' '/^appVersion:/ {print $$2}' charts/tollgate/Chart.yaml)
IMAGE_REPO := $(shell awk '/^image:/ {f=1} f && /repository:/ {print $$2; exit}' charts/tollgate/values.yaml)
# One GOARCH, or several ("amd64 arm64") for a multi-arch image index.
IMAGE_ARCH ?= amd64

.PHONY: image
image: ## OCI image without a container engine: bin/tollgate-image.tar (oci-archive), a static linux tollgate run as non-root, named from the chart; IMAGE_ARCH="amd64 arm64" for an index of both.
	for a in $(IMAGE_ARCH); do \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build -trimpath -ldflags '-s -w -X main.version=$(IMAGE_VERSION)' -o $(BIN)/image/linux-$$a/tollgate ./cmd/tollgate || exit; \
	done
	cd tools/image && $(GO) run . $(foreach a,$(IMAGE_ARCH),-binary $(a)=$(abspath $(BIN))/image/linux-$(a)/tollgate) -version $(IMAGE_VERSION) \
	  -ref $(IMAGE_REPO):$(IMAGE_VERSION) -out $(abspath $(BIN))/tollgate-image.tar
	cd tools/image && IMAGE_TAR=$(abspath $(BIN))/tollgate-image.tar IMAGE_VERSION=$(IMAGE_VERSION) IMAGE_REF=$(IMAGE_REPO):$(IMAGE_VERSION) \
	  IMAGE_ARCH='$(IMAGE_ARCH)' $(GO) test -count=1 -run TestImageTarball ./...

.PHONY: image-ref
image-ref: ## Print the image's name, REPO:TAG, as the chart sets it.
	@echo $(IMAGE_REPO):$(IMAGE_VERSION)

.PHONY: image-push
image-push: image ## Build and check the image, then push it to the chart's name (credentials: IMAGE_REGISTRY_USER and IMAGE_REGISTRY_PASSWORD, else docker login's); .github/workflows/release.yml runs it.
	cd tools/image && $(GO) run . -push $(abspath $(BIN))/tollgate-image.tar

.PHONY: release-check
release-check: ## Refuse a release tag TAG that is not v<appVersion>: the image's tag is the chart's appVersion, so the two cannot drift.
	@[ "$(TAG)" = "v$(IMAGE_VERSION)" ] || { \
	  echo "tag '$(TAG)' is not v$(IMAGE_VERSION), the appVersion in charts/tollgate/Chart.yaml: tag v$(IMAGE_VERSION), or set appVersion first"; exit 1; }
	@echo "tag $(TAG) releases $(IMAGE_REPO):$(IMAGE_VERSION)"

# actionlint for `make validate`, installed like golangci-lint: into bin/, checked against the pinned version.
# It runs shellcheck on the workflows' run: scripts when shellcheck is on PATH; `make shellcheck` puts it there.
ACTIONLINT_VERSION ?= v1.7.12

.PHONY: shellcheck
shellcheck: ## Install shellcheck when it is missing (actionlint checks the workflows' scripts with it).
	@command -v shellcheck >/dev/null 2>&1 || { \
	  echo "shellcheck not found: installing it with apt-get"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends shellcheck; }

.PHONY: actionlint
actionlint: shellcheck ## Check .github/workflows with actionlint (ACTIONLINT_VERSION, installed into bin/ when missing) and shellcheck.
	@v=$$($(BIN)/actionlint -version 2>/dev/null | head -1 || true); [ "$$v" = "$(ACTIONLINT_VERSION)" ] || { \
	  echo "installing actionlint $(ACTIONLINT_VERSION) into $(BIN)/ (found: $${v:-none})"; \
	  GOBIN=$(abspath $(BIN)) $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION); }
	$(BIN)/actionlint -shellcheck "$$(command -v shellcheck)"

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
