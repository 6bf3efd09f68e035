// SPDX-License-Identifier: Apache-2.0

package model

import (
	"encoding/binary"
	"net/netip"
)

// icmpv6QuoteMax: an ICMPv6 error fits the minimum IPv6 MTU (RFC 4443
// 2.4): 1280 - 40 - 8 bytes of quote.
const icmpv6QuoteMax = 1232

// RejectLimit is a token bucket of refusals, of one CPU (each keeps its
// own, with its share of the node's rate), kept as one time in the form
// of GCRA's virtual scheduling: one refusal per Interval, up to
// Burst/Interval of them at once. Burst 0: none at all.
type RejectLimit struct {
	Interval, Burst uint64 // ns
}

// allowed takes one refusal from the bucket at now, if there is one.
func (d *Datapath) rejectAllowed(now uint64) bool {
	l := d.RejectLimit
	if l.Burst == 0 {
		return false
	}
	tat := max(d.State.RejectTAT, now)
	// A bucket further ahead than this limit allows was left by a larger
	// one (the map outlives the agent): it is this limit's empty bucket,
	// not days without refusals.
	if tat-now > l.Burst {
		tat = now + l.Burst
		d.State.RejectTAT = tat
	}
	if tat+l.Interval-now > l.Burst {
		return false
	}
	d.State.RejectTAT = tat + l.Interval
	return true
}

// refuse refuses a new flow at once rather than letting the client time
// out: TCP gets a RST (never for a RST), UDP an ICMP or ICMPv6 port
// unreachable; the refusal leaves by the interface the packet came in on,
// to its sender. Refusals answer whatever source a packet names: beyond
// the reject limit the packet is dropped (counted apart), so that a flood
// of spoofed sources is not reflected onto its victims. Nor is a refusal
// sent to a source that names no single host (RFC 1122 3.2.2, RFC 4443
// 2.4 e): it would reach many hosts, or none.
func (d *Datapath) refuse(p *packet, out []byte, svcID uint32, now uint64, why string) Result {
	if p.proto == ProtoTCP && p.tcpFlags&tcpRST != 0 {
		d.State.countDrop(svcID, DropNoBackend)
		return Result{Drop, out, why + ": a RST is never answered"}
	}
	if !unicastSource(p.src, p.v6) {
		d.State.countDrop(svcID, DropNoBackend)
		return Result{Drop, out, why + ": the source is not one host"}
	}
	if !d.rejectAllowed(now) {
		d.State.countDrop(svcID, DropRejectLimit)
		return Result{Drop, out, why + ": over the reject limit"}
	}
	d.State.countDrop(svcID, DropNoBackend)
	var f []byte
	if p.proto == ProtoTCP {
		f = rst(p)
	} else {
		if f = portUnreachable(p); f == nil {
			return Result{Drop, out, why + ": too short to quote"}
		}
	}
	return Result{Redirect, f, why + ", refused"}
}

// swappedEth is the frame's Ethernet header back to its sender.
func swappedEth(p *packet) []byte {
	e := append([]byte(nil), p.frame[:ethLen]...)
	copy(e[0:6], p.frame[6:12])
	copy(e[6:12], p.frame[0:6])
	return e
}

// ipv4Header is a header of 20 bytes from the VIP to the client.
func ipv4Header(p *packet, proto uint8, payload int, df bool) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	put16(h[2:], uint16(20+payload))
	if df {
		put16(h[6:], 0x4000)
	}
	h[8], h[9] = 64, proto
	copy(h[12:], addrBytes(p.dst, false))
	copy(h[16:], addrBytes(p.src, false))
	put16(h[10:], checksum(h))
	return h
}

func ipv6Header(p *packet, next uint8, payload int) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	put16(h[4:], uint16(payload))
	h[6], h[7] = next, 64
	copy(h[8:], addrBytes(p.dst, true))
	copy(h[24:], addrBytes(p.src, true))
	return h
}

// pseudo is the L4 pseudo-header of a packet from the VIP to the client.
func pseudo(p *packet, proto uint8, n int) []byte {
	if !p.v6 {
		b := append(addrBytes(p.dst, false), addrBytes(p.src, false)...)
		return append(b, 0, proto, byte(n>>8), byte(n))
	}
	b := append(addrBytes(p.dst, true), addrBytes(p.src, true)...)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, 0, 0, 0, proto)
}

// rst is the RFC 793 reset of a segment: with an ACK it takes its
// sequence number from it, without, it acknowledges the segment.
func rst(p *packet) []byte {
	t := make([]byte, 20)
	put16(t[0:], p.dport)
	put16(t[2:], p.sport)
	t[12] = 5 << 4
	if p.tcpFlags&tcpACK != 0 {
		binary.BigEndian.PutUint32(t[4:], p.ack)
		t[13] = tcpRST
	} else {
		seglen := uint32(p.l4Len - p.l4HdrLen)
		if p.tcpFlags&tcpSYN != 0 {
			seglen++
		}
		if p.tcpFlags&tcpFIN != 0 {
			seglen++
		}
		binary.BigEndian.PutUint32(t[8:], p.seq+seglen)
		t[13] = tcpRST | tcpACK
	}
	put16(t[16:], checksum(pseudo(p, ProtoTCP, len(t)), t))
	f := swappedEth(p)
	if p.v6 {
		f = append(f, ipv6Header(p, ProtoTCP, len(t))...)
	} else {
		f = append(f, ipv4Header(p, ProtoTCP, len(t), true)...)
	}
	return append(f, t...)
}

// portUnreachable quotes, for IPv4, the IP header and the first 8 bytes of
// its payload (RFC 792); for IPv6 as much of the packet as fits the
// minimum MTU. nil when the packet is too short to quote.
func portUnreachable(p *packet) []byte {
	var quote []byte
	icmp := make([]byte, 8)
	f := swappedEth(p)
	if !p.v6 {
		quote = p.frame[ethLen : ethLen+p.l3Len+8]
		icmp[0], icmp[1] = 3, 3
		put16(icmp[2:], checksum(icmp, quote))
		f = append(f, ipv4Header(p, ProtoICMP, len(icmp)+len(quote), false)...)
	} else {
		if len(p.frame) < ethLen+ipv6HdrLen+8 {
			return nil
		}
		n := min(p.l3Len+p.l4Len, len(p.frame)-ethLen, icmpv6QuoteMax)
		quote = p.frame[ethLen : ethLen+n]
		icmp[0], icmp[1] = 1, 4
		put16(icmp[2:], checksum(pseudo(p, ProtoICMPv6, len(icmp)+len(quote)), icmp, quote))
		f = append(f, ipv6Header(p, ProtoICMPv6, len(icmp)+len(quote))...)
	}
	f = append(f, icmp...)
	return append(f, quote...)
}

// unicastSource: not IPv4 0/8, multicast, class E or the limited
// broadcast, not IPv6 unspecified or multicast. By the packet's family:
// src is in its 16-byte form, and an IPv6 packet from an IPv4-mapped
// address is judged by its IPv6 form (::ffff:224.0.0.1 is no multicast).
func unicastSource(src netip.Addr, v6 bool) bool {
	if !v6 {
		b := src.Unmap().As4()
		return b[0] != 0 && b[0] < 224
	}
	b := src.As16()
	return b[0] != 0xff && b != [16]byte{}
}
