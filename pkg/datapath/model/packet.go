// SPDX-License-Identifier: Apache-2.0

package model

import (
	"encoding/binary"
	"net/netip"
)

const (
	ethLen      = 14
	etherIPv4   = 0x0800
	etherIPv6   = 0x86dd
	ipv6HdrLen  = 40
	fragHdrLen  = 8
	nextHdrFrag = 44
	nextHdrHop  = 0
	jumboLen    = 8    // a Hop-by-Hop header of one Jumbo Payload option
	tlvJumbo    = 0xc2 // IPV6_TLV_JUMBO

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// class is what the parser makes of a packet.
type class int

const (
	// notIP: not a packet the program can read as IPv4 or IPv6 (another
	// EtherType, a header shorter than its fixed part, a bad version or
	// IHL): the stack's business, which discards what is invalid.
	notIP class = iota
	// translatable: TCP or UDP with its ports, the first (or only)
	// fragment of its datagram.
	translatable
	// laterFragment: no L4 header; the translation of its datagram's
	// first fragment applies.
	laterFragment
	// truncated: the L4 header is not all there or inconsistent.
	truncated
	// icmp: ICMP or ICMPv6, not fragmented.
	icmp
	// untranslated: addresses read, nothing the program translates
	// (the reason is in packet.why).
	untranslated
)

// packet is what the parser reads of a frame.
type packet struct {
	frame    []byte
	gsoSize  uint32
	class    class
	why      DropReason // with untranslated
	v6       bool
	src, dst netip.Addr // 16-byte form
	proto    uint8
	// hasPorts: the L4 header's ports were read (even if the rest of the
	// header turned out inconsistent).
	hasPorts     bool
	sport, dport uint16
	tcpFlags     uint8
	seq, ack     uint32
	ttl          uint8
	// l3Len is the IP header's length: IPv4 options, IPv6 with a Fragment
	// header, included. l4Len is the length after it, as the IP header
	// says (not the frame). l4HdrLen is the TCP data offset, 8 for UDP.
	l3Len, l4Len, l4HdrLen int
	// firstFrag: the first fragment of a fragmented datagram.
	firstFrag bool
	fragID    uint32
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// l4Off is the offset of the L4 header in the frame.
func (p *packet) l4Off() int { return ethLen + p.l3Len }

func (p *packet) key(dir Direction) FlowKey {
	return FlowKey{Src: netip.AddrPortFrom(p.src, p.sport), Dst: netip.AddrPortFrom(p.dst, p.dport), Proto: p.proto, Dir: dir}
}

func (p *packet) frontend() Frontend { return Frontend{VIP: p.dst, Port: p.dport, Proto: p.proto} }

func (p *packet) closing() bool { return p.proto == ProtoTCP && p.tcpFlags&(tcpFIN|tcpRST) != 0 }

func parse(pkt Packet) *packet {
	frame := pkt.Frame
	p := &packet{frame: frame, gsoSize: pkt.GSOSize}
	if len(frame) < ethLen {
		return p
	}
	switch be16(frame[12:]) {
	case etherIPv4:
		parse4(p)
	case etherIPv6:
		parse6(p)
	}
	return p
}

func parse4(p *packet) {
	ip := p.frame[ethLen:]
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[0]&0xf < 5 {
		return
	}
	ihl := int(ip[0]&0xf) * 4
	fragOff := be16(ip[6:])
	p.proto = ip[9]
	p.src = addr16(netip.AddrFrom4([4]byte(ip[12:16])))
	p.dst = addr16(netip.AddrFrom4([4]byte(ip[16:20])))
	if p.proto != ProtoTCP && p.proto != ProtoUDP && p.proto != ProtoICMP {
		p.class, p.why = untranslated, DropProtocol
		return
	}
	p.l3Len, p.ttl = ihl, ip[8]
	tot := int(be16(ip[2:]))
	if p.proto == ProtoICMP {
		if !ipv4Length(p, tot, ihl) {
			p.class = truncated
			return
		}
		// An ICMP error fits one packet: fragments are not translated.
		if fragOff&(ipMF|ipOffset) != 0 {
			p.class, p.why = untranslated, DropICMP
			return
		}
		p.class = icmp
		return
	}
	// BIG TCP: a TCP GSO packet of more than 64 KiB says 0, the length
	// being the skb's; never a fragment.
	if tot == 0 && fragOff&(ipMF|ipOffset) == 0 {
		tot = p.bigTCPLen(0)
	}
	if !ipv4Length(p, tot, ihl) {
		p.class = truncated
		return
	}
	p.fragID = uint32(be16(ip[4:]))
	if fragOff&ipOffset != 0 {
		p.class = laterFragment
		return
	}
	p.firstFrag = fragOff&ipMF != 0
	parseL4(p)
}

const (
	ipMF     = 0x2000
	ipOffset = 0x1fff
	ip6MF    = 0x0001
	ip6Off   = 0xfff8
)

// bigTCPLen is the length after the IP header's hlen bytes of a BIG TCP
// packet, whose length field says 0: the skb's. Only a TCP GSO packet is
// one (GRO merges TCP segments only beyond 64 KiB); on any other a length
// of 0 is what the header says, and 0 is returned.
func (p *packet) bigTCPLen(hlen int) int {
	if p.proto != ProtoTCP || p.gsoSize == 0 || len(p.frame) < ethLen+hlen {
		return 0
	}
	return len(p.frame) - ethLen - hlen
}

// ipv4Length sets the L4 length from the IPv4 total length; false when the
// total length is shorter than the header.
func ipv4Length(p *packet, tot, ihl int) bool {
	if tot < ihl {
		return false
	}
	p.l4Len = tot - ihl
	return true
}

// ipv6Untranslated is why an IPv6 packet whose next header (after the
// fixed one, or a leading Fragment header) is not TCP or UDP is not
// translated.
func ipv6Untranslated(next uint8) DropReason {
	switch next {
	case ProtoICMPv6:
		return DropICMP // fragmented ICMPv6
	case 0, 43, 44, 51, 60, 135, 139, 140, 253, 254:
		return DropIPv6Extension
	}
	return DropProtocol
}

func parse6(p *packet) {
	ip := p.frame[ethLen:]
	if len(ip) < ipv6HdrLen || ip[0]>>4 != 6 {
		return
	}
	p.v6 = true
	p.src = netip.AddrFrom16([16]byte(ip[8:24]))
	p.dst = netip.AddrFrom16([16]byte(ip[24:40]))
	p.l3Len, p.ttl = ipv6HdrLen, ip[7]
	p.l4Len = int(be16(ip[4:]))
	next := ip[6]
	// BIG TCP, without or with a Hop-by-Hop header of one Jumbo Payload
	// option (RFC 2675) saying the length after the fixed header (Linux
	// up to 6.19), which is kept and the packet translated after it.
	if p.l4Len == 0 && next == ProtoTCP {
		p.proto = ProtoTCP
		p.l4Len = p.bigTCPLen(ipv6HdrLen)
	} else if p.l4Len == 0 && next == nextHdrHop && p.gsoSize != 0 && len(ip) >= ipv6HdrLen+jumboLen {
		jh := ip[ipv6HdrLen:]
		p.proto = jh[0]
		n := p.bigTCPLen(ipv6HdrLen)
		p.proto = 0
		if n != 0 && jh[1] == 0 && jh[2] == tlvJumbo && jh[3] == 4 && int(be32(jh[4:])) == n && n >= jumboLen {
			p.proto = ProtoTCP
			p.l3Len += jumboLen
			p.l4Len = n - jumboLen
			parseL4(p)
			return
		}
	}
	switch {
	case next == ProtoICMPv6:
		p.proto, p.class = ProtoICMPv6, icmp
		return
	case next == nextHdrFrag:
		// The only extension header walked: a Fragment header right
		// after the fixed one.
		if len(ip) < ipv6HdrLen+fragHdrLen {
			// Cut short: malformed (dropped if to a VIP), not the
			// stack's, which would forward it without reading it.
			p.class = truncated
			return
		}
		fh := ip[ipv6HdrLen:]
		if fh[0] != ProtoTCP && fh[0] != ProtoUDP {
			p.class, p.why = untranslated, ipv6Untranslated(fh[0])
			return
		}
		p.proto, p.fragID = fh[0], be32(fh[4:])
		if p.l4Len < fragHdrLen {
			p.class = truncated
			return
		}
		p.l3Len += fragHdrLen
		p.l4Len -= fragHdrLen
		off := be16(fh[2:])
		if off&ip6Off != 0 {
			p.class = laterFragment
			return
		}
		// Offset 0 without M is an atomic fragment (RFC 6946): a whole
		// datagram.
		p.firstFrag = off&ip6MF != 0
		parseL4(p)
	case next == ProtoTCP || next == ProtoUDP:
		p.proto = next
		parseL4(p)
	default:
		p.class, p.why = untranslated, ipv6Untranslated(next)
	}
}

// parseL4 reads the TCP or UDP header: it must be within both the frame
// and the IP header's length.
func parseL4(p *packet) {
	p.class = truncated
	l4 := p.frame[min(p.l4Off(), len(p.frame)):]
	if p.proto == ProtoTCP {
		if p.l4Len < 20 || len(l4) < 20 {
			return
		}
		p.hasPorts = true
		p.sport, p.dport = be16(l4), be16(l4[2:])
		p.seq, p.ack = be32(l4[4:]), be32(l4[8:])
		p.l4HdrLen, p.tcpFlags = int(l4[12]>>4)*4, l4[13]
		if p.l4HdrLen < 20 || p.l4HdrLen > p.l4Len {
			return
		}
	} else {
		if p.l4Len < 8 || len(l4) < 8 {
			return
		}
		p.hasPorts = true
		p.sport, p.dport = be16(l4), be16(l4[2:])
		p.l4HdrLen = 8
	}
	p.class = translatable
}
