#!/usr/bin/env bash
# Builds Cilium's load-balancer benchmark command (pkg/loadbalancer/benchmark/cmd
# of github.com/cilium/cilium) at the version the cilium/ module uses, with
# that module's replace directives and checksums, in a throwaway module
# outside the repository: the Cilium dependency stays out of the root module.
#
#   test/bench/build-cilium-bench.sh cilium/go.mod bin/cilium-lb-bench
set -euo pipefail

modfile=$1
out=$(realpath -m "$2")
go=${GO:-go}

version=$(awk '$1 == "github.com/cilium/cilium" && $2 ~ /^v/ { print $2; exit }' "$modfile")
if [ -z "$version" ]; then
	echo "build-cilium-bench: no github.com/cilium/cilium requirement in $modfile" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
	echo "module cilium-lb-bench"
	echo
	echo "go $(awk '$1 == "go" { print $2; exit }' "$modfile")"
	echo
	echo "require github.com/cilium/cilium $version"
	echo
	# The replace directives that pin modules, not those naming a directory
	# (the l4xds module itself).
	grep -E '^replace .* => [^./][^ ]* v[^ ]+$' "$modfile" || true
} >"$tmp/go.mod"
cp "$(dirname "$modfile")/go.sum" "$tmp/go.sum"

mkdir -p "$(dirname "$out")"
cd "$tmp"
GOFLAGS=-mod=mod "$go" build -o "$out" github.com/cilium/cilium/pkg/loadbalancer/benchmark/cmd
echo "built $out: Cilium $version pkg/loadbalancer/benchmark"
