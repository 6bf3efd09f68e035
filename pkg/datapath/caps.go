// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Without the capabilities the datapath needs, the first bpf(2) call fails
// with EPERM, and the first call is cilium/ebpf's memlock probe, which then
// blames RLIMIT_MEMLOCK ("failed to set memlock rlimit: operation not
// permitted"). Where a kind node runs on Docker 20.10, whose privileged set
// has no CAP_BPF or CAP_PERFMON, the node's runtime cannot grant them and
// the pod gets NET_ADMIN alone. So the agent checks its effective set first
// and names what is missing.

// capabilityProblems returns an error naming the capabilities missing from
// the effective set eff for loading and attaching the datapath, and a
// warning for the one that only costs performance.
func capabilityProblems(eff uint64) (warning string, err error) {
	has := func(c int) bool { return eff&(1<<uint(c)) != 0 }
	var missing []string
	if !has(unix.CAP_BPF) && !has(unix.CAP_SYS_ADMIN) {
		missing = append(missing, "CAP_BPF (or CAP_SYS_ADMIN, where the container runtime predates CAP_BPF): create maps and load programs")
	}
	if !has(unix.CAP_NET_ADMIN) {
		missing = append(missing, "CAP_NET_ADMIN: load tc programs and attach them (tcx links or tc filters)")
	}
	if len(missing) > 0 {
		err = fmt.Errorf("missing capabilities (effective set %#x): %s; in Kubernetes, the chart's value "+
			"legacyCapabilities=true adds SYS_ADMIN for runtimes that do not grant BPF and PERFMON",
			eff, strings.Join(missing, "; "))
	}
	if !has(unix.CAP_PERFMON) && !has(unix.CAP_SYS_ADMIN) {
		warning = "CAP_PERFMON (or CAP_SYS_ADMIN) is missing: the verifier hardens the program against Spectre, which costs every packet"
	}
	return warning, err
}

// effectiveCapabilities reads the CapEff line of /proc/self/status.
func effectiveCapabilities() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}
