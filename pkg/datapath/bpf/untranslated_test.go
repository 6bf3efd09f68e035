// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// IPv6 next-header numbers of the extension headers the tests send.
const (
	protoHopByHop = 0
	protoDestOpts = 60
	protoGRE      = 47
	protoSCTP     = 132
)

// rawIP is an IP packet of protocol proto and payload from src to dst.
func rawIP(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	return ether(clientMAC, lbMAC, ipPacket(src, dst, proto, payload, ipv4Opts{fragOff: 0x4000}))
}

// withExtension is seg's IPv6 packet with an 8-byte extension header of
// type ext (Hop-by-Hop or Destination Options, padded with PadN) before its
// TCP or UDP header.
func withExtension(seg segment, ext uint8) []byte {
	h := []byte{seg.proto, 0, 1, 4, 0, 0, 0, 0} // next header, length 0 (8 bytes), PadN of 4
	return rawIP(seg.src.Addr(), seg.dst.Addr(), ext, append(h, seg.l4()...))
}

// icmpMessage is an ICMP or ICMPv6 message of type typ from src to dst.
func icmpMessage(src, dst netip.Addr, typ uint8) []byte {
	msg := []byte{typ, 0, 0, 0, 0x12, 0x34, 0, 1, 'p', 'i', 'n', 'g'}
	if src.Is4() {
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
		return rawIP(src, dst, protoICMP, msg)
	}
	binary.BigEndian.PutUint16(msg[2:], checksum(pseudoHeader(src, dst, protoICMPv6, len(msg)), msg))
	return rawIP(src, dst, protoICMPv6, msg)
}

const (
	icmp6NeighborSol   = 135
	removedVIPLifetime = 60 // seconds a test's removed VIP is dropped for
)

// Whatever is addressed to a VIP and not translated is dropped and counted
// by reason: passed to the stack, it would be forwarded to the node's
// default route, which on an edge node routes the VIP back to the node,
// until the TTL runs out. Others' packets of the same kinds pass.
func TestUntranslatedTrafficToAVIPIsDropped(t *testing.T) {
	other6 := netip.MustParseAddrPort("[2001:db8:99::1]:80")
	svc4 := service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}}
	svc6 := service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}}
	runScenarios(t, []scenario{
		{
			name:     "other IP protocols",
			services: []service{svc4, svc6},
			steps: []step{
				drop("GRE to a VIP", rawIP(client4.Addr(), vip4.Addr(), protoGRE, make([]byte, 8))),
				drop("SCTP to a VIP", rawIP(client6.Addr(), vip6.Addr(), protoSCTP, make([]byte, 12))),
				pass("GRE to another address", rawIP(client4.Addr(), other4.Addr(), protoGRE, make([]byte, 8))),
				pass("SCTP to another address", rawIP(client6.Addr(), other6.Addr(), protoSCTP, make([]byte, 12))),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropProtocol: 2})
			},
		},
		{
			name:     "IPv6 extension headers before TCP or UDP",
			services: []service{svc6},
			steps: []step{
				drop("Destination Options, TCP", withExtension(syn(client6, vip6), protoDestOpts)),
				drop("Hop-by-Hop, UDP", withExtension(udp(client6, vip6, "x"), protoHopByHop)),
				pass("Destination Options to another address", withExtension(syn(client6, other6), protoDestOpts)),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropExtension: 2})
				wantStats(t, d, 6, 0, 0, nil)
			},
		},
		{
			// Echo is dropped, not answered: the node does not own the
			// VIP, and an answer would tell of the node, not of the
			// service's backends; one more answer sent from BPF would
			// also be one more reflector for spoofed sources.
			name:     "ICMP to a live VIP: echo and errors of no flow",
			services: []service{svc4, svc6},
			steps: []step{
				drop("echo to an IPv4 VIP", icmpMessage(client4.Addr(), vip4.Addr(), icmpEcho)),
				drop("echo to an IPv6 VIP", icmpMessage(client6.Addr(), vip6.Addr(), icmp6Echo)),
				drop("an error quoting no flow", icmpError(client4.Addr(), vip4.Addr(), icmpDestUnreach, icmpPortUnreach, 0,
					udp(vip4, client4, "x").frame(), 0)),
				drop("an IPv6 error quoting no flow", icmpError(client6.Addr(), vip6.Addr(), icmp6DestUnreach, icmp6PortUnreach, 0,
					udp(vip6, client6, "x").frame(), 0)),
				// Neighbour discovery is the stack's: a router's NUD
				// probe to an address the node answers for must pass.
				pass("neighbour solicitation to an IPv6 VIP", icmpMessage(client6.Addr(), vip6.Addr(), icmp6NeighborSol)),
				pass("echo to another address", icmpMessage(client4.Addr(), other4.Addr(), icmpEcho)),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropICMP: 4})
			},
		},
		{
			name:     "a VIP just removed, for its grace period",
			services: []service{svc4, svc6},
			steps: []step{
				func() step {
					s := drop("TCP to the removed IPv4 VIP", syn(client4, vip4).frame())
					s.before = func(d *datapath) {
						d.removeService(svc4, monotonicNow(t)+removedVIPLifetime*1e9)
						d.removeService(svc6, monotonicNow(t)+removedVIPLifetime*1e9)
					}
					return s
				}(),
				drop("UDP to the removed IPv6 VIP", udp(client6, vip6, "x").frame()),
				drop("GRE to the removed IPv4 VIP", rawIP(client4.Addr(), vip4.Addr(), protoGRE, make([]byte, 8))),
				drop("echo to the removed IPv6 VIP", icmpMessage(client6.Addr(), vip6.Addr(), icmp6Echo)),
				func() step {
					// Its grace period over, the address is the stack's.
					s := pass("TCP to the IPv4 VIP removed long ago", syn(client4, vip4).frame())
					s.before = func(d *datapath) { d.setRemovedVIP(vip4.Addr(), monotonicNow(t)-1) }
					return s
				}(),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropRemovedVIP: 4})
			},
		},
	})
}
