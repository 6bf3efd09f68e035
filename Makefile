# l4xds — see README.md. `make demo` and `make test` are the two commands.

GO       ?= go
BIN      := bin
BINARIES := l4xds-agent l4xds-dbg
PKGS     := ./...
# The reference control plane is a module of its own (client-go and the
# Gateway API stay out of the agent's module).
CP       := cmd/l4xds-control-plane
# What --version prints and l4xds_build_info reports (pkg/version); the
# Dockerfiles take the same as build arguments.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X github.com/l4xds/l4xds/pkg/version.Version=$(VERSION) -X github.com/l4xds/l4xds/pkg/version.Commit=$(COMMIT)
# Static binaries, as Cilium builds its own (its Makefile.defs), and one
# build configuration for every module, tier and image (cilium/Makefile and
# test/kind use it too): Go's build cache then compiles each package once.
# The race detector needs cgo: CGO_ENABLED=1 GOFLAGS=-race make test.
export CGO_ENABLED ?= 0

.PHONY: all build release release-check release-images release-chart test test-control-plane test-cilium test-kind test-kind-cilium soak chaos bench bench-cilium fuzz generate demo demo-cilium docs lint clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES)) ./test/l4xds-traffic
	$(GO) build -C $(CP) -ldflags '$(LDFLAGS)' -o $(abspath $(BIN))/ .

# Release artifacts of VERSION, a release version (MAJOR.MINOR.PATCH, the
# tag's leading v dropped): the images, tagged VERSION, and the chart
# packaged in $(DIST) with version and appVersion VERSION, so that its
# default image tag is the image's (Documentation/release.md). Tag the commit
# (git tag v0.2.0) or set VERSION=v0.2.0.
#   RELEASE_IMAGES=offline     the binaries on an empty base, as the kind tier
#                              builds its image: no registry needed (default)
#   RELEASE_IMAGES=dockerfile  the Dockerfiles (distroless and Cilium's image as
#                              bases, pulled from their registries)
DIST           ?= dist
REGISTRY       ?= registry.example.com
RELEASE_IMAGES ?= offline
RELEASE_VERSION = $(patsubst v%,%,$(VERSION))
L4XDS_IMAGE     = $(REGISTRY)/l4xds:$(RELEASE_VERSION)
CILIUM_VERSION := $(shell sed -n 's/^\tgithub.com\/cilium\/cilium \(v[^ ]*\)$$/\1/p' cilium/go.mod)
CILIUM_BASE    ?= quay.io/cilium/cilium:$(CILIUM_VERSION)
CILIUM_IMAGE    = $(REGISTRY)/l4xds/cilium:$(CILIUM_VERSION)-l4xds-$(RELEASE_VERSION)
release: release-images release-chart
	@ls -l $(DIST)

release-check:
	@echo '$(RELEASE_VERSION)' | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$' || { \
		echo "make release: VERSION=$(VERSION) is not a release version (MAJOR.MINOR.PATCH): tag the commit (git tag v0.2.0) or set VERSION=v0.2.0" >&2; exit 1; }

# helm from the chart test's module, where it is a tool.
release-chart: release-check
	@mkdir -p $(DIST)
	cd $(CHART_TEST) && $(GO) tool helm lint --strict $(CURDIR)/install/kubernetes/l4xds
	cd $(CHART_TEST) && $(GO) tool helm package $(CURDIR)/install/kubernetes/l4xds \
		--version $(RELEASE_VERSION) --app-version $(RELEASE_VERSION) -d $(abspath $(DIST))

release-images: release-check
	@command -v docker >/dev/null || { echo "make release-images: docker is missing (apt-get install docker.io)" >&2; exit 1; }
	rm -rf $(DIST)/image && mkdir -p $(DIST)/image
ifeq ($(RELEASE_IMAGES),dockerfile)
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(L4XDS_IMAGE) .
	docker build -f cilium/Dockerfile --build-arg CILIUM_IMAGE=$(CILIUM_BASE) --build-arg VERSION=$(VERSION) \
		--build-arg COMMIT=$(COMMIT) -t $(CILIUM_IMAGE) .
else
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(DIST)/image/ ./cmd/l4xds-agent ./cmd/l4xds-dbg ./test/l4xds-traffic
	CGO_ENABLED=0 $(GO) build -C $(CP) -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(abspath $(DIST))/image/ .
	printf 'FROM scratch\nCOPY l4xds-agent l4xds-dbg l4xds-control-plane l4xds-traffic /usr/local/bin/\nENV PATH=/usr/local/bin\nCMD ["l4xds-agent"]\n' >$(DIST)/image/Dockerfile
	docker build -q -t $(L4XDS_IMAGE) $(DIST)/image
	@# Cilium's image is the upstream one with our agent: offline, only
	@# where that base is already in Docker.
	@if docker image inspect $(CILIUM_BASE) >/dev/null 2>&1; then \
		set -e; mkdir -p $(DIST)/cilium-image; \
		(cd cilium && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(abspath $(DIST))/cilium-image/cilium-agent ./cmd/cilium-agent); \
		printf 'FROM $(CILIUM_BASE)\nCOPY cilium-agent /usr/bin/cilium-agent\n' >$(DIST)/cilium-image/Dockerfile; \
		docker build -q -t $(CILIUM_IMAGE) $(DIST)/cilium-image; \
	else \
		echo "make release-images: $(CILIUM_IMAGE) not built: its base $(CILIUM_BASE) is not in Docker (RELEASE_IMAGES=dockerfile pulls it)"; \
	fi
endif
	rm -rf $(DIST)/image $(DIST)/cilium-image
	@docker image inspect -f '{{index .RepoTags 0}} {{.Id}}' $(L4XDS_IMAGE)

# All test tiers: unit and script tests always; the privileged tiers (BPF,
# network namespaces) run when root and skip with a message otherwise. Then
# the Helm chart, tested in its own module so that Helm and the Kubernetes
# API stay out of the agent's dependencies.
CHART_TEST := install/kubernetes/test
# Each module is vetted once, fully, and tested with -vet=off: go test's own
# vet would analyse every dependency a second time (the Cilium module is
# vetted by lint only: its vet analyses all of Cilium).
#
# The chaos schedules against a real API server need the kube-apiserver and
# etcd the kind tier builds: they run after it. Last, the longest tier:
# Cilium with our cell as the CNI of a kind cluster (test-kind-cilium).
KUBE_CHAOS := TestChaosKubernetesSchedules
test: build
	$(GO) vet $(PKGS)
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -vet=off -count=1 -timeout 20m -skip '^$(KUBE_CHAOS)$$' $(PKGS)
	cd $(CHART_TEST) && $(GO) vet ./... && L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -vet=off -count=1 ./...
	$(MAKE) test-cilium
	cd test/kind && $(GO) vet ./...
	./test/kind/run.sh
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -vet=off -count=1 -timeout 10m -run '^$(KUBE_CHAOS)$$' ./test/chaos
	$(MAKE) test-control-plane
	./test/kind/cilium/run.sh

# The control plane's module: its unit tests, and the Kubernetes source
# against a real kube-apiserver and etcd, the binaries the kind harness
# (run.sh above) builds into $$L4XDS_CACHE/build/bin; without them the
# test skips with a message (it fails under L4XDS_KIND_REQUIRED=1, as in CI).
test-control-plane:
	cd $(CP) && $(GO) vet ./... && L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -vet=off -count=1 -timeout 15m ./...

# The Cilium module (cilium/): Cilium's agent with our cell, its script
# tests on Cilium's tables and maps, the upstream chart, and as root the real
# agent serving real traffic (cilium/internal/agenttest; needs clang-19
# llvm-19 iptables ipset bpftool). Go's build cache keeps the agent's build.
test-cilium: build
	$(MAKE) -C cilium test L4XDS_BIN=$(CURDIR)/$(BIN)

# The chart, traffic and faults on a two-node kind cluster built offline
# (test/kind/README.md). Root only; it skips with a message otherwise.
test-kind:
	./test/kind/run.sh

# Cilium v1.20.2 as the CNI of a two-node kind cluster, installed by its own
# chart with our agent image (test/kind/cilium): images built offline from
# the Cilium module and cached by content hash, the kind tier's node image.
# Root only; it skips with a message otherwise.
test-kind-cilium:
	./test/kind/cilium/run.sh

# The soak test (test/soak): live TCP and UDP traffic through several VIPs
# while the control plane rewrites its resources several times a second and
# is restarted, and the agent is SIGKILLed, at random moments; it prints
# SOAK lines of figures. `make test` runs it for two minutes (root only);
# this target for SOAK_DURATION (SOAK_SEED replays a run's churn). No go
# test timeout: the run bounds each of its phases itself.
SOAK_DURATION ?= 10m
soak: build
	SOAK_DURATION=$(SOAK_DURATION) L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -run '^TestPrivilegedSoak$$' -timeout 0 ./test/soak

# The fault schedules (test/chaos): one agent against two or three control
# planes that are started, killed, restarted, hung and given new states at
# random, its tables and status checked throughout; as root again with the
# BPF datapath and live traffic; and two control planes in Kubernetes mode
# against a real kube-apiserver and etcd that are paused and restarted (the
# kind harness's binaries). It prints CHAOS lines. `make test` runs a minute
# of it (half a minute as root, and in Kubernetes mode); this target
# CHAOS_DURATION of each, in which servers also stay hung through a settle
# (CHAOS_SEED replays a run's schedule). No go test timeout: the run bounds its settles itself.
CHAOS_DURATION ?= 10m
chaos: build
	CHAOS_DURATION=$(CHAOS_DURATION) L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -run '^(TestChaosFaultSchedules|TestChaosKubernetesSchedules|TestPrivilegedChaosWithTraffic)$$' -timeout 0 ./test/chaos

# Benchmarks, each printing `BENCH <name> key=value ...` lines besides Go's
# own: the micro-benchmarks with Go's timing, then the end-to-end ones of
# test/bench once each (every run is a whole server and agent). As root they
# use real BPF maps; Documentation/performance.md has the figures.
# As root, make bench ends with bench-cilium.
BENCH_E2E := ./test/bench
bench: build
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m $$($(GO) list $(PKGS) | grep -v '/test/bench$$')
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench 'Convergence|Update|AgentProcess|Fleet' -benchtime=1x -count=1 -timeout 60m $(BENCH_E2E)
	cd cilium && $(GO) test -run '^$$' -bench Convergence -benchtime=1x -count=1 -timeout 60m ./l4xds
	if [ "$$(id -u)" = 0 ]; then $(MAKE) bench-cilium; fi

# Side by side with Cilium's own load-balancer benchmark
# (pkg/loadbalancer/benchmark, at the Cilium version of cilium/go.mod, built
# in a throwaway module outside the repository): it and the 50000x1
# convergence run alternately, three times each, each a fresh process,
# the standalone agent's then the agent's inside Cilium; `BENCH
# versus-cilium` lines with the medians (Documentation/performance.md).
# As root, then, the real cilium-agent fed by Cilium's file source and by
# our cell, alternately (`BENCH versus-cilium-file` lines).
bench-cilium: build
	GO=$(GO) ./test/bench/build-cilium-bench.sh cilium/go.mod $(BIN)/cilium-lb-bench
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench VersusCilium -benchtime=1x -count=1 -timeout 60m $(BENCH_E2E)
	cd cilium && L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench VersusCilium -benchtime=1x -count=1 -timeout 60m ./l4xds
	if [ "$$(id -u)" = 0 ]; then $(MAKE) -C cilium build && cd cilium && L4XDS_BIN=$(CURDIR)/$(BIN) L4XDS_CILIUM_BIN=$(CURDIR)/cilium/bin \
		$(GO) test -run '^$$' -bench VersusCiliumFile -benchtime=1x -count=1 -timeout 120m ./internal/agenttest; fi

# Runs every fuzzer for FUZZTIME (FUZZTIME=10m for longer), one at a time:
# go test -fuzz takes one fuzzer per invocation. Each keeps its seeds, and
# every crasher found, in its package's testdata/fuzz/<Fuzzer>/, which plain
# `go test` runs as tests. test/fuzz.sh passes a run that ends on Go's own
# -fuzztime race (before Go 1.27) with no failing input.
FUZZTIME ?= 30s
FUZZERS  := ./pkg/l4lb:FuzzTranslateCluster ./pkg/xds:FuzzClientSotW ./pkg/xds:FuzzClientDelta \
	./pkg/controlplane:FuzzParseResources ./pkg/datapath:FuzzDatapath
fuzz:
	@set -e; for f in $(FUZZERS); do \
		echo "fuzz $${f#*:} ($${f%%:*}) for $(FUZZTIME)"; \
		GO=$(GO) ./test/fuzz.sh "$${f%%:*}" "$${f#*:}" $(FUZZTIME); \
	done

# Regenerates the BPF objects (needs clang and llvm-strip: apt-get install
# clang llvm libbpf-dev). The objects are committed, so `go build` needs no clang.
BPF_CFLAGS := -O2 -Wall -Werror -I/usr/include/$(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
generate:
	BPF2GO_CFLAGS="$(BPF_CFLAGS)" $(GO) generate $(PKGS)

demo: build
	./test/demo.sh

# The same inside Cilium: Cilium's agent with our cell, in its own namespaces,
# serving the CFP example and a UDP 70/30 service to real clients.
demo-cilium: build
	$(MAKE) -C cilium demo L4XDS_BIN=$(CURDIR)/$(BIN)

# Regenerates the generated parts of Documentation/ (the agent's flag table,
# the command reference) from the binaries' --help; `make test` checks them.
docs: build
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run 'TestFlagReference|TestCommandReference' ./internal/docs -update

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	cd $(CHART_TEST) && $(GO) vet ./...
	cd cilium && $(GO) vet ./...
	cd test/kind && $(GO) vet ./...
	cd $(CP) && $(GO) vet ./...
	@command -v shellcheck >/dev/null || { echo "shellcheck is missing: apt-get install shellcheck"; exit 1; }
	shellcheck test/demo.sh test/kind/*.sh test/kind/cilium/*.sh test/bench/*.sh .ci/run

clean:
	rm -rf $(BIN) $(DIST)
