// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// floodCTEntries is the established conntrack map's size in the flood
// test; the flood sends four times as many new flows of each protocol.
const floodCTEntries = 1024

// floodFamily is the flood test's addresses in one family: a TCP and a
// UDP service with two backends each and a third added after the flows
// are established, the clients, and the spoofed sources.
type floodFamily struct {
	name           string
	vipTCP, vipUDP netip.AddrPort
	tcpBe, udpBe   []backend
	tcpNew, udpNew backend
	client         func(i int) netip.Addr
	// spoofed draws a random source from a prefix apart from the clients.
	spoofed func(rng *rand.Rand) netip.AddrPort
}

func floodBackend(id uint32, a string) backend {
	return backend{id: id, addr: netip.MustParseAddrPort(a)}
}

var floodFamilies = []floodFamily{
	{
		name:   "IPv4",
		vipTCP: netip.MustParseAddrPort("192.0.2.20:443"), vipUDP: netip.MustParseAddrPort("192.0.2.20:53"),
		tcpBe:  []backend{floodBackend(1, "10.1.0.1:8443"), floodBackend(2, "10.1.0.2:8443")},
		udpBe:  []backend{floodBackend(3, "10.1.0.3:5353"), floodBackend(4, "10.1.0.4:5353")},
		tcpNew: floodBackend(5, "10.1.0.5:8443"), udpNew: floodBackend(6, "10.1.0.6:5353"),
		client: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) },
		spoofed: func(rng *rand.Rand) netip.AddrPort { // 100.64.0.0/10
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], 100<<24|64<<16|rng.Uint32N(1<<22))
			return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(1024+rng.IntN(64512)))
		},
	},
	{
		name:   "IPv6",
		vipTCP: netip.MustParseAddrPort("[2001:db8::20]:443"), vipUDP: netip.MustParseAddrPort("[2001:db8::20]:53"),
		tcpBe:  []backend{floodBackend(1, "[fd00::1]:8443"), floodBackend(2, "[fd00::2]:8443")},
		udpBe:  []backend{floodBackend(3, "[fd00::3]:5353"), floodBackend(4, "[fd00::4]:5353")},
		tcpNew: floodBackend(5, "[fd00::5]:8443"), udpNew: floodBackend(6, "[fd00::6]:5353"),
		client: func(i int) netip.Addr {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x18, 14: byte(i >> 8), 15: byte(i)})
		},
		spoofed: func(rng *rand.Rand) netip.AddrPort { // 2001:db8:64::/48
			b := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x64}
			binary.BigEndian.PutUint64(b[8:], rng.Uint64())
			binary.BigEndian.PutUint16(b[6:], uint16(rng.Uint32()))
			return netip.AddrPortFrom(netip.AddrFrom16(b), uint16(1024+rng.IntN(64512)))
		},
	},
}

// establishedFlow is a flow whose backend answered (and, for TCP, whose
// client completed the handshake) through the program.
type establishedFlow struct {
	client, vip, backend netip.AddrPort
	proto                uint8
}

// forwardSeg and replySeg are packets of the flow in each direction, as
// the client and the backend send them after the handshake.
func (f establishedFlow) forwardSeg() segment {
	if f.proto == protoTCP {
		return segment{src: f.client, dst: f.vip, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: []byte("request")}
	}
	return udp(f.client, f.vip, "query")
}

func (f establishedFlow) replySeg() segment {
	if f.proto == protoTCP {
		return segment{src: f.backend, dst: f.client, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 5001, ack: 1008, payload: []byte("response")}
	}
	return udp(f.backend, f.client, "answer")
}

// TestConntrackSurvivesFlood: established flows keep their backend, their
// reverse NAT and their clients' affinity while spoofed SYNs and datagrams
// from random sources, four times as many of each as the established
// conntrack map holds, open flows the backends never answer.
func TestConntrackSurvivesFlood(t *testing.T) {
	for _, fam := range floodFamilies {
		t.Run(fam.name, func(t *testing.T) { conntrackSurvivesFlood(t, fam) })
	}
}

func conntrackSurvivesFlood(t *testing.T, fam floodFamily) {
	d := newDatapathWith(t, loadOptions{ctEntries: floodCTEntries, ctNewEntries: floodCTEntries})
	floodVIPTCP, floodVIPUDP := fam.vipTCP, fam.vipUDP
	tcpSvc := service{id: 1, vip: floodVIPTCP, proto: protoTCP, flags: svcAffinity, affinityTimeout: 3600, backends: fam.tcpBe}
	udpSvc := service{id: 2, vip: floodVIPUDP, proto: protoUDP, backends: fam.udpBe}
	d.addService(tcpSvc)
	d.addService(udpSvc)

	// Well within the map (two entries per flow): an LRU map may evict
	// before it is full, as its free entries are spread over per-CPU lists.
	const tcpFlows, udpFlows = 160, 96
	var flows []establishedFlow
	clientAt := fam.client
	for i := range tcpFlows {
		client := netip.AddrPortFrom(clientAt(i), 40000)
		synSeg := segment{src: client, dst: floodVIPTCP, proto: protoTCP, flags: tcpSYN, seq: 1000}
		be := d.mustForward(t, "SYN", synSeg, tcpSvc.backends)
		synAck := segment{src: be, dst: client, proto: protoTCP, flags: tcpSYN | tcpACK, seq: 5000, ack: 1001}
		d.mustReverse(t, "SYN-ACK", synAck, floodVIPTCP)
		ack := segment{src: client, dst: floodVIPTCP, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 5001}
		d.mustForwardTo(t, "ACK", ack, be)
		flows = append(flows, establishedFlow{client: client, vip: floodVIPTCP, backend: be, proto: protoTCP})
	}
	for i := range udpFlows {
		client := netip.AddrPortFrom(clientAt(1000+i), 50000)
		f := establishedFlow{client: client, vip: floodVIPUDP, proto: protoUDP}
		f.backend = d.mustForward(t, "datagram", f.forwardSeg(), udpSvc.backends)
		d.mustReverse(t, "answer", f.replySeg(), floodVIPUDP)
		flows = append(flows, f)
	}

	// A backend added to each service takes every new flow from here on
	// (and the old ones stay active): a flow that lost its conntrack entry
	// moves to it.
	tcpNew, udpNew := fam.tcpNew, fam.udpNew
	for _, s := range []struct {
		svc *service
		be  backend
	}{{&tcpSvc, tcpNew}, {&udpSvc, udpNew}} {
		d.putBackend(s.svc.id, s.be)
		s.svc.backends = append(s.svc.backends, s.be)
		table := make([]uint32, testMaglevN)
		for i := range table {
			table[i] = s.be.id
		}
		d.setMaglev(s.svc.id, table)
	}

	// The flood: new flows from random sources, forwarded as any new flow
	// is, never answered.
	rng := rand.New(rand.NewPCG(21, 4))
	spoofed := func() netip.AddrPort { return fam.spoofed(rng) }
	const flood = 4 * floodCTEntries
	for range flood {
		d.mustForward(t, "spoofed SYN", segment{src: spoofed(), dst: floodVIPTCP, proto: protoTCP, flags: tcpSYN, seq: rng.Uint32()}, tcpSvc.backends)
		d.mustForward(t, "spoofed datagram", udp(spoofed(), floodVIPUDP, "flood"), udpSvc.backends)
	}

	// The backends' answers first: a forward packet of a flow whose reply
	// entry was lost would write it again.
	var lost, moved, unsticky int
	for _, f := range flows {
		seg := f.replySeg()
		verdict, out := d.run(seg.frame())
		if want := seg.from(f.vip).frame(); verdict != verdictNext || !bytes.Equal(out, want) {
			lost++
			if lost <= 3 {
				t.Errorf("after the flood, the answer of %s to the %s flow %s -> %s left with verdict %d from %s, want from the VIP",
					f.backend, protoName(f.proto), f.client, f.vip, int32(verdict), srcOf(out))
			}
		}
	}
	// Affinity before the forward packets, which would write it anew
	// for a flow that lost its conntrack entry.
	for _, f := range flows {
		if f.proto != protoTCP {
			continue
		}
		var a L4xdsLbAffinity
		err := d.objs.L4xdsAffinity.Lookup(&L4xdsLbAffinityKey{Client: addr(f.client.Addr()), SvcId: tcpSvc.id}, &a)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("affinity of %s: %v", f.client.Addr(), err)
		}
		if err != nil || !slicesHasBackend(tcpSvc.backends, a.BackendId, f.backend) {
			unsticky++
			if unsticky <= 3 {
				t.Errorf("after the flood, the affinity of client %s is %+v (%v), want its backend %s", f.client.Addr(), a, err, f.backend)
			}
		}
	}
	for _, f := range flows {
		seg := f.forwardSeg()
		verdict, out := d.run(seg.frame())
		if want := seg.to(f.backend).frame(); verdict != verdictNext || !bytes.Equal(out, want) {
			moved++
			if moved <= 3 {
				t.Errorf("after the flood, a packet of the %s flow %s -> %s went with verdict %d to %s, want its backend %s",
					protoName(f.proto), f.client, f.vip, int32(verdict), dstOf(out), f.backend)
			}
		}
	}
	t.Logf("%d established flows (%d TCP, %d UDP), then %d spoofed SYNs and %d spoofed datagrams: %d lost their reverse NAT, %d their backend, %d TCP clients their affinity",
		len(flows), tcpFlows, udpFlows, flood, flood, lost, moved, unsticky)
	if lost+moved+unsticky > 0 {
		t.Errorf("%d of %d answers un-NATed, %d of %d flows moved, %d of %d affinities lost", lost, len(flows), moved, len(flows), unsticky, tcpFlows)
	}
}

// mustForward runs a client's packet to a VIP and returns the backend,
// one of backends, it was DNATed to.
func (d *datapath) mustForward(t *testing.T, what string, seg segment, backends []backend) netip.AddrPort {
	t.Helper()
	verdict, out := d.run(seg.frame())
	be := dstOf(out)
	if verdict != verdictNext || !slicesHasAddr(backends, be) || !bytes.Equal(out, seg.to(be).frame()) {
		t.Fatalf("%s %s -> %s: verdict %d, to %s; want DNAT to a backend", what, seg.src, seg.dst, int32(verdict), be)
	}
	return be
}

// mustForwardTo runs a client's packet to a VIP, which must be DNATed to be.
func (d *datapath) mustForwardTo(t *testing.T, what string, seg segment, be netip.AddrPort) {
	t.Helper()
	verdict, out := d.run(seg.frame())
	if verdict != verdictNext || !bytes.Equal(out, seg.to(be).frame()) {
		t.Fatalf("%s %s -> %s: verdict %d, to %s; want DNAT to %s", what, seg.src, seg.dst, int32(verdict), dstOf(out), be)
	}
}

// mustReverse runs a backend's packet, which must leave from the VIP.
func (d *datapath) mustReverse(t *testing.T, what string, seg segment, vip netip.AddrPort) {
	t.Helper()
	verdict, out := d.run(seg.frame())
	if verdict != verdictNext || !bytes.Equal(out, seg.from(vip).frame()) {
		t.Fatalf("%s %s -> %s: verdict %d, from %s; want reverse NAT from %s", what, seg.src, seg.dst, int32(verdict), srcOf(out), vip)
	}
}

func slicesHasAddr(backends []backend, a netip.AddrPort) bool {
	for _, b := range backends {
		if b.addr == a {
			return true
		}
	}
	return false
}

// slicesHasBackend reports whether id is the backend at a.
func slicesHasBackend(backends []backend, id uint32, a netip.AddrPort) bool {
	for _, b := range backends {
		if b.id == id && b.addr == a {
			return true
		}
	}
	return false
}

func protoName(p uint8) string {
	if p == protoTCP {
		return "TCP"
	}
	return "UDP"
}

// srcOf is the source address and port of an IPv4 or IPv6 TCP or UDP
// frame (without IP options or extension headers).
func srcOf(f []byte) netip.AddrPort {
	if len(f) < 14 {
		return netip.AddrPort{}
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		if len(f) >= 14+20+4 {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(f[26:30])), binary.BigEndian.Uint16(f[34:]))
		}
	case 0x86dd:
		if len(f) >= 14+40+4 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(f[22:38])), binary.BigEndian.Uint16(f[54:]))
		}
	}
	return netip.AddrPort{}
}
