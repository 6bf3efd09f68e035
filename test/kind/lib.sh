# shellcheck shell=bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/lib.sh: what run.sh and cilium/run.sh share, sourced by both.
# Before sourcing, a tier sets TIER (its name in messages: test-kind,
# test-kind-cilium), L4XDS_CACHE, CLUSTER, CLIENT, KEEP and SYSCTLS (the
# host sysctls it restores, in that order). It then calls, in order:
#
#   kind_preflight TOOLS HINT   # root, else SKIP; each tool, else SKIP (CI: error)
#   kind_save_sysctls           # saved=(name=value ...)
#   trap cleanup EXIT           # its cleanup calls kind_teardown first
#   kind_docker                 # the running Docker engine, or one of this run's
#   ...
#   kind_report_failures LOG    # after a failed go test
#
# and sets created=1 before creating the cluster.

lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The Makefile's build configuration (static binaries for the images'
# empty base), so that the tiers' builds reuse what make build compiled.
export CGO_ENABLED=0
t0=$(date +%s)
dockerd_pid=
created=0
network_existed=1
saved=()

say() { printf '=== %s +%ss: %s\n' "$TIER" "$(($(date +%s) - t0))" "$*"; }

# kind_preflight TOOLS HINT: as root with every tool of the space-separated
# TOOLS, or exits: 0 with SKIP (not root, or a tool missing), 1 when a tool
# is missing and L4XDS_KIND_REQUIRED=1 (CI installs them, so there a missing
# tool is an error). HINT ends the line naming the missing tool.
kind_preflight() {
	local tool
	if [ "$(id -u)" != 0 ]; then
		echo "$TIER: SKIP: needs root (kind nodes are privileged containers, kubelet sets host sysctls)"
		exit 0
	fi
	for tool in $1; do
		command -v "$tool" >/dev/null && continue
		echo "$TIER: $tool is missing: $2"
		[ "${L4XDS_KIND_REQUIRED:-0}" = 1 ] && exit 1
		echo "$TIER: SKIP"
		exit 0
	done
}

kind_save_sysctls() {
	local s
	for s in "${SYSCTLS[@]}"; do saved+=("$s=$(sysctl -n "$s")"); done
}

# kind_teardown deletes what the run made (unless KEEP=1): the client, the
# cluster and kind's network when the run made it, stops the dockerd it
# started (by its PID) and restores the sysctls.
kind_teardown() {
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
}

# kind_docker: a Docker engine, the running one or one started for this run.
# A host whose capability bounding set lacks CAP_SYS_RESOURCE (itself a
# container) cannot run privileged containers with plain runc: runc-nosysres
# drops the capabilities the host does not have from each container's spec.
# It is set on the command line, so /etc/docker/daemon.json is not touched.
kind_docker() {
	mkdir -p "$L4XDS_CACHE/bin"
	(cd "$lib_dir/node/tools" && CGO_ENABLED=0 go build -o "$L4XDS_CACHE/bin/" ./runc-nosysres)
	if ! docker info >/dev/null 2>&1; then
		say "starting dockerd"
		dockerd --add-runtime "runc-nosysres=$L4XDS_CACHE/bin/runc-nosysres" --default-runtime runc-nosysres \
			>"$L4XDS_CACHE/dockerd.log" 2>&1 &
		dockerd_pid=$!
		for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
		docker info >/dev/null || { tail -20 "$L4XDS_CACHE/dockerd.log" >&2; exit 1; }
	fi
	docker network inspect kind >/dev/null 2>&1 || network_existed=0
}

# kind_report_failures LOG: the cluster's state is dumped after the
# subtests; repeat each failed test's own output (in go test -v's LOG) so
# that it is last. A test's errors print as its logs do, so all of it is
# shown: its first 30 lines and its last 20.
kind_report_failures() {
	local failed name
	say "failed; each failed test's output:"
	failed=$(sed -n 's/^ *--- FAIL: \([^ ]*\) .*/\1/p' "$1")
	for name in $failed; do
		# A parent's failure is its children's: show the innermost.
		awk -v p="$name/" 'index($0, p) == 1 { found = 1 } END { exit !found }' <<<"$failed" && continue
		echo "--- $name"
		awk -v n="$name" '$1 == "===" { on = ($3 == n) } /^ *--- (FAIL|PASS|SKIP)/ { on = 0 } on' "$1" |
			awk '{ l[NR] = $0 } END { for (i = 1; i <= NR; i++) if (i <= 30 || i > NR - 20) print l[i]; else if (i == 31) print "    [" NR - 50 " lines]" }'
	done
}
