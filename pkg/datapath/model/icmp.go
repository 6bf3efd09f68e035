// SPDX-License-Identifier: Apache-2.0

package model

import (
	"fmt"
	"net/netip"
)

// isICMPError: the errors that quote a packet of a flow (destination
// unreachable and time exceeded; for ICMPv6 packet too big as well).
func isICMPError(typ uint8, v6 bool) bool {
	if v6 {
		return typ == 1 || typ == 2 || typ == 3
	}
	return typ == 3 || typ == 11
}

// isNeighbourDiscovery: ICMPv6 router and neighbour solicitation and
// advertisement, and redirect; the stack's, even to a VIP (a router's
// unreachability probe of an address the node answers for must reach it).
func isNeighbourDiscovery(typ uint8, v6 bool) bool { return v6 && typ >= 133 && typ <= 137 }

// icmpError translates an ICMP or ICMPv6 error about a packet of a
// translated flow, so that PMTU discovery and port unreachable work
// through the VIP. The error goes to the source of the packet it quotes:
//   - a backend's (or a router's behind it) error to a client quotes
//     client -> backend (after DNAT): the client must see VIP:port as the
//     quoted destination, and the VIP as the error's source;
//   - a client's error to the VIP quotes VIP -> client (a reply after
//     reverse NAT): the backend must see its own address and port as the
//     quoted source, and get the error.
//
// The quoted L4 checksum is updated too when quoted, and every checksum is
// updated from the same changes. false: not an error of a translated flow
// (neighbour discovery: passed, true).
func (d *Datapath) icmpError(p *packet, out []byte, now uint64) (Result, bool) {
	f := p.frame
	icmpOff := ethLen + p.l3Len
	if p.l4Len < 8 || len(f) < icmpOff+8 {
		return Result{}, false
	}
	typ := f[icmpOff]
	if !isICMPError(typ, p.v6) {
		if isNeighbourDiscovery(typ, p.v6) {
			return Result{Pass, out, "neighbour discovery"}, true
		}
		return Result{}, false
	}
	inOff := icmpOff + 8
	quote := min(p.l4Len-8, len(f)-inOff)

	// The quoted packet: of the error's family, TCP or UDP, the first
	// fragment if fragmented, sent by the error's destination.
	var (
		inSrc, inDst netip.Addr
		proto        uint8
		inL3         int
	)
	if p.v6 {
		if len(f) < inOff+40 || f[inOff]>>4 != 6 {
			return Result{}, false
		}
		proto = f[inOff+6]
		inSrc = netip.AddrFrom16([16]byte(f[inOff+8 : inOff+24]))
		inDst = netip.AddrFrom16([16]byte(f[inOff+24 : inOff+40]))
		inL3 = 40
		// A first fragment (a datagram too big for the path, which its
		// sender fragmented) has its ports after the Fragment header; a
		// later one quotes none.
		if proto == nextHdrFrag {
			if len(f) < inOff+40+fragHdrLen || be16(f[inOff+42:])&ip6Off != 0 {
				return Result{}, false
			}
			proto = f[inOff+40]
			inL3 += fragHdrLen
		}
	} else {
		if len(f) < inOff+20 || f[inOff]>>4 != 4 || f[inOff]&0xf < 5 {
			return Result{}, false
		}
		proto = f[inOff+9]
		if be16(f[inOff+6:])&ipOffset != 0 {
			if proto == ProtoTCP || proto == ProtoUDP {
				return Result{}, false // a later fragment quotes no ports
			}
		}
		inSrc = addr16(netip.AddrFrom4([4]byte(f[inOff+12 : inOff+16])))
		inDst = addr16(netip.AddrFrom4([4]byte(f[inOff+16 : inOff+20])))
		inL3 = int(f[inOff]&0xf) * 4
	}
	if proto != ProtoTCP && proto != ProtoUDP {
		return Result{}, false
	}
	if p.dst != inSrc || quote < inL3+8 {
		return Result{}, false
	}
	l4Off := inOff + inL3
	if len(f) < l4Off+8 {
		return Result{}, false
	}
	inSport, inDport := be16(f[l4Off:]), be16(f[l4Off+2:])

	// The flow's entry as the quoted packet's receiver would answer it.
	key := FlowKey{Src: netip.AddrPortFrom(inDst, inDport), Dst: netip.AddrPortFrom(inSrc, inSport), Proto: proto, Dir: Reply}
	var (
		reply            bool
		svcID            uint32
		oldAddr, newAddr netip.Addr
		newPort          uint16
		outerOld         netip.Addr
	)
	e, ok := live(d.State.CT, key, now)
	if !ok {
		if e, ok = live(d.State.CTNew, key, now); ok {
			// About a backend the flow, not established yet, has left:
			// not the flow's (it would abort the client's connect).
			if f, m, _ := d.halfOpenForward(key, e); halfOpenStale(f, m, e) {
				return Result{}, false
			}
		}
	}
	if ok {
		reply, svcID = true, e.ServiceID
		oldAddr, newAddr, newPort, outerOld = inDst, e.VIP.Addr(), e.VIP.Port(), p.src
	} else {
		key.Dir = Forward
		e, ok := d.liveFlow(key, now)
		if !ok {
			return Result{}, false
		}
		svc, b := d.Table.backend(e.BackendID)
		if b == nil || svc.ID != e.ServiceID {
			return Result{}, false
		}
		// To the backend only what a packet of the flow would reach it
		// with: its service still there, and its client (not the error's
		// sender, any router on the client's path) in the service's
		// source ranges now, which may have shrunk since the flow began.
		if fs := d.Table.service(Frontend{VIP: inSrc, Port: inSport, Proto: proto}); fs == nil || fs.ID != e.ServiceID {
			return Result{}, false
		} else if !fs.admits(inDst, p.v6) {
			d.State.countDrop(fs.ID, DropSourceRange)
			return Result{Drop, out, fmt.Sprintf("ICMP error to a backend of service %d for a client outside its source ranges", fs.ID)}, true
		}
		svcID = e.ServiceID
		oldAddr, newAddr, newPort, outerOld = inSrc, addr16(b.Addr.Addr()), b.Addr.Port(), p.dst
	}
	if newAddr.Is4In6() == p.v6 {
		return Result{}, false
	}

	newSport, newDport := inSport, newPort
	if !reply {
		newSport, newDport = newPort, inDport
	}
	addrDiffOld, addrDiffNew := addrBytes(oldAddr, p.v6), addrBytes(newAddr, p.v6)
	portsOld := append(portBytes(inSport), portBytes(inDport)...)
	portsNew := append(portBytes(newSport), portBytes(newDport)...)

	// The quoted L4 checksum, when quoted: always for UDP (a zero one is
	// none, IPv4, and stays so), for TCP with 18 bytes of header.
	checkOff := -1
	switch {
	case proto == ProtoUDP:
		checkOff = l4Off + 6
	case quote >= inL3+18:
		checkOff = l4Off + 16
	}
	var oldL4, newL4 []byte
	if checkOff >= 0 {
		c := be16(f[checkOff:])
		oldL4 = portBytes(c)
		if proto != ProtoUDP || c != 0 {
			c = update(c, append(addrDiffOld, portsOld...), append(addrDiffNew, portsNew...))
			if proto == ProtoUDP && c == 0 {
				c = 0xffff
			}
		}
		newL4 = portBytes(c)
	}
	var oldIPCheck, newIPCheck []byte
	if !p.v6 {
		c := be16(f[inOff+ip4Check:])
		oldIPCheck = portBytes(c)
		newIPCheck = portBytes(update(c, addrDiffOld, addrDiffNew))
	}

	// The ICMP checksum covers what changed in the quote, and for ICMPv6
	// the outer address through its pseudo-header.
	old := concat(addrDiffOld, portsOld, oldIPCheck, oldL4)
	nw := concat(addrDiffNew, portsNew, newIPCheck, newL4)
	if p.v6 {
		old = append(old, addrBytes(outerOld, true)...)
		nw = append(nw, addrBytes(newAddr, true)...)
	}
	icmpCheck := update(be16(f[icmpOff+2:]), old, nw)

	// The outer address on the error's side of the flow, the quoted one
	// on the other side.
	rewriteAddr(out, p.v6, !reply, newAddr)
	copy(out[addrOff(inOff, p.v6, reply):], addrDiffNew)
	if !p.v6 {
		copy(out[inOff+ip4Check:], newIPCheck)
	}
	put16(out[icmpOff+2:], icmpCheck)
	copy(out[l4Off:], portsNew)
	if checkOff >= 0 {
		copy(out[checkOff:], newL4)
	}
	d.State.countPacket(svcID, len(f))
	return Result{Pass, out, fmt.Sprintf("ICMP error of a translated flow (reply side %v), quoted address to %s", reply, newAddr)}, true
}

func (d *Datapath) liveFlow(k FlowKey, now uint64) (Flow, bool) {
	if e, ok := live(d.State.CT, k, now); ok {
		return e, true
	}
	return live(d.State.CTNew, k, now)
}

func concat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}
