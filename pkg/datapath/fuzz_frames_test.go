// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"encoding/binary"
	"net/netip"
)

// Frames of the datapath fuzzer, built from scratch with their checksums
// computed anew (RFC 1071), independently of the program and the model.

func fzSum(parts ...[]byte) uint16 {
	var s uint32
	for _, p := range parts {
		for i := 0; i+1 < len(p); i += 2 {
			s += uint32(p[i])<<8 | uint32(p[i+1])
		}
		if len(p)%2 == 1 {
			s += uint32(p[len(p)-1]) << 8
		}
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// fzPseudo is the pseudo-header of an L4 checksum.
func fzPseudo(v6 bool, src, dst netip.Addr, proto uint8, n int) []byte {
	if !v6 {
		b := append(src.Unmap().AsSlice(), dst.Unmap().AsSlice()...)
		return append(b, 0, proto, byte(n>>8), byte(n))
	}
	s, d := src.As16(), dst.As16()
	b := append(s[:], d[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, 0, 0, 0, proto)
}

// fzL4 is a TCP segment or UDP datagram (or, for other protocols, the
// payload alone).
type fzL4 struct {
	proto    uint8
	sport    uint16
	dport    uint16
	flags    uint8 // TCP
	seq, ack uint32
	payload  []byte
	// doff overrides the TCP data offset (words); 0: 5.
	doff uint8
	// noChecksum leaves the UDP checksum 0 (none).
	noChecksum bool
}

func (l fzL4) bytes(v6 bool, src, dst netip.Addr) []byte {
	var b []byte
	switch l.proto {
	case 6:
		b = binary.BigEndian.AppendUint16(b, l.sport)
		b = binary.BigEndian.AppendUint16(b, l.dport)
		b = binary.BigEndian.AppendUint32(b, l.seq)
		b = binary.BigEndian.AppendUint32(b, l.ack)
		doff := l.doff
		if doff == 0 {
			doff = 5
		}
		b = append(b, doff<<4, l.flags, 0xff, 0xff, 0, 0, 0, 0)
		b = append(b, l.payload...)
		binary.BigEndian.PutUint16(b[16:], fzSum(fzPseudo(v6, src, dst, 6, len(b)), b))
	case 17:
		b = binary.BigEndian.AppendUint16(b, l.sport)
		b = binary.BigEndian.AppendUint16(b, l.dport)
		b = binary.BigEndian.AppendUint16(b, uint16(8+len(l.payload)))
		b = append(b, 0, 0)
		b = append(b, l.payload...)
		if !l.noChecksum {
			c := fzSum(fzPseudo(v6, src, dst, 17, len(b)), b)
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(b[6:], c)
		}
	default:
		b = append(b, l.payload...)
	}
	return b
}

// fzICMP is an ICMP or ICMPv6 message with its checksum.
func fzICMP(v6 bool, src, dst netip.Addr, typ, code uint8, rest []byte) []byte {
	b := append([]byte{typ, code, 0, 0, 0, 0, 0, 0}, rest...)
	if v6 {
		binary.BigEndian.PutUint16(b[2:], fzSum(fzPseudo(true, src, dst, 58, len(b)), b))
	} else {
		binary.BigEndian.PutUint16(b[2:], fzSum(b))
	}
	return b
}

// fzIP is an IPv4 or IPv6 packet around an L4 payload.
type fzIP struct {
	v6       bool
	src, dst netip.Addr
	proto    uint8
	ttl      uint8
	id       uint32
	// fragOff: IPv4 flags and offset; IPv6 the Fragment header's offset
	// and M field (with fragHdr).
	fragOff uint16
	fragHdr bool
	// options: IPv4 options (a multiple of 4 bytes).
	options []byte
	// ext: an IPv6 extension header (its number, or fzJumbo) before the
	// payload; 0xff none.
	ext uint8
}

func (p fzIP) bytes(l4 []byte) []byte {
	if !p.v6 {
		h := make([]byte, 20, 20+len(p.options))
		h = append(h, p.options...)
		h[0] = 0x40 | byte(len(h)/4)
		binary.BigEndian.PutUint16(h[2:], uint16(len(h)+len(l4)))
		binary.BigEndian.PutUint16(h[4:], uint16(p.id))
		binary.BigEndian.PutUint16(h[6:], p.fragOff)
		h[8], h[9] = p.ttl, p.proto
		copy(h[12:], p.src.Unmap().AsSlice())
		copy(h[16:], p.dst.Unmap().AsSlice())
		binary.BigEndian.PutUint16(h[10:], fzSum(h))
		return append(h, l4...)
	}
	next := p.proto
	var ext []byte
	if p.fragHdr {
		f := []byte{next, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint16(f[2:], p.fragOff)
		binary.BigEndian.PutUint32(f[4:], p.id)
		ext, next = f, 44
	}
	payloadLen := 0
	switch p.ext {
	case fzJumbo: // BIG TCP's Hop-by-Hop header, its length field 0
		j := []byte{next, 0, 0xc2, 4, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(j[4:], uint32(8+len(ext)+len(l4)))
		ext, next = append(j, ext...), 0
	case 0xff:
		payloadLen = len(ext) + len(l4)
	default: // PadN
		ext, next = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...), p.ext
		payloadLen = len(ext) + len(l4)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(payloadLen))
	h[6], h[7] = next, p.ttl
	s, d := p.src.As16(), p.dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(append(h, ext...), l4...)
}

// fzJumbo stands for a Hop-by-Hop header of one Jumbo Payload option.
const fzJumbo = 0xc2

var (
	fzClientMAC = []byte{0x02, 0, 0, 0, 0, 0x01}
	fzLBMAC     = []byte{0x02, 0, 0, 0, 0, 0x02}
)

func fzEther(v6 bool, ip []byte) []byte {
	b := append(append([]byte(nil), fzLBMAC...), fzClientMAC...)
	if v6 {
		b = append(b, 0x86, 0xdd)
	} else {
		b = append(b, 0x08, 0x00)
	}
	return append(b, ip...)
}
