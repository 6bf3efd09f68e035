// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// Packets are built by hand, with checksums computed from scratch (RFC
// 1071), so that a rewritten packet is checked against an independent
// construction rather than against the kernel's incremental updates.

const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	// protoFragment is the IPv6 Fragment header's next-header number.
	protoFragment = 44

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

var (
	clientMAC = []byte{0x02, 0, 0, 0, 0, 0x01}
	lbMAC     = []byte{0x02, 0, 0, 0, 0, 0x02}
)

// checksum is the Internet checksum (RFC 1071) of the concatenated parts.
// Parts of odd length are only allowed last.
func checksum(parts ...[]byte) uint16 {
	var sum uint32
	for _, p := range parts {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(p[i])<<8 | uint32(p[i+1])
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func pseudoHeader(src, dst netip.Addr, proto uint8, length int) []byte {
	var b []byte
	if src.Is4() {
		b = append(b, src.AsSlice()...)
		b = append(b, dst.AsSlice()...)
		b = append(b, 0, proto)
		return binary.BigEndian.AppendUint16(b, uint16(length))
	}
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	b = binary.BigEndian.AppendUint32(b, uint32(length))
	return append(b, 0, 0, 0, proto)
}

// segment is one TCP or UDP packet from src to dst.
type segment struct {
	src, dst netip.AddrPort
	proto    uint8
	flags    uint8 // TCP
	seq, ack uint32
	payload  []byte
	// noUDPChecksum sends an IPv4 UDP datagram without checksum (0).
	noUDPChecksum bool
	// ipOptions are appended to the IPv4 header (a multiple of 4 bytes).
	ipOptions []byte
	// fragOff is the IPv4 flags and fragment offset field (DF if zero).
	fragOff uint16
	// ttl is the IPv4 TTL or IPv6 hop limit (64 if zero).
	ttl uint8
}

func (s segment) l4() []byte {
	var b []byte
	b = binary.BigEndian.AppendUint16(b, s.src.Port())
	b = binary.BigEndian.AppendUint16(b, s.dst.Port())
	if s.proto == protoTCP {
		b = binary.BigEndian.AppendUint32(b, s.seq)
		b = binary.BigEndian.AppendUint32(b, s.ack)
		b = append(b, 5<<4, s.flags)
		b = binary.BigEndian.AppendUint16(b, 65535) // window
		b = append(b, 0, 0, 0, 0)                   // checksum, urgent pointer
		b = append(b, s.payload...)
		csum := checksum(pseudoHeader(s.src.Addr(), s.dst.Addr(), protoTCP, len(b)), b)
		binary.BigEndian.PutUint16(b[16:], csum)
		return b
	}
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(s.payload)))
	b = append(b, 0, 0)
	b = append(b, s.payload...)
	if s.src.Addr().Is4() && s.noUDPChecksum {
		return b
	}
	csum := checksum(pseudoHeader(s.src.Addr(), s.dst.Addr(), protoUDP, len(b)), b)
	if csum == 0 {
		csum = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:], csum)
	return b
}

// frame is the segment as it arrives from the client's side.
func (s segment) frame() []byte {
	ipOpts := ipv4Opts{options: s.ipOptions, fragOff: 0x4000, id: 0x1234, ttl: s.ttl}
	if s.fragOff != 0 {
		ipOpts.fragOff = s.fragOff
	}
	return ether(clientMAC, lbMAC, ipPacket(s.src.Addr(), s.dst.Addr(), s.proto, s.l4(), ipOpts))
}

// to is the same segment with another destination (DNAT).
func (s segment) to(dst netip.AddrPort) segment {
	s.dst = dst
	return s
}

// from is the same segment with another source (reverse NAT).
func (s segment) from(src netip.AddrPort) segment {
	s.src = src
	return s
}

// sport is the same segment from another client port.
func (s segment) sport(port uint16) segment {
	s.src = netip.AddrPortFrom(s.src.Addr(), port)
	return s
}

func (s segment) withFlags(flags uint8) segment {
	s.flags = flags
	return s
}

type ipv4Opts struct {
	options []byte
	fragOff uint16
	id      uint16
	tos     uint8
	ttl     uint8 // also the IPv6 hop limit; 64 if zero
}

func ipPacket(src, dst netip.Addr, proto uint8, l4 []byte, o ipv4Opts) []byte {
	ttl := o.ttl
	if ttl == 0 {
		ttl = 64
	}
	if src.Is4() {
		hlen := 20 + len(o.options)
		h := []byte{byte(0x40 | hlen/4), o.tos}
		h = binary.BigEndian.AppendUint16(h, uint16(hlen+len(l4)))
		h = binary.BigEndian.AppendUint16(h, o.id)
		h = binary.BigEndian.AppendUint16(h, o.fragOff)
		h = append(h, ttl, proto, 0, 0)
		h = append(h, src.AsSlice()...)
		h = append(h, dst.AsSlice()...)
		h = append(h, o.options...)
		binary.BigEndian.PutUint16(h[10:], checksum(h))
		return append(h, l4...)
	}
	h := []byte{0x60, 0, 0, 0}
	h = binary.BigEndian.AppendUint16(h, uint16(len(l4)))
	h = append(h, proto, ttl)
	h = append(h, src.AsSlice()...)
	h = append(h, dst.AsSlice()...)
	return append(h, l4...)
}

func ether(src, dst []byte, ip []byte) []byte {
	b := append([]byte{}, dst...)
	b = append(b, src...)
	if ip[0]>>4 == 4 {
		b = append(b, 0x08, 0x00)
	} else {
		b = append(b, 0x86, 0xdd)
	}
	return append(b, ip...)
}

// fragments is the segment's datagram as its sender's kernel fragments
// it: the IP payload (L4 header and data) cut at the given byte offsets
// (multiples of 8), each piece in its own IPv4 packet, or IPv6 packet with
// a Fragment header, all with the same IP ID.
func (s segment) fragments(id uint32, cuts ...int) [][]byte {
	l4 := s.l4()
	var frames [][]byte
	for i, off := range append([]int{0}, cuts...) {
		end := len(l4)
		if i < len(cuts) {
			end = cuts[i]
		}
		more := end < len(l4)
		var ip []byte
		if s.src.Addr().Is4() {
			fo := uint16(off / 8)
			if more {
				fo |= 0x2000 // MF
			}
			ip = ipPacket(s.src.Addr(), s.dst.Addr(), s.proto, l4[off:end], ipv4Opts{fragOff: fo, id: uint16(id)})
		} else {
			fh := []byte{s.proto, 0}
			fo := uint16(off) // the offset in 8-byte units, shifted left by 3
			if more {
				fo |= 1 // M
			}
			fh = binary.BigEndian.AppendUint16(fh, fo)
			fh = binary.BigEndian.AppendUint32(fh, id)
			ip = ipPacket(s.src.Addr(), s.dst.Addr(), protoFragment, append(fh, l4[off:end]...), ipv4Opts{})
		}
		frames = append(frames, ether(clientMAC, lbMAC, ip))
	}
	return frames
}

// icmpError is an ICMP (IPv4) or ICMPv6 error from src to dst quoting the
// first n bytes of the IP packet in frame (all of it if n is 0); rest is
// the header's last 4 bytes (the MTU of frag-needed and packet too big).
func icmpError(src, dst netip.Addr, typ, code uint8, rest uint32, frame []byte, n int) []byte {
	quote := frame[14:]
	if n > 0 {
		quote = quote[:n]
	}
	msg := binary.BigEndian.AppendUint32([]byte{typ, code, 0, 0}, rest)
	msg = append(msg, quote...)
	proto := uint8(protoICMP)
	if src.Is4() {
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
	} else {
		proto = protoICMPv6
		binary.BigEndian.PutUint16(msg[2:], checksum(pseudoHeader(src, dst, proto, len(msg)), msg))
	}
	return ether(clientMAC, lbMAC, ipPacket(src, dst, proto, msg, ipv4Opts{}))
}

// rst is the reset the datapath answers seg with (RFC 793): it takes its
// sequence number from an ACK, or else acknowledges the segment.
func rst(seg segment) []byte {
	var seq, ack uint32
	flags := uint8(tcpRST)
	if seg.flags&tcpACK != 0 {
		seq = seg.ack
	} else {
		ack = seg.seq + uint32(len(seg.payload))
		if seg.flags&tcpSYN != 0 {
			ack++
		}
		if seg.flags&tcpFIN != 0 {
			ack++
		}
		flags |= tcpACK
	}
	src, dst := seg.dst, seg.src
	var b []byte
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint32(b, seq)
	b = binary.BigEndian.AppendUint32(b, ack)
	b = append(b, 5<<4, flags, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint16(b[16:], checksum(pseudoHeader(src.Addr(), dst.Addr(), protoTCP, len(b)), b))
	return ether(lbMAC, clientMAC, ipPacket(src.Addr(), dst.Addr(), protoTCP, b, ipv4Opts{fragOff: 0x4000}))
}

// portUnreachable is the ICMP or ICMPv6 error the datapath answers the
// UDP datagram in frame with: it quotes the IPv4 header and 8 bytes, or as
// much of the IPv6 packet as fits 1280 bytes.
func portUnreachable(seg segment, frame []byte) []byte {
	src, dst := seg.dst.Addr(), seg.src.Addr()
	ip := frame[14:]
	if src.Is4() {
		quote := ip[:int(ip[0]&0x0f)*4+8]
		msg := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quote...)
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
		return ether(lbMAC, clientMAC, ipPacket(src, dst, protoICMP, msg, ipv4Opts{}))
	}
	quote := ip[:min(len(ip), 1280-48)]
	msg := append([]byte{1, 4, 0, 0, 0, 0, 0, 0}, quote...)
	binary.BigEndian.PutUint16(msg[2:], checksum(pseudoHeader(src, dst, protoICMPv6, len(msg)), msg))
	return ether(lbMAC, clientMAC, ipPacket(src, dst, protoICMPv6, msg, ipv4Opts{}))
}

// flowHash mirrors flow_hash in bpf/l4xds.c: the words are the
// network-order bytes read in host order.
func flowHash(src, dst netip.AddrPort, proto uint8) uint32 {
	rol := func(x uint32, k uint) uint32 { return x<<k | x>>(32-k) }
	mix := func(a, b, c uint32) (uint32, uint32, uint32) {
		a -= c
		a ^= rol(c, 4)
		c += b
		b -= a
		b ^= rol(a, 6)
		a += c
		c -= b
		c ^= rol(b, 8)
		b += a
		a -= c
		a ^= rol(c, 16)
		c += b
		b -= a
		b ^= rol(a, 19)
		a += c
		c -= b
		c ^= rol(b, 4)
		b += a
		return a, b, c
	}
	s, d := addr(src.Addr()), addr(dst.Addr())
	a := uint32(0x4c347d5e + 10<<2)
	b, c := a, a
	a += s[0]
	b += s[1]
	c += s[2]
	a, b, c = mix(a, b, c)
	a += s[3]
	b += d[0]
	c += d[1]
	a, b, c = mix(a, b, c)
	a += d[2]
	b += d[3]
	c += uint32(port(src.Port())) | uint32(port(dst.Port()))<<16
	a, b, c = mix(a, b, c)
	a += uint32(proto)
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}

// addr is a as the maps hold it: 16 bytes, IPv4 mapped, as host-order
// words.
func addr(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[i*4:])
	}
	return w
}

// port is p in network order, as the maps hold it.
func port(p uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p))
}

// verifyChecksums checks every checksum of an IPv4 or IPv6 frame carrying
// TCP, UDP, ICMP or ICMPv6 (a valid Internet checksum sums to zero).
func verifyChecksums(t *testing.T, name string, f []byte) {
	t.Helper()
	if len(f) < 14 {
		return
	}
	var src, dst netip.Addr
	var proto uint8
	var l4 []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		ip := f[14:]
		hlen := int(ip[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if tot == 0 { // BIG TCP: the frame's length
			tot = len(ip)
		}
		if c := checksum(ip[:hlen]); c != 0 {
			t.Errorf("%s: bad IPv4 header checksum (sum %#04x)", name, c)
		}
		if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 || tot > len(ip) {
			return
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		proto, l4 = ip[9], ip[hlen:tot]
	case 0x86dd:
		ip := f[14:]
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if plen == 0 { // BIG TCP: the frame's length
			plen = len(ip) - 40
		}
		if 40+plen > len(ip) {
			return
		}
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		proto, l4 = ip[6], ip[40:40+plen]
		// BIG TCP before Linux 7.0: a Hop-by-Hop header of a Jumbo
		// Payload option, which the pseudo-header does not count.
		if proto == protoHopByHop && len(l4) >= 8 && l4[1] == 0 && l4[2] == 0xc2 {
			proto, l4 = l4[0], l4[8:]
		}
	default:
		return
	}
	var c uint16
	switch {
	case proto == protoTCP && len(l4) >= 20:
		c = checksum(pseudoHeader(src, dst, proto, len(l4)), l4)
	case proto == protoUDP && len(l4) >= 8:
		if src.Is4() && binary.BigEndian.Uint16(l4[6:]) == 0 {
			return
		}
		c = checksum(pseudoHeader(src, dst, proto, len(l4)), l4)
	case proto == protoICMP:
		c = checksum(l4)
	case proto == protoICMPv6:
		c = checksum(pseudoHeader(src, dst, proto, len(l4)), l4)
	default:
		return
	}
	if c != 0 {
		t.Errorf("%s: bad protocol %d checksum (sum %#04x)", name, proto, c)
	}
	// An ICMP error quotes an IPv4 header with its own checksum.
	if (proto == protoICMP || proto == protoICMPv6) && len(l4) >= 8+20 && l4[8]>>4 == 4 {
		inner := l4[8:]
		if hlen := int(inner[0]&0x0f) * 4; hlen <= len(inner) {
			if c := checksum(inner[:hlen]); c != 0 {
				t.Errorf("%s: bad quoted IPv4 header checksum (sum %#04x)", name, c)
			}
		}
	}
}
