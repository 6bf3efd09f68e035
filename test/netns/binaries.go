// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// AgentBinaries is what a test that runs the agent, the control plane and
// traffic in namespaces needs: it skips without root or without L4XDS_BIN
// (the directory of the built binaries), and fails when a binary or ip(8)
// is missing. It returns L4XDS_BIN.
func AgentBinaries(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces, mounts a bpffs and loads eBPF programs")
	}
	bin := os.Getenv("L4XDS_BIN")
	if bin == "" {
		tb.Skip("needs L4XDS_BIN, the directory of the built binaries (make test sets it)")
	}
	for _, b := range []string{"l4xds-agent", "l4xds-control-plane", "l4xds-dbg", "l4xds-traffic"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			tb.Fatalf("%s is not built in L4XDS_BIN (run make build): %v", b, err)
		}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatalf("needs ip(8) from iproute2: %v", err)
	}
	return bin
}
