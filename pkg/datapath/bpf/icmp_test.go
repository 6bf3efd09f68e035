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

// An ICMP error that goes to a backend is checked as a packet of the flow
// it quotes would be: its client (the quoted packet's destination) must be
// in the service's source ranges, now, not only when the flow began. The
// error's own source is not checked: a router on the client's path sends
// frag needed from its own address, and a sender that spoofs does not
// spoof a denied address.
func TestICMPErrorsCheckedLikeTheirFlow(t *testing.T) {
	admitted4 := client4 // 198.51.100.7, in 198.51.100.7/32 throughout
	denied4 := netip.MustParseAddrPort("198.51.100.9:40000")
	admitted6 := client6
	denied6 := netip.MustParseAddrPort("[2001:db8:1::9]:40000")
	router4 := netip.MustParseAddr("203.0.113.254")

	query := func(c, vip netip.AddrPort) segment { return udp(c, vip, "q") }
	answer := func(be backend, c netip.AddrPort) segment { return udp(be.addr, c, "answer") }
	// The error a client (or a router on its path) sends about the
	// answer it got from the VIP, as it arrives and as the backend gets it.
	portUnreach := func(from netip.Addr, be backend, vip, c netip.AddrPort, typ, code uint8, rest uint32) (in, out []byte) {
		a := answer(be, c)
		in = icmpError(from, vip.Addr(), typ, code, rest, a.from(vip).frame(), 0)
		out = icmpError(from, be.addr.Addr(), typ, code, rest, a.frame(), 0)
		return in, out
	}
	fromAdmitted4, toBackend4 := portUnreach(admitted4.Addr(), be4a, vip4, admitted4, icmpDestUnreach, icmpPortUnreach, 0)
	fromDenied4, _ := portUnreach(denied4.Addr(), be4a, vip4, denied4, icmpDestUnreach, icmpPortUnreach, 0)
	fromRouter4, routerToBackend4 := portUnreach(router4, be4a, vip4, admitted4, icmpDestUnreach, icmpFragNeeded, 576)
	fromRouterDenied4, _ := portUnreach(router4, be4a, vip4, denied4, icmpDestUnreach, icmpFragNeeded, 576)
	fromAdmitted6, toBackend6 := portUnreach(admitted6.Addr(), be6a, vip6, admitted6, icmp6DestUnreach, icmp6PortUnreach, 0)
	fromDenied6, _ := portUnreach(denied6.Addr(), be6a, vip6, denied6, icmp6DestUnreach, icmp6PortUnreach, 0)

	flow := func(c, vip netip.AddrPort, be backend) []step {
		return []step{
			forward("query from "+c.String(), query(c, vip), be.addr),
			reply("answer to "+c.String(), answer(be, c), vip),
		}
	}
	narrow := func(name string, frame []byte, id uint32, p netip.Prefix) step {
		s := drop(name, frame)
		s.before = func(d *datapath) { d.denySource(id, p) }
		return s
	}
	var steps4 []step
	steps4 = append(steps4, flow(admitted4, vip4, be4a)...)
	steps4 = append(steps4, flow(denied4, vip4, be4a)...)
	steps4 = append(steps4,
		// The range of denied4 is withdrawn: its flow's packets and
		// the errors about it are dropped, the others' pass.
		narrow("port unreachable from a client no longer admitted", fromDenied4, 1, netip.MustParsePrefix("198.51.100.9/32")),
		drop("frag needed from a router about that client's flow", fromRouterDenied4),
		drop("that client's next query", query(denied4, vip4).frame()),
		translated("port unreachable from an admitted client", fromAdmitted4, toBackend4),
		translated("frag needed from a router about an admitted client's flow", fromRouter4, routerToBackend4),
	)
	var steps6 []step
	steps6 = append(steps6, flow(admitted6, vip6, be6a)...)
	steps6 = append(steps6, flow(denied6, vip6, be6a)...)
	steps6 = append(steps6,
		narrow("port unreachable from a client no longer admitted", fromDenied6, 6, netip.MustParsePrefix("2001:db8:1::9/128")),
		translated("port unreachable from an admitted client", fromAdmitted6, toBackend6),
	)
	allow := func(steps []step, ranges map[uint32][]string) []step {
		first := steps[0]
		first.before = func(d *datapath) {
			for id, ps := range ranges {
				for _, p := range ps {
					d.allowSource(id, netip.MustParsePrefix(p))
				}
			}
		}
		steps[0] = first
		return steps
	}
	flowBytes := func(c, vip netip.AddrPort, be backend) int {
		return len(query(c, vip).frame()) + len(answer(be, c).frame())
	}
	runScenarios(t, []scenario{
		{
			name:     "IPv4",
			services: []service{{id: 1, vip: vip4, proto: protoUDP, flags: svcSourceRanges, backends: []backend{be4a}}},
			steps:    allow(steps4, map[uint32][]string{1: {"198.51.100.7/32", "198.51.100.9/32"}}),
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 6, flowBytes(admitted4, vip4, be4a)+flowBytes(denied4, vip4, be4a)+len(fromAdmitted4)+len(fromRouter4),
					map[int]uint64{dropSourceRange: 3})
			},
		},
		{
			name:     "IPv6",
			services: []service{{id: 6, vip: vip6, proto: protoUDP, flags: svcSourceRanges, backends: []backend{be6a}}},
			steps:    allow(steps6, map[uint32][]string{6: {"2001:db8:1::7/128", "2001:db8:1::9/128"}}),
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 6, 5, flowBytes(admitted6, vip6, be6a)+flowBytes(denied6, vip6, be6a)+len(fromAdmitted6),
					map[int]uint64{dropSourceRange: 1})
			},
		},
	})
}
