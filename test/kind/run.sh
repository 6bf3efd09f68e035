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

t0=$(date +%s)
say() { printf '=== test-kind +%ss: %s\n' "$(($(date +%s) - t0))" "$*"; }

if [ "$(id -u)" != 0 ]; then
	echo "test-kind: SKIP: needs root (kind nodes are privileged containers, kubelet sets host sysctls)"
	exit 0
fi
for tool in go docker dockerd zstd; do
	command -v "$tool" >/dev/null && continue
	echo "test-kind: $tool is missing: apt-get install docker.io zstd (debootstrap too for the offline node image; .ci/run installs them)"
	# CI installs them, so there a missing tool is an error, not a skip.
	[ "${L4XDS_KIND_REQUIRED:-0}" = 1 ] && exit 1
	echo "test-kind: SKIP"
	exit 0
done
[ -n "$KIND_NODE_IMAGE" ] || command -v debootstrap >/dev/null || {
	echo "test-kind: debootstrap is missing (apt-get install debootstrap), needed to build the node image offline" >&2
	exit 1
}

work=$(mktemp -d -t l4xds-kind.XXXXXX)
saved=()
for s in "${SYSCTLS[@]}"; do saved+=("$s=$(sysctl -n "$s")"); done
dockerd_pid=
created=0
KUBECONFIG=$work/kubeconfig
network_existed=1

cleanup() {
	local rc=$?
	set +e
	if [ "$created" = 1 ] && [ "$KEEP" != 1 ]; then
		say "deleting cluster $CLUSTER and the client"
		docker rm -f "$CLIENT" >/dev/null 2>&1
		"$L4XDS_CACHE/bin/kind" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG"
		# kind leaves its Docker network; remove it when it made it.
		[ "$network_existed" = 1 ] || docker network rm kind >/dev/null
	fi
	if [ -n "$dockerd_pid" ] && [ "$KEEP" != 1 ]; then
		say "stopping the dockerd this run started (pid $dockerd_pid)"
		kill "$dockerd_pid"
		wait "$dockerd_pid"
	fi
	if [ "$KEEP" != 1 ]; then
		sysctl -q -w "${saved[@]}"
		say "restored ${saved[*]}"
	else
		say "kept: KUBECONFIG=$KUBECONFIG; afterwards: kind delete cluster --name $CLUSTER; docker rm -f $CLIENT; sysctl -w ${saved[*]}"
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A Docker engine: the running one, or one started for this run. A host
# whose capability bounding set lacks CAP_SYS_RESOURCE (itself a container)
# cannot run privileged containers with plain runc: runc-nosysres drops the
# capabilities the host does not have from each container's spec. It is set
# on the command line, so /etc/docker/daemon.json is not touched.
mkdir -p "$L4XDS_CACHE/bin"
(cd "$here/node/tools" && CGO_ENABLED=0 go build -o "$L4XDS_CACHE/bin/" ./runc-nosysres)
if ! docker info >/dev/null 2>&1; then
	say "starting dockerd"
	dockerd --add-runtime "runc-nosysres=$L4XDS_CACHE/bin/runc-nosysres" --default-runtime runc-nosysres \
		>"$L4XDS_CACHE/dockerd.log" 2>&1 &
	dockerd_pid=$!
	for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
	docker info >/dev/null || { tail -20 "$L4XDS_CACHE/dockerd.log" >&2; exit 1; }
fi
docker network inspect kind >/dev/null 2>&1 || network_existed=0

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
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/image/" \
	./cmd/l4xds-agent ./cmd/l4xds-dbg ./test/l4xds-traffic)
(cd "$repo/cmd/l4xds-control-plane" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/image/" .)
# The same binaries as the repository's Dockerfile, which needs a registry
# for its base images: static, on an empty base.
printf 'FROM scratch\nCOPY l4xds-agent l4xds-dbg l4xds-control-plane l4xds-traffic /usr/local/bin/\nENV PATH=/usr/local/bin\nCMD ["l4xds-agent"]\n' >"$work/image/Dockerfile"
docker build -q -t "$IMAGE" "$work/image" >/dev/null 2>&1

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
	# The cluster's state is dumped after the subtests; repeat where each
	# failed test stopped (the end of its own output) so that it is last.
	say "failed; the end of each failed test's output:"
	failed=$(sed -n 's/^ *--- FAIL: \([^ ]*\) .*/\1/p' "$work/go-test.log")
	for name in $failed; do
		# A parent's failure is its children's: show the innermost.
		awk -v p="$name/" 'index($0, p) == 1 { found = 1 } END { exit !found }' <<<"$failed" && continue
		echo "--- $name"
		awk -v n="$name" '$1 == "===" { on = ($3 == n) } /^ *--- (FAIL|PASS|SKIP)/ { on = 0 } on' "$work/go-test.log" | tail -8
	done
	exit "$status"
fi
say "passed"
