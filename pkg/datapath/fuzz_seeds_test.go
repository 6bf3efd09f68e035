// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The hand-made inputs of FuzzDatapath, one per feature, written as what
// they decode into (seedScenario.bytes is decodeScenario backwards), and
// kept in its corpus, testdata/fuzz/FuzzDatapath.

// TestFuzzDatapathSeeds checks that the corpus holds the seeds as written
// here; UPDATE_FUZZ_SEEDS=1 writes them.
func TestFuzzDatapathSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDatapath")
	for _, s := range fuzzSeeds() {
		path := filepath.Join(dir, "seed-"+s.name)
		want := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s.bytes())
		if os.Getenv("UPDATE_FUZZ_SEEDS") != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("seed %s: %s is not the seed as written in fuzzSeeds (UPDATE_FUZZ_SEEDS=1 writes it): %v", s.name, path, err)
		}
		t.Logf("seed %s:\n%s", s.name, decodeScenario(s.bytes()))
	}
}

// Indexes into the decoder's pools and choices.
const (
	sVIP4, sVIP4b, sVIP6, sVIP6b = 0, 1, 2, 3 // fzVIPs
	sPort80, sPort53             = 0, 1       // fzPorts

	// fzPktDsts
	sDstMappedVIP4, sDstOther4, sDstOther6, sDstVIP4, sDstVIP4b, sDstVIP6, sDstVIP6b = 0, 1, 2, 3, 4, 5, 6
	sDport80, sDport53, sDport81                                                     = 0, 1, 2

	// Backends and clients: of the family of the VIP, these indexes.
	sBE0, sBE1, sBE2 = 0, 1, 2
	// Clients: 10.0.0.2 | 2001:db8:c::2; 203.0.113.9 | ::ffff:10.0.0.2;
	// 192.168.1.10 | fd00::10; 224.0.0.1 | ::ffff:224.0.0.1; - | ff02::1.
	sClient0, sClient1, sClient2, sClientMcast, sClientMcast6 = 0, 1, 2, 3, 4

	// fzRejectAhead
	sAheadNone, sAhead1s, sAhead1h, sAhead48h = 0, 2, 3, 4

	sActive, sTerminating, sQuarantined, sMaintenance = 0, 3, 4, 5
	sW1, sW2, sW0                                     = 0, 2, 3
	sP0, sP1, sP2                                     = 0, 2, 3

	// fzRanges
	sRange10, sRange203, sRangeAll4, sRangeAll6, sRangeC6, sRangeMapped96, sRangeMapped10, sRange6slash8 = 0, 1, 2, 3, 4, 5, 6, 7

	sAffNone, sAff30m = 0, 2
	sRejNone, sRej1   = 0, 3

	sAge0, sAge2s, sAge30s, sAge90s, sAge7h = 0, 1, 2, 3, 4

	// fzKinds
	sToVIP, sFromBackend, sICMPError, sICMPOther, sOtherProto, sLaterFrag = 0, 3, 5, 7, 8, 9

	// fzTCPFlags
	sSYN, sACK, sSYNACK, sFINACK, sRST = 0, 1, 2, 3, 4
	// fzSeqs
	sSeq0, sSeq1000, sSeq1001, sSeq5000, sSeq5001 = 0, 1, 2, 3, 4
)

type seedBackend struct{ addr, state, weight, prio int }

type seedFrontend struct {
	udp      bool
	vip      int
	port     int
	backends []seedBackend
	ranges   []int
	affinity int
	reject   int
	removed  bool
}

type seedFlowIn struct {
	fe, client, cport, backend int
	established                bool
	age                        int
	// 1 closing, 2 reply lost, 4 SYN-ACK seen, 8 affinity, 16 the reply
	// entry of the next backend, 32 the forward entry established
	flags     byte
	synAckSeq int
}

type seedAffinityIn struct{ fe, client, backend, age int }

// seedPacket is one packet: its kind, then as decodePacket reads it.
type seedPacket struct {
	kind            int
	ttl, id         int
	flags, seq, ack int
	udp             bool
	payload         int
	dst, dport      int
	// fe, when not -1, aims at a frontend of the table (its VIP, port
	// and protocol) and its backend be.
	fe, be        int
	client, cport int
	other         int // sOtherProto: fzIP protocols' index
	fragOf        int // sLaterFrag: which first fragment
	lastFrag      bool
	// ICMP: from the backend's side (reply) or the client's; the
	// quote's length; the type and code indexes.
	icmpFromClient     bool
	icmpV6             bool // the error's family: IPv4 reads a code too
	icmpSrc, quote     int
	icmpType, icmpCode int
	mangle             byte
	mangleArgs         []byte // in the order decodePacket reads them
}

type seedScenario struct {
	name      string
	frontends []seedFrontend
	flows     []seedFlowIn
	affinity  []seedAffinityIn
	packets   []seedPacket
	// rejectAhead: fzRejectAhead's index.
	rejectAhead int
}

func (s seedScenario) bytes() []byte {
	var b []byte
	b = append(b, byte(len(s.frontends)-1))
	for _, fe := range s.frontends {
		b = append(b, boolByte(fe.udp), byte(fe.vip), byte(fe.port), byte(len(fe.backends)))
		for _, be := range fe.backends {
			b = append(b, 1, byte(be.addr), byte(be.state), byte(be.weight), byte(be.prio))
		}
		b = append(b, []byte{0, 2, 3}[len(fe.ranges)])
		for _, r := range fe.ranges {
			b = append(b, byte(r))
		}
		b = append(b, byte(fe.affinity), byte(fe.reject), boolByte(!fe.removed))
	}
	b = append(b, 1) // no VIP removed long ago
	b = append(b, byte(len(s.flows)))
	for _, f := range s.flows {
		b = append(b, byte(f.fe), 1, byte(f.client), byte(f.cport), byte(f.backend), boolByte(!f.established), byte(f.age), f.flags)
		if !f.established && f.flags&4 != 0 {
			b = append(b, byte(f.synAckSeq))
		}
	}
	b = append(b, byte(len(s.affinity)))
	for _, a := range s.affinity {
		b = append(b, byte(a.fe), 1, byte(a.client), byte(a.backend), byte(a.age))
	}
	b = append(b, byte(len(s.packets)-1))
	for _, p := range s.packets {
		b = append(b, byte(p.kind), byte(p.ttl), byte(p.id), byte(p.flags), byte(p.seq), byte(p.ack), boolByte(p.udp),
			byte(p.payload), byte(p.dst), byte(p.dport), 1, 0)
		if p.fe >= 0 {
			b = append(b, 1, byte(p.fe))
			if len(s.frontends[p.fe].backends) > 0 {
				b = append(b, byte(p.be))
			}
		} else {
			b = append(b, 0)
		}
		b = append(b, 1, byte(p.client), byte(p.cport))
		switch p.kind {
		case sOtherProto:
			b = append(b, byte(p.other))
		case sICMPError, sICMPOther:
			b = append(b, boolByte(p.icmpFromClient))
			if !p.icmpFromClient {
				b = append(b, byte(p.icmpSrc))
			}
			b = append(b, byte(p.quote), byte(p.icmpType))
			if p.kind == sICMPError && !p.icmpV6 {
				b = append(b, byte(p.icmpCode))
			}
		case sLaterFrag:
			b = append(b, byte(p.fragOf), boolByte(!p.lastFrag))
		}
		if p.mangle == 0 {
			b = append(b, 1)
		} else {
			b = append(b, 0, p.mangle)
			b = append(b, p.mangleArgs...)
		}
	}
	return append(b, byte(s.rejectAhead))
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// toVIP is a packet from a client to frontend fe, by way of its backend be.
func toVIP(fe, be, client, flags, seq, ack int) seedPacket {
	return seedPacket{kind: sToVIP, fe: fe, be: be, client: client, flags: flags, seq: seq, ack: ack}
}

// fromBackend is backend be of frontend fe answering the client.
func fromBackend(fe, be, client, flags, seq, ack int) seedPacket {
	return seedPacket{kind: sFromBackend, fe: fe, be: be, client: client, flags: flags, seq: seq, ack: ack}
}

func udp(p seedPacket) seedPacket { p.udp, p.payload = true, 1; return p }

func mangled(p seedPacket, m byte, args ...byte) seedPacket {
	p.mangle, p.mangleArgs = m, args
	return p
}

func fuzzSeeds() []seedScenario {
	be := func(addr, state, weight, prio int) seedBackend { return seedBackend{addr, state, weight, prio} }
	active := be(sBE0, sActive, sW1, sP0)
	return []seedScenario{{
		name:      "tcp4-handshake",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80, backends: []seedBackend{active}}},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			fromBackend(0, 0, sClient0, sSYNACK, sSeq5000, sSeq1001),
			toVIP(0, 0, sClient0, sACK, sSeq1001, sSeq5001),
			toVIP(0, 0, sClient0, sFINACK, sSeq1001, sSeq5001),
		},
	}, {
		name:      "udp6-reply-establishes",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{active, be(sBE1, sActive, sW2, sP0)}}},
		packets: []seedPacket{
			udp(toVIP(0, 0, sClient0, 0, 0, 0)),
			udp(fromBackend(0, 0, sClient0, 0, 0, 0)),
			udp(fromBackend(0, 1, sClient0, 0, 0, 0)),
			udp(toVIP(0, 0, sClient0, 0, 0, 0)),
		},
	}, {
		name: "affinity-yields-to-failover",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80, affinity: sAff30m,
			backends: []seedBackend{active, be(sBE1, sActive, sW1, sP1)}}},
		// The client's affinity names the second backend, now behind a
		// better priority.
		affinity: []seedAffinityIn{{fe: 0, client: sClient0, backend: 1, age: sAge0}},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			fromBackend(0, 0, sClient0, sSYNACK, sSeq5000, sSeq1001),
			toVIP(0, 0, sClient0, sACK, sSeq1001, sSeq5001),
		},
	}, {
		name: "affinity-kept",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, affinity: sAff30m,
			backends: []seedBackend{active, be(sBE1, sActive, sW1, sP0), be(sBE2, sActive, sW1, sP0)}}},
		affinity: []seedAffinityIn{{fe: 0, client: sClient0, backend: 2, age: sAge30s}},
		packets:  []seedPacket{udp(toVIP(0, 0, sClient0, 0, 0, 0)), udp(fromBackend(0, 2, sClient0, 0, 0, 0))},
	}, {
		name: "source-ranges-keep-families-apart",
		frontends: []seedFrontend{
			{vip: sVIP4, port: sPort80, backends: []seedBackend{active}, ranges: []int{sRangeAll6}},
			{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{active}, ranges: []int{sRange10, sRange6slash8}},
			{vip: sVIP4b, port: sPort80, backends: []seedBackend{active}, ranges: []int{sRangeMapped96}},
			{vip: sVIP6b, port: sPort80, backends: []seedBackend{active}, ranges: []int{sRangeC6, sRangeMapped10}},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			udp(toVIP(1, 0, sClient1, 0, 0, 0)),
			toVIP(2, 0, sClient1, sSYN, sSeq1000, sSeq0),
			toVIP(3, 0, sClient0, sSYN, sSeq1000, sSeq0),
		},
	}, {
		name: "removed-vip-and-untranslated",
		frontends: []seedFrontend{
			{vip: sVIP4, port: sPort80, backends: []seedBackend{active}, removed: true},
			{vip: sVIP6, port: sPort80, backends: []seedBackend{active}},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			{kind: sOtherProto, fe: 1, client: sClient0, other: 0},
			{kind: sICMPOther, fe: 1, client: sClient0, icmpFromClient: true, icmpV6: true, icmpType: 0},
			mangled(toVIP(1, 0, sClient0, sSYN, sSeq1000, sSeq0), 2, 0),
		},
	}, {
		name: "reject",
		frontends: []seedFrontend{
			{vip: sVIP4, port: sPort80, backends: []seedBackend{be(sBE0, sQuarantined, sW1, sP0)}},
			{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{be(sBE0, sMaintenance, sW1, sP0)}},
			{udp: true, vip: sVIP4, port: sPort53},
			{vip: sVIP6b, port: sPort80, backends: []seedBackend{active}, reject: sRej1},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			udp(toVIP(1, 0, sClient0, 0, 0, 0)),
			udp(toVIP(2, 0, sClient1, 0, 0, 0)),
			toVIP(3, 0, sClient1, sSYN, sSeq1000, sSeq0),
		},
	}, {
		name:      "fragments4",
		frontends: []seedFrontend{{udp: true, vip: sVIP4, port: sPort53, backends: []seedBackend{active}}},
		packets: []seedPacket{
			mangled(seedPacket{kind: sToVIP, fe: 0, client: sClient0, udp: true, payload: 3}, 1),
			{kind: sLaterFrag, fe: 0, client: sClient0, fragOf: 0, lastFrag: true},
			{kind: sLaterFrag, fe: -1, dst: sDstVIP4b, client: sClient0, udp: true},
		},
	}, {
		name:      "fragments6",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{active}}},
		packets: []seedPacket{
			mangled(seedPacket{kind: sToVIP, fe: 0, client: sClient0, udp: true, payload: 3}, 1),
			{kind: sLaterFrag, fe: 0, client: sClient0, fragOf: 0},
			udp(fromBackend(0, 0, sClient0, 0, 0, 0)),
		},
	}, {
		name:      "icmp-errors4",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80, backends: []seedBackend{active}}},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0),
			// The backend's fragmentation needed, quoting client -> backend.
			{kind: sICMPError, fe: 0, client: sClient0, icmpType: 0, icmpCode: 0},
			// A router's, with a quote long enough for the TCP checksum.
			{kind: sICMPError, fe: 0, client: sClient0, icmpSrc: 1, quote: 2, icmpType: 1, icmpCode: 1},
			// The client's port unreachable to the VIP, quoting VIP -> client.
			{kind: sICMPError, fe: 0, client: sClient0, icmpFromClient: true, icmpType: 0, icmpCode: 1},
		},
	}, {
		name:      "icmp-errors6",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{active}}},
		packets: []seedPacket{
			udp(toVIP(0, 0, sClient0, 0, 0, 0)),
			{kind: sICMPError, fe: 0, client: sClient0, udp: true, icmpV6: true, icmpType: 1},
			{kind: sICMPError, fe: 0, client: sClient0, udp: true, icmpFromClient: true, icmpV6: true, icmpType: 0},
			{kind: sICMPOther, fe: 0, client: sClient0, icmpV6: true, icmpType: 2}, // neighbour solicitation
		},
	}, {
		name: "established-drain-and-close",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80,
			backends: []seedBackend{be(sBE0, sTerminating, sW1, sP0), be(sBE1, sActive, sW1, sP0)}}},
		flows: []seedFlowIn{
			{fe: 0, client: sClient0, cport: 0, backend: 0, established: true, age: sAge2s, flags: 2},
			{fe: 0, client: sClient1, cport: 1, backend: 0, established: true, age: sAge0, flags: 1},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sACK, sSeq1001, sSeq5001),
			fromBackend(0, 0, sClient0, sFINACK, sSeq5001, sSeq1001),
			{kind: sToVIP, fe: 0, client: sClient1, cport: 1, flags: sSYN},
			{kind: sToVIP, fe: 0, client: sClient1, cport: 1, flags: sACK},
		},
	}, {
		name:      "half-open-flows",
		frontends: []seedFrontend{{vip: sVIP6, port: sPort80, backends: []seedBackend{active}}},
		flows: []seedFlowIn{
			{fe: 0, client: sClient0, backend: 0, age: sAge2s, flags: 4 | 8, synAckSeq: sSeq5001},
			{fe: 0, client: sClient1, backend: 0, age: sAge90s},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClient0, sACK, sSeq1001, sSeq5001),
			toVIP(0, 0, sClient1, sACK, sSeq1001, sSeq5001),
			fromBackend(0, 0, sClient1, sRST, sSeq0, sSeq0),
		},
	}, {
		name:      "malformed-and-big-tcp",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80, backends: []seedBackend{active}}, {vip: sVIP6, port: sPort80, backends: []seedBackend{active}}},
		packets: []seedPacket{
			mangled(toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), 2, 1),        // 8 bytes of IP options
			mangled(toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), 4, 1),        // data offset 15
			mangled(toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), 32, 0),       // total length 0 (BIG TCP)
			mangled(toVIP(1, 0, sClient0, sSYN, sSeq1000, sSeq0), 32|64, 0, 2), // payload length 0, cut
		},
	}, {
		name:      "unknown-port-and-other-addresses",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80, backends: []seedBackend{active}}},
		packets: []seedPacket{
			{kind: sToVIP, fe: -1, dst: sDstVIP4, dport: sDport81, client: sClient0},
			{kind: sToVIP, fe: -1, dst: sDstOther4, dport: sDport80, client: sClient0},
			{kind: sToVIP, fe: -1, dst: sDstMappedVIP4, dport: sDport80, client: sClient0},
			{kind: sICMPOther, fe: 0, client: sClient0, icmpFromClient: true, icmpType: 0}, // echo to the VIP
		},
	}, {
		name:      "ipv6-fragment-header-cut",
		frontends: []seedFrontend{{vip: sVIP6, port: sPort80, backends: []seedBackend{active}}},
		packets: []seedPacket{
			// A first fragment cut within its Fragment header, and
			// before it: malformed, to a VIP.
			mangled(toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), 1|64, 1),
			mangled(toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), 1|64, 0),
			// Not to a VIP: the stack's.
			mangled(seedPacket{kind: sToVIP, fe: -1, dst: sDstOther6, client: sClient0, flags: sSYN}, 1|64, 1),
		},
	}, {
		name:        "reject-bucket-ahead",
		frontends:   []seedFrontend{{vip: sVIP4, port: sPort80, backends: []seedBackend{be(sBE0, sQuarantined, sW1, sP0)}}},
		rejectAhead: sAhead48h,
		// Left 48 h ahead by a larger limit: this limit's empty bucket,
		// not two days without refusals.
		packets: []seedPacket{toVIP(0, 0, sClient0, sSYN, sSeq1000, sSeq0), toVIP(0, 0, sClient1, sSYN, sSeq1000, sSeq0)},
	}, {
		name:        "reject-bucket-within-burst",
		frontends:   []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{be(sBE0, sMaintenance, sW1, sP0)}}},
		rejectAhead: sAhead1s,
		packets:     []seedPacket{udp(toVIP(0, 0, sClient0, 0, 0, 0)), udp(toVIP(0, 0, sClient1, 0, 0, 0))},
	}, {
		name: "refusals-to-no-single-host",
		frontends: []seedFrontend{
			{vip: sVIP4, port: sPort80, backends: []seedBackend{be(sBE0, sQuarantined, sW1, sP0)}},
			{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{be(sBE0, sMaintenance, sW1, sP0)}},
		},
		packets: []seedPacket{
			toVIP(0, 0, sClientMcast, sSYN, sSeq1000, sSeq0),
			udp(toVIP(1, 0, sClientMcast6, 0, 0, 0)),
			// IPv4-mapped multicast is no IPv6 multicast: refused.
			udp(toVIP(1, 0, sClientMcast, 0, 0, 0)),
		},
	}, {
		name: "half-open-stale",
		frontends: []seedFrontend{{vip: sVIP4, port: sPort80,
			backends: []seedBackend{active, be(sBE1, sActive, sW1, sP0)}}},
		// Flows gone to another backend, the reply entry of the one
		// they left behind; one established meanwhile.
		flows: []seedFlowIn{
			{fe: 0, client: sClient0, backend: 0, age: sAge0, flags: 16},
			{fe: 0, client: sClient1, backend: 0, age: sAge0, flags: 16 | 32},
		},
		packets: []seedPacket{
			fromBackend(0, 0, sClient0, sSYNACK, sSeq5000, sSeq1001),
			fromBackend(0, 1, sClient0, sSYNACK, sSeq5000, sSeq1001),
			{kind: sICMPError, fe: 0, be: 1, client: sClient1, icmpType: 0, icmpCode: 0},
			{kind: sICMPError, fe: 0, be: 0, client: sClient1, icmpType: 0, icmpCode: 0},
		},
	}, {
		name: "half-open-established-elsewhere",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53,
			backends: []seedBackend{active, be(sBE1, sActive, sW1, sP0)}}},
		// The forward entry established on another CPU: a SYN-ACK is
		// not remembered in it, an answer establishes the flow.
		flows: []seedFlowIn{{fe: 0, client: sClient0, backend: 0, age: sAge2s, flags: 32}},
		packets: []seedPacket{
			udp(fromBackend(0, 0, sClient0, 0, 0, 0)),
			udp(fromBackend(0, 1, sClient0, 0, 0, 0)),
		},
	}, {
		name:      "icmp6-errors-quoting-fragments",
		frontends: []seedFrontend{{udp: true, vip: sVIP6, port: sPort53, backends: []seedBackend{active}}},
		packets: []seedPacket{
			udp(toVIP(0, 0, sClient0, 0, 0, 0)),
			// Packet too big quoting a first fragment: the flow's.
			{kind: sICMPError, fe: 0, client: sClient0, udp: true, icmpV6: true, icmpType: 1, mangle: 1},
			// Quoting a later fragment: no ports, not translated.
			{kind: sICMPError, fe: 0, client: sClient0, udp: true, icmpV6: true, icmpType: 1, mangle: 1 | 2},
			// The client's, to the VIP, quoting the reply's first fragment.
			{kind: sICMPError, fe: 0, client: sClient0, udp: true, icmpFromClient: true, icmpV6: true, icmpType: 0, mangle: 1},
		},
	}}
}
