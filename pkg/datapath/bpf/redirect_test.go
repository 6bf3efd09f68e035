// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"net/netip"
	"os/exec"
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// A translated packet goes straight to its next hop (fib_forward): what
// the FIB of the namespace BPF_PROG_RUN runs in says decides between
// TCX_REDIRECT with the TTL or hop limit one lower, and TCX_NEXT with the
// packet as the stack would get it before.

// routedNetns creates a network namespace that forwards and has routes to
// the tests' clients (198.51.100.0/24, 2001:db8:1::/64) and backends
// (10.1.0.0/24, fd00::/64) through two veth pairs, and no default route.
// It is deleted when the test ends.
func routedNetns(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skipf("needs ip(8) from iproute2: %v", err)
	}
	ns := netns.Add(tb, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	for _, l := range []struct{ dev, v4, v6 string }{
		{"lan", "10.1.0.254/24", "fd00::fe/64"},
		{"wan", "198.51.100.254/24", "2001:db8:1::fe/64"},
	} {
		netns.IP(tb, "-n", ns, "link", "add", l.dev, "type", "veth", "peer", "name", l.dev+"p")
		netns.IP(tb, "-n", ns, "link", "set", l.dev+"p", "up")
		netns.IP(tb, "-n", ns, "link", "set", l.dev, "up")
		netns.IP(tb, "-n", ns, "addr", "add", l.v4, "dev", l.dev)
		netns.IP(tb, "-n", ns, "addr", "add", l.v6, "dev", l.dev, "nodad")
	}
	return ns
}

func TestForwardToNextHop(t *testing.T) {
	d := newDatapathWith(t, loadOptions{fibRedirect: true})
	ns := routedNetns(t)
	unrouted4 := backend{id: 21, addr: netip.MustParseAddrPort("10.9.9.9:8080")}
	unrouted6 := backend{id: 22, addr: netip.MustParseAddrPort("[fd09::9]:8080")}
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	d.addService(service{id: 2, vip: vip4, proto: protoUDP, backends: []backend{unrouted4}})
	d.addService(service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}})
	d.addService(service{id: 7, vip: vip6, proto: protoUDP, backends: []backend{unrouted6}})

	ttl := func(s segment, ttl uint8) segment { s.ttl = ttl; return s }
	data := func(src, dst netip.AddrPort) segment {
		return segment{src: src, dst: dst, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 5001, payload: []byte("data")}
	}
	for _, fam := range []struct {
		name              string
		client, vip       netip.AddrPort
		backend, unrouted netip.AddrPort
	}{
		{"IPv4", client4, vip4, be4a.addr, unrouted4.addr},
		{"IPv6", client6, vip6, be6a.addr, unrouted6.addr},
	} {
		t.Run(fam.name, func(t *testing.T) {
			fwd := data(fam.client, fam.vip)
			answer := data(fam.backend, fam.client)
			lastHop := ttl(data(netip.AddrPortFrom(fam.client.Addr(), 40001), fam.vip), 1)
			toUnrouted := udp(fam.client, fam.vip, "hello")
			steps := []step{
				{name: "to the backend's next hop, TTL down by one", in: syn(fam.client, fam.vip).frame(),
					verdict: verdictRedirect, want: ttl(syn(fam.client, fam.backend), 63).frame()},
				{name: "the flow's next packet too", in: fwd.frame(),
					verdict: verdictRedirect, want: ttl(fwd.to(fam.backend), 63).frame()},
				{name: "the backend's answer to the client's next hop", in: answer.frame(),
					verdict: verdictRedirect, want: ttl(answer.from(fam.vip), 63).frame()},
				{name: "TTL 1 is the stack's, which sends time exceeded", in: lastHop.frame(),
					verdict: verdictNext, want: lastHop.to(fam.backend).frame()},
				{name: "a backend with no route is the stack's", in: toUnrouted.frame(),
					verdict: verdictNext, want: toUnrouted.to(fam.unrouted).frame()},
			}
			netns.Do(t, ns, func() {
				for _, s := range steps {
					verdict, out := d.run(s.in)
					out = out[:len(s.want)]
					if verdict != s.verdict {
						t.Errorf("%s: verdict %d, want %d", s.name, int32(verdict), int32(s.verdict))
					}
					if string(out) != string(s.want) {
						t.Errorf("%s:\n got %x\nwant %x", s.name, out, s.want)
					}
					verifyChecksums(t, s.name, out)
				}
			})
		})
	}
}

// Without fib_redirect (the harness's default), the same packets in the
// same namespace go on to the stack untouched but for the translation.
func TestForwardToNextHopOff(t *testing.T) {
	d := newDatapath(t)
	ns := routedNetns(t)
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	netns.Do(t, ns, func() {
		verdict, out := d.run(syn(client4, vip4).frame())
		want := syn(client4, be4a.addr).frame()
		if verdict != verdictNext || string(out[:len(want)]) != string(want) {
			t.Errorf("verdict %d, packet %x; want TCX_NEXT and %x", int32(verdict), out[:len(want)], want)
		}
	})
}
