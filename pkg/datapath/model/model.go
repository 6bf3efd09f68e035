// SPDX-License-Identifier: Apache-2.0

package model

import (
	"fmt"
	"math"
	"net/netip"
)

// Verdict is what becomes of a packet.
type Verdict int

const (
	// Pass: on to the stack, translated or not. (A translated packet goes
	// to its next hop straight when the FIB has a route for it; the model
	// has no FIB: it stands for a node without one.)
	Pass Verdict = iota
	// Drop: dropped, and counted when it was addressed to a VIP.
	Drop
	// Redirect: the packet became the refusal (TCP RST, ICMP port
	// unreachable) and leaves by the interface it came in on.
	Redirect
)

func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Drop:
		return "drop"
	case Redirect:
		return "redirect"
	}
	return fmt.Sprintf("verdict %d", int(v))
}

// Result of one packet.
type Result struct {
	Verdict Verdict
	// Frame is the packet as it leaves (translated, or the refusal); for
	// Drop, as it came in.
	Frame []byte
	// Rule names the rule that decided, for readable differences.
	Rule string
}

// Datapath is the model: the table and the state it changes.
type Datapath struct {
	Table *Table
	State *State
	// RejectLimit bounds the refusals sent; the zero value sends none.
	RejectLimit RejectLimit
}

// Packet is a packet as the datapath receives it: its frame, and for a
// GSO packet (GRO's, a guest's, a local socket's) the size of its segments.
type Packet struct {
	Frame   []byte
	GSOSize uint32
}

// Process runs one packet through the model at the monotonic time now
// (ns), changing d.State as the datapath changes its maps.
func (d *Datapath) Process(pkt Packet, now uint64) Result {
	p := parse(pkt)
	out := append([]byte(nil), pkt.Frame...)
	switch p.class {
	case notIP:
		// Includes IPv4 with a bad version or IHL: the stack discards
		// it, it does not forward it.
		return Result{Pass, out, "not IP the program reads"}
	case laterFragment:
		return d.laterFragment(p, out, now)
	case icmp:
		if r, ok := d.icmpError(p, out, now); ok {
			return r
		}
		return d.dropIfVIP(p, out, DropICMP, now)
	case truncated:
		return d.dropIfVIP(p, out, DropMalformed, now)
	case untranslated:
		return d.dropIfVIP(p, out, p.why, now)
	}
	if r, ok := d.toService(p, out, now); ok {
		return r
	}
	if r, ok := d.reply(p, out, now); ok {
		return r
	}
	if d.Table.isVIP(p.dst) {
		d.State.countDrop(0, DropUnknownPort)
		return Result{Drop, out, "to a VIP on a port no service serves"}
	}
	if d.Table.removedVIP(p.dst, now) {
		d.State.countDrop(0, DropRemovedVIP)
		return Result{Drop, out, "to a removed VIP"}
	}
	return Result{Pass, out, "not for a VIP"}
}

// dropIfVIP is the fate of a packet the program does not translate:
// dropped when it is addressed to a VIP (charged to the service of its
// ports when they were read, else to 0) or to one removed within its
// grace period, passed otherwise. Passed to the stack, a packet to a VIP
// would be routed back out, on an edge node to the node again.
func (d *Datapath) dropIfVIP(p *packet, out []byte, why DropReason, now uint64) Result {
	if p.hasPorts {
		if svc := d.Table.service(p.frontend()); svc != nil {
			d.State.countDrop(svc.ID, why)
			return Result{Drop, out, fmt.Sprintf("not translated (%s), to service %d", why, svc.ID)}
		}
	}
	if d.Table.isVIP(p.dst) {
		d.State.countDrop(0, why)
		return Result{Drop, out, fmt.Sprintf("not translated (%s), to a VIP", why)}
	}
	if d.Table.removedVIP(p.dst, now) {
		d.State.countDrop(0, DropRemovedVIP)
		return Result{Drop, out, fmt.Sprintf("not translated (%s), to a removed VIP", why)}
	}
	return Result{Pass, out, fmt.Sprintf("not translated (%s), not for a VIP", why)}
}

// toService handles a packet to a VIP:port/protocol that a service
// serves; false when there is none, or when the packet is a backend's
// reply (to a client that is itself on a VIP:port).
func (d *Datapath) toService(p *packet, out []byte, now uint64) (Result, bool) {
	svc := d.Table.service(p.frontend())
	if svc == nil {
		return Result{}, false
	}
	st := d.State
	fk := p.key(Forward)
	est, hasEst := st.CT[fk]
	be := d.flowBackend(p, est, hasEst, svc, now)
	if be == nil {
		rk := p.key(Reply)
		if _, ok := live(st.CT, rk, now); ok {
			return Result{}, false
		}
		if _, ok := live(st.CTNew, rk, now); ok {
			return Result{}, false
		}
	}
	if !svc.admits(p.src, p.v6) {
		st.countDrop(svc.ID, DropSourceRange)
		return Result{Drop, out, fmt.Sprintf("client outside the source ranges of service %d", svc.ID)}, true
	}
	vip := netip.AddrPortFrom(p.dst, p.dport)

	// An established flow keeps its backend. Its reply entry is written
	// again with each refresh, which restores it if it was evicted or
	// taken by another flow of the client's port.
	if be != nil {
		closing := p.closing() && est.Flags&Closing == 0
		if closing || est.Flags&ReplyLost != 0 || now-est.LastSeen >= uint64(refreshEvery) {
			est.LastSeen = now
			if closing {
				est.Flags |= Closing
			}
			est.Flags &^= ReplyLost
			st.CT[fk] = est
			rk := replyKey(p, be.Addr)
			d.claimReply(rk, vip)
			st.CT[rk] = Flow{LastSeen: now, BackendID: est.BackendID, ServiceID: svc.ID, VIP: vip, Flags: est.Flags}
		}
		return d.forward(p, out, svc.ID, be.Addr, true, "established flow"), true
	}

	// A flow not established yet keeps its backend too; the client's
	// ACK of the backend's SYN-ACK establishes it.
	h, hasH := st.CTNew[fk]
	if be = d.flowBackend(p, h, hasH, svc, now); be != nil {
		rk := replyKey(p, be.Addr)
		if h.Flags&SynAckSeen != 0 && h.SynAckAck == p.ack && p.tcpFlags&(tcpSYN|tcpRST|tcpACK) == tcpACK {
			if p.closing() {
				h.Flags |= Closing
			}
			d.promote(fk, rk, h, now)
			return d.forward(p, out, svc.ID, be.Addr, true, "client's ACK establishes the flow"), true
		}
		closing := p.closing() && h.Flags&Closing == 0
		if !closing && now-h.LastSeen < uint64(refreshEvery) && d.replyIsOurs(rk, vip) {
			return d.forward(p, out, svc.ID, be.Addr, true, "flow not established yet"), true
		}
		h.LastSeen = now
		if closing {
			h.Flags |= Closing
		}
		d.storeNew(fk, rk, h)
		return d.forward(p, out, svc.ID, be.Addr, true, "flow not established yet, refreshed"), true
	}

	// A new flow.
	if svc.usableCount() == 0 {
		return d.refuse(p, out, svc.ID, now, fmt.Sprintf("service %d has no backend for new flows", svc.ID)), true
	}
	var chosen *Backend
	rule := "new flow, affinity"
	if svc.Affinity > 0 {
		chosen = d.affinityBackend(p, svc, now)
	}
	if chosen == nil {
		if len(svc.Table) == 0 {
			st.countDrop(svc.ID, DropNoBackend)
			return Result{Drop, out, fmt.Sprintf("service %d has no Maglev table", svc.ID)}, true
		}
		slot := FlowHash(fk) % uint32(len(svc.Table))
		id := svc.Table[slot]
		rule = fmt.Sprintf("new flow, Maglev slot %d", slot)
		if id == 0 {
			return d.refuse(p, out, svc.ID, now, fmt.Sprintf("service %d: the reject share (slot %d)", svc.ID, slot)), true
		}
		if _, chosen = svc.backendByID(id); chosen == nil {
			st.countDrop(svc.ID, DropNoBackend)
			return Result{Drop, out, fmt.Sprintf("service %d: slot %d names no backend of it (%d)", svc.ID, slot, id)}, true
		}
		if chosen.Addr.Addr().Unmap().Is4() == p.v6 {
			st.countDrop(svc.ID, DropBackendFamily)
			return Result{Drop, out, fmt.Sprintf("service %d: backend %s of another family than the packet", svc.ID, chosen.Addr)}, true
		}
	}
	flags := New
	if p.closing() {
		flags |= Closing
	}
	if svc.Affinity > 0 {
		flags |= WithAffinity
	}
	ce := Flow{LastSeen: now, BackendID: chosen.ID, ServiceID: svc.ID, VIP: vip, Flags: flags}
	// An established entry of these ports (a closed connection, a backend
	// gone) would take the new flow's packets.
	if hasEst {
		delete(st.CT, fk)
	}
	d.storeNew(fk, replyKey(p, chosen.Addr), ce)
	return d.forward(p, out, svc.ID, chosen.Addr, true, rule), true
}

// flowBackend is the backend of an existing flow, if the flow may keep
// it: whatever its state (a terminating backend drains), as long as it
// still belongs to the service and is of the packet's family. A SYN on the
// ports of a closing connection is a new connection.
func (d *Datapath) flowBackend(p *packet, f Flow, ok bool, svc *Service, now uint64) *Backend {
	if !ok || f.ServiceID != svc.ID || f.expired(p.proto, now) {
		return nil
	}
	if f.Flags&Closing != 0 && p.proto == ProtoTCP && p.tcpFlags&(tcpSYN|tcpACK) == tcpSYN {
		return nil
	}
	_, b := svc.backendByID(f.BackendID)
	if b == nil || b.Addr.Addr().Unmap().Is4() == p.v6 {
		return nil
	}
	return b
}

// affinityBackend is the backend of the client's affinity if it still
// takes new flows: affinity never overrides priority failover, a weight of
// 0 or a backend's state.
func (d *Datapath) affinityBackend(p *packet, svc *Service, now uint64) *Backend {
	a, ok := d.State.Affinity[AffinityKey{Client: p.src, ServiceID: svc.ID}]
	if !ok || now-a.LastUsed > affinitySeconds(svc)*1e9 {
		return nil
	}
	_, b := svc.backendByID(a.BackendID)
	if b == nil || !svc.Usable(b) || b.Addr.Addr().Unmap().Is4() == p.v6 {
		return nil
	}
	return b
}

// affinitySeconds: whole seconds, rounded up, at least 1.
func affinitySeconds(svc *Service) uint64 {
	s := math.Ceil(svc.Affinity.Seconds())
	return uint64(min(max(s, 1), math.MaxUint32))
}

func replyKey(p *packet, backend netip.AddrPort) FlowKey {
	return FlowKey{Src: netip.AddrPortFrom(addr16(backend.Addr()), backend.Port()), Dst: netip.AddrPortFrom(p.src, p.sport), Proto: p.proto, Dir: Reply}
}

// claimReply: the reply key has no VIP in it, so a client that reuses its
// port for another VIP with the same backend takes the entry over; the
// flow that held it is marked, and takes it back with its next packet.
func (d *Datapath) claimReply(rk FlowKey, vip netip.AddrPort) {
	r, ok := d.State.CT[rk]
	if !ok || r.VIP == vip {
		return
	}
	fk := FlowKey{Src: rk.Dst, Dst: r.VIP, Proto: rk.Proto, Dir: Forward}
	if f, ok := d.State.CT[fk]; ok {
		f.Flags |= ReplyLost
		d.State.CT[fk] = f
	}
}

func (d *Datapath) replyIsOurs(rk FlowKey, vip netip.AddrPort) bool {
	r, ok := d.State.CTNew[rk]
	return ok && r.VIP == vip
}

// storeNew writes a flow not established yet: both its entries go to the
// new-flow map only, so that floods of new flows (spoofed included) cannot
// evict established ones. An established reply entry with the same key
// would take the backend's answers: it is taken over.
func (d *Datapath) storeNew(fk, rk FlowKey, ce Flow) {
	if _, ok := d.State.CT[rk]; ok {
		d.claimReply(rk, ce.VIP)
		delete(d.State.CT, rk)
	}
	d.State.CTNew[fk] = ce
	d.State.CTNew[rk] = ce
}

// promote moves an established flow's entries to the established map, and
// writes the client's affinity: only here, so that a flood of new flows
// writes nothing but the new-flow map.
func (d *Datapath) promote(fk, rk FlowKey, ce Flow, now uint64) {
	flags := ce.Flags
	ce.LastSeen, ce.Flags, ce.SynAckAck = now, flags&Closing, 0
	d.State.CT[fk] = ce
	d.claimReply(rk, ce.VIP)
	d.State.CT[rk] = ce
	if flags&WithAffinity != 0 {
		d.State.Affinity[AffinityKey{Client: fk.Src.Addr(), ServiceID: ce.ServiceID}] = Affinity{LastUsed: now, BackendID: ce.BackendID}
	}
	delete(d.State.CTNew, fk)
	delete(d.State.CTNew, rk)
}

// reply handles a backend's reply: the VIP restored as its source.
func (d *Datapath) reply(p *packet, out []byte, now uint64) (Result, bool) {
	st := d.State
	rk := p.key(Reply)
	e, ok := live(st.CT, rk, now)
	established := ok
	if !ok {
		if e, ok = live(st.CTNew, rk, now); !ok {
			return Result{}, false
		}
	}
	// The entry of the other family's flow that shares the key (an
	// IPv4-mapped IPv6 address): not this packet's.
	if e.VIP.Addr().Is4In6() == p.v6 {
		return Result{Pass, out, "reply entry of the other family"}, true
	}
	if !established {
		if !d.replyNew(p, rk, e, now) {
			return Result{}, false
		}
	} else {
		closing := p.closing() && e.Flags&Closing == 0
		if closing || now-e.LastSeen >= uint64(refreshEvery) {
			e.LastSeen = now
			if closing {
				e.Flags |= Closing
			}
			st.CT[rk] = e
			fk := FlowKey{Src: netip.AddrPortFrom(p.dst, p.dport), Dst: e.VIP, Proto: p.proto, Dir: Forward}
			if f, ok := st.CT[fk]; ok {
				f.LastSeen = now
				if closing {
					f.Flags |= Closing
				}
				st.CT[fk] = f
			}
		}
	}
	return d.forward(p, out, e.ServiceID, e.VIP, false, "backend's reply"), true
}

// replyNew: a backend's answer to a flow not established yet. UDP: the
// answer establishes the flow. TCP: a SYN-ACK is remembered, and the
// client's ACK of it establishes the flow; anything but a SYN or a RST
// means the backend's side is established. (A backend answering a spoofed
// SYN sends SYN-ACKs only, to a client that never acknowledges them.)
// false: the entry is stale (halfOpenStale), the answer not the flow's.
func (d *Datapath) replyNew(p *packet, rk FlowKey, h Flow, now uint64) bool {
	f, m, fk := d.halfOpenForward(rk, h)
	if halfOpenStale(f, m, h) {
		return false
	}
	if p.proto == ProtoTCP && p.tcpFlags&tcpSYN != 0 {
		// Only a flow not established yet remembers a SYN-ACK, once.
		if m != nil && f.Flags&(New|SynAckSeen) == New {
			f.SynAckAck = p.seq + 1
			f.Flags |= SynAckSeen
			m[fk] = f
		}
		return true
	}
	if p.proto == ProtoTCP && p.tcpFlags&tcpRST != 0 {
		return true
	}
	if p.closing() {
		h.Flags |= Closing
	}
	d.promote(fk, rk, h, now)
	return true
}

// halfOpenForward is the forward entry of the flow whose half-open reply
// entry is rk, h: in the new-flow map, or in the established one if the
// flow was established meanwhile; m is the map it is in, nil if none. As
// the maps hold it: an entry past its lifetime not yet reclaimed counts.
func (d *Datapath) halfOpenForward(rk FlowKey, h Flow) (Flow, map[FlowKey]Flow, FlowKey) {
	fk := FlowKey{Src: rk.Dst, Dst: h.VIP, Proto: rk.Proto, Dir: Forward}
	if f, ok := d.State.CTNew[fk]; ok {
		return f, d.State.CTNew, fk
	}
	if f, ok := d.State.CT[fk]; ok {
		return f, d.State.CT, fk
	}
	return Flow{}, nil, fk
}

// halfOpenStale: the flow of the half-open reply entry h has gone to
// another backend (or service) since, its forward entry f says: what its
// old backend, or a router in front of it, sends about it is not the
// flow's. Taken as the flow's, a SYN-ACK would hand the client this
// backend's sequence numbers, an answer take the flow back to it, an ICMP
// error abort the client's connect.
func halfOpenStale(f Flow, m map[FlowKey]Flow, h Flow) bool {
	return m != nil && (f.BackendID != h.BackendID || f.ServiceID != h.ServiceID)
}

// forward translates the packet (the destination to the backend, or the
// source to the VIP), leaves the translation for the later fragments of
// a first fragment, and counts it.
func (d *Datapath) forward(p *packet, out []byte, svcID uint32, to netip.AddrPort, dnat bool, rule string) Result {
	nat(p, out, dnat, to)
	if p.firstFrag {
		dir := Forward
		if !dnat {
			dir = Reply
		}
		d.State.Frags[FragKey{Src: p.src, Dst: p.dst, ID: p.fragID, Proto: p.proto, Dir: dir, IPv6: p.v6}] = Frag{Addr: addr16(to.Addr()), ServiceID: svcID}
	}
	d.State.countPacket(svcID, len(p.frame))
	return Result{Pass, out, rule + fmt.Sprintf(", to %s", to)}
}

// laterFragment: translated as its datagram's first fragment was (its
// address; its L4 checksum is in the first fragment). With no first
// fragment seen, a fragment to a VIP cannot be sent anywhere.
func (d *Datapath) laterFragment(p *packet, out []byte, now uint64) Result {
	k := FragKey{Src: p.src, Dst: p.dst, ID: p.fragID, Proto: p.proto, Dir: Forward, IPv6: p.v6}
	f, ok := d.State.Frags[k]
	if !ok {
		k.Dir = Reply
		f, ok = d.State.Frags[k]
	}
	if !ok {
		return d.dropIfVIP(p, out, DropFragment, now)
	}
	if f.Addr.Is4In6() == p.v6 {
		return Result{Pass, out, "later fragment, translation of the other family"}
	}
	rewriteAddr(out, p.v6, k.Dir == Forward, f.Addr)
	d.State.countPacket(f.ServiceID, len(p.frame))
	return Result{Pass, out, fmt.Sprintf("later fragment, to %s", f.Addr)}
}
