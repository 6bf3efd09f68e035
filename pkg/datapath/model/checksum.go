// SPDX-License-Identifier: Apache-2.0

package model

import (
	"encoding/binary"
	"net/netip"
)

// sum is the ones' complement sum (RFC 1071) of the concatenated parts,
// unfolded; parts of odd length only last.
func sum(parts ...[]byte) uint32 {
	var s uint32
	for _, p := range parts {
		for i := 0; i+1 < len(p); i += 2 {
			s += uint32(p[i])<<8 | uint32(p[i+1])
			s = s&0xffff + s>>16
		}
		if len(p)%2 == 1 {
			s += uint32(p[len(p)-1]) << 8
			s = s&0xffff + s>>16
		}
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// checksum is the Internet checksum of the parts.
func checksum(parts ...[]byte) uint16 { return ^fold(sum(parts...)) }

// update is a checksum after the bytes it covers changed from old to new
// (same lengths), updated rather than computed anew (RFC 1624, eqn. 3:
// HC' = ~(~HC + ~m + m')): whatever was wrong with it stays wrong, as it
// does when the kernel's helpers update it.
func update(check uint16, old, new []byte) uint16 {
	s := uint32(^check) + uint32(^fold(sum(old))) + uint32(fold(sum(new)))
	return ^fold(s)
}

// addrBytes is an address as its header carries it: 4 bytes for IPv4, 16
// for IPv6.
func addrBytes(a netip.Addr, v6 bool) []byte {
	if v6 {
		b := a.As16()
		return b[:]
	}
	b := a.Unmap().As4()
	return b[:]
}

func put16(b []byte, v uint16) { binary.BigEndian.PutUint16(b, v) }

func portBytes(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }
