#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kind/build-node-image.sh: builds the kind node image with no container
# registry, or reuses it. Everything comes from Debian's apt (debootstrap)
# and the Go module proxy:
#   - Kubernetes binaries built from k8s.io/kubernetes (its module lacks
#     staging/, filled from the published k8s.io/* modules of the same tag);
#   - etcd, a CoreDNS with only kubeadm's plugins, a tiny pause (node/);
#   - control-plane images FROM scratch, tagged as `kubeadm config images
#     list` prints, preloaded into the node's containerd as kind does.
#
# The image is tagged with a hash of its inputs (node/, this script, the
# versions) and cached as `docker save | zstd` in $L4XDS_CACHE, so a warm
# machine only loads it. Intermediate results (the source tree, binaries,
# the Debian root filesystem) stay in $L4XDS_CACHE/build, so an interrupted
# build resumes. Prints the image's name on its last line.
#
# Also builds the host tools the tests use into $L4XDS_CACHE/bin: kind,
# kubectl and helm (from the chart test's module).
#
# --prepare builds everything that needs no Docker engine (the tools, the
# Kubernetes and component binaries, the Debian root) and stops: .ci/run
# starts it beside the other test tiers, since most of a cold build is Go
# compiling and the mirror, and the tiers spend much of their time waiting.
# A lock in $L4XDS_CACHE makes a second build wait for the first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

CACHE=${L4XDS_CACHE:-/var/cache/l4xds}
KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.34.4}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
# Debian packages of the node: systemd as init, containerd and runc, the CNI
# plugins, and the tools kubeadm, kube-proxy and kind's scripts call.
NODE_PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps,socat,ebtables,iputils-ping,less
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

build=$CACHE/build
bin=$build/bin
mkdir -p "$bin" "$CACHE/bin" "$build/logs"
exec 9>"$CACHE/build.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
t0=$(date +%s)
# step NAME: a line with the time since the start, to read cold timings off.
step() { echo "=== build-node-image +$(($(date +%s) - t0))s: $*" >&2; }
timed() { # timed NAME CMD...: runs CMD, reports how long it took
	local name=$1 s
	shift
	s=$(date +%s)
	"$@"
	echo "=== build-node-image: $name took $(($(date +%s) - s))s" >&2
}

# quiet CMD...: runs CMD, showing its output only when it fails (Docker
# 20.10's builder prints a deprecation notice on every build).
quiet() {
	local out
	out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }
}

# Host tools. go build is incremental, so these are quick when warm.
tools() {
	if [ ! -x "$CACHE/bin/kind" ] || ! "$CACHE/bin/kind" version | grep -q "$KIND_VERSION"; then
		timed "kind $KIND_VERSION" env GOBIN="$CACHE/bin" nice -n 10 go install "sigs.k8s.io/kind@$KIND_VERSION"
	fi
	if [ ! -x "$CACHE/bin/helm" ]; then
		# With the chart test's own settings (the Makefile's CGO_ENABLED=0,
		# its go.sum as is), so that its compiled Helm packages are reused.
		(cd "$repo/install/kubernetes/test" && timed helm env GOFLAGS= nice -n 10 go build -o "$CACHE/bin/helm" helm.sh/helm/v3/cmd/helm)
	fi
}

# Kubernetes binaries, from k8s.io/kubernetes with staging/ filled in.
kubernetes() {
	local kv=$KUBERNETES_VERSION sv minor src=$build/kubernetes-$KUBERNETES_VERSION
	sv=v0.${kv#v1.}
	minor=${kv#v1.}
	minor=${minor%%.*}
	if [ -x "$bin/kubelet" ] && [ "$(cat "$bin/.kubernetes-version" 2>/dev/null)" = "$kv" ]; then
		cp "$bin/kubectl" "$CACHE/bin/kubectl"
		return
	fi
	if [ ! -f "$src/.ready" ]; then
		step "Kubernetes $kv source"
		go mod download "k8s.io/kubernetes@$kv"
		rm -rf "$src"
		cp -r "$(go env GOMODCACHE)/k8s.io/kubernetes@$kv" "$src"
		chmod -R u+w "$src"
		rm -rf "$src/go.work" "$src/go.work.sum" "$src/vendor"
		local m n d
		mkdir -p "$src/staging/src/k8s.io"
		# go.mod replaces every staging module with ./staging/src/k8s.io/...:
		# fill each from the module published from the same tag.
		sed -n '/^replace (/,/^)/p' "$src/go.mod" | grep '=> ./staging' | awk '{print $1}' | while read -r m; do
			n=${m#k8s.io/}
			if go mod download "$m@$sv" 2>/dev/null; then
				d=$(go env GOMODCACHE)/$m@$sv
				cp -r "$d" "$src/staging/src/k8s.io/$n"
			else # sample-* modules are not published and not built
				mkdir -p "$src/staging/src/k8s.io/$n"
				printf 'module %s\n\ngo 1.24\n' "$m" >"$src/staging/src/k8s.io/$n/go.mod"
			fi
		done
		chmod -R u+w "$src/staging"
		touch "$src/.ready"
	fi
	step "Kubernetes $kv binaries"
	# Version ldflags as Kubernetes' own build sets them: kubeadm asks for
	# the control-plane images of its version.
	local v="-X k8s.io/component-base/version" c="-X k8s.io/client-go/pkg/version"
	local ld="-s -w $v.gitVersion=$kv $v.gitMajor=1 $v.gitMinor=$minor $v.gitTreeState=clean $v.gitCommit=0000000000000000000000000000000000000000 $v.buildDate=1970-01-01T00:00:00Z"
	ld="$ld $c.gitVersion=$kv $c.gitMajor=1 $c.gitMinor=$minor $c.gitTreeState=clean"
	(cd "$src" && timed "Kubernetes binaries" nice -n 10 go build -trimpath -tags=notest -ldflags "$ld" -o "$bin/" \
		./cmd/kubelet ./cmd/kubeadm ./cmd/kubectl ./cmd/kube-apiserver \
		./cmd/kube-controller-manager ./cmd/kube-scheduler ./cmd/kube-proxy)
	echo "$kv" >"$bin/.kubernetes-version"
	cp "$bin/kubectl" "$CACHE/bin/kubectl"
}

# etcd, CoreDNS, pause and the runc wrapper, from node/'s pinned modules.
components() {
	[ -x "$bin/etcd" ] || (cd "$here/node/etcd" && timed etcd nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
	[ -x "$bin/coredns" ] || (cd "$here/node/coredns" && timed coredns nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin/coredns" .)
	(cd "$here/node/tools" && go build -trimpath -ldflags "-s -w" -o "$bin/" ./pause ./runc-nosysres)
}

# The Debian root filesystem, with the machine's apt mirror.
rootfs() {
	if [ ! -x "$build/rootfs/usr/bin/containerd" ]; then
		step "debootstrap bookworm"
		rm -rf "$build/rootfs.tmp"
		timed debootstrap nice -n 10 debootstrap --variant=minbase --include="$NODE_PACKAGES" \
			bookworm "$build/rootfs.tmp" "$DEBIAN_MIRROR" >"$build/logs/debootstrap.log" 2>&1
		mv "$build/rootfs.tmp" "$build/rootfs"
	fi
}

# Everything the images are made of. debootstrap mostly waits for the
# mirror: it runs beside the Go builds.
prepare() {
	local rootfs_pid
	rootfs >"$build/logs/rootfs.out" 2>&1 &
	rootfs_pid=$!
	kubernetes
	step "etcd, CoreDNS, pause"
	components
	step "waiting for debootstrap"
	if ! wait "$rootfs_pid"; then
		cat "$build/logs/rootfs.out" >&2
		tail -20 "$build/logs/debootstrap.log" >&2
		exit 1
	fi
	cat "$build/logs/rootfs.out" >&2
}

# The hash of everything the image is made of.
inputs_hash() {
	{
		echo "$KUBERNETES_VERSION $NODE_PACKAGES"
		cd "$here" && find node build-node-image.sh -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum
	} | sha256sum | cut -c1-12
}

hash=$(inputs_hash)
image=l4xds-kind/node:$KUBERNETES_VERSION-$hash
tarball=$CACHE/node-$KUBERNETES_VERSION-$hash.tar.zst

# --prepare: the node image's parts first (debootstrap starts at once and
# waits for the mirror while the rest compiles), then the tools.
if [ "${1:-}" = --prepare ]; then
	[ -f "$tarball" ] || prepare
	step "tools"
	tools
	[ -x "$CACHE/bin/kubectl" ] || kubernetes
	step "prepared"
	exit 0
fi
step "tools"
tools
# With a stock node image (KIND_NODE_IMAGE), only the host tools are needed.
if [ "${L4XDS_TOOLS_ONLY:-0}" = 1 ]; then
	[ -x "$CACHE/bin/kubectl" ] || command -v kubectl >/dev/null || kubernetes
	exit 0
fi
if docker image inspect "$image" >/dev/null 2>&1; then
	step "node image $image is in Docker"
	[ -x "$CACHE/bin/kubectl" ] || kubernetes
	echo "$image"
	exit 0
fi
if [ -f "$tarball" ]; then
	step "loading $tarball"
	zstd -dc "$tarball" | docker load >&2
	[ -x "$CACHE/bin/kubectl" ] || kubernetes
	echo "$image"
	exit 0
fi

prepare

step "images"
s=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=l4xds-kind/debian:bookworm-$hash
docker image inspect "$base" >/dev/null 2>&1 || tar -C "$build/rootfs" -c . | docker import - "$base" >&2

# The images kubeadm will ask for, by the names it prints.
mapfile -t wanted < <("$bin/kubeadm" config images list --kubernetes-version "$KUBERNETES_VERSION")
want() { printf '%s\n' "${wanted[@]}" | grep "/$1:"; }
scratch_image() { # scratch_image TAG BINARY PATH: FROM scratch, the binary at PATH
	mkdir -p "$work/$2"
	cp "$bin/$2" "$work/$2/"
	printf 'FROM scratch\nENV PATH=/usr/local/bin:/usr/bin:/bin\nCOPY %s %s\nENTRYPOINT ["%s"]\n' "$2" "$3" "$3" >"$work/$2/Dockerfile"
	quiet docker build -q -t "$1" "$work/$2"
}
scratch_image "$(want kube-apiserver)" kube-apiserver /usr/local/bin/kube-apiserver
scratch_image "$(want kube-controller-manager)" kube-controller-manager /usr/local/bin/kube-controller-manager
scratch_image "$(want kube-scheduler)" kube-scheduler /usr/local/bin/kube-scheduler
scratch_image "$(want etcd)" etcd /usr/local/bin/etcd
scratch_image "$(want pause)" pause /pause
# kubeadm's CoreDNS Deployment passes arguments only: the entry point is /coredns.
scratch_image "$(want coredns)" coredns /coredns
# kube-proxy needs iptables; the same image runs the CNI DaemonSet (kubectl, ip).
mkdir -p "$work/proxy"
cp "$bin/kube-proxy" "$bin/kubectl" "$work/proxy/"
printf 'FROM %s\nCOPY kube-proxy kubectl /usr/local/bin/\n' "$base" >"$work/proxy/Dockerfile"
netd=docker.io/l4xds-kind/netd:v1
quiet docker build -q -t "$(want kube-proxy)" -t "$netd" "$work/proxy"
docker save "${wanted[@]}" "$netd" -o "$work/images.tar"

mkdir -p "$work/node"
cp -r "$here/node/Dockerfile" "$here/node/files" "$work/node/"
mkdir -p "$work/node/bin"
cp "$bin/kubelet" "$bin/kubeadm" "$bin/kubectl" "$bin/runc-nosysres" "$work/node/bin/"
quiet docker build -q --build-arg "BASE=$base" --build-arg "KUBERNETES_VERSION=$KUBERNETES_VERSION" -t "$image-base" "$work/node"

# Preload the images into the node's containerd, as `kind build node-image`
# does: start containerd in a container of the image, import, commit.
c=l4xds-kind-build-$$
docker run -d --name "$c" --entrypoint=sleep --security-opt seccomp=unconfined "$image-base" infinity >&2
trap 'docker rm -f "$c" >/dev/null 2>&1; rm -rf "$work"' EXIT
docker exec "$c" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 & echo $! >/tmp/containerd.pid'
docker exec "$c" bash -c 'for _ in $(seq 30); do ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; cat /tmp/containerd.log; exit 1' >&2
docker exec -i "$c" ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests - <"$work/images.tar" >&2
for i in "${wanted[@]}" "$netd"; do
	docker exec "$c" ctr -n k8s.io images label "$i" io.cri-containerd.pinned=pinned >/dev/null
done
docker exec "$c" bash -c 'kill "$(cat /tmp/containerd.pid)"; sleep 2; rm -f /tmp/containerd.*'
docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$c" "$image" >&2
docker rm -f "$c" >/dev/null
docker rmi "$image-base" >/dev/null
echo "=== build-node-image: images and node image took $(($(date +%s) - s))s" >&2

step "saving $tarball"
s=$(date +%s)
docker save "$image" | zstd -q -T0 -3 -o "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
# Older node images of this machine are replaced by this one.
find "$CACHE" -maxdepth 1 -name 'node-*.tar.zst' ! -name "$(basename "$tarball")" -delete
echo "=== build-node-image: save took $(($(date +%s) - s))s" >&2
step "done"
echo "$image"
