// SPDX-License-Identifier: Apache-2.0

package model

import (
	"net/netip"
	"testing"
)

// A source range admits clients of its own family only; an IPv4-mapped
// prefix of at least 96 bits is the IPv4 prefix it maps.
func TestSourceRangesKeepFamiliesApart(t *testing.T) {
	for _, c := range []struct {
		ranges []string
		client string
		v6     bool // the packet's family
		want   bool
	}{
		{nil, "10.0.0.2", false, true},
		{[]string{"::/0"}, "10.0.0.2", false, false},
		{[]string{"::/8"}, "10.0.0.2", false, false},
		{[]string{"::ffff:0:0/96"}, "10.0.0.2", false, true},
		{[]string{"::ffff:10.0.0.0/104"}, "10.0.0.2", false, true},
		{[]string{"10.0.0.0/8"}, "::ffff:10.0.0.2", true, false},
		{[]string{"::/0"}, "::ffff:10.0.0.2", true, true},
		{[]string{"10.0.0.0/8", "2001:db8::/32"}, "2001:db8::1", true, true},
		{[]string{"10.0.0.0/8"}, "203.0.113.9", false, false},
	} {
		s := &Service{}
		for _, r := range c.ranges {
			s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(r))
		}
		if got := s.admits(addr16(netip.MustParseAddr(c.client)), c.v6); got != c.want {
			t.Errorf("ranges %v, client %s (IPv6 packet %v): admitted %v, want %v", c.ranges, c.client, c.v6, got, c.want)
		}
	}
}

// The reject limit: a burst, then one per interval.
func TestRejectLimit(t *testing.T) {
	const s = uint64(1e9)
	d := &Datapath{State: NewState(), RejectLimit: RejectLimit{Interval: 2 * s, Burst: 4 * s}}
	now := 100 * s
	for i, c := range []struct {
		at   uint64
		want bool
	}{{now, true}, {now, true}, {now, false}, {now + 1*s, false}, {now + 2*s, true}, {now + 2*s, false}, {now + 10*s, true}} {
		if got := d.rejectAllowed(c.at); got != c.want {
			t.Errorf("reject %d at %d s: allowed %v, want %v", i, c.at/s, got, c.want)
		}
	}
	if (&Datapath{State: NewState()}).rejectAllowed(now) {
		t.Error("a zero reject limit allowed a reject")
	}
}

// Updated checksums are those computed anew when the old one was right.
func TestChecksumUpdate(t *testing.T) {
	h := []byte{0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 1, 2, 3}
	put16(h[10:], checksum(h))
	old := append([]byte(nil), h[16:20]...)
	copy(h[16:], []byte{192, 168, 1, 10})
	got := update(be16(h[10:]), old, h[16:20])
	put16(h[10:], 0)
	if want := checksum(h); got != want {
		t.Errorf("updated checksum %#04x, computed anew %#04x", got, want)
	}
}

// A SYN to a service of one backend is sent to it, and its flow waits
// in the new-flow conntrack.
func TestNewFlowToTheOneBackend(t *testing.T) {
	be := netip.MustParseAddrPort("192.168.1.10:8080")
	svc := &Service{ID: 1, Frontend: Frontend{VIP: netip.MustParseAddr("10.1.2.3"), Port: 80, Proto: ProtoTCP},
		Backends: []Backend{{ID: 7, Addr: be, Weight: 1}}, Table: []uint32{7}}
	d := &Datapath{Table: &Table{Services: []*Service{svc}}, State: NewState()}
	frame := []byte{
		2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00,
		0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 1, 2, 3,
		0x9c, 0x40, 0, 80, 0, 0, 3, 0xe8, 0, 0, 0, 0, 0x50, tcpSYN, 0xff, 0xff, 0, 0, 0, 0,
	}
	r := d.Process(Packet{Frame: frame}, 1e12)
	if r.Verdict != Pass || netip.AddrFrom4([4]byte(r.Frame[30:34])) != be.Addr() || be16(r.Frame[36:]) != be.Port() {
		t.Fatalf("SYN: %s (%s), frame % x; want it passed to %s", r.Verdict, r.Rule, r.Frame, be)
	}
	fk := FlowKey{Src: netip.MustParseAddrPort("[::ffff:10.0.0.2]:40000"), Dst: netip.MustParseAddrPort("[::ffff:10.1.2.3]:80"), Proto: ProtoTCP}
	if f, ok := d.State.CTNew[fk]; !ok || f.BackendID != 7 || f.Flags != New {
		t.Errorf("new-flow entry of %v: %+v, %v; want backend 7, flags New", fk, f, ok)
	}
	if c := d.State.Counters[1]; c.Packets != 1 || c.Bytes != uint64(len(frame)) {
		t.Errorf("counters of service 1: %+v, want one packet of %d bytes", c, len(frame))
	}
}
