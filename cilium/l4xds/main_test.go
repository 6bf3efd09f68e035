// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"os"
	"syscall"
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// TestMain runs the tests, as root, in namespaces of their own (netns.Main):
// Cilium's real LB maps then live in a private mount namespace, on a bpffs
// of its own at /sys/fs/bpf where Cilium looks for one.
func TestMain(m *testing.M) { netns.Main(m) }

// mountBPFFS gives Cilium, as root, the bpffs it requires at /sys/fs/bpf, in
// the tests' private mount namespace.
func mountBPFFS(tb testing.TB) {
	if os.Geteuid() != 0 {
		return
	}
	if err := syscall.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
		tb.Fatalf("mount -t bpf bpf /sys/fs/bpf: %v", err)
	}
	tb.Cleanup(func() { syscall.Unmount("/sys/fs/bpf", syscall.MNT_DETACH) })
	// Where Cilium pins the maps it shares with its programs.
	if err := os.MkdirAll("/sys/fs/bpf/tc/globals", 0o755); err != nil {
		tb.Fatal(err)
	}
}
