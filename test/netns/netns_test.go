// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestPrivilegedTopologyIsCreatedAndDeletedWhole(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	topo, err := New(UniquePrefix(), 3)
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			topo.Delete()
		}
	})

	for ns, want := range map[string][]string{
		topo.Client:         {"10.0.0.2/24", "fd00::2/64"},
		topo.LB:             {"10.0.0.1/24", "fd00::1/64", "192.168.1.1/24", "fd01::1/64"},
		topo.Backends[2].NS: {"192.168.1.12/24", "fd01::12/64"},
	} {
		out, err := exec.Command("ip", "-n", ns, "-brief", "addr").CombinedOutput()
		if err != nil {
			t.Fatalf("ip -n %s addr: %v\n%s", ns, err, out)
		}
		for _, a := range want {
			if !strings.Contains(string(out), a) {
				t.Errorf("%s lacks %s:\n%s", ns, a, out)
			}
		}
	}
	out, err := Command(context.Background(), topo.LB, "cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding", "/proc/sys/net/ipv4/conf/br0/rp_filter").Output()
	if err != nil || !slices.Equal(strings.Fields(string(out)), []string{"1", "1", "0"}) {
		t.Errorf("LB sysctls ip_forward, forwarding, br0 rp_filter: %q, %v; want 1 1 0", out, err)
	}

	// A process left in a namespace does not keep it alive.
	sleeper := Command(context.Background(), topo.Backends[0].NS, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	if err := topo.Delete(); err != nil {
		t.Fatal(err)
	}
	deleted = true
	sleeper.Wait()
	list, _ := exec.Command("ip", "netns", "list").Output()
	for _, ns := range topo.Namespaces() {
		if slices.Contains(strings.Fields(string(list)), ns) {
			t.Errorf("namespace %s is still there after Delete", ns)
		}
	}
}

func TestNewRefusesABadNumberOfBackends(t *testing.T) {
	for _, n := range []int{0, 91} {
		if _, err := New("l4xbad", n); err == nil {
			t.Errorf("New with %d backends: no error", n)
		}
	}
}
