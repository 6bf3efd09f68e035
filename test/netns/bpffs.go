// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// MountBPFFS mounts a bpffs on a new temporary directory, in the test's
// mount namespace (Main's): `ip netns exec` remounts only /sys, so an agent
// in a topology's namespace sees this one, and its pins survive an agent
// restart. Unmounted when the test or benchmark ends, and gone with the
// mount namespace if the run is killed.
func MountBPFFS(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "bpffs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		tb.Fatalf("mount -t bpf bpf %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
