// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// agreeLengths is f with its IP length field (IPv4 total length, IPv6
// payload length) saying what the frame holds.
func agreeLengths(f []byte) []byte {
	if len(f) < 14+20 {
		return f
	}
	if f[12] == 0x08 {
		return truncateIPv4(f, len(f))
	}
	if len(f) < 14+40 {
		return f
	}
	f = append([]byte{}, f...)
	binary.BigEndian.PutUint16(f[14+4:], uint16(len(f)-14-40))
	return f
}

// A packet to a VIP cut short anywhere in its headers, its IP length
// field lying about it or telling the truth, is dropped, never passed to
// the stack: forwarded, it would go to the node's default route and, on an
// edge node, back to the node. Only a frame whose fixed IP header itself
// is cut short may pass, for the stack to drop it (ip_rcv, ipv6_rcv).
func TestTruncatedHeadersToAVIPAreDropped(t *testing.T) {
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	d.addService(service{id: 2, vip: vip4, proto: protoUDP, backends: []backend{be4a}})
	d.addService(service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}})
	d.addService(service{id: 7, vip: vip6, proto: protoUDP, backends: []backend{be6a}})

	withOpts := syn(client4, vip4)
	withOpts.ipOptions = []byte{0x01, 0x01, 0x01, 0x00, 0x01, 0x01, 0x01, 0x00}
	kinds := []struct {
		name string
		f    []byte
		// headers is how many bytes of the frame are headers the
		// program must read (Ethernet, IP, extension, L4).
		headers int
	}{
		{"IPv4 TCP with IP options", withOpts.frame(), 14 + 28 + 20},
		{"IPv4 UDP", udp(client4, vip4, "payload").frame(), 14 + 20 + 8},
		{"IPv6 TCP", syn(client6, vip6).frame(), 14 + 40 + 20},
		{"IPv6 UDP", udp(client6, vip6, "payload").frame(), 14 + 40 + 8},
		{"IPv6 UDP first fragment", udp(client6, vip6, "0123456789abcdefgh").fragments(7, 16)[0], 14 + 40 + 8 + 8},
		{"IPv6 TCP atomic fragment", syn(client6, vip6).fragments(9)[0], 14 + 40 + 8 + 20},
		{"ICMP error to the VIP", icmpError(client4.Addr(), vip4.Addr(), icmpDestUnreach, icmpPortUnreach, 0,
			udp(vip4, client4, "x").frame(), 0), 14 + 20 + 8 + 20 + 8},
		{"ICMPv6 error to the VIP", icmpError(client6.Addr(), vip6.Addr(), icmp6DestUnreach, icmp6PortUnreach, 0,
			udp(vip6, client6, "x").frame(), 0), 14 + 40 + 8 + 40 + 8},
	}
	for _, k := range kinds {
		fixed := 14 + 20
		if k.f[12] == 0x86 {
			fixed = 14 + 40
		}
		for n := fixed; n < k.headers; n++ {
			for _, agree := range []bool{false, true} {
				f := k.f[:n]
				what := "lying"
				if agree {
					f, what = agreeLengths(f), "agreeing"
				}
				if verdict, _ := d.run(f); verdict != verdictDrop {
					t.Errorf("%s cut to %d bytes (length field %s): verdict %d, want drop", k.name, n, what, int32(verdict))
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	var drops uint64
	for _, id := range []uint32{0, 1, 2, 6, 7} {
		for _, n := range d.stats(id).Drops {
			drops += n
		}
	}
	want := 0
	for _, k := range kinds {
		fixed := 14 + 20
		if k.f[12] == 0x86 {
			fixed = 14 + 40
		}
		want += 2 * (k.headers - fixed)
	}
	if drops != uint64(want) {
		t.Errorf("%d drops counted, want %d", drops, want)
	}
}

// ICMP errors of a live flow whose quote is cut at every length, their
// lengths agreeing: translated only once the quote holds the ports, with
// every checksum right (the quoted ones included); before, an error to the
// client passes as it came, and one to the VIP is dropped.
func TestICMPErrorsWithTheirQuoteCutShort(t *testing.T) {
	for _, fam := range []struct {
		name            string
		svc             service
		client, vip, be netip.AddrPort
		typ, code       uint8
		inL3            int // the quoted query's IP header (IPv4: with options)
	}{
		{"IPv4", service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}, client4, vip4, be4a.addr, icmpDestUnreach, icmpPortUnreach, 24},
		{"IPv6", service{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}}, client6, vip6, be6a.addr, icmp6DestUnreach, icmp6PortUnreach, 40},
	} {
		t.Run(fam.name, func(t *testing.T) {
			d := newDatapath(t)
			d.addService(fam.svc)
			q := udp(fam.client, fam.vip, "query with a payload")
			if fam.vip.Addr().Is4() {
				q.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}
			}
			a := udp(fam.be, fam.client, "answer")
			d.expect("query", q, ptr(q.to(fam.be)))
			d.expect("answer", a, ptr(a.from(fam.vip)))
			toClient := q.to(fam.be).frame()
			toVIP := a.from(fam.vip).frame()
			// The answer quoted to the VIP has no IP options.
			replyL3 := 20
			if !fam.vip.Addr().Is4() {
				replyL3 = 40
			}
			for n := 1; n < len(toClient)-14; n++ {
				in := icmpError(fam.be.Addr(), fam.client.Addr(), fam.typ, fam.code, 0, toClient, n)
				verdict, out := d.run(in)
				if verdict != verdictNext {
					t.Fatalf("error to the client quoting %d bytes: verdict %d", n, int32(verdict))
				}
				out = out[:len(in)]
				if n < fam.inL3+8 {
					if !bytes.Equal(out, in) {
						t.Errorf("error to the client quoting %d bytes (no ports): changed", n)
					}
					continue
				}
				want := icmpError(fam.vip.Addr(), fam.client.Addr(), fam.typ, fam.code, 0, q.frame(), n)
				if !bytes.Equal(out, want) {
					t.Errorf("error to the client quoting %d bytes:\n got %x\nwant %x", n, out, want)
				}
				verifyChecksums(t, fmt.Sprintf("error to the client quoting %d bytes", n), out)
			}
			for n := 1; n < len(toVIP)-14; n++ {
				in := icmpError(fam.client.Addr(), fam.vip.Addr(), fam.typ, fam.code, 0, toVIP, n)
				verdict, out := d.run(in)
				out = out[:len(in)]
				if n < replyL3+8 {
					if verdict != verdictDrop {
						t.Errorf("error to the VIP quoting %d bytes (no ports): verdict %d, want drop", n, int32(verdict))
					}
					continue
				}
				want := icmpError(fam.client.Addr(), fam.be.Addr(), fam.typ, fam.code, 0, a.frame(), n)
				if verdict != verdictNext || !bytes.Equal(out, want) {
					t.Errorf("error to the VIP quoting %d bytes: verdict %d\n got %x\nwant %x", n, int32(verdict), out, want)
				}
				verifyChecksums(t, fmt.Sprintf("error to the VIP quoting %d bytes", n), out)
			}
		})
	}
}

// An ICMP error whose quote is not the packet of a flow the error's
// addresses name: an IPv6 packet quoted in ICMP, an IPv4 one in ICMPv6, a
// flow of another service on the same VIP, a flow to another VIP. None is
// translated; to a VIP, all are dropped.
func TestICMPErrorsQuotingAnotherFlow(t *testing.T) {
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}})
	d.addService(service{id: 2, vip: vip4b, proto: protoUDP, backends: []backend{be4b}})
	d.addService(service{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}})
	q4, q6 := udp(client4, vip4, "q"), udp(client6, vip6, "q")
	d.expect("query", q4, ptr(q4.to(be4a.addr)))
	d.expect("answer", udp(be4a.addr, client4, "a"), ptr(udp(vip4, client4, "a")))
	d.expect("query6", q6, ptr(q6.to(be6a.addr)))
	d.expect("answer6", udp(be6a.addr, client6, "a"), ptr(udp(vip6, client6, "a")))
	reply4 := udp(vip4, client4, "a").frame()
	reply6 := udp(vip6, client6, "a").frame()
	for _, c := range []struct {
		name string
		f    []byte
	}{
		{"ICMP quoting IPv6", icmpError(client4.Addr(), vip4.Addr(), icmpDestUnreach, icmpPortUnreach, 0, reply6, 0)},
		{"ICMPv6 quoting IPv4", icmpError(client6.Addr(), vip6.Addr(), icmp6DestUnreach, icmp6PortUnreach, 0, reply4, 0)},
		{"a flow of the VIP's other port", icmpError(client4.Addr(), vip4.Addr(), icmpDestUnreach, icmpPortUnreach, 0,
			udp(netip.AddrPortFrom(vip4.Addr(), 81), client4, "a").frame(), 0)},
		{"a flow of another VIP", icmpError(client4.Addr(), vip4b.Addr(), icmpDestUnreach, icmpPortUnreach, 0, reply4, 0)},
	} {
		if verdict, _ := d.run(c.f); verdict != verdictDrop {
			t.Errorf("%s: verdict %d, want drop", c.name, int32(verdict))
		}
	}
	wantStats(t, d, 0, 0, 0, map[int]uint64{dropICMP: 4})
}

// BIG TCP lengths that lie: a fragment (BIG TCP packets are never
// fragments) and an IPv6 Fragment header with a payload length of 0 are
// malformed, GSO or not. A BIG TCP packet with IPv4 options is translated
// with the ports where the options end, and refused with a reset that
// acknowledges its whole payload.
func TestBigTCPLengthsThatLie(t *testing.T) {
	const mss = 1448
	payload := []byte(strings.Repeat("b", 2*mss))
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
	d.addService(service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}})
	d.addService(service{id: 2, vip: vip4b, proto: protoTCP})

	data4 := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: payload}
	fragment := data4
	fragment.fragOff = 0x2000 // MF
	later := data4
	later.fragOff = 0x0100
	data6 := segment{src: client6, dst: vip6, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: payload}
	frag6 := zeroPayloadLen(data6.fragments(5)[0])
	for _, c := range []struct {
		name string
		f    []byte
	}{
		{"IPv4 total length 0, first fragment", zeroTotLen(fragment.frame())},
		{"IPv4 total length 0, later fragment", zeroTotLen(later.frame())},
		{"IPv6 payload length 0, Fragment header", frag6},
	} {
		if verdict, _ := d.runGSO(c.f, mss, 2); verdict != verdictDrop {
			t.Errorf("%s (GSO): verdict %d, want drop", c.name, int32(verdict))
		}
	}

	withOpts := data4
	withOpts.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}
	if verdict, out := d.runGSO(zeroTotLen(withOpts.frame()), mss, 2); verdict != verdictNext {
		t.Errorf("BIG TCP with IP options: verdict %d", int32(verdict))
	} else if want := zeroTotLen(withOpts.to(be4a.addr).frame()); !bytes.Equal(out[:len(want)], want) {
		t.Errorf("BIG TCP with IP options:\n got %x\nwant %x", out[:64], want[:64])
	}

	refused := segment{src: client4, dst: vip4b, proto: protoTCP, flags: tcpPSH, seq: 1001, payload: payload}
	if verdict, out := d.runGSO(zeroTotLen(refused.frame()), mss, 2); verdict != verdictRedirect {
		t.Errorf("BIG TCP to a service without backends: verdict %d, want the reset", int32(verdict))
	} else if want := rst(refused); !bytes.Equal(out[:len(want)], want) {
		t.Errorf("reset of a BIG TCP packet:\n got %x\nwant %x", out[:len(want)], want)
	}
}

// A datagram too big for the backend's path, fragmented by the client: the
// router's Packet Too Big quotes its first fragment, whose Fragment header
// sits before the UDP header. It is the flow's error like any other (the
// client's kernel skips the Fragment header to find the socket): without
// it the client never learns the path's MTU through the VIP.
func TestICMPv6ErrorQuotingAFirstFragment(t *testing.T) {
	d := newDatapath(t)
	d.addService(service{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}})
	q := udp(client6, vip6, strings.Repeat("q", 1400))
	frags := q.fragments(0x51, 1232)
	first := q.to(be6a.addr).fragments(0x51, 1232)[0]
	if verdict, out := d.run(frags[0]); verdict != verdictNext || !bytes.Equal(out[:len(first)], first) {
		t.Fatalf("first fragment: verdict %d, to %s", int32(verdict), dstOf(out))
	}
	router := netip.MustParseAddr("fd00::fe")
	in := icmpError(router, client6.Addr(), icmp6PacketTooBig, 0, 1280, first, 1232)
	want := icmpError(vip6.Addr(), client6.Addr(), icmp6PacketTooBig, 0, 1280, frags[0], 1232)
	verdict, out := d.run(in)
	if verdict != verdictNext || !bytes.Equal(out[:len(want)], want) {
		t.Errorf("Packet Too Big quoting the first fragment: verdict %d, from %s; want it from the VIP about the VIP", int32(verdict), srcOf(out).Addr())
	}
	verifyChecksums(t, "Packet Too Big", out[:len(want)])
	// A later fragment quotes no ports: not the flow's to say.
	later := icmpError(router, client6.Addr(), icmp6PacketTooBig, 0, 1280, q.to(be6a.addr).fragments(0x51, 1232)[1], 0)
	if verdict, out := d.run(later); verdict != verdictNext || !bytes.Equal(out[:len(later)], later) {
		t.Errorf("Packet Too Big quoting a later fragment: verdict %d, from %s; want it passed as it came", int32(verdict), srcOf(out).Addr())
	}
}
