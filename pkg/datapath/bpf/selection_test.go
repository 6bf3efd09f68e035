// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

var mixedTable = []uint32{1, 2, 2, 1, 2, 1, 1}

// chosen is the backend a forwarded frame went to.
func chosen(t *testing.T, d *datapath, seg segment, backends ...backend) backend {
	t.Helper()
	verdict, out := d.run(seg.frame())
	if verdict != verdictNext {
		t.Fatalf("port %d: verdict %d, want TCX_NEXT", seg.src.Port(), int32(verdict))
	}
	for _, b := range backends {
		if bytes.Equal(out, seg.to(b.addr).frame()) {
			return b
		}
	}
	t.Fatalf("port %d: not forwarded to any backend: %x", seg.src.Port(), out)
	return backend{}
}

// handshake completes the TCP flow whose SYN went to be: the backend's
// SYN-ACK leaves from the VIP, the client's ACK goes to be, and the flow is
// established.
func handshake(t *testing.T, d *datapath, syn segment, be netip.AddrPort) {
	t.Helper()
	synAck := segment{src: be, dst: syn.src, proto: protoTCP, flags: tcpSYN | tcpACK, seq: 5000, ack: syn.seq + 1}
	if verdict, out := d.run(synAck.frame()); verdict != verdictNext || !bytes.Equal(out, synAck.from(syn.dst).frame()) {
		t.Fatalf("SYN-ACK of %s: verdict %d, %x; want it from %s", be, int32(verdict), out, syn.dst)
	}
	ack := segment{src: syn.src, dst: syn.dst, proto: protoTCP, flags: tcpACK, seq: syn.seq + 1, ack: 5001}
	if verdict, out := d.run(ack.frame()); verdict != verdictNext || !bytes.Equal(out, ack.to(be).frame()) {
		t.Fatalf("ACK of %s: verdict %d, %x; want it to %s", syn.src, int32(verdict), out, be)
	}
	if _, ok := d.ct(ctKey(syn.src, syn.dst, protoTCP, ctForward)); !ok {
		t.Fatalf("the handshake of %s -> %s left no established entry", syn.src, syn.dst)
	}
}

// maglevChoice is the backend the Maglev table gives a new flow.
func maglevChoice(seg segment, table []uint32) uint32 {
	return table[flowHash(seg.src, seg.dst, seg.proto)%testMaglevN]
}

// twoBackendCases are a service of two backends (ids 1 and 2) per family
// and protocol.
var twoBackendCases = []struct {
	name     string
	vip      netip.AddrPort
	client   netip.AddrPort
	proto    uint8
	backends []backend
}{
	{"IPv4 TCP", vip4, client4, protoTCP, []backend{be4a, be4b}},
	{"IPv4 UDP", vip4, client4, protoUDP, []backend{be4a, be4b}},
	{"IPv6 TCP", vip6, client6, protoTCP, []backend{{id: 1, addr: be6a.addr}, {id: 2, addr: be6b.addr}}},
	{"IPv6 UDP", vip6, client6, protoUDP, []backend{{id: 1, addr: be6a.addr}, {id: 2, addr: be6b.addr}}},
}

func TestMaglevSlotFromFlowHash(t *testing.T) {
	for _, tc := range twoBackendCases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			d.addService(service{id: 1, vip: tc.vip, proto: tc.proto, backends: tc.backends, table: mixedTable})
			seen := map[uint32]int{}
			for p := uint16(40000); p < 40032; p++ {
				seg := segment{src: netip.AddrPortFrom(tc.client.Addr(), p), dst: tc.vip, proto: tc.proto, flags: tcpSYN}
				got := chosen(t, d, seg, tc.backends...)
				if want := maglevChoice(seg, mixedTable); got.id != want {
					t.Fatalf("port %d went to backend %d, want %d (slot %d)", p, got.id, want,
						flowHash(seg.src, seg.dst, seg.proto)%testMaglevN)
				}
				seen[got.id]++
			}
			if len(seen) != 2 {
				t.Errorf("32 flows all went to one backend: %v", seen)
			}
		})
	}
}

func TestSessionAffinity(t *testing.T) {
	d := newDatapath(t)
	backends := []backend{be4a, be4b}
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, flags: svcAffinity, affinityTimeout: 60, backends: backends, table: mixedTable})
	first := syn(client4, vip4)
	pinned := chosen(t, d, first, backends...)
	// Affinity is written once the flow is established: spoofed sources,
	// which never complete a handshake, cannot flush it.
	key := L4xdsLbAffinityKey{Client: addr(client4.Addr()), SvcId: 1}
	var a L4xdsLbAffinity
	if err := d.objs.L4xdsAffinity.Lookup(&key, &a); err == nil {
		t.Fatalf("a SYN alone wrote the affinity of %s: %+v", client4.Addr(), a)
	}
	handshake(t, d, first, pinned.addr)

	// A client port whose Maglev slot names the other backend (the slot
	// choice itself is checked by TestMaglevSlotFromFlowHash).
	var other segment
	for p := uint16(40001); ; p++ {
		other = first.sport(p)
		if maglevChoice(other, mixedTable) != pinned.id {
			break
		}
	}
	if got := chosen(t, d, other, backends...); got.id != pinned.id {
		t.Fatalf("new client port went to backend %d, want %d (affinity)", got.id, pinned.id)
	}
	d.must(d.objs.L4xdsAffinity.Lookup(&key, &a), "affinity of %s", client4.Addr())
	if a.BackendId != pinned.id {
		t.Fatalf("affinity entry names backend %d, want %d", a.BackendId, pinned.id)
	}

	// Another client has its own choice.
	otherClient := other.from(netip.AddrPortFrom(netip.MustParseAddr("198.51.100.8"), other.src.Port()))
	if got, want := chosen(t, d, otherClient, backends...).id, maglevChoice(otherClient, mixedTable); got != want {
		t.Fatalf("another client went to backend %d, want its Maglev choice %d", got, want)
	}

	// A backend that stops being active loses the affinity for new flows.
	stopped := pinned
	stopped.state = backendTerminating
	d.putBackend(1, stopped)
	next := other.sport(other.src.Port() + 1000)
	for maglevChoice(next, mixedTable) == pinned.id {
		next = next.sport(next.src.Port() + 1)
	}
	if got := chosen(t, d, next, backends...); got.id == pinned.id {
		t.Fatalf("a terminating backend kept getting new flows through affinity")
	}

	// So does an active one out of the table (a priority behind the
	// best, or weight 0): affinity does not override failover.
	standby := pinned
	standby.flags = backendFStandby
	d.putBackend(1, standby)
	a.LastUsed, a.BackendId = monotonicNow(t), pinned.id
	d.must(d.objs.L4xdsAffinity.Put(&key, &a), "affinity update")
	next = next.sport(next.src.Port() + 1)
	for maglevChoice(next, mixedTable) == pinned.id {
		next = next.sport(next.src.Port() + 1)
	}
	if got := chosen(t, d, next, backends...); got.id == pinned.id {
		t.Fatalf("a standby backend kept getting new flows through affinity")
	}
	d.putBackend(1, pinned)

	// An entry older than the timeout is not used.
	a.LastUsed = monotonicNow(t) - uint64(61*time.Second)
	a.BackendId = pinned.id
	d.must(d.objs.L4xdsAffinity.Put(&key, &a), "affinity update")
	next = next.sport(next.src.Port() + 1)
	for maglevChoice(next, mixedTable) == pinned.id {
		next = next.sport(next.src.Port() + 1)
	}
	if got := chosen(t, d, next, backends...); got.id == pinned.id {
		t.Fatalf("an expired affinity still pinned the client")
	}
}

func TestTCPCloseMarksBothEntries(t *testing.T) {
	for _, tc := range []struct {
		name string
		fin  segment // FIN or RST, from either side
	}{
		{"FIN from the client", segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpFIN | tcpACK, seq: 1001, ack: 5001}},
		{"RST from the backend", segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpRST, seq: 5001}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}})
			if v, _ := d.run(syn(client4, vip4).frame()); v != verdictNext {
				t.Fatalf("syn: verdict %d", int32(v))
			}
			handshake(t, d, syn(client4, vip4), be4a.addr)
			fwd, rep := ctKey(client4, vip4, protoTCP, ctForward), ctKey(be4a.addr, client4, protoTCP, ctReply)
			for _, k := range []L4xdsLbCtKey{fwd, rep} {
				if e, ok := d.ct(k); !ok || e.Flags&ctFClosing != 0 {
					t.Fatalf("entry dir %d before close = %+v (found %v)", k.Dir, e, ok)
				}
			}
			if v, _ := d.run(tc.fin.frame()); v != verdictNext {
				t.Fatalf("close: verdict %d", int32(v))
			}
			for _, k := range []L4xdsLbCtKey{fwd, rep} {
				if e, ok := d.ct(k); !ok || e.Flags&ctFClosing == 0 {
					t.Errorf("entry dir %d after close = %+v (found %v), want closing", k.Dir, e, ok)
				}
			}
		})
	}
}

// A service of one backend has no Maglev table: its entry names the
// backend, and every packet comes out as it does from a table whose every
// slot names that backend.
func TestOneBackendWithoutATable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vip    netip.AddrPort
		client netip.AddrPort
		proto  uint8
		be     backend
	}{
		{"IPv4 TCP", vip4, client4, protoTCP, be4a},
		{"IPv4 UDP", vip4, client4, protoUDP, be4a},
		{"IPv6 TCP", vip6, client6, protoTCP, be6a},
		{"IPv6 UDP", vip6, client6, protoUDP, be6a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, single := newDatapath(t), newDatapath(t)
			table.addService(service{id: 1, vip: tc.vip, proto: tc.proto, backends: []backend{tc.be}})
			single.addService(service{id: 1, vip: tc.vip, proto: tc.proto, backends: []backend{tc.be}, single: tc.be.id})
			var inner *ebpf.Map
			if err := single.objs.L4xdsMaglev.Lookup(uint32(1), &inner); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Fatalf("Maglev table of the service of one backend: %v, want none", err)
			}
			for p := uint16(40000); p < 40016; p++ {
				seg := segment{src: netip.AddrPortFrom(tc.client.Addr(), p), dst: tc.vip, proto: tc.proto, flags: tcpSYN, payload: []byte("x")}
				wantVerdict, want := table.run(seg.frame())
				verdict, got := single.run(seg.frame())
				if verdict != wantVerdict || !bytes.Equal(got, want) || !bytes.Equal(got, seg.to(tc.be.addr).frame()) {
					t.Fatalf("port %d: verdict %d, %x; with a table %d, %x", p, int32(verdict), got, int32(wantVerdict), want)
				}
			}
			if got, want := single.stats(1), table.stats(1); got != want || got.Packets != 16 {
				t.Errorf("counters %+v, with a table %+v", got, want)
			}
		})
	}

	// The entry naming a backend of another service: dropped, as a table
	// slot naming one is.
	d := newDatapath(t)
	d.addService(service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}, single: be4a.id})
	d.addService(service{id: 2, vip: vip4b, proto: protoTCP, backends: []backend{be4b}, single: be4a.id})
	if verdict, _ := d.run(syn(client4, vip4b).frame()); verdict != verdictDrop {
		t.Errorf("verdict %d, want TCX_DROP", int32(verdict))
	}
	wantStats(t, d, 2, 0, 0, map[int]uint64{dropNoBackend: 1})
}

// Slots of backend 0 are the reject share (reject_weight): a new flow that
// hashes to one is refused as if the service had no backend (RST, ICMP
// port unreachable), every other one goes to its slot's backend.
func TestRejectShareSlots(t *testing.T) {
	table := []uint32{1, 0, 2, 0, 1, 2, 0}
	for _, tc := range twoBackendCases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDatapath(t)
			d.addService(service{id: 1, vip: tc.vip, proto: tc.proto, backends: tc.backends, table: table})
			refused := 0
			for p := uint16(40000); p < 40032; p++ {
				seg := segment{src: netip.AddrPortFrom(tc.client.Addr(), p), dst: tc.vip, proto: tc.proto, flags: tcpSYN}
				if maglevChoice(seg, table) != 0 {
					chosen(t, d, seg, tc.backends...)
					continue
				}
				refused++
				want := rst(seg)
				if tc.proto == protoUDP {
					want = portUnreachable(seg, seg.frame())
				}
				if verdict, out := d.run(seg.frame()); verdict != verdictRedirect || !bytes.Equal(out, want) {
					t.Fatalf("port %d (a reject slot): verdict %d, %x; want the refusal %x", p, int32(verdict), out, want)
				}
			}
			if refused == 0 || refused == 32 {
				t.Fatalf("%d of 32 flows hashed to a reject slot: the test needs some of each", refused)
			}
			if st := d.stats(1); st.Packets != uint64(32-refused) || st.Drops[dropNoBackend] != uint64(refused) {
				t.Errorf("counters %+v: want %d packets forwarded, %d no-backend drops", st, 32-refused, refused)
			}
		})
	}
}
