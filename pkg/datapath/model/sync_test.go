// SPDX-License-Identifier: Apache-2.0

package model

import (
	"net/netip"
	"strings"
	"testing"
)

// A bucket left further ahead than the limit allows (by a larger limit,
// the map outliving the agent) is this limit's empty bucket: refusals
// again one interval on, not once the old time is reached.
func TestRejectBucketAheadIsEmpty(t *testing.T) {
	const s = uint64(1e9)
	now := 100 * s
	d := &Datapath{State: NewState(), RejectLimit: RejectLimit{Interval: 2 * s, Burst: 4 * s}}
	d.State.RejectTAT = now + 48*3600*s
	if d.rejectAllowed(now) {
		t.Error("a reject allowed from a bucket 48 h ahead")
	}
	if got, want := d.State.RejectTAT, now+4*s; got != want {
		t.Errorf("bucket 48 h ahead: tat %d after a reject, want now + burst %d", got, want)
	}
	if !d.rejectAllowed(now + 2*s) {
		t.Error("no reject one interval after an empty bucket")
	}
	// Within the burst: as it is.
	d.State.RejectTAT = now + 1*s
	if !d.rejectAllowed(now) || d.State.RejectTAT != now+3*s {
		t.Errorf("bucket 1 s ahead: tat %d, want a reject and tat now + 3 s", d.State.RejectTAT)
	}
}

// A source that names no single host is judged in the packet's family:
// an IPv6 packet from IPv4-mapped multicast is not from IPv6 multicast.
func TestUnicastSource(t *testing.T) {
	for _, c := range []struct {
		src  string
		v6   bool
		want bool
	}{
		{"10.0.0.2", false, true},
		{"223.255.255.255", false, true},
		{"224.0.0.1", false, false},
		{"255.255.255.255", false, false},
		{"0.0.0.0", false, false},
		{"0.1.2.3", false, false},
		{"2001:db8::1", true, true},
		{"ff02::1", true, false},
		{"::", true, false},
		{"::ffff:224.0.0.1", true, true},
		{"::ffff:0.0.0.0", true, true},
	} {
		if got := unicastSource(addr16(netip.MustParseAddr(c.src)), c.v6); got != c.want {
			t.Errorf("source %s (IPv6 packet %v): unicast %v, want %v", c.src, c.v6, got, c.want)
		}
	}
}

var (
	tVIP6 = netip.MustParseAddr("2001:db8::1")
	tBE7  = netip.MustParseAddrPort("[fd00::10]:8080")
	tBE8  = netip.MustParseAddrPort("[fd00::11]:8080")
	tCli6 = netip.MustParseAddrPort("[2001:db8:c::2]:40000")
)

// tDatapath6 has one TCP service on [2001:db8::1]:80 of backends 7 and 8.
func tDatapath6() *Datapath {
	svc := &Service{ID: 1, Frontend: Frontend{VIP: tVIP6, Port: 80, Proto: ProtoTCP},
		Backends: []Backend{{ID: 7, Addr: tBE7, Weight: 1}, {ID: 8, Addr: tBE8, Weight: 1}}, Table: []uint32{7, 8}}
	return &Datapath{Table: &Table{Services: []*Service{svc}}, State: NewState()}
}

// tFrame6 is an Ethernet frame of an IPv6 packet; its payload length is
// that of payload.
func tFrame6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	f := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, next, 64}
	put16(f[18:], uint16(len(payload)))
	f = append(f, src.AsSlice()...)
	f = append(f, dst.AsSlice()...)
	return append(f, payload...)
}

// tTCP is a TCP header of ports and flags.
func tTCP(sport, dport uint16, seq uint32, flags uint8) []byte {
	t := make([]byte, 20)
	put16(t, sport)
	put16(t[2:], dport)
	t[4], t[5], t[6], t[7] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	t[12], t[13] = 5<<4, flags
	return t
}

// An IPv6 packet to a VIP whose Fragment header is cut short is
// malformed: dropped, not passed to the stack; not to a VIP, passed.
func TestCutFragmentHeaderIsMalformed(t *testing.T) {
	d := tDatapath6()
	cut := []byte{ProtoTCP, 0, 0, 1} // half a Fragment header
	r := d.Process(Packet{Frame: tFrame6(tCli6.Addr(), tVIP6, nextHdrFrag, cut)}, 1e12)
	if r.Verdict != Drop || d.State.Counters[0].Drops[DropMalformed] != 1 {
		t.Errorf("cut Fragment header to a VIP: %s (%s), counters %+v; want dropped as malformed", r.Verdict, r.Rule, d.State.Counters[0])
	}
	r = d.Process(Packet{Frame: tFrame6(tCli6.Addr(), netip.MustParseAddr("2001:db8::9"), nextHdrFrag, cut)}, 1e12)
	if r.Verdict != Pass {
		t.Errorf("cut Fragment header not to a VIP: %s (%s), want passed", r.Verdict, r.Rule)
	}
}

// tHalfOpen writes a flow of tCli6 not established yet to backend 8
// (forward entry, in the new-flow map or, established meanwhile, in the
// established one), with the reply entry backend 7 left behind.
func tHalfOpen(d *Datapath, now uint64, forwardEstablished bool) (fk, staleRK FlowKey) {
	vip := netip.AddrPortFrom(tVIP6, 80)
	fk = FlowKey{Src: tCli6, Dst: vip, Proto: ProtoTCP, Dir: Forward}
	staleRK = FlowKey{Src: tBE7, Dst: tCli6, Proto: ProtoTCP, Dir: Reply}
	f := Flow{LastSeen: now, BackendID: 8, ServiceID: 1, VIP: vip, Flags: New}
	if forwardEstablished {
		f.Flags = 0
		d.State.CT[fk] = f
	} else {
		d.State.CTNew[fk] = f
	}
	d.State.CTNew[staleRK] = Flow{LastSeen: now, BackendID: 7, ServiceID: 1, VIP: vip, Flags: New}
	return fk, staleRK
}

// A half-open reply entry whose flow went to another backend since is
// stale: the old backend's SYN-ACK is not the flow's (it would hand the
// client its sequence numbers), nor is its answer (it would take the flow
// back), whether the flow is still half-open or established meanwhile.
func TestStaleHalfOpenReply(t *testing.T) {
	const now = uint64(1e12)
	for _, est := range []bool{false, true} {
		for _, flags := range []uint8{tcpSYN | tcpACK, tcpACK} {
			d := tDatapath6()
			fk, _ := tHalfOpen(d, now, est)
			before := d.State.CTNew[fk]
			frame := tFrame6(tBE7.Addr(), tCli6.Addr(), ProtoTCP, tTCP(tBE7.Port(), tCli6.Port(), 5000, flags))
			r := d.Process(Packet{Frame: frame}, now)
			if r.Verdict != Pass || string(r.Frame) != string(frame) {
				t.Errorf("forward established %v, flags %#x: %s (%s); want passed untranslated", est, flags, r.Verdict, r.Rule)
			}
			if d.State.CTNew[fk] != before || len(d.State.CT) != map[bool]int{false: 0, true: 1}[est] {
				t.Errorf("forward established %v, flags %#x: state changed: %+v %+v", est, flags, d.State.CT, d.State.CTNew)
			}
		}
	}
}

// A SYN-ACK is remembered only in a forward entry of a flow not
// established yet: not in one established meanwhile.
func TestSynAckNotRememberedInEstablished(t *testing.T) {
	const now = uint64(1e12)
	d := tDatapath6()
	fk, _ := tHalfOpen(d, now, true)
	rk := FlowKey{Src: tBE8, Dst: tCli6, Proto: ProtoTCP, Dir: Reply}
	d.State.CTNew[rk] = Flow{LastSeen: now, BackendID: 8, ServiceID: 1, VIP: fk.Dst, Flags: New}
	r := d.Process(Packet{Frame: tFrame6(tBE8.Addr(), tCli6.Addr(), ProtoTCP, tTCP(tBE8.Port(), tCli6.Port(), 5000, tcpSYN|tcpACK))}, now)
	if r.Verdict != Pass || !strings.Contains(r.Rule, "backend's reply") {
		t.Errorf("SYN-ACK: %s (%s), want the backend's reply", r.Verdict, r.Rule)
	}
	if f := d.State.CT[fk]; f.Flags != 0 || f.SynAckAck != 0 {
		t.Errorf("established forward entry after a SYN-ACK: %+v, want it unchanged", f)
	}
}

// tICMPv6 is a packet too big from backend be to the client, quoting
// the client's packet to it, first (off 0) or later fragment; UDP.
func tICMPv6(be netip.AddrPort, fragOff uint16) []byte {
	udp := []byte{0, 0, 0, 0, 0, 16, 0, 0}
	put16(udp, tCli6.Port())
	put16(udp[2:], be.Port())
	frag := []byte{ProtoUDP, 0, 0, 0, 0, 0, 0, 9}
	put16(frag[2:], fragOff|1) // more fragments
	quote := tFrame6(tCli6.Addr(), be.Addr(), nextHdrFrag, append(frag, udp...))[ethLen:]
	icmp := append([]byte{2, 0, 0, 0, 0, 0, 0x05, 0x00}, quote...)
	return tFrame6(be.Addr(), tCli6.Addr(), ProtoICMPv6, icmp)
}

// An ICMPv6 error quoting a first fragment (PMTU discovery of a datagram
// its sender fragmented) is the flow's; one quoting a later fragment
// quotes no ports, and is not.
func TestICMPv6ErrorQuotingFragments(t *testing.T) {
	const now = uint64(1e12)
	vip := netip.AddrPortFrom(tVIP6, 53)
	setup := func() *Datapath {
		d := tDatapath6()
		d.Table.Services[0].Frontend = Frontend{VIP: tVIP6, Port: 53, Proto: ProtoUDP}
		rk := FlowKey{Src: tBE7, Dst: tCli6, Proto: ProtoUDP, Dir: Reply}
		d.State.CT[rk] = Flow{LastSeen: now, BackendID: 7, ServiceID: 1, VIP: vip}
		return d
	}
	d := setup()
	r := d.Process(Packet{Frame: tICMPv6(tBE7, 0)}, now)
	if r.Verdict != Pass || !strings.Contains(r.Rule, "ICMP error of a translated flow") ||
		netip.AddrFrom16([16]byte(r.Frame[22:38])) != tVIP6 {
		t.Errorf("quoting a first fragment: %s (%s), want translated, from the VIP", r.Verdict, r.Rule)
	}
	d = setup()
	if r = d.Process(Packet{Frame: tICMPv6(tBE7, 8)}, now); strings.Contains(r.Rule, "translated flow") {
		t.Errorf("quoting a later fragment: %s (%s), want not translated", r.Verdict, r.Rule)
	}
}

// An ICMP error about a backend a half-open flow has left is not the
// flow's (it would abort the client's connect).
func TestICMPErrorAboutStaleHalfOpen(t *testing.T) {
	const now = uint64(1e12)
	for _, est := range []bool{false, true} {
		d := tDatapath6()
		tHalfOpen(d, now, est)
		udp := tTCP(tCli6.Port(), tBE7.Port(), 1000, tcpSYN)[:8]
		quote := tFrame6(tCli6.Addr(), tBE7.Addr(), ProtoTCP, udp)[ethLen:]
		frame := tFrame6(tBE7.Addr(), tCli6.Addr(), ProtoICMPv6, append([]byte{1, 4, 0, 0, 0, 0, 0, 0}, quote...))
		r := d.Process(Packet{Frame: frame}, now)
		if r.Verdict != Pass || string(r.Frame) != string(frame) || strings.Contains(r.Rule, "translated flow") {
			t.Errorf("forward established %v: %s (%s), want passed untranslated", est, r.Verdict, r.Rule)
		}
	}
}
