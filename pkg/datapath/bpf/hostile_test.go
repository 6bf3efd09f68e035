// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"encoding/binary"
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
