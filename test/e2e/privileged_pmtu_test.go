// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// clientPathMTU is the MTU of the router's route to the client in the
// routed topology; every link is 1500.
const clientPathMTU = 1280

// Path MTU discovery through a VIP. A router between the client and the LB
// forwards to the client over a path narrower than the links, so the
// backends' full-sized TCP segments (MSS from the client's 1500 link, DF
// set) do not fit: the router answers each with ICMP "fragmentation
// needed" / ICMPv6 "packet too big", sent to the segment's source, the VIP.
// Only when the datapath translates that error back to the flow's backend
// (outer destination, and the quoted packet inside) does the backend lower
// its path MTU and resend smaller; otherwise the answer stalls and the flow
// times out.
func TestPrivilegedPathMTUDiscoveryThroughAVIP(t *testing.T) {
	e := newLBEnvOn(t, func(prefix string) (*netns.Topology, error) {
		return netns.NewRouted(prefix, 3, clientPathMTU)
	})
	clients := []netip.Addr{e.topo.ClientIPv4, e.topo.ClientIPv6}

	// The topology alone: b2, behind no VIP, gets the router's errors
	// itself and learns the narrow path, so a large answer arrives. The
	// path MTU is per destination and per backend namespace, so b0 and b1,
	// which stay silent until they answer through a VIP, learn nothing
	// from it.
	direct := e.topo.Backends[2]
	for _, addr := range []netip.Addr{direct.IPv4, direct.IPv6} {
		r := probe(t, e.bin, e.topo.Client, netip.AddrPortFrom(addr, 8080).String(), "tcp", 10, "--size", "65536", "--timeout", "5s")
		t.Logf("without a VIP: %s", r)
		if r.Answered != 10 {
			t.Fatalf("64 KiB straight from %s (no VIP, plain PMTU discovery) did not arrive in full: the topology is broken, not the datapath: %s", addr, r)
		}
	}
	for _, client := range clients {
		if mtu := pathMTU(t, direct.NS, client); mtu != clientPathMTU {
			t.Fatalf("b2 answered %s directly but its path MTU to it is %d, want %d: the router did not narrow the path", client, mtu, clientPathMTU)
		}
		for _, b := range e.topo.Backends[:2] {
			if mtu := pathMTU(t, b.NS, client); mtu != 0 {
				t.Fatalf("%s knows a path MTU of %d to %s before any traffic", b.NS, mtu, client)
			}
		}
	}

	fe4, fe6 := tcp("10.1.2.50", 8080), tcp("fd00:10::50", 8080)
	e.serve(t, svc("pmtu4", fe4).with(v4(0, 8080), v4(1, 8080)), svc("pmtu6", fe6).with(v6(0, 8080), v6(1, 8080)))
	routerBefore := icmpCounters(t, e.topo.Router)
	for _, fe := range []frontend{fe4, fe6} {
		r := e.probe(t, fe, 30, "--size", "65536", "--timeout", "3s")
		if r.Answered != 30 || len(r.Backends) != 2 {
			t.Errorf("%s: want all 30 flows of 64 KiB echoed in full over the narrow path, by b0 and b1; got %s", fe, r)
		}
	}
	t.Logf("router %s sent, during the VIP flows: %s", e.topo.Router, icmpCounters(t, e.topo.Router).since(routerBefore))
	for _, client := range clients {
		for _, b := range e.topo.Backends[:2] {
			if mtu := pathMTU(t, b.NS, client); mtu != clientPathMTU {
				t.Errorf("%s's path MTU to %s is %d after answering through the VIP, want %d: the router's ICMP error about the VIP never reached it",
					b.NS, client, mtu, clientPathMTU)
			}
		}
	}
}

// pathMTU is the path MTU namespace ns has learned towards dst (`ip route
// get`), 0 when it has learned none.
func pathMTU(t *testing.T, ns string, dst netip.Addr) int {
	t.Helper()
	args := []string{"-n", ns, "route", "get", dst.String()}
	if dst.Is6() {
		args = append([]string{"-6"}, args...)
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	f := strings.Fields(string(out))
	for i := range len(f) - 1 {
		if f[i] == "mtu" {
			mtu, err := strconv.Atoi(f[i+1])
			if err != nil {
				t.Fatalf("ip %s: mtu %q: %v", strings.Join(args, " "), f[i+1], err)
			}
			return mtu
		}
	}
	return 0
}

// icmpErrors counts the ICMP errors about a too large packet a namespace
// has sent (/proc/net/snmp, /proc/net/snmp6).
type icmpErrors struct{ unreachable, tooBig int }

func icmpCounters(t *testing.T, ns string) icmpErrors {
	t.Helper()
	out, err := netns.Command(context.Background(), ns, "cat", "/proc/net/snmp", "/proc/net/snmp6").Output()
	if err != nil {
		t.Fatalf("reading the ICMP counters of %s: %v", ns, err)
	}
	var c icmpErrors
	var header []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "Icmp6OutPktTooBigs":
			c.tooBig, _ = strconv.Atoi(f[1])
		case len(f) > 1 && f[0] == "Icmp:" && header == nil:
			header = f
		case len(f) > 1 && f[0] == "Icmp:":
			for i, name := range header {
				if name == "OutDestUnreachs" && i < len(f) {
					c.unreachable, _ = strconv.Atoi(f[i])
				}
			}
		}
	}
	return c
}

func (c icmpErrors) since(before icmpErrors) string {
	return fmt.Sprintf("%d ICMP destination unreachable (fragmentation needed), %d ICMPv6 packet too big",
		c.unreachable-before.unreachable, c.tooBig-before.tooBig)
}
