#!/usr/bin/env bash
# make demo: the reference control plane serves examples/demo.yaml over mTLS,
# an agent subscribes, and we watch the tables follow live edits of the file,
# including a malformed cluster that is NACKed while everything else stays.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
work=$(mktemp -d -t l4xds-demo.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
dbg() { "$BIN/l4xds-dbg" --socket "$work/agent.sock" "$@"; }
# until CMD... : retry for up to 20 s.
until_ok() { for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; echo "timed out: $*" >&2; return 1; }

say "Development certificates"
"$BIN/l4xds-control-plane" certs --out "$work/certs"

cp examples/demo.yaml "$work/resources.yaml"
port=$((20000 + RANDOM % 20000))
say "Control plane on 127.0.0.1:$port serving examples/demo.yaml over mTLS"
"$BIN/l4xds-control-plane" serve --resources "$work/resources.yaml" --listen "127.0.0.1:$port" \
	--cert "$work/certs/server.crt" --key "$work/certs/server.key" --client-ca "$work/certs/ca.crt" \
	>"$work/control-plane.log" 2>&1 &
pids+=($!)

say "Agent (control-plane half; --datapath=none)"
"$BIN/l4xds-agent" --api-socket "$work/agent.sock" --datapath none \
	--enable-xds-control-plane --xds-server-address "127.0.0.1:$port" --xds-server-name localhost \
	--xds-client-cert-path "$work/certs/client.crt" --xds-client-key-path "$work/certs/client.key" \
	--xds-ca-cert-path "$work/certs/ca.crt" --xds-node-id demo-node \
	>"$work/agent.log" 2>&1 &
pids+=($!)

until_ok sh -c "'$BIN/l4xds-dbg' --socket '$work/agent.sock' statedb frontends | grep -q 7777/UDP"
say "l4xds-dbg statedb frontends"
dbg statedb frontends
say "l4xds-dbg statedb backends"
dbg statedb backends

say "Edit: game weights 70/30 -> 50/50, 192.168.1.10 DRAINING"
sed -i -e 's/load_balancing_weight: 70/load_balancing_weight: 50/' -e 's/load_balancing_weight: 30/load_balancing_weight: 50/' \
	-e '0,/socket_address: { address: 192.168.1.10, port_value: 3306 }/s//&\n      health_status: DRAINING/' "$work/resources.yaml"
until_ok sh -c "'$BIN/l4xds-dbg' --socket '$work/agent.sock' statedb backends | grep -q terminating"
dbg statedb backends

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
say "l4xds-dbg xds status (the NACK names the cluster and the field; the rest is applied)"
dbg xds status
say "l4xds-dbg statedb frontends (unchanged)"
dbg statedb frontends

say "Done; cleaning up"
