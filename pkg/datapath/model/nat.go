// SPDX-License-Identifier: Apache-2.0

package model

import "net/netip"

// Offsets in the IP headers.
const (
	ip4Check = 10
	ip4Src   = 12
	ip4Dst   = 16
	ip6Src   = 8
	ip6Dst   = 24
)

// addrOff is the offset of the source or destination address in the IP
// header at ipOff.
func addrOff(ipOff int, v6, dst bool) int {
	switch {
	case v6 && dst:
		return ipOff + ip6Dst
	case v6:
		return ipOff + ip6Src
	case dst:
		return ipOff + ip4Dst
	}
	return ipOff + ip4Src
}

// rewriteAddr replaces one address of the outer IP header, and updates
// the IPv4 header checksum that covers it. On its own, the translation of
// a later fragment, which has no L4 header.
func rewriteAddr(f []byte, v6, dst bool, to netip.Addr) {
	off := addrOff(ethLen, v6, dst)
	nb := addrBytes(to, v6)
	if !v6 {
		old := append([]byte(nil), f[off:off+4]...)
		put16(f[ethLen+ip4Check:], update(be16(f[ethLen+ip4Check:]), old, nb))
	}
	copy(f[off:], nb)
}

// nat rewrites one end of the flow, the destination (DNAT, to a backend)
// or the source (reverse NAT, to the VIP), and updates the checksums: the
// L4 one covers the addresses through its pseudo-header. A UDP checksum of
// zero is none (IPv4) and stays zero; a UDP checksum that becomes zero is
// written 0xffff (zero would mean none).
func nat(p *packet, f []byte, dst bool, to netip.AddrPort) {
	l4 := f[p.l4Off():]
	checkOff := 16
	if p.proto == ProtoUDP {
		checkOff = 6
	}
	portOff := 0
	oldPort := p.sport
	if dst {
		portOff, oldPort = 2, p.dport
	}
	addrAt := addrOff(ethLen, p.v6, dst)
	oldAddr := append([]byte(nil), f[addrAt:addrAt+len(addrBytes(to.Addr(), p.v6))]...)
	newAddr := addrBytes(to.Addr(), p.v6)

	// Address and port are two updates of the L4 checksum, each kept
	// from reading zero for UDP.
	l4update := func(old, new []byte) {
		c := be16(l4[checkOff:])
		if p.proto == ProtoUDP && c == 0 {
			return
		}
		c = update(c, old, new)
		if p.proto == ProtoUDP && c == 0 {
			c = 0xffff
		}
		put16(l4[checkOff:], c)
	}
	l4update(oldAddr, newAddr)
	rewriteAddr(f, p.v6, dst, to.Addr())
	if oldPort != to.Port() {
		l4update(portBytes(oldPort), portBytes(to.Port()))
		put16(l4[portOff:], to.Port())
	}
}
