// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// A container may have only the agent's own directory of the node's BPF
// filesystem, <bpf-root>/l4xds, mounted: --bpf-root itself is then no BPF
// filesystem (a tmpfs, in the chart), and the agent neither needs nor
// mounts one there.
func TestPrivilegedLoadWithOnlyItsOwnBPFFSDirectory(t *testing.T) {
	needRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	// The node's BPF filesystem, of which the directory l4xds is mounted.
	node := bpffs(t)
	if err := os.Mkdir(filepath.Join(node, PinDir), 0o755); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(root, PinDir)
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(filepath.Join(node, PinDir), own, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(own, syscall.MNT_DETACH) })

	dp := load(t, testConfig(root))
	dp.Close()
	// The pins are on the node's BPF filesystem, where the next agent
	// finds them.
	if _, err := os.Stat(filepath.Join(node, PinDir, bpf.L4xdsMapL4xdsServices)); err != nil {
		t.Errorf("the maps are not pinned on the node's BPF filesystem: %v", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	if uint32(st.Type) == bpfFSMagic {
		t.Errorf("a BPF filesystem was mounted over --bpf-root %s, hiding the node's", root)
	}
}
