#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/run.sh: l4xds on a real Kubernetes cluster. Creates a kind
# cluster, builds the image and loads it, installs the Helm chart with the
# reference control plane over mTLS, serves a VIP whose backends are pods,
# and checks from a client pod that every TCP and UDP flow to the VIP is
# answered and that the flows split by the backends' weights.
#
# Needs a Docker engine, kind, kubectl, helm and jq (see README.md). It
# cannot run on a machine without a Docker engine, such as this
# repository's CI machine: there `make test` covers the chart instead.
#
#   test/kind/run.sh             # create, test, delete the cluster
#   KEEP=1 test/kind/run.sh      # keep the cluster for a look afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-l4xds}
IMAGE_REPO=${IMAGE_REPO:-l4xds}
IMAGE_TAG=${IMAGE_TAG:-kind}
NS=${NS:-l4xds}
KEEP=${KEEP:-0}
FLOWS=${FLOWS:-2000}
# Allowed distance, in percentage points, between a backend's share of the
# flows and its share of the weights (Maglev approximates the weights).
TOLERANCE=${TOLERANCE:-5}

IMAGE=$IMAGE_REPO:$IMAGE_TAG
NODE=$CLUSTER-control-plane
RELEASE=l4xds
VIP=10.200.0.10
PORT=8080
# The backend pods and their weights: 50/30/20.
BACKENDS=(backend-0 backend-1 backend-2)
WEIGHTS=(50 30 20)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
k() { kubectl --context "kind-$CLUSTER" "$@"; }
on_node() { docker exec "$NODE" "$@"; }

missing=()
for tool in docker kind kubectl helm jq; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
	cat >&2 <<EOF
missing: ${missing[*]}
This harness needs a Docker engine and kind, kubectl, helm and jq:
  docker   https://docs.docker.com/engine/install/ (the engine, not only the client)
  kind     go install sigs.k8s.io/kind@latest
  kubectl  https://kubernetes.io/docs/tasks/tools/
  helm     https://helm.sh/docs/intro/install/
  jq       apt-get install jq
EOF
	exit 2
fi
if ! docker info >/dev/null 2>&1; then
	echo "no Docker engine answers (docker info failed): kind runs its nodes as Docker containers, so this harness cannot run here" >&2
	exit 2
fi

work=$(mktemp -d -t l4xds-kind.XXXXXX)
created=0
cleanup() {
	local rc=$?
	set +e
	if [ "$rc" != 0 ] && [ "$created" = 1 ]; then
		say "Failed: the state of the cluster"
		k get pods -A -o wide
		k -n "$NS" logs "ds/$RELEASE" --tail 40
		k -n "$NS" logs "deploy/$RELEASE-control-plane" --tail 20
		k -n "$NS" exec "ds/$RELEASE" -- l4xds-dbg status
		k -n "$NS" exec "ds/$RELEASE" -- l4xds-dbg statedb frontends
	fi
	if [ "$created" = 1 ]; then
		if [ "$KEEP" = 1 ]; then
			say "Keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
		else
			say "Deleting cluster $CLUSTER"
			kind delete cluster --name "$CLUSTER"
		fi
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# until_ok CMD...: retry CMD for up to 3 minutes.
until_ok() {
	for _ in $(seq 90); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 2
	done
	echo "timed out waiting for: $*" >&2
	return 1
}

say "kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
	echo "cluster $CLUSTER exists already: delete it (kind delete cluster --name $CLUSTER) or set CLUSTER" >&2
	exit 1
fi
created=1
kind create cluster --name "$CLUSTER" --config test/kind/kind-config.yaml --wait 180s

# kind nodes share the host's kernel: the datapath attaches with tcx.
kernel=$(on_node uname -r)
major=${kernel%%.*} rest=${kernel#*.}
minor=${rest%%[!0-9]*}
if [ "$major" -lt 6 ] || { [ "$major" = 6 ] && [ "$minor" -lt 6 ]; }; then
	echo "kernel $kernel: the l4xds datapath needs Linux 6.6 or newer (tcx)" >&2
	exit 1
fi

# The agent is not privileged and cannot mount a bpffs: the node provides
# one (systemd does on a real node; a kind node container may not have it).
# Shared, so that the agent's HostToContainer mount sees it.
on_node sh -c 'grep -q " /sys/fs/bpf bpf " /proc/mounts || mount -t bpf bpf /sys/fs/bpf; mount --make-shared /sys/fs/bpf'

say "Image $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

say "Development certificates and the TLS Secrets"
# The agents dial the control plane's Service: its certificate carries that name.
mkdir -p "$work/certs"
docker run --rm --user "$(id -u):$(id -g)" -v "$work/certs:/certs" "$IMAGE" \
	l4xds-control-plane certs --out /certs --server-name "$RELEASE-control-plane.$NS.svc"
k create namespace "$NS"
k -n "$NS" create secret generic l4xds-agent-tls \
	--from-file=tls.crt="$work/certs/client.crt" --from-file=tls.key="$work/certs/client.key" \
	--from-file=ca.crt="$work/certs/ca.crt"
k -n "$NS" create secret generic l4xds-control-plane-tls \
	--from-file=tls.crt="$work/certs/server.crt" --from-file=tls.key="$work/certs/server.key" \
	--from-file=ca.crt="$work/certs/ca.crt"

say "Backend pods (l4xds-traffic serve, TCP and UDP $PORT) and a client pod"
pod() { # pod NAME ARGS...: a pod of the image running l4xds-traffic ARGS
	local name=$1
	shift
	cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $NS, labels: {app.kubernetes.io/part-of: l4xds-kind}}
spec:
  automountServiceAccountToken: false
  containers:
  - name: traffic
    image: $IMAGE
    imagePullPolicy: Never
    command: [l4xds-traffic]
    args:
EOF
	local a
	for a in "$@"; do printf '    - "%s"\n' "$a"; done
}
{
	for b in "${BACKENDS[@]}"; do pod "$b" serve --name "$b" --tcp ":$PORT" --udp ":$PORT"; done
	# The client only needs to run: the probes are kubectl exec'd into it.
	pod client serve --name client --tcp :9
} >"$work/pods.yaml"
k apply -f "$work/pods.yaml"
k -n "$NS" wait --for=condition=Ready pod -l app.kubernetes.io/part-of=l4xds-kind --timeout=180s

# Where each pod's traffic enters the node: the host side of its veth.
# The agent attaches to the client's (packets to the VIP, DNATed there) and
# the backends' (their replies, reverse-NATed there).
ip_of() { k -n "$NS" get pod "$1" -o jsonpath='{.status.podIP}'; }
dev_of() { on_node ip -o route get "$1" | sed -n 's/.* dev \([^ ]*\).*/\1/p'; }
client_ip=$(ip_of client)
devices=("$(dev_of "$client_ip")")
endpoints=""
for i in "${!BACKENDS[@]}"; do
	ip=$(ip_of "${BACKENDS[$i]}")
	devices+=("$(dev_of "$ip")")
	endpoints+="        - {endpoint: {address: {socket_address: {address: $ip, port_value: $PORT}}}, load_balancing_weight: ${WEIGHTS[$i]}}
"
	echo "${BACKENDS[$i]} $ip on ${devices[-1]}, weight ${WEIGHTS[$i]}"
done
echo "client $client_ip on ${devices[0]}"

# The datapath rewrites packets at tc ingress, before netfilter: the node's
# conntrack would see a flow's two halves as two flows and find the TCP
# SYN-ACK invalid (kube-proxy drops invalid packets it forwards). The client's
# packets and the VIP's replies bypass conntrack. Replies from the VIP come
# in on a backend's interface, which strict reverse-path filtering drops.
on_node iptables -t raw -I PREROUTING -s "$client_ip" -j NOTRACK
on_node iptables -t raw -I PREROUTING -s "$VIP" -j NOTRACK
on_node sysctl -qw net.ipv4.conf.all.rp_filter=0
for dev in "${devices[@]}"; do on_node sysctl -qw "net.ipv4.conf.$dev.rp_filter=0"; done

say "helm install: the agent on ${devices[*]}, the control plane serving $VIP:$PORT TCP and UDP"
cat >"$work/values.yaml" <<EOF
image: {repository: $IMAGE_REPO, tag: $IMAGE_TAG, pullPolicy: Never}
xdsControlPlane:
  enabled: true
  tlsSecretName: l4xds-agent-tls
devices: [$(
	IFS=,
	echo "${devices[*]}"
)]
controlPlane:
  enabled: true
  tlsSecretName: l4xds-control-plane-tls
  xdsResources: |
    resource:
      '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: kind-echo
      metadata:
        filter_metadata:
          io.cilium.l4lb:
            frontends:
            - {vip: "$VIP", port: $PORT, protocol: TCP}
            - {vip: "$VIP", port: $PORT, protocol: UDP}
      type: EDS
    ---
    resource:
      '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
      cluster_name: kind-echo
      endpoints:
      - lb_endpoints:
$endpoints
EOF
cat "$work/values.yaml"
# --wait: the agent is Ready once connected and synced (l4xds-dbg status).
helm --kube-context "kind-$CLUSTER" install "$RELEASE" install/kubernetes/l4xds -n "$NS" \
	-f "$work/values.yaml" --wait --timeout 5m

dbg() { k -n "$NS" exec "ds/$RELEASE" -- l4xds-dbg "$@"; }
# all_done: both frontends are in the table and written to the datapath.
all_done() { dbg statedb frontends | awk 'NR > 1 { rows++; if ($NF != "Done") bad++ } END { exit !(rows == 2 && !bad) }'; }
until_ok all_done
say "l4xds-dbg status"
dbg status
say "l4xds-dbg statedb frontends"
dbg statedb frontends

failed=0
for proto in tcp udp; do
	say "$FLOWS new $proto flows from the client pod to $VIP:$PORT"
	# probe exits 1 when a flow failed: the report says which, below.
	k -n "$NS" exec client -- l4xds-traffic probe --to "$VIP:$PORT" --proto "$proto" --flows "$FLOWS" -o json >"$work/$proto.json" || true
	jq -c '{answered, backends, errors}' "$work/$proto.json"
	answered=$(jq .answered "$work/$proto.json")
	if [ "$answered" != "$FLOWS" ]; then
		echo "FAIL $proto: $answered of $FLOWS flows answered: $(jq -c .errors "$work/$proto.json")" >&2
		failed=1
	fi
	total=0
	for w in "${WEIGHTS[@]}"; do total=$((total + w)); done
	for i in "${!BACKENDS[@]}"; do
		got=$(jq --arg b "${BACKENDS[$i]}" '.backends[$b] // 0' "$work/$proto.json")
		if ! awk -v got="$got" -v flows="$FLOWS" -v w="${WEIGHTS[$i]}" -v total="$total" -v tol="$TOLERANCE" \
			'BEGIN { d = got * 100 / flows - w * 100 / total; if (d < 0) d = -d; exit !(d <= tol) }'; then
			echo "FAIL $proto: ${BACKENDS[$i]} answered $got of $FLOWS flows, weight ${WEIGHTS[$i]} of $total (tolerance $TOLERANCE points)" >&2
			failed=1
		fi
	done
done

if [ "$failed" != 0 ]; then
	exit 1
fi
say "PASS: every TCP and UDP flow to $VIP:$PORT was answered, split by the weights within $TOLERANCE points"
