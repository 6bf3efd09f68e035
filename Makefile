# l4xds — see README.md. `make demo` and `make test` are the two commands.

GO       ?= go
BIN      := bin
BINARIES := l4xds-agent l4xds-dbg l4xds-control-plane
PKGS     := ./...

.PHONY: all build test test-unit bench generate demo lint clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

# All test tiers: unit and script tests always; the privileged tiers (BPF,
# network namespaces) run when root and skip with a message otherwise.
test: build
	$(GO) vet $(PKGS)
	L4XDS_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 20m $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m $(PKGS)

generate:
	$(GO) generate $(PKGS)

demo: build
	./test/demo.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)

clean:
	rm -rf $(BIN)
