// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"net/netip"
	"testing"
)

// A refusal is never sent to a source that names no single host (RFC 1122
// 3.2.2, RFC 4443 2.4 e): a port unreachable to a multicast or broadcast
// source would reach many hosts, and makes the load balancer a reflector
// for spoofed ones. The packet is dropped, and counted as refused.
func TestNoRefusalToAMulticastOrBroadcastSource(t *testing.T) {
	d := newDatapath(t)
	dns4 := netip.AddrPortFrom(vip4.Addr(), 53)
	dns6 := netip.AddrPortFrom(vip6.Addr(), 53)
	d.addService(service{id: 1, vip: dns4, proto: protoUDP})
	d.addService(service{id: 2, vip: dns6, proto: protoUDP})
	for _, c := range []struct {
		src netip.AddrPort
		vip netip.AddrPort
	}{
		{netip.MustParseAddrPort("224.0.0.251:5353"), dns4},
		{netip.MustParseAddrPort("255.255.255.255:5353"), dns4},
		{netip.MustParseAddrPort("[ff02::fb]:5353"), dns6},
	} {
		verdict, out := d.run(udp(c.src, c.vip, "query").frame())
		if verdict != verdictDrop {
			t.Errorf("UDP from %s to %s (no backend): verdict %d, want %d (dropped); the program sent:\n% x", c.src, c.vip, int32(verdict), verdictDrop, out[:min(len(out), 64)])
		}
	}
}

// An IPv6 packet to a VIP whose Fragment header is cut off is not
// translated: it is dropped and counted, not passed to the stack, which
// forwards it (forwarding reads no extension header but Hop-by-Hop) to
// the node's default route.
func TestIPv6CutFragmentHeaderToAVIPIsDropped(t *testing.T) {
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip6, proto: protoTCP, backends: []backend{be6a}})
	frame := rawIP(client6.Addr(), vip6.Addr(), protoFragment, []byte{protoTCP, 0, 0, 0})
	verdict, _ := d.run(frame)
	if verdict != verdictDrop {
		t.Errorf("IPv6 to %s with 4 bytes of a Fragment header: verdict %d, want %d (dropped)", vip6.Addr(), int32(verdict), verdictDrop)
	}
	if got := d.stats(0).Drops[dropMalformed]; got != 1 {
		t.Errorf("malformed drops of no service: %d, want 1", got)
	}
}
