#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/run.sh (`make test-kind`): l4xds on a real two-node Kubernetes
# cluster. Starts a Docker engine if none runs, builds or reuses the kind
# node image (build-node-image.sh) and the l4xds image, creates the cluster
# and a client container outside the nodes, runs the Go test of this
# directory (kind_test.go), then deletes what it made and restores the host:
# the sysctls kubelet and dockerd change, and the dockerd it started.
#
#   test/kind/run.sh                       # offline: everything built here
#   KIND_NODE_IMAGE=kindest/node:v1.34.0 test/kind/run.sh   # with internet
#   KEEP=1 test/kind/run.sh                # keep the cluster for a look
#
# Needs root (kind's nodes, the sysctls), Go, docker.io, zstd and, for the
# offline node image, debootstrap (.ci/run installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

export L4XDS_CACHE=${L4XDS_CACHE:-/var/cache/l4xds}
CLUSTER=${CLUSTER:-l4xds}
KEEP=${KEEP:-0}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
# The docs' image name (Documentation/kubernetes.md), at the chart's version.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/install/kubernetes/l4xds/Chart.yaml")
IMAGE=registry.example.com/l4xds:$app_version
CLIENT=$CLUSTER-client
# Sysctls a run changes on the host (found by diffing `sysctl -a` around a
# run): kubelet's kernel.panic, kernel.panic_on_oops, vm.overcommit_memory
# and the nodes' systemd's fs.* are global, not per container, as with kind
# anywhere; dockerd turns on forwarding (which also turns off
# accept_redirects). Restored in this order.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory
	fs.file-max fs.protected_fifos fs.protected_regular fs.protected_symlinks
	net.ipv4.ip_forward net.ipv4.conf.all.accept_redirects net.ipv6.conf.all.forwarding)

TIER=test-kind
# shellcheck source=lib.sh
. "$here/lib.sh"

# CI installs the tools, so there a missing tool is an error, not a skip.
kind_preflight "go docker dockerd zstd" "apt-get install docker.io zstd (debootstrap too for the offline node image; .ci/run installs them)"
[ -n "$KIND_NODE_IMAGE" ] || command -v debootstrap >/dev/null || {
	echo "test-kind: debootstrap is missing (apt-get install debootstrap), needed to build the node image offline" >&2
	exit 1
}

kind_save_sysctls
# Made after what can fail before the trap below, which removes it.
work=$(mktemp -d -t l4xds-kind.XXXXXX)
KUBECONFIG=$work/kubeconfig

cleanup() {
	local rc=$?
	set +e
	kind_teardown
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

kind_docker

say "node image"
if [ -n "$KIND_NODE_IMAGE" ]; then
	node_image=$KIND_NODE_IMAGE
	L4XDS_TOOLS_ONLY=1 "$here/build-node-image.sh" >/dev/null
else
	node_image=$("$here/build-node-image.sh" | tail -1)
fi
export PATH=$L4XDS_CACHE/bin:$PATH

say "l4xds binaries and image $IMAGE"
make -C "$repo" build >/dev/null
mkdir -p "$work/image"
(cd "$repo" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$work/image/" \
	./cmd/l4xds-agent ./cmd/l4xds-dbg ./test/l4xds-traffic)
(cd "$repo/cmd/l4xds-control-plane" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$work/image/" .)
# The same binaries as the repository's Dockerfile, which needs a registry
# for its base images: static, on an empty base.
printf 'FROM scratch\nCOPY l4xds-agent l4xds-dbg l4xds-control-plane l4xds-traffic /usr/local/bin/\nENV PATH=/usr/local/bin\nCMD ["l4xds-agent"]\n' >"$work/image/Dockerfile"
docker build -q -t "$IMAGE" "$work/image" >/dev/null

say "creating cluster $CLUSTER ($node_image)"
created=1
export KUBECONFIG=$work/kubeconfig
# A kept cluster's kubeconfig outlives the run.
[ "$KEEP" != 1 ] || KUBECONFIG=$L4XDS_CACHE/kubeconfig-$CLUSTER
kind create cluster --name "$CLUSTER" --image "$node_image" --config "$here/kind-config.yaml" --wait 4m
say "cluster Ready"
kind load docker-image "$IMAGE" --name "$CLUSTER"
# The client, outside the nodes on kind's network: the node image has ip
# and a shell; it gets l4xds-traffic, and routes to the VIPs per test.
docker run -d --name "$CLIENT" --network kind --cap-add NET_ADMIN --entrypoint sleep "$node_image" infinity >/dev/null
docker cp "$work/image/l4xds-traffic" "$CLIENT:/usr/local/bin/l4xds-traffic"

say "go test"
status=0
(cd "$here" && L4XDS_KIND_CLUSTER=$CLUSTER L4XDS_KIND_IMAGE=$IMAGE L4XDS_KIND_CLIENT=$CLIENT L4XDS_BIN=$repo/bin \
	go test -count=1 -v -timeout 40m ./...) 2>&1 | tee "$work/go-test.log" || status=$?
if [ "$status" != 0 ]; then
	kind_report_failures "$work/go-test.log"
	exit "$status"
fi
say "passed"
