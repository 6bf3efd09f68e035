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
	if _, err := os.Stat("/proc/sys/net/bridge"); err == nil {
		out, err := Command(context.Background(), topo.LB, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables", "/proc/sys/net/bridge/bridge-nf-call-ip6tables").Output()
		if err != nil || !slices.Equal(strings.Fields(string(out)), []string{"0", "0"}) {
			t.Errorf("LB sysctls bridge-nf-call-iptables, -ip6tables: %q, %v; want 0 0", out, err)
		}
	}
	for _, ns := range []string{topo.Client, topo.Backends[0].NS} {
		out, err := Command(context.Background(), ns, "cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding").Output()
		if err != nil || !slices.Equal(strings.Fields(string(out)), []string{"0", "0"}) {
			t.Errorf("%s sysctls ip_forward, forwarding: %q, %v; want 0 0", ns, out, err)
		}
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

func TestPrivilegedRoutedTopologyNarrowsThePathToTheClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	topo, err := NewRouted(UniquePrefix(), 1, 1280)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Delete() })
	if topo.ClientIPv4 != RoutedClientIPv4 || topo.ClientIPv6 != RoutedClientIPv6 || len(topo.Namespaces()) != 4 {
		t.Errorf("client %s %s, namespaces %v: want the routed client's addresses and 4 namespaces", topo.ClientIPv4, topo.ClientIPv6, topo.Namespaces())
	}
	for _, c := range []struct {
		ns   string
		args []string
		want string
	}{
		{topo.Client, []string{"-brief", "addr"}, "10.0.1.2/24 fd00:1::2/64"},
		{topo.Router, []string{"-brief", "addr", "show", "eth0"}, "10.0.0.2/24 fd00::2/64"},
		{topo.Router, []string{"-brief", "addr", "show", "eth1"}, "10.0.1.1/24 fd00:1::1/64"},
		// The client's own link is 1500: only the router knows the
		// narrow path.
		{topo.Client, []string{"link", "show", "eth0"}, "mtu 1500"},
		{topo.Router, []string{"route", "get", "10.0.1.2"}, "mtu lock 1280"},
		{topo.Router, []string{"-6", "route", "get", "fd00:1::2"}, "mtu lock 1280"},
		{topo.Router, []string{"route", "get", "10.1.2.3"}, "via 10.0.0.1"},
		{topo.LB, []string{"route", "get", "10.0.1.2"}, "via 10.0.0.2"},
		{topo.LB, []string{"-6", "route", "get", "fd00:1::2"}, "via fd00::2"},
	} {
		out, err := exec.Command("ip", append([]string{"-n", c.ns}, c.args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip -n %s %s: %v\n%s", c.ns, strings.Join(c.args, " "), err, out)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(out)), " "), c.want) {
			t.Errorf("ip -n %s %s lacks %q:\n%s", c.ns, strings.Join(c.args, " "), c.want, out)
		}
	}
	if _, err := NewRouted("l4xbad", 1, 1500); err == nil {
		t.Error("NewRouted with a path MTU of 1500 (no narrower than the links): no error")
	}
}
