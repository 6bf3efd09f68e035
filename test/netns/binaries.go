// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binaries are what make build puts in L4XDS_BIN.
var binaries = []string{"l4xds-agent", "l4xds-control-plane", "l4xds-dbg", "l4xds-traffic"}

// AgentBinaries is what a test that runs the agent, the control plane and
// traffic in namespaces needs: it skips without root or without L4XDS_BIN
// (the directory of the built binaries), and fails when a binary or ip(8)
// is missing. It returns L4XDS_BIN.
func AgentBinaries(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces, mounts a bpffs and loads eBPF programs")
	}
	bin := Binaries(tb)
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatalf("needs ip(8) from iproute2: %v", err)
	}
	return bin
}

// Binaries is what a test that runs the binaries without namespaces or BPF
// (the agent with --datapath none) needs: it skips without L4XDS_BIN and
// fails when a binary is missing from it. It returns L4XDS_BIN.
func Binaries(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv("L4XDS_BIN")
	if bin == "" {
		tb.Skip("needs L4XDS_BIN, the directory of the built binaries (make test sets it)")
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			tb.Fatalf("%s is not built in L4XDS_BIN (run make build): %v", b, err)
		}
	}
	return bin
}
