#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/cilium/build-images.sh: builds Cilium's agent and operator images
# with no container registry, or reuses them:
#   - the agent image: Cilium's agent with the l4xds cell (cilium/cmd/
#     cilium-agent), cilium-dbg, cilium-health and its responder, the CNI
#     plugin and its scripts, cilium-mount and cilium-sysctlfix (the chart's
#     init containers), init-container.sh, the BPF sources at
#     /var/lib/cilium/bpf, on a Debian root with clang/llc 19, iproute2,
#     iptables, ipset, kmod and bpftool (Cilium's images/runtime);
#   - the operator image: cilium-operator-generic.
# Everything comes from the Cilium module of cilium/go.mod (its sources, its
# scripts, its bpf/) and Debian's apt (debootstrap); the images' layout is
# that of Cilium's images/cilium/Dockerfile. No Envoy: its image is built
# from cilium/proxy with Bazel, so the chart runs with envoy.enabled=false.
#
# Version ldflags as Cilium's Makefile.defs sets them (pkg/version and the
# Envoy version the agent expects), so `cilium-dbg version` is truthful.
#
# The images are tagged with a hash of their inputs (the sources the
# binaries are built from, go.mod and go.sum, this directory, the packages)
# and kept as `docker save | zstd` in $L4XDS_CACHE, so a warm machine only
# loads them. The Debian root stays in $L4XDS_CACHE/build; Go's build cache
# keeps the compiled packages (the flags are those of cilium/Makefile, so
# `make -C cilium build` and this share them). Prints the agent image's name
# and the operator image's name on its last two lines.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)

CACHE=${L4XDS_CACHE:-/var/cache/l4xds}
# cilium/Makefile's setting (and Cilium's own), so that the compiled
# packages are shared.
export CGO_ENABLED=0
# Cilium's images/runtime installs these (plus iptables 1.8.8 of its own and
# LLVM 19 of its own image; Debian bookworm has iptables 1.8.9 and LLVM 19);
# bash, util-linux (nsenter) and mount for the init containers' scripts,
# containernetworking-plugins for the loopback plugin install-plugin.sh copies.
PACKAGES=bash,bash-completion,ca-certificates,iproute2,iptables,ipset,kmod,util-linux,mount,procps,libatomic1,jq,clang-19,llvm-19,bpftool,containernetworking-plugins,iputils-ping
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
build=$CACHE/build
mkdir -p "$build/logs"
t0=$(date +%s)
step() { echo "=== build-cilium-images +$(($(date +%s) - t0))s: $*" >&2; }
timed() { # timed NAME CMD...: runs CMD, reports how long it took
	local name=$1 s
	shift
	s=$(date +%s)
	"$@"
	echo "=== build-cilium-images: $name took $(($(date +%s) - s))s" >&2
}
quiet() {
	local out
	out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }
}

# The Debian root, by its own package list's hash, with the machine's mirror.
# A lock, since --prepare may still be making it when the images are built.
pkg_hash=$(echo "$PACKAGES" | sha256sum | cut -c1-12)
rootfs=$build/cilium-rootfs-$pkg_hash
rootfs_build() (
	exec 8>"$build/cilium-rootfs.lock"
	flock 8
	[ -x "$rootfs/usr/bin/clang-19" ] && exit 0
	rm -rf "$rootfs.tmp"
	timed debootstrap nice -n 10 debootstrap --variant=minbase --include="$PACKAGES" \
		bookworm "$rootfs.tmp" "$DEBIAN_MIRROR" >"$build/logs/cilium-debootstrap.log" 2>&1
	rm -rf "$rootfs.tmp/var/cache/apt/archives/"*.deb "$rootfs.tmp/var/lib/apt/lists/"* "$rootfs.tmp/usr/share/doc" "$rootfs.tmp/usr/share/man"
	mv "$rootfs.tmp" "$rootfs"
)
# --prepare: only the Debian root, which needs neither Docker nor Go and is
# mostly a wait on the mirror (.ci/run starts it beside the first tiers).
if [ "${1:-}" = --prepare ]; then
	rootfs_build
	exit 0
fi

cd "$repo/cilium"
# `go list -m` names no directory for a module not yet downloaded (a cold
# machine that has not built the agent).
go mod download github.com/cilium/cilium
cilium_dir=$(go list -m -f '{{.Dir}}' github.com/cilium/cilium)
[ -d "$cilium_dir" ] || { echo "build-images.sh: no directory for github.com/cilium/cilium (go list -m said \"$cilium_dir\")" >&2; exit 1; }
cilium_version=$(go list -m -f '{{.Version}}' github.com/cilium/cilium)

# Cilium's Makefile.defs: ciliumVersion is "VERSION GIT_VERSION" (the
# commit's short hash and author date), the Envoy SHA comes from the Envoy
# image of images/cilium/Dockerfile. The commit is the last one of this
# repository that changed the inputs (tests, test data and docs aside: a
# commit of only those must not rebuild the images), so that it is the same
# for the same hash; "-dirty" when they have uncommitted changes. Part of
# the hash.
envoy_sha=$(sed -nE 's/^ARG CILIUM_ENVOY_IMAGE=([^ ]*)/\1/p' "$cilium_dir/images/cilium/Dockerfile" | head -1 |
	sed -E 's/[^/]*\/[^:]*:(.*-)?([^:@]*).*/\2/p;d')
paths=(go.mod go.sum pkg cilium test/kind/cilium/build-images.sh test/kind/cilium/image test/kind/cilium/mcs-api-controllers
	':(exclude,glob)**/*_test.go' ':(exclude,glob)**/testdata/**' ':(exclude,glob)**/*.md')
git_version=$(cd "$repo" && git log -1 --format='%h %aI' -- "${paths[@]}" 2>/dev/null || echo "unknown 1970-01-01T00:00:00Z")
commit=$(git -C "$repo" log -1 --format=%H -- "${paths[@]}" 2>/dev/null) || commit=
version=$(git -C "$repo" describe --tags --always "${commit:-HEAD}" 2>/dev/null) || version=dev
if [ -n "$(cd "$repo" && git status --porcelain -- "${paths[@]}" 2>/dev/null)" ]; then
	git_version="${git_version% *}-dirty ${git_version#* }"
	version=$version-dirty
fi
# The hash of everything the images are made of: the Go files of this
# repository's packages linked into the agent, both modules' go.mod and
# go.sum (which pin Cilium and every dependency), this directory, the
# packages.
inputs_hash() {
	{
		echo "$cilium_version $git_version $version $PACKAGES $(go version)"
		# shellcheck disable=SC2016 # a Go template, not shell
		go list -deps -f '{{if .Module}}{{if or (eq .Module.Path "github.com/l4xds/l4xds") (eq .Module.Path "github.com/l4xds/l4xds/cilium")}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .CgoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}' \
			./cmd/cilium-agent ./cmd/cilium-dbg | grep . | sort | xargs sha256sum | sed "s|$repo/||"
		(cd "$repo" && sha256sum go.mod go.sum cilium/go.mod cilium/go.sum)
		(cd "$here" && find build-images.sh image mcs-api-controllers -type f -print0 | sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -c1-12
}
hash=$(inputs_hash)
tag=$cilium_version-$hash
agent_image=l4xds-kind/cilium:$tag
operator_image=l4xds-kind/operator-generic:$tag
tarball=$CACHE/cilium-images-$tag.tar.zst
done_images() { echo "$agent_image"; echo "$operator_image"; }

if docker image inspect "$agent_image" >/dev/null 2>&1 && docker image inspect "$operator_image" >/dev/null 2>&1; then
	step "images $tag are in Docker"
	done_images
	exit 0
fi
exec 9>"$CACHE/cilium-images.lock"
flock 9
if [ -f "$tarball" ]; then
	step "loading $tarball"
	timed load bash -c "zstd -dc '$tarball' | docker load >&2"
	done_images
	exit 0
fi

step "debootstrap (beside the Go builds)"
rootfs_build >"$build/logs/cilium-rootfs.out" 2>&1 &
rootfs_pid=$!

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ctx=$work/agent/rootfs
mkdir -p "$ctx/usr/bin" "$ctx/opt/cni/bin" "$ctx/cni" "$ctx/var/lib/cilium" "$work/operator"

ldflags="-s -w -X 'github.com/cilium/cilium/pkg/version.ciliumVersion=${cilium_version#v} $git_version'"
ldflags="$ldflags -X github.com/cilium/cilium/pkg/envoy.requiredEnvoyVersionSHA=$envoy_sha"
ldflags="$ldflags -X github.com/l4xds/l4xds/pkg/version.Version=$version -X github.com/l4xds/l4xds/pkg/version.Commit=$commit"

# With cilium/Makefile's settings (CGO_ENABLED=0, no -trimpath), so that
# its compiled packages are reused; only the link differs.
step "agent binaries"
timed "agent binaries" nice -n 5 go build -ldflags "$ldflags" -o "$work/bin/" \
	./cmd/cilium-agent ./cmd/cilium-dbg \
	github.com/cilium/cilium/cilium-health github.com/cilium/cilium/cilium-health/responder \
	github.com/cilium/cilium/plugins/cilium-cni github.com/cilium/cilium/tools/mount

# cilium-sysctlfix and the operator import packages whose modules cilium/
# does not list in go.sum (the agent does not import them), and the operator
# one that the module proxy does not serve (mcs-api-controllers/): a copy of
# go.mod and go.sum, which go build completes.
sed -e "s|=> \.\./\$|=> $repo|" -e "s|=> \.\./ *$|=> $repo|" go.mod >"$work/extra.mod"
printf '\nreplace sigs.k8s.io/mcs-api/controllers => %s\n' "$here/mcs-api-controllers" >>"$work/extra.mod"
cp go.sum "$work/extra.sum"
step "operator and cilium-sysctlfix"
timed "cilium-sysctlfix" nice -n 5 go build -mod=mod -modfile="$work/extra.mod" -ldflags "$ldflags" -o "$work/bin/cilium-sysctlfix" github.com/cilium/cilium/tools/sysctlfix
timed "cilium-operator-generic" nice -n 5 go build -mod=mod -modfile="$work/extra.mod" -tags ipam_provider_operator -ldflags "$ldflags" \
	-o "$work/operator/cilium-operator-generic" github.com/cilium/cilium/operator

# The layout of Cilium's image (its Makefiles' install targets).
b=$work/bin
cp "$b/cilium-agent" "$b/cilium-dbg" "$b/cilium-health" "$b/cilium-sysctlfix" "$ctx/usr/bin/"
cp "$b/responder" "$ctx/usr/bin/cilium-health-responder"
cp "$b/mount" "$ctx/usr/bin/cilium-mount"
cp "$b/cilium-cni" "$ctx/opt/cni/bin/"
install -m 0755 "$cilium_dir/images/cilium/init-container.sh" "$cilium_dir/plugins/cilium-cni/install-plugin.sh" \
	"$cilium_dir/plugins/cilium-cni/cni-uninstall.sh" "$ctx/"
# install-bpf: bpf/ without its tests and build files (Makefile.defs,
# BPF_SRCFILES_IGNORE).
tar -C "$cilium_dir" -c --exclude=bpf/tests --exclude=bpf/complexity-tests --exclude=bpf/custom \
	--exclude=bpf/Makefile --exclude=bpf/Makefile.bpf --exclude=bpf/.gitignore bpf | tar -C "$ctx/var/lib/cilium" -x
chmod -R u+w,go+rX "$ctx"
cp "$here/image/Dockerfile" "$work/agent/"
cp "$here/image/operator.Dockerfile" "$work/operator/Dockerfile"

step "waiting for debootstrap"
if ! wait "$rootfs_pid"; then
	cat "$build/logs/cilium-rootfs.out" >&2
	tail -20 "$build/logs/cilium-debootstrap.log" >&2
	exit 1
fi
cat "$build/logs/cilium-rootfs.out" >&2
# The loopback plugin install-plugin.sh copies when the node has none.
cp "$rootfs/usr/lib/cni/loopback" "$ctx/cni/"

step "images"
s=$(date +%s)
base=l4xds-kind/cilium-runtime:bookworm-$pkg_hash
docker image inspect "$base" >/dev/null 2>&1 || tar -C "$rootfs" -c . | docker import - "$base" >&2
quiet docker build -q --build-arg "BASE=$base" -t "$agent_image" "$work/agent"
quiet docker build -q --build-arg "BASE=$base" -t "$operator_image" "$work/operator"
echo "=== build-cilium-images: images took $(($(date +%s) - s))s" >&2
docker run --rm --entrypoint cilium-dbg "$agent_image" version 2>&1 | sed -n 's/^Client: /=== build-cilium-images: cilium-dbg version: /p' >&2

step "saving $tarball"
s=$(date +%s)
docker save "$agent_image" "$operator_image" | zstd -q -T0 -3 -o "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
# Older images of this machine are replaced by these.
find "$CACHE" -maxdepth 1 -name 'cilium-images-*.tar.zst' ! -name "$(basename "$tarball")" -delete
docker images --format '{{.Repository}}:{{.Tag}}' l4xds-kind/cilium | grep -vFx "$agent_image" | xargs -r docker rmi >/dev/null 2>&1 || true
docker images --format '{{.Repository}}:{{.Tag}}' l4xds-kind/operator-generic | grep -vFx "$operator_image" | xargs -r docker rmi >/dev/null 2>&1 || true
echo "=== build-cilium-images: save took $(($(date +%s) - s))s" >&2
step "done"
done_images
