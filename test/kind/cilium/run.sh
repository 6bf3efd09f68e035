#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/cilium/run.sh (`make test-kind-cilium`): Cilium as the CNI of a
# real two-node kind cluster, installed by Cilium's own chart (from the
# Cilium module) with our agent image, the l4xds cell serving xDS VIPs.
# Reuses the kind tier's node image (../build-node-image.sh) and builds the
# Cilium images offline (build-images.sh), creates the cluster and a client
# container outside the nodes, installs Cilium, runs TestKindCilium of
# ../cilium_test.go, then deletes what it made and restores the host.
#
#   test/kind/cilium/run.sh            # CLUSTER=l4xds-cilium by default
#   KEEP=1 test/kind/cilium/run.sh     # keep the cluster for a look
#
# Needs root, Go, docker.io, zstd and debootstrap, as ../run.sh, and bpftool.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kind_dir=$(cd "$here/.." && pwd)
repo=$(cd "$here/../../.." && pwd)

export L4XDS_CACHE=${L4XDS_CACHE:-/var/cache/l4xds}
CLUSTER=${CLUSTER:-l4xds-cilium}
KEEP=${KEEP:-0}
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/install/kubernetes/l4xds/Chart.yaml")
IMAGE=registry.example.com/l4xds:$app_version
CLIENT=$CLUSTER-client
# The host sysctls ../run.sh restores, and the two host-wide ones Cilium's
# agent sets (kernel.timer_migration=0, kernel.unprivileged_bpf_disabled=1,
# which from 2 cannot be undone without a reboot): the nodes' /proc/sys/kernel
# is made read-only before Cilium starts, so they fail as Cilium allows
# (pkg/datapath/loader: IgnoreErr), and the run checks they did not change.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory
	fs.file-max fs.protected_fifos fs.protected_regular fs.protected_symlinks
	net.ipv4.ip_forward net.ipv4.conf.all.accept_redirects net.ipv6.conf.all.forwarding
	kernel.timer_migration)

TIER=test-kind-cilium
# shellcheck source=../lib.sh
. "$kind_dir/lib.sh"

# bpftool: the test reads socket-LB's attachments from the machine.
kind_preflight "go docker dockerd zstd debootstrap bpftool" "apt-get install docker.io zstd debootstrap bpftool (.ci/run installs them)"

kind_save_sysctls
unpriv_bpf=$(sysctl -n kernel.unprivileged_bpf_disabled)
# Made after what can fail before the trap below, which removes it.
work=$(mktemp -d -t l4xds-kind-cilium.XXXXXX)
KUBECONFIG=$work/kubeconfig

cleanup() {
	local rc=$?
	set +e
	kind_teardown
	if [ "$(sysctl -n kernel.unprivileged_bpf_disabled)" != "$unpriv_bpf" ]; then
		echo "test-kind-cilium: kernel.unprivileged_bpf_disabled is $(sysctl -n kernel.unprivileged_bpf_disabled), was $unpriv_bpf" >&2
		[ "$rc" != 0 ] || rc=1
	fi
	[ "$KEEP" = 1 ] || rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

kind_docker

say "node image"
node_image=$("$kind_dir/build-node-image.sh" | tail -1)
export PATH=$L4XDS_CACHE/bin:$PATH

say "Cilium images"
# Not a process substitution: its failure would go unseen.
images=$("$here/build-images.sh" | tail -2)
agent_image=$(sed -n 1p <<<"$images")
operator_image=$(sed -n 2p <<<"$images")

say "l4xds image $IMAGE (control plane, traffic tool)"
mkdir -p "$work/image" "$work/bin"
(cd "$repo" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$work/image/" ./test/l4xds-traffic)
(cd "$repo/cmd/l4xds-control-plane" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$work/image/" .)
printf 'FROM scratch\nCOPY l4xds-control-plane l4xds-traffic /usr/local/bin/\nENV PATH=/usr/local/bin\n' >"$work/image/Dockerfile"
docker build -q -t "$IMAGE-cilium" "$work/image" >/dev/null
IMAGE=$IMAGE-cilium

say "creating cluster $CLUSTER ($node_image)"
created=1
export KUBECONFIG=$work/kubeconfig
[ "$KEEP" != 1 ] || KUBECONFIG=$L4XDS_CACHE/kubeconfig-$CLUSTER
# No --wait: the nodes are Ready only once Cilium runs.
kind create cluster --name "$CLUSTER" --image "$node_image" --config "$here/kind-config.yaml"
nodes=$(kind get nodes --name "$CLUSTER")
for n in $nodes; do
	# Cilium's host-wide sysctls fail instead of changing the host (above).
	docker exec "$n" bash -c 'mount --bind /proc/sys/kernel /proc/sys/kernel && mount -o remount,bind,ro /proc/sys/kernel'
	# The test probes the VIPs from the node's own network namespace too,
	# where socket-LB balances them.
	docker cp "$work/image/l4xds-traffic" "$n:/usr/local/bin/l4xds-traffic"
done
say "loading images"
kind load docker-image "$agent_image" "$operator_image" "$IMAGE" --name "$CLUSTER"

say "installing Cilium $(cd "$repo/cilium" && go list -m -f '{{.Version}}' github.com/cilium/cilium) with its chart"
chart=$(cd "$repo/cilium" && go list -m -f '{{.Dir}}' github.com/cilium/cilium)/install/kubernetes/cilium
control_plane=$CLUSTER-control-plane
sed -e "s|@CONTROL_PLANE@|$control_plane|g" -e "s|@AGENT_IMAGE@|$agent_image|" -e "s|@OPERATOR_IMAGE@|$operator_image|" \
	"$here/values.yaml" >"$work/values.yaml"
# The certificates of Documentation/kubernetes.md, the server's for the name
# the agents dial; the client's in the Secret of Documentation/cilium.md.
(cd "$repo/cmd/l4xds-control-plane" && go build -o "$work/bin/" .)
"$work/bin/l4xds-control-plane" certs --out "$work/certs" --server-name "$control_plane" >/dev/null
kubectl -n kube-system create secret generic cilium-xds-client \
	--from-file=tls.crt="$work/certs/client.crt" --from-file=tls.key="$work/certs/client.key" --from-file=ca.crt="$work/certs/ca.crt"
kubectl -n kube-system create secret generic l4xds-control-plane-tls \
	--from-file=tls.crt="$work/certs/server.crt" --from-file=tls.key="$work/certs/server.key" --from-file=ca.crt="$work/certs/ca.crt"
helm install cilium "$chart" -n kube-system -f "$work/values.yaml" --wait --timeout 10m
kubectl wait --for=condition=Ready nodes --all --timeout 5m
say "Cilium Ready"

docker run -d --name "$CLIENT" --network kind --cap-add NET_ADMIN --entrypoint sleep "$node_image" infinity >/dev/null
docker cp "$work/image/l4xds-traffic" "$CLIENT:/usr/local/bin/l4xds-traffic"

say "go test"
status=0
(cd "$kind_dir" && L4XDS_KIND_CLUSTER=$CLUSTER L4XDS_KIND_IMAGE=$IMAGE L4XDS_KIND_CLIENT=$CLIENT L4XDS_BIN=$work/bin \
	L4XDS_KIND_CILIUM_CHART=$chart L4XDS_KIND_CILIUM_VALUES=$work/values.yaml \
	go test -count=1 -v -timeout 30m -run 'TestKindCilium' ./...) 2>&1 | tee "$work/go-test.log" || status=$?
if [ "$status" != 0 ]; then
	kind_report_failures "$work/go-test.log"
	exit "$status"
fi
say "passed"
