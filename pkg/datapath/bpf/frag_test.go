// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

// fragKey is the l4xds_frags key of a datagram: the IP ID as the program
// loads it (network-order bytes read in host order).
func fragKey(src, dst netip.Addr, id uint32, proto, dir uint8) L4xdsLbFragKey {
	k := L4xdsLbFragKey{Saddr: addr(src), Daddr: addr(dst), Proto: proto, Dir: dir}
	if src.Is4() {
		k.Id = uint32(port(uint16(id)))
	} else {
		k.Id = binary.NativeEndian.Uint32(binary.BigEndian.AppendUint32(nil, id))
	}
	return k
}

// fragSteps sends the fragments in order; each must come out as the
// fragment of the same index in want.
func fragSteps(name string, in, want [][]byte) []step {
	var steps []step
	for i := range in {
		steps = append(steps, step{name: name + " " + fragName(i), in: in[i], verdict: verdictNext, want: want[i]})
	}
	return steps
}

func fragName(i int) string {
	if i == 0 {
		return "first fragment"
	}
	return "fragment " + string(rune('1'+i))
}

func totalLen(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}

func TestFragments(t *testing.T) {
	// A 4000-byte DNS-like answer and a large query, fragmented for a
	// 1500-byte MTU (IPv4: 1480 bytes of payload a fragment, IPv6: 1448).
	big := strings.Repeat("0123456789abcdef", 250)
	query4 := udp(client4, vip4, big)
	answer4 := udp(be4a.addr, client4, big)
	query6 := udp(client6, vip6, big)
	answer6 := udp(be6a.addr, client6, big)
	small6 := udp(client6, vip6, "hello")
	cuts4 := []int{1480, 2960}
	cuts6 := []int{1448, 2896}

	udp4Svc := service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}
	udp6Svc := service{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}}

	// Two clients' datagrams that Maglev sends to different backends,
	// their fragments interleaved.
	mixed := service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a, be4b}, table: mixedTable}
	a := query4
	b := query4.sport(40001)
	for maglevChoice(b, mixedTable) == maglevChoice(a, mixedTable) {
		b = b.sport(b.src.Port() + 1)
	}
	backendOf := func(s segment) netip.AddrPort {
		if maglevChoice(s, mixedTable) == be4a.id {
			return be4a.addr
		}
		return be4b.addr
	}
	aIn, aWant := a.fragments(0x1111, cuts4...), a.to(backendOf(a)).fragments(0x1111, cuts4...)
	bIn, bWant := b.fragments(0x2222, cuts4...), b.to(backendOf(b)).fragments(0x2222, cuts4...)

	runScenarios(t, []scenario{
		{
			name:     "IPv4 UDP datagram in fragments to a VIP",
			services: []service{udp4Svc},
			steps: fragSteps("query", query4.fragments(0x4242, cuts4...),
				query4.to(be4a.addr).fragments(0x4242, cuts4...)),
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 3, totalLen(query4.fragments(0x4242, cuts4...)), nil)
				f, ok := d.frag(fragKey(client4.Addr(), vip4.Addr(), 0x4242, protoUDP, ctForward))
				if !ok || f.Addr != addr(be4a.addr.Addr()) || f.SvcId != 1 {
					t.Errorf("frag entry = %+v (found %v), want backend %s of service 1", f, ok, be4a.addr.Addr())
				}
			},
		},
		{
			name:     "interleaved datagrams keep their own backends",
			services: []service{mixed},
			steps: []step{
				{name: "A first fragment", in: aIn[0], verdict: verdictNext, want: aWant[0]},
				{name: "B first fragment", in: bIn[0], verdict: verdictNext, want: bWant[0]},
				{name: "B fragment 2", in: bIn[1], verdict: verdictNext, want: bWant[1]},
				{name: "A fragment 3", in: aIn[2], verdict: verdictNext, want: aWant[2]},
				{name: "A fragment 2", in: aIn[1], verdict: verdictNext, want: aWant[1]},
				{name: "B fragment 3", in: bIn[2], verdict: verdictNext, want: bWant[2]},
			},
		},
		{
			name:     "an IPv4 fragment whose first fragment was not seen",
			services: []service{udp4Svc},
			steps: []step{
				drop("to the VIP", query4.fragments(0x4242, cuts4...)[1]),
				// The first fragment of another datagram maps only its own.
				{
					name: "another datagram's first fragment", verdict: verdictNext,
					in: query4.fragments(0x4343, cuts4...)[0], want: query4.to(be4a.addr).fragments(0x4343, cuts4...)[0],
				},
				drop("to the VIP after another datagram", query4.fragments(0x4242, cuts4...)[2]),
				pass("to another address", udp(client4, other4, big).fragments(0x4242, cuts4...)[1]),
				pass("from a backend", answer4.fragments(0x4242, cuts4...)[1]),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropFragment: 2})
				wantStats(t, d, 1, 1, len(query4.fragments(0x4343, cuts4...)[0]), nil)
			},
		},
		{
			name:     "IPv4 reply fragments from a backend are reverse NATed",
			services: []service{udp4Svc},
			steps: append([]step{forward("query", udp(client4, vip4, "q"), be4a.addr)},
				fragSteps("answer", answer4.fragments(0x9999, cuts4...),
					answer4.from(vip4).fragments(0x9999, cuts4...))...),
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 4, len(udp(client4, vip4, "q").frame())+totalLen(answer4.fragments(0x9999, cuts4...)), nil)
				f, ok := d.frag(fragKey(be4a.addr.Addr(), client4.Addr(), 0x9999, protoUDP, ctReply))
				if !ok || f.Addr != addr(vip4.Addr()) || f.SvcId != 1 {
					t.Errorf("frag entry = %+v (found %v), want VIP %s of service 1", f, ok, vip4.Addr())
				}
			},
		},
		{
			name:     "IPv6 UDP datagram in fragments to a VIP and back",
			services: []service{udp6Svc},
			steps: append(
				fragSteps("query", query6.fragments(0x12345678, cuts6...), query6.to(be6a.addr).fragments(0x12345678, cuts6...)),
				fragSteps("answer", answer6.fragments(0x9abcdef0, cuts6...), answer6.from(vip6).fragments(0x9abcdef0, cuts6...))...),
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 6, 6, totalLen(query6.fragments(0x12345678, cuts6...))+totalLen(answer6.fragments(0x9abcdef0, cuts6...)), nil)
				if _, ok := d.frag(fragKey(client6.Addr(), vip6.Addr(), 0x12345678, protoUDP, ctForward)); !ok {
					t.Error("no frag entry of the query")
				}
				if _, ok := d.frag(fragKey(be6a.addr.Addr(), client6.Addr(), 0x9abcdef0, protoUDP, ctReply)); !ok {
					t.Error("no frag entry of the answer")
				}
			},
		},
		{
			name:     "IPv6 fragments without their first, and an atomic fragment",
			services: []service{udp6Svc},
			steps: []step{
				drop("to the VIP", query6.fragments(7, cuts6...)[1]),
				pass("from a backend", answer6.fragments(7, cuts6...)[2]),
				// Offset 0 without M: a whole datagram behind a
				// Fragment header (RFC 6946).
				{name: "atomic fragment", in: small6.fragments(8)[0], verdict: verdictNext, want: small6.to(be6a.addr).fragments(8)[0]},
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropFragment: 1})
				wantStats(t, d, 6, 1, len(small6.fragments(8)[0]), nil)
				if _, ok := d.frag(fragKey(client6.Addr(), vip6.Addr(), 8, protoUDP, ctForward)); ok {
					t.Error("an atomic fragment left a frag entry")
				}
			},
		},
		{
			name:     "IPv4 TCP segment in fragments",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}}},
			steps: func() []step {
				s := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 7, ack: 99, payload: []byte(big[:100])}
				return fragSteps("segment", s.fragments(0x77, 24, 64), s.to(be4a.addr).fragments(0x77, 24, 64))
			}(),
		},
	})
}
