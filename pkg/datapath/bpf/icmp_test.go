// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"net/netip"
	"strings"
	"testing"
)

// ICMP types and codes of the errors in these tests.
const (
	icmpDestUnreach  = 3
	icmpPortUnreach  = 3
	icmpFragNeeded   = 4
	icmpRedirect     = 5
	icmpEcho         = 8
	icmpTimeExceeded = 11

	icmp6DestUnreach  = 1
	icmp6PacketTooBig = 2
	icmp6TimeExceeded = 3
	icmp6PortUnreach  = 4
	icmp6Echo         = 128
)

// Linux quotes as much of the packet as fits 576 bytes (IPv4) or the
// minimum IPv6 MTU.
const (
	quote4 = 576 - 20 - 8
	quote6 = 1280 - 40 - 8
)

func translated(name string, in, want []byte) step {
	return step{name: name, in: in, verdict: verdictNext, want: want}
}

func TestICMPErrors(t *testing.T) {
	payload := strings.Repeat("x", 1400)
	query4 := udp(client4, vip4, payload)
	answer4 := udp(be4a.addr, client4, "answer")
	query6 := udp(client6, vip6, payload)
	answer6 := udp(be6a.addr, client6, "answer")
	data4 := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 7, ack: 99, payload: []byte(payload)}
	withOpts := udp(client4, vip4, "hi").sport(40001)
	withOpts.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}
	router4 := netip.MustParseAddr("10.1.0.254")
	router6 := netip.MustParseAddr("fd00::fe")

	c4, v4, b4 := client4.Addr(), vip4.Addr(), be4a.addr.Addr()
	c6, v6, b6 := client6.Addr(), vip6.Addr(), be6a.addr.Addr()
	udp4Svc := service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}
	udp6Svc := service{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}}

	fragNeeded := icmpError(b4, c4, icmpDestUnreach, icmpFragNeeded, 1400, query4.to(be4a.addr).frame(), quote4)
	fragNeededOpts := icmpError(b4, c4, icmpDestUnreach, icmpFragNeeded, 1400, withOpts.to(be4a.addr).frame(), 0)
	packetTooBig := icmpError(b6, c6, icmp6PacketTooBig, 0, 1280, query6.to(be6a.addr).frame(), quote6)
	portUnreach4 := icmpError(c4, v4, icmpDestUnreach, icmpPortUnreach, 0, answer4.from(vip4).frame(), 0)

	runScenarios(t, []scenario{
		{
			name:     "ICMP frag needed from a backend is about the VIP",
			services: []service{udp4Svc},
			steps: []step{
				forward("datagram", query4, be4a.addr),
				translated("frag needed", fragNeeded,
					icmpError(v4, c4, icmpDestUnreach, icmpFragNeeded, 1400, query4.frame(), quote4)),
				// The quoted header has options: the ports are further.
				forward("datagram with IP options", withOpts, be4a.addr),
				translated("frag needed quoting IP options", fragNeededOpts,
					icmpError(v4, c4, icmpDestUnreach, icmpFragNeeded, 1400, withOpts.frame(), 0)),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 4, len(query4.frame())+len(fragNeeded)+len(withOpts.frame())+len(fragNeededOpts), nil)
			},
		},
		{
			name:     "ICMP errors about a TCP flow, with and without its checksum quoted",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}}},
			steps: []step{
				forward("segment", data4, be4a.addr),
				// RFC 792: the IP header and 8 bytes, no TCP checksum.
				translated("frag needed with an 8-byte quote",
					icmpError(b4, c4, icmpDestUnreach, icmpFragNeeded, 1400, data4.to(be4a.addr).frame(), 20+8),
					icmpError(v4, c4, icmpDestUnreach, icmpFragNeeded, 1400, data4.frame(), 20+8)),
				// A router between the load balancer and the backend:
				// the client hears it from the VIP.
				translated("time exceeded from a router",
					icmpError(router4, c4, icmpTimeExceeded, 0, 0, data4.to(be4a.addr).frame(), quote4),
					icmpError(v4, c4, icmpTimeExceeded, 0, 0, data4.frame(), quote4)),
			},
		},
		{
			name:     "ICMPv6 packet too big from a backend is about the VIP",
			services: []service{udp6Svc},
			steps: []step{
				forward("datagram", query6, be6a.addr),
				translated("packet too big", packetTooBig,
					icmpError(v6, c6, icmp6PacketTooBig, 0, 1280, query6.frame(), quote6)),
				translated("time exceeded from a router",
					icmpError(router6, c6, icmp6TimeExceeded, 0, 0, query6.to(be6a.addr).frame(), quote6),
					icmpError(v6, c6, icmp6TimeExceeded, 0, 0, query6.frame(), quote6)),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 6, 3, len(query6.frame())+2*len(packetTooBig), nil)
			},
		},
		{
			name:     "ICMP port unreachable from a client reaches the backend",
			services: []service{udp4Svc},
			steps: []step{
				forward("query", udp(client4, vip4, "q"), be4a.addr),
				reply("answer", answer4, vip4),
				translated("port unreachable", portUnreach4,
					icmpError(c4, b4, icmpDestUnreach, icmpPortUnreach, 0, answer4.frame(), 0)),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 3, len(udp(client4, vip4, "q").frame())+len(answer4.frame())+len(portUnreach4), nil)
			},
		},
		{
			name:     "ICMPv6 port unreachable from a client reaches the backend",
			services: []service{udp6Svc},
			steps: []step{
				forward("query", udp(client6, vip6, "q"), be6a.addr),
				reply("answer", answer6, vip6),
				translated("port unreachable",
					icmpError(c6, v6, icmp6DestUnreach, icmp6PortUnreach, 0, answer6.from(vip6).frame(), 0),
					icmpError(c6, b6, icmp6DestUnreach, icmp6PortUnreach, 0, answer6.frame(), 0)),
			},
		},
		{
			// Unless to a VIP: untranslated, they are dropped (see
			// TestUntranslatedTrafficToAVIPIsDropped).
			name:     "unrelated ICMP messages pass untouched",
			services: []service{udp4Svc, udp6Svc},
			steps: []step{
				forward("datagram", query4, be4a.addr),
				forward("datagram v6", query6, be6a.addr),
				pass("frag needed about another flow",
					icmpError(b4, c4, icmpDestUnreach, icmpFragNeeded, 1400, query4.sport(40001).to(be4a.addr).frame(), quote4)),
				drop("port unreachable to the VIP about another flow",
					icmpError(c4, v4, icmpDestUnreach, icmpPortUnreach, 0, udp(vip4, netip.AddrPortFrom(c4, 40001), "answer").frame(), 0)),
				pass("packet too big about another flow",
					icmpError(b6, c6, icmp6PacketTooBig, 0, 1280, query6.sport(40001).to(be6a.addr).frame(), quote6)),
				pass("an error not to the quoted packet's source",
					icmpError(b4, other4.Addr(), icmpDestUnreach, icmpFragNeeded, 1400, query4.to(be4a.addr).frame(), quote4)),
				pass("a redirect is not an error",
					icmpError(b4, c4, icmpRedirect, 1, 0, query4.to(be4a.addr).frame(), quote4)),
				drop("echo request to the VIP", icmpError(c4, v4, icmpEcho, 0, 0x00010001, query4.frame(), 8)),
				drop("ICMPv6 echo request to the VIP", icmpError(c6, v6, icmp6Echo, 0, 0x00010001, query6.frame(), 8)),
				pass("a quote shorter than 8 bytes of UDP",
					icmpError(b4, c4, icmpDestUnreach, icmpFragNeeded, 1400, query4.to(be4a.addr).frame(), 20+4)),
				pass("a quoted later fragment", func() []byte {
					// Its data where the ports would be looks like
					// the flow's: only the offset tells.
					p := []byte(payload)
					copy(p[1200-8:], []byte{0x9c, 0x40, 0x1f, 0x90})
					f := udp(client4, be4a.addr, string(p)).fragments(5, 1200)[1]
					return icmpError(b4, c4, icmpTimeExceeded, 1, 0, f, 0)
				}()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 1, len(query4.frame()), nil)
				wantStats(t, d, 6, 1, len(query6.frame()), nil)
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropICMP: 3})
			},
		},
	})
}
