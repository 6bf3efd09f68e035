// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func capSet(caps ...int) uint64 {
	var s uint64
	for _, c := range caps {
		s |= 1 << uint(c)
	}
	return s
}

func TestCapabilityProblems(t *testing.T) {
	for _, tc := range []struct {
		name    string
		eff     uint64
		missing []string // substrings of the error; none: no error
		warn    bool
	}{
		{"the chart's set", capSet(unix.CAP_NET_ADMIN, unix.CAP_BPF, unix.CAP_PERFMON), nil, false},
		{"legacy runtime with SYS_ADMIN", capSet(unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN), nil, false},
		{"no PERFMON", capSet(unix.CAP_NET_ADMIN, unix.CAP_BPF), nil, true},
		// What Docker 20.10's nodes gave the agent: BPF and PERFMON dropped.
		{"NET_ADMIN only", capSet(unix.CAP_NET_ADMIN), []string{"CAP_BPF (or CAP_SYS_ADMIN", "legacyCapabilities=true"}, true},
		{"BPF only", capSet(unix.CAP_BPF, unix.CAP_PERFMON), []string{"CAP_NET_ADMIN"}, false},
		{"none", 0, []string{"CAP_BPF", "CAP_NET_ADMIN"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warn, err := capabilityProblems(tc.eff)
			if (err != nil) != (len(tc.missing) > 0) {
				t.Fatalf("error %v, want one naming %q", err, tc.missing)
			}
			for _, m := range tc.missing {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not name %q", err, m)
				}
			}
			if err != nil && strings.Contains(err.Error(), "memlock") {
				t.Errorf("error %q blames memlock", err)
			}
			if (warn != "") != tc.warn {
				t.Errorf("warning %q, want one: %v", warn, tc.warn)
			}
		})
	}
}

func TestEffectiveCapabilities(t *testing.T) {
	if _, err := effectiveCapabilities(); err != nil {
		t.Fatal(err)
	}
}

func TestResolveDevices(t *testing.T) {
	got, err := resolveDevices([]string{"eth9"})
	if err != nil || len(got) != 1 || got[0] != "eth9" {
		t.Fatalf("explicit devices changed: %v %v", got, err)
	}
	got, err = resolveDevices([]string{AutoDevices})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range got {
		if d == AutoDevices || d == "lo" {
			t.Errorf("detected %q in %v", d, got)
		}
	}
}
