# syntax=docker/dockerfile:1
# SPDX-License-Identifier: Apache-2.0
#
# One image with every l4xds binary: the agent (the Helm chart's DaemonSet),
# l4xds-dbg (its probes and `kubectl exec`), the reference control plane and
# l4xds-traffic (the kind harness's backends and client).
#
#   docker build -t l4xds:dev .
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t l4xds:v0.1.0 .
#
# The BPF objects are generated and committed (pkg/datapath/bpf), so the
# build needs Go only: no clang, no cgo.

ARG GO_IMAGE=golang:1.26-bookworm

# The builder runs on the build machine and cross-compiles for the target
# (docker buildx build --platform linux/amd64,linux/arm64 .): pure Go needs
# no emulation.
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS builder
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# What --version prints and l4xds_build_info reports: the context has no
# .git, so the Makefile's VERSION and COMMIT come as arguments
# (docker build --build-arg VERSION=$(git describe --tags --always --dirty)
# --build-arg COMMIT=$(git rev-parse HEAD) .).
ARG VERSION=dev
ARG COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
	go build -trimpath -ldflags="-s -w -X github.com/l4xds/l4xds/pkg/version.Version=${VERSION} -X github.com/l4xds/l4xds/pkg/version.Commit=${COMMIT}" -o /out/ \
		./cmd/l4xds-agent ./cmd/l4xds-dbg ./test/l4xds-traffic && \
	CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
	go build -C cmd/l4xds-control-plane -trimpath -ldflags="-s -w -X github.com/l4xds/l4xds/pkg/version.Version=${VERSION} -X github.com/l4xds/l4xds/pkg/version.Commit=${COMMIT}" -o /out/ .

# distroless/static: the binaries are static (CGO_ENABLED=0) and nothing in
# the chart runs a shell (the probes exec l4xds-dbg directly), so the image
# carries no shell, package manager or libc for an intruder to use, and is
# a few MiB instead of debian:bookworm-slim's ~75 MiB. Its default user is
# root, which the agent needs for its pins on the node's bpffs (its powers
# are the capabilities the chart grants); the chart runs the control plane
# as uid 65532.
FROM gcr.io/distroless/static-debian12
COPY --from=builder /out/ /usr/local/bin/
CMD ["l4xds-agent"]
