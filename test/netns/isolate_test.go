// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// The tests run in a network namespace of their own, whatever the host's
// forwarding and routes: forwarding off, only lo, no route but lo's.
func TestPrivilegedTestsRunInANamespaceOfTheirOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tests run in namespaces of their own as root only")
	}
	for _, kv := range isolatedSysctls {
		k, want, _ := strings.Cut(kv, "=")
		if got, err := Sysctl(k); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %s", k, got, err, want)
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" || ifaces[0].Flags&net.FlagUp == 0 {
		t.Errorf("interfaces %v: want lo alone, up", ifaces)
	}
	for _, fam := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", fam, "route", "show", "table", "main").CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s route: %v\n%s", fam, err, out)
		}
		if r := strings.TrimSpace(string(out)); r != "" && !(fam == "-6" && strings.HasPrefix(r, "::1 dev lo") && !strings.Contains(r, "\n")) {
			t.Errorf("ip %s route show table main: %q; want no route (::1 on lo for IPv6)", fam, r)
		}
	}
	// ip netns add names its namespaces in a /run/netns of the tests' own.
	if entries, err := os.ReadDir(runDir); err != nil || len(entries) != 0 {
		t.Errorf("%s: %v, %v; want an empty directory", runDir, entries, err)
	}
	if os.Getpid() != 1 {
		t.Errorf("pid %d: want 1, the init of a PID namespace of the tests' own", os.Getpid())
	}
	// No bpffs of the host's (or of another test's, mounted there).
	if m := bpfMounts(t); len(m) != 0 {
		t.Errorf("bpffs mounts %q: want none of the host's", m)
	}
}

// detachBPFFS leaves no bpffs mounted, two on one point included.
func TestPrivilegedDetachBPFFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts")
	}
	dir := filepath.Join(t.TempDir(), "a b")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := syscall.Mount("bpf", dir, "bpf", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	if m := bpfMounts(t); len(m) != 2 || m[0] != dir {
		t.Fatalf("bpffs mounts %q: want %s twice", m, dir)
	}
	if err := detachBPFFS(); err != nil {
		t.Fatal(err)
	}
	if m := bpfMounts(t); len(m) != 0 {
		t.Errorf("bpffs mounts %q after detachBPFFS: want none", m)
	}
}

// bpfMounts are the mount points of the bpffs mounts this process sees.
func bpfMounts(t *testing.T) []string {
	t.Helper()
	points, err := Mounts("bpf", "")
	if err != nil {
		t.Fatal(err)
	}
	return points
}

// Add's namespace has the settings asked for, and Do runs on a thread in it.
func TestPrivilegedAddSetsWhatItIsAsked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	ns := Add(t, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=2")
	Do(t, ns, func() {
		for k, want := range map[string]string{"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "2"} {
			if got, err := Sysctl(k); err != nil || got != want {
				t.Errorf("in %s: %s = %q, %v; want %s", ns, k, got, err, want)
			}
		}
	})
	if got, _ := Sysctl("net.ipv4.ip_forward"); got != "0" {
		t.Errorf("after Do: ip_forward %q, want the test's own 0", got)
	}
}
