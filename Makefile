# The one place the BPF toolchain is pinned. CI, the Vagrantfile and the docs use it.
CLANG ?= clang-19
STRIP ?= llvm-strip-19
ARCH_INCLUDE ?= /usr/include/$(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
CFLAGS := -O2 -g -Wall -Werror -mcpu=v3 -I$(ARCH_INCLUDE)

export BPF_CLANG := $(CLANG)
export BPF_STRIP := $(STRIP)
export BPF_CFLAGS := $(CFLAGS)

.PHONY: help generate build test bench lint demo deb kernel-matrix

help: ## Show this help.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

generate: ## Compile the BPF program and regenerate the Go bindings (needs clang-19).
	go generate ./...

# Version stamp for edgectl (edgectl version, status, edgeguard_build_info):
# the commit's tag or hash, the commit and its date (not the build time, so a
# rebuild of one commit is the same binary). Packaging uses EDGECTL_LDFLAGS too.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE ?= $(shell git log -1 --format=%cI 2>/dev/null)
EDGECTL_LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)

build: ## Build edgectl into ./bin, stamped with version, commit and date.
	go build -ldflags "$(EDGECTL_LDFLAGS)" -o bin/edgectl ./cmd/edgectl

test: ## Run every test (root needed for the BPF and netns tiers).
	go test -count=1 -timeout 30m ./...

bench: ## Run the data-plane and L7 benchmarks.
	bash bench/run.sh

demo: ## Run the distributed-flood demo in private network namespaces (root).
	go run ./cmd/edgectl demo

lint: ## go vet and gofmt.
	go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

DEB_OUT ?= .
deb: ## Build the Debian package edgeguard_<version>_amd64.deb into DEB_OUT (default: here; docs/operations.md).
	bash packaging/deb/build.sh $(DEB_OUT)

kernel-matrix: ## Boot Debian's 6.1 and 6.12 kernels in QEMU and run the verifier, loader and netns tests in each (root; docs/operations.md).
	bash scripts/kernel-matrix.sh --update-docs
