#!/usr/bin/env bash
# make demo: a client, an LB and three backends in network namespaces; the
# reference control plane serves examples/demo.yaml over mTLS to the agent,
# whose eBPF datapath balances real TCP and UDP traffic from the client.
# Live edits of the resources (a weight change, a draining backend) show in
# the measured split. Everything the demo creates is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "make demo needs root: it creates network namespaces and loads eBPF programs; run: sudo make demo" >&2
	exit 1
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if ! command -v ip >/dev/null; then
	say "Installing iproute2"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2
fi

BIN=${BIN:-$PWD/bin}
for b in l4xds-agent l4xds-control-plane l4xds-dbg l4xds-traffic; do
	[ -x "$BIN/$b" ] || { say "Building"; make build; break; }
done

# The demo runs in network, mount and PID namespaces of its own: its
# namespaces, bpffs and processes go with it however it ends (even
# SIGKILL), and the host's network settings do not reach it.
if [ -z "${L4XDS_DEMO_ISOLATED:-}" ] && command -v unshare >/dev/null; then
	exec env L4XDS_DEMO_ISOLATED=1 unshare --net --mount --pid --fork --kill-child --mount-proc "$PWD/test/demo.sh" "$@"
fi
if [ -n "${L4XDS_DEMO_ISOLATED:-}" ]; then
	mkdir -p /run/netns
	mount -t tmpfs -o mode=0755 tmpfs /run/netns
	ip link set lo up
fi

work=$(mktemp -d -t l4xds-demo.XXXXXX)
prefix=l4xdemo$(printf '%04x' $((RANDOM)))
client=$prefix-client lb=$prefix-lb
backends=("$prefix-b0" "$prefix-b1" "$prefix-b2")
namespaces=()
pids=()
cleanup() {
	local rc=$?
	set +e
	if [ "$rc" != 0 ]; then
		for log in "$work"/*.log; do
			[ -s "$log" ] && { echo "--- last lines of $(basename "$log")"; tail -n 15 "$log"; }
		done
	fi
	say "Cleaning up: processes, namespaces, bpffs, $work"
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	for ns in "${namespaces[@]}"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
		ip netns delete "$ns" 2>/dev/null
	done
	grep -q " $work/bpffs " /proc/mounts && umount "$work/bpffs"
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# in_ns NS CMD...: run CMD in NS. Background processes use ip netns exec
# directly, so that $! is their pid (it execs in place).
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
# setsys NS KEY=VALUE...: /proc/sys settings inside NS (KEY as a path).
setsys() {
	local ns=$1 kv
	shift
	for kv in "$@"; do in_ns "$ns" sh -c "echo ${kv#*=} > /proc/sys/${kv%%=*}"; done
}
dbg() { "$BIN/l4xds-dbg" --socket "$work/agent.sock" "$@"; }
# until_ok CMD...: retry for up to 30 s, while every process we started runs.
until_ok() {
	local p
	for _ in $(seq 150); do
		"$@" >/dev/null 2>&1 && return 0
		for p in "${pids[@]}"; do
			kill -0 "$p" 2>/dev/null || { echo "process $p ($(cat "$work/pid-$p" 2>/dev/null)) exited" >&2; return 1; }
		done
		sleep 0.2
	done
	echo "timed out waiting for: $*" >&2
	return 1
}
# started NAME: remember the last background process.
started() { pids+=($!); echo "$1" >"$work/pid-$!"; }
# all_done N: the frontends table has N rows, all reconciled (Done).
all_done() { dbg statedb frontends | awk -v n="$1" 'NR > 1 { rows++; if ($NF != "Done") bad++ } END { exit !(rows == n && !bad) }'; }
# split SERVICE VIP:PORT PROTO FLOWS: new flows from the client, per backend,
# beside the weights and states the agent has for SERVICE.
split() {
	local svc=$1 to=$2 proto=$3 flows=$4 args=() addr weight state
	while read -r addr weight state; do
		args+=(--backend "${addr%:*}=$weight:$state")
	done < <(dbg statedb backends | awk -v s="$svc" 'NR > 1 && $2 == s { print $1, $3, $4 }')
	echo "$svc:"
	in_ns "$client" "$BIN/l4xds-traffic" probe --to "$to" --proto "$proto" --flows "$flows" --concurrency 32 "${args[@]}"
}

say "Network namespaces: client 10.0.0.2 -> LB 10.0.0.1 | bridge 192.168.1.1 -> backends 192.168.1.10-12"
for ns in "$client" "$lb" "${backends[@]}"; do
	ip netns add "$ns"
	namespaces+=("$ns")
	# Set explicitly: a new namespace inherits the host's IPv4 settings.
	setsys "$ns" net/ipv6/conf/all/accept_dad=0 net/ipv6/conf/default/accept_dad=0 \
		net/ipv4/ip_forward=0 net/ipv4/conf/all/rp_filter=0 net/ipv4/conf/default/rp_filter=0
	ip -n "$ns" link set lo up
done
setsys "$lb" net/ipv4/ip_forward=1 net/ipv6/conf/all/forwarding=1
# Bridged frames skip iptables, as where br_netfilter is not loaded.
# shellcheck disable=SC2016 # $f expands in the namespace's shell
in_ns "$lb" sh -c '[ ! -d /proc/sys/net/bridge ] || for f in iptables ip6tables arptables; do echo 0 > /proc/sys/net/bridge/bridge-nf-call-$f; done'
ip -n "$lb" link add c0 type veth peer name eth0 netns "$client"
ip -n "$lb" addr add 10.0.0.1/24 dev c0
ip -n "$lb" addr add fd00::1/64 dev c0 nodad
ip -n "$lb" link set c0 up
ip -n "$lb" link add br0 type bridge
ip -n "$lb" addr add 192.168.1.1/24 dev br0
ip -n "$lb" addr add fd01::1/64 dev br0 nodad
ip -n "$lb" link set br0 up
ip -n "$client" addr add 10.0.0.2/24 dev eth0
ip -n "$client" addr add fd00::2/64 dev eth0 nodad
ip -n "$client" link set eth0 up
ip -n "$client" route add default via 10.0.0.1
ip -n "$client" -6 route add default via fd00::1
for i in 0 1 2; do
	ns=${backends[$i]}
	ip -n "$lb" link add "b$i" type veth peer name eth0 netns "$ns"
	ip -n "$lb" link set "b$i" master br0 up
	ip -n "$ns" addr add "192.168.1.1$i/24" dev eth0
	ip -n "$ns" addr add "fd01::1$i/64" dev eth0 nodad
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route add default via 192.168.1.1
	ip -n "$ns" -6 route add default via fd01::1
done
ip netns list | grep "^$prefix"

say "Backends: l4xds-traffic serve in each namespace (TCP 3306, 53; UDP 53, 7777), answering with its address"
for i in 0 1 2; do
	ip netns exec "${backends[$i]}" "$BIN/l4xds-traffic" serve --name "192.168.1.1$i" \
		--tcp :3306 --tcp :53 --udp :53 --udp :7777 >"$work/backend-$i.log" 2>&1 &
	started "backend $i"
done
for i in 0 1 2; do until_ok grep -q ready "$work/backend-$i.log"; done

say "Development certificates"
"$BIN/l4xds-control-plane" certs --out "$work/certs"

cp examples/demo.yaml "$work/resources.yaml"
say "Control plane in the LB namespace on 127.0.0.1:18000, serving examples/demo.yaml over mTLS"
ip netns exec "$lb" "$BIN/l4xds-control-plane" serve --resources "$work/resources.yaml" --listen 127.0.0.1:18000 \
	--cert "$work/certs/server.crt" --key "$work/certs/server.key" --client-ca "$work/certs/ca.crt" \
	>"$work/control-plane.log" 2>&1 &
started "control plane"

say "Agent in the LB namespace: BPF datapath on c0 (client side) and br0 (backends), maps pinned in a private bpffs"
mkdir "$work/bpffs"
mount -t bpf bpf "$work/bpffs"
ip netns exec "$lb" "$BIN/l4xds-agent" --api-socket "$work/agent.sock" \
	--datapath bpf --devices c0,br0 --bpf-root "$work/bpffs" \
	--enable-xds-control-plane --xds-server-address 127.0.0.1:18000 --xds-server-name localhost \
	--xds-client-cert-path "$work/certs/client.crt" --xds-client-key-path "$work/certs/client.key" \
	--xds-ca-cert-path "$work/certs/ca.crt" --xds-node-id demo-lb \
	--prometheus-serve-addr 127.0.0.1:9970 \
	>"$work/agent.log" 2>&1 &
started agent
until_ok all_done 5
say "l4xds-dbg statedb frontends"
dbg statedb frontends

say "Traffic from the client: new flows per backend, beside the configured weights"
split my-database-service 10.1.2.3:3306 tcp 1000
split game 10.1.2.7:7777 udp 2000
split dns 10.1.2.53:53 udp 500
split dns 10.1.2.53:53 tcp 500
echo "my-database-service-v6 (backends answer with their IPv4 address):"
in_ns "$client" "$BIN/l4xds-traffic" probe --to '[fd00:10::3]:3306' --proto tcp --flows 500

say "l4xds-dbg status: the node at a glance (exits non-zero when degraded)"
dbg status
say "l4xds-dbg bpf lb list: what the BPF maps hold (the Maglev slots realise the weights)"
"$BIN/l4xds-dbg" bpf lb list --bpf-root "$work/bpffs"
say "Metrics (--prometheus-serve-addr): the per-service counters of the datapath"
ip netns exec "$lb" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9970 && printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 && cat <&3' |
	grep -E '^l4xds_(datapath_service_packets_total|xds_client_connected)'

say "A long-lived TCP connection to 10.1.2.3:3306 on 192.168.1.10, echoing every 100 ms through the edits below"
# New connections land on either backend: retry until one is on .10, the
# backend about to drain.
for _ in $(seq 30); do
	ip netns exec "$client" "$BIN/l4xds-traffic" hold --to 10.1.2.3:3306 --interval 100ms >"$work/hold.log" 2>&1 &
	hold=$!
	until_ok grep -q '^ok ' "$work/hold.log"
	grep -q '^connected 192.168.1.10$' "$work/hold.log" && break
	kill "$hold"
	wait "$hold" 2>/dev/null || true
done
started "long-lived connection"
head -n 1 "$work/hold.log"

say "Edit: game weights 70/30 -> 50/50; 192.168.1.10 of my-database-service DRAINING"
sed -i -e 's/load_balancing_weight: 70/load_balancing_weight: 50/' -e 's/load_balancing_weight: 30/load_balancing_weight: 50/' \
	-e '0,/socket_address: { address: 192.168.1.10, port_value: 3306 }/s//&\n      health_status: DRAINING/' "$work/resources.yaml"
until_ok sh -c "'$BIN/l4xds-dbg' --socket '$work/agent.sock' statedb frontends | grep -q '192.168.1.10:3306/terminating'"
until_ok sh -c "'$BIN/l4xds-dbg' --socket '$work/agent.sock' statedb backends | awk '\$2 == \"game\" && \$3 != 50 { exit 1 }'"
until_ok all_done 5
dbg statedb frontends
say "The split follows"
split my-database-service 10.1.2.3:3306 tcp 1000
split game 10.1.2.7:7777 udp 2000
echo "the long-lived connection: $(grep -c '^ok ' "$work/hold.log") echoes, $(grep -c '^fail' "$work/hold.log") failed; last: $(tail -n 1 "$work/hold.log")"
grep -q '^fail' "$work/hold.log" && exit 1

say "Edit: a malformed cluster (port 70000) beside the good ones"
cat >>"$work/resources.yaml" <<'YAML'
---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: broken
  metadata:
    filter_metadata:
      io.cilium.l4lb: { vip: "10.1.2.99", port: 70000 }
  type: EDS
YAML
until_ok sh -c "'$BIN/l4xds-dbg' --socket '$work/agent.sock' xds status | grep -q 70000"
say "l4xds-dbg xds status: the NACK names the cluster and the field; the rest stays applied"
dbg xds status
say "Traffic is unchanged"
split game 10.1.2.7:7777 udp 500

say "Done"
