// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// flowState reports where the flow's forward entry is: l4xds_ct
// (established), l4xds_ct_new (not yet) or nowhere.
func (d *datapath) flowState(client, vip netip.AddrPort, proto uint8) string {
	k := ctKey(client, vip, proto, ctForward)
	if e, ok := d.ct(k); ok {
		if e.Flags&ctFClosing != 0 {
			return "established closing"
		}
		return "established"
	}
	if e, ok := d.ctNew(k); ok {
		if e.Flags&ctFNew == 0 {
			d.t.Errorf("entry of %s -> %s in l4xds_ct_new without CT_F_NEW: %+v", client, vip, e)
		}
		return "new"
	}
	return "none"
}

// TestConntrackEstablishment: which packets move a flow from l4xds_ct_new
// to l4xds_ct. A backend answers a spoofed SYN with SYN-ACKs only, and the
// spoofed client never acknowledges them: such a flow stays new.
func TestConntrackEstablishment(t *testing.T) {
	svc := service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}}
	synSeg := syn(client4, vip4)
	synAck := segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpSYN | tcpACK, seq: 5000, ack: 1001}
	ack := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 5001}
	type packet struct {
		name string
		seg  segment
		// fromBackend: reverse NAT from the VIP, else DNAT to the backend.
		fromBackend bool
	}
	for _, tc := range []struct {
		name    string
		svc     service
		packets []packet
		want    string
	}{
		{"SYN", svc, []packet{{"SYN", synSeg, false}}, "new"},
		{"SYN, SYN-ACK", svc, []packet{{"SYN", synSeg, false}, {"SYN-ACK", synAck, true}}, "new"},
		{"SYN, SYN-ACK, ACK", svc, []packet{{"SYN", synSeg, false}, {"SYN-ACK", synAck, true}, {"ACK", ack, false}}, "established"},
		{"SYN, SYN-ACK, ACK of another sequence", svc, []packet{
			{"SYN", synSeg, false}, {"SYN-ACK", synAck, true}, {"blind ACK", segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 77}, false},
		}, "new"},
		{"SYN, ACK before any SYN-ACK", svc, []packet{{"SYN", synSeg, false}, {"blind ACK", ack, false}}, "new"},
		{"SYN, SYN-ACK, SYN-ACK retransmitted, ACK", svc, []packet{
			{"SYN", synSeg, false}, {"SYN-ACK", synAck, true}, {"SYN-ACK again", synAck, true}, {"ACK", ack, false},
		}, "established"},
		{"SYN, RST from the backend", svc, []packet{
			{"SYN", synSeg, false}, {"RST", segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpRST | tcpACK, ack: 1001}, true},
		}, "new"},
		// The backend's side is established (an agent restarted during
		// the handshake, or its ACK lost): its data establishes the flow.
		{"SYN, data from the backend", svc, []packet{
			{"SYN", synSeg, false}, {"data", segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 5001, ack: 1001, payload: []byte("hi")}, true},
		}, "established"},
		// A FIN is not a SYN: established, and closing.
		{"SYN, FIN from the backend", svc, []packet{
			{"SYN", synSeg, false}, {"FIN", segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpFIN | tcpACK, seq: 5001, ack: 1001}, true},
		}, "established closing"},
		{"UDP datagram", service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}, []packet{
			{"datagram", udp(client4, vip4, "ping"), false},
		}, "new"},
		{"UDP datagram, answer", service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}, []packet{
			{"datagram", udp(client4, vip4, "ping"), false}, {"answer", udp(be4a.addr, client4, "pong"), true},
		}, "established"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			d.addService(tc.svc)
			for _, p := range tc.packets {
				want := p.seg.to(be4a.addr)
				if p.fromBackend {
					want = p.seg.from(vip4)
				}
				if verdict, out := d.run(p.seg.frame()); verdict != verdictNext || !bytes.Equal(out, want.frame()) {
					t.Fatalf("%s: verdict %d, %x; want %x", p.name, int32(verdict), out, want.frame())
				}
			}
			if got := d.flowState(client4, vip4, tc.svc.proto); got != tc.want {
				t.Errorf("flow after %s: %s, want %s", tc.name, got, tc.want)
			}
			// Both entries are in the same map.
			rk := ctKey(be4a.addr, client4, tc.svc.proto, ctReply)
			_, inCT := d.ct(rk)
			_, inNew := d.ctNew(rk)
			if wantCT := strings.HasPrefix(tc.want, "established"); inCT != wantCT || inNew == wantCT {
				t.Errorf("reply entry in l4xds_ct %v, in l4xds_ct_new %v; want the flow's map (%s)", inCT, inNew, tc.want)
			}
		})
	}
}

// TestReplyHonoursExpiry: an expired reply entry, which the LRU map has
// not reclaimed yet, reverse-NATs nothing.
func TestReplyHonoursExpiry(t *testing.T) {
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}})
	query, answer := udp(client4, vip4, "ping"), udp(be4a.addr, client4, "pong")
	if verdict, out := d.run(query.frame()); verdict != verdictNext || !bytes.Equal(out, query.to(be4a.addr).frame()) {
		t.Fatalf("query: verdict %d, %x", int32(verdict), out)
	}
	if verdict, out := d.run(answer.frame()); verdict != verdictNext || !bytes.Equal(out, answer.from(vip4).frame()) {
		t.Fatalf("answer: verdict %d, %x", int32(verdict), out)
	}
	key := ctKey(be4a.addr, client4, protoUDP, ctReply)
	e, ok := d.ct(key)
	if !ok {
		t.Fatalf("no reply entry after the answer")
	}
	e.LastSeen = monotonicNow(t) - uint64(61*time.Second)
	d.putCT(key, e)
	if verdict, out := d.run(answer.frame()); verdict != verdictNext || !bytes.Equal(out, answer.frame()) {
		t.Errorf("an answer with an expired reply entry: verdict %d, from %s; want it unchanged", int32(verdict), srcOf(out))
	}
}
