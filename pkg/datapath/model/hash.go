// SPDX-License-Identifier: Apache-2.0

package model

import (
	"encoding/binary"
	"math/bits"
)

// FlowHash is the hash of a flow's 5-tuple that picks its Maglev slot: a
// Jenkins mix without seed, so that a flow's slot is the same on every
// node. Words are the key's bytes read in the host's order (as the
// program loads them): source, destination, the ports (source in the low
// half), the protocol.
func FlowHash(k FlowKey) uint32 {
	var w [10]uint32
	s, dst := k.Src.Addr().As16(), k.Dst.Addr().As16()
	for i := range 4 {
		w[i] = binary.NativeEndian.Uint32(s[4*i:])
		w[4+i] = binary.NativeEndian.Uint32(dst[4*i:])
	}
	var sp, dp [2]byte
	binary.BigEndian.PutUint16(sp[:], k.Src.Port())
	binary.BigEndian.PutUint16(dp[:], k.Dst.Port())
	w[8] = uint32(binary.NativeEndian.Uint16(sp[:])) | uint32(binary.NativeEndian.Uint16(dp[:]))<<16
	w[9] = uint32(k.Proto)

	a := uint32(0x4c347d5e + 10<<2)
	b, c := a, a
	a += w[0]
	b += w[1]
	c += w[2]
	a, b, c = mix(a, b, c)
	a += w[3]
	b += w[4]
	c += w[5]
	a, b, c = mix(a, b, c)
	a += w[6]
	b += w[7]
	c += w[8]
	a, b, c = mix(a, b, c)
	a += w[9]
	_, _, c = final(a, b, c)
	return c
}

func rol(x uint32, k int) uint32 { return bits.RotateLeft32(x, k) }

func mix(a, b, c uint32) (uint32, uint32, uint32) {
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

func final(a, b, c uint32) (uint32, uint32, uint32) {
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
	return a, b, c
}
