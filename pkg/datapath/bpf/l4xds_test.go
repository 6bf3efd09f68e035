// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	vip4    = netip.MustParseAddrPort("192.0.2.10:80")
	vip4b   = netip.MustParseAddrPort("192.0.2.11:80")
	vip6    = netip.MustParseAddrPort("[2001:db8::10]:80")
	client4 = netip.MustParseAddrPort("198.51.100.7:40000")
	client6 = netip.MustParseAddrPort("[2001:db8:1::7]:40000")
	other4  = netip.MustParseAddrPort("203.0.113.1:80")

	be4a = backend{id: 1, addr: netip.MustParseAddrPort("10.1.0.1:8080")}
	be4b = backend{id: 2, addr: netip.MustParseAddrPort("10.1.0.2:8081")}
	be6a = backend{id: 11, addr: netip.MustParseAddrPort("[fd00::1]:8080")}
	be6b = backend{id: 12, addr: netip.MustParseAddrPort("[fd00::2]:8081")}
)

func syn(src, dst netip.AddrPort) segment {
	return segment{src: src, dst: dst, proto: protoTCP, flags: tcpSYN, seq: 1000}
}

func udp(src, dst netip.AddrPort, payload string) segment {
	return segment{src: src, dst: dst, proto: protoUDP, payload: []byte(payload)}
}

// step sends one frame. Without want, the frame must come out unchanged.
type step struct {
	name    string
	before  func(d *datapath) // map changes between steps
	in      []byte
	verdict uint32
	want    []byte
}

type scenario struct {
	name     string
	services []service
	steps    []step
	check    func(t *testing.T, d *datapath)
}

func forward(name string, seg segment, to netip.AddrPort) step {
	return step{name: name, in: seg.frame(), verdict: verdictNext, want: seg.to(to).frame()}
}

func reply(name string, seg segment, from netip.AddrPort) step {
	return step{name: name, in: seg.frame(), verdict: verdictNext, want: seg.from(from).frame()}
}

func drop(name string, frame []byte) step {
	return step{name: name, in: frame, verdict: verdictDrop}
}

func pass(name string, frame []byte) step {
	return step{name: name, in: frame, verdict: verdictNext}
}

func TestDatapath(t *testing.T) {
	tcp4 := syn(client4, vip4)
	udp4 := udp(client4, vip4, "hello")
	tcp6 := syn(client6, vip6)
	udp6 := udp(client6, vip6, "hello, six")
	svc4 := service{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}}
	svc6 := service{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}}

	// The backend answers the client through the load balancer.
	synAck4 := segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpSYN | tcpACK, seq: 5000, ack: 1001}
	ack4 := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK, seq: 1001, ack: 5001}
	udpReply6 := udp(be6a.addr, client6, "pong")

	tableB := func(d *datapath) { d.setMaglev(1, []uint32{2, 2, 2, 2, 2, 2, 2}) }
	withB := []backend{be4a, be4b}
	onlyA := make([]uint32, testMaglevN)
	for i := range onlyA {
		onlyA[i] = be4a.id
	}

	ackSeg := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 7, ack: 99, payload: []byte("data")}
	finSeg := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpFIN | tcpACK, seq: 7, ack: 99}
	ipOptsUDP := udp4
	ipOptsUDP.ipOptions = []byte{0x01, 0x01, 0x01, 0x00} // NOP NOP NOP EOL
	bigUDP6 := udp(client6, vip6, string(bytes.Repeat([]byte("x"), 1400)))

	scenarios := []scenario{
		{
			name:     "IPv4 TCP forward",
			services: []service{svc4},
			steps:    []step{forward("syn", tcp4, be4a.addr)},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 1, len(tcp4.frame()), nil)
			},
		},
		{
			name:     "IPv4 UDP forward",
			services: []service{{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}},
			steps:    []step{forward("datagram", udp4, be4a.addr)},
		},
		{
			name:     "IPv4 UDP without checksum keeps none",
			services: []service{{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}}},
			steps: func() []step {
				s := udp4
				s.noUDPChecksum = true
				return []step{forward("datagram", s, be4a.addr)}
			}(),
		},
		{
			name:     "IPv4 with header options forward",
			services: []service{svc4},
			steps: func() []step {
				s := tcp4
				s.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}
				return []step{forward("syn", s, be4a.addr)}
			}(),
		},
		{
			name:     "IPv6 TCP forward",
			services: []service{svc6},
			steps:    []step{forward("syn", tcp6, be6a.addr)},
		},
		{
			name:     "IPv6 UDP forward",
			services: []service{{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}}},
			steps:    []step{forward("datagram", udp6, be6a.addr)},
		},
		{
			name:     "IPv4 reply reverse NAT",
			services: []service{svc4},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				reply("syn-ack", synAck4, vip4),
				forward("ack", ack4, be4a.addr),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 3, len(tcp4.frame())+len(synAck4.frame())+len(ack4.frame()), nil)
				e, ok := d.ct(ctKey(be4a.addr, client4, protoTCP, ctReply))
				if !ok || e.Vip != addr(vip4.Addr()) || e.VipPort != port(vip4.Port()) || e.BackendId != be4a.id || e.SvcId != 1 || e.Flags != 0 {
					t.Errorf("reply entry = %+v (found %v), want VIP %s on backend %d", e, ok, vip4, be4a.id)
				}
				for _, k := range []L4xdsLbCtKey{ctKey(client4, vip4, protoTCP, ctForward), ctKey(be4a.addr, client4, protoTCP, ctReply)} {
					if e, ok := d.ctNew(k); ok {
						t.Errorf("entry dir %d of the established flow still in l4xds_ct_new: %+v", k.Dir, e)
					}
				}
			},
		},
		{
			name:     "IPv6 reply reverse NAT",
			services: []service{{id: 6, vip: vip6, proto: protoUDP, backends: []backend{be6a}}},
			steps: []step{
				forward("datagram", udp6, be6a.addr),
				reply("answer", udpReply6, vip6),
			},
		},
		{
			name:     "a reply without conntrack passes unchanged",
			services: []service{svc4},
			steps:    []step{pass("syn-ack", synAck4.frame())},
		},
		{
			name:     "conntrack keeps the backend after the Maglev table changes",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: withB, table: onlyA}},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				func() step {
					s := forward("same flow", ackSeg, be4a.addr)
					s.before = tableB
					return s
				}(),
				forward("new flow", tcp4.sport(40001), be4b.addr),
			},
		},
		{
			name:     "a terminating backend keeps its flows and gets no new one",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: withB, table: onlyA}},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				func() step {
					s := forward("same flow", ackSeg, be4a.addr)
					s.before = func(d *datapath) {
						b := be4a
						b.state = backendTerminating
						d.putBackend(1, b)
						tableB(d)
					}
					return s
				}(),
				forward("new flow", tcp4.sport(40001), be4b.addr),
			},
		},
		{
			name:     "the flows of a deleted backend are balanced again",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: withB, table: onlyA}},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				func() step {
					s := forward("same flow", ackSeg, be4b.addr)
					s.before = func(d *datapath) {
						d.deleteBackend(be4a.id)
						tableB(d)
					}
					return s
				}(),
			},
			check: func(t *testing.T, d *datapath) {
				e, ok := d.ctNew(ctKey(client4, vip4, protoTCP, ctForward))
				if !ok || e.BackendId != be4b.id {
					t.Errorf("forward entry = %+v (found %v), want backend %d", e, ok, be4b.id)
				}
			},
		},
		{
			name:     "a backend moved to another service loses its flows",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: withB, table: onlyA}},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				func() step {
					s := forward("same flow", ackSeg, be4b.addr)
					s.before = func(d *datapath) {
						d.putBackend(99, be4a)
						tableB(d)
					}
					return s
				}(),
			},
		},
		{
			name:     "a closed TCP connection's ports start a new flow",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: withB, table: onlyA}},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				forward("fin", finSeg, be4a.addr),
				func() step {
					s := forward("syn again", tcp4, be4b.addr)
					s.before = tableB
					return s
				}(),
			},
			check: func(t *testing.T, d *datapath) {
				e, _ := d.ctNew(ctKey(client4, vip4, protoTCP, ctForward))
				if e.Flags&ctFClosing != 0 || e.BackendId != be4b.id {
					t.Errorf("forward entry after the new SYN = %+v, want backend %d, not closing", e, be4b.id)
				}
			},
		},
		{
			name:     "an expired UDP flow is balanced again",
			services: []service{{id: 1, vip: vip4, proto: protoUDP, backends: withB, table: onlyA}},
			steps: []step{
				forward("first", udp4, be4a.addr),
				func() step {
					s := forward("after the lifetime", udp4, be4b.addr)
					s.before = func(d *datapath) {
						key := ctKey(client4, vip4, protoUDP, ctForward)
						e, _ := d.ctNew(key)
						e.LastSeen = monotonicNow(d.t) - uint64(61*time.Second)
						d.putCTNew(key, e)
						tableB(d)
					}
					return s
				}(),
			},
		},
		{
			name:     "reject TCP with a RST (IPv4)",
			services: []service{{id: 1, vip: vip4, proto: protoTCP}},
			steps: []step{
				{name: "syn", in: tcp4.frame(), verdict: verdictRedirect, want: rst(tcp4)},
				{name: "ack with data", in: ackSeg.frame(), verdict: verdictRedirect, want: rst(ackSeg)},
				func() step {
					s := tcp4.sport(40001)
					s.ipOptions = []byte{0x01, 0x01, 0x01, 0x00}
					return step{name: "syn with IP options", in: s.frame(), verdict: verdictRedirect, want: rst(s)}
				}(),
				drop("rst", tcp4.withFlags(tcpRST).frame()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 0, 0, map[int]uint64{dropNoBackend: 4})
			},
		},
		{
			name:     "reject TCP with a RST (IPv6)",
			services: []service{{id: 6, vip: vip6, proto: protoTCP}},
			steps: []step{
				{name: "syn", in: tcp6.frame(), verdict: verdictRedirect, want: rst(tcp6)},
				func() step {
					s := segment{src: client6, dst: vip6, proto: protoTCP, flags: tcpFIN, seq: 42, payload: []byte("bye")}
					return step{name: "fin with data", in: s.frame(), verdict: verdictRedirect, want: rst(s)}
				}(),
			},
		},
		{
			name:     "reject UDP with ICMP port unreachable",
			services: []service{{id: 1, vip: vip4, proto: protoUDP}},
			steps: []step{
				{name: "datagram", in: udp4.frame(), verdict: verdictRedirect, want: portUnreachable(udp4, udp4.frame())},
				{name: "with IP options", in: ipOptsUDP.frame(), verdict: verdictRedirect, want: portUnreachable(ipOptsUDP, ipOptsUDP.frame())},
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 0, 0, map[int]uint64{dropNoBackend: 2})
			},
		},
		{
			name:     "reject UDP with ICMPv6 port unreachable",
			services: []service{{id: 6, vip: vip6, proto: protoUDP}},
			steps: []step{
				{name: "datagram", in: udp6.frame(), verdict: verdictRedirect, want: portUnreachable(udp6, udp6.frame())},
				{name: "quote cut at 1280 bytes", in: bigUDP6.frame(), verdict: verdictRedirect, want: portUnreachable(bigUDP6, bigUDP6.frame())},
			},
		},
		{
			name: "source ranges",
			services: []service{
				{id: 1, vip: vip4, proto: protoTCP, flags: svcSourceRanges, backends: []backend{be4a}},
				{id: 6, vip: vip6, proto: protoTCP, flags: svcSourceRanges, backends: []backend{be6a}},
			},
			steps: []step{
				func() step {
					s := forward("allowed v4", tcp4, be4a.addr)
					s.before = func(d *datapath) {
						d.allowSource(1, netip.MustParsePrefix("198.51.100.0/24"))
						d.allowSource(6, netip.MustParsePrefix("2001:db8:1::/48"))
						// Another service's range does not open this one.
						d.allowSource(6, netip.MustParsePrefix("203.0.113.0/24"))
					}
					return s
				}(),
				drop("denied v4", syn(netip.MustParseAddrPort("203.0.113.9:40000"), vip4).frame()),
				forward("allowed v6", tcp6, be6a.addr),
				drop("denied v6", syn(netip.MustParseAddrPort("[2001:db8:2::7]:40000"), vip6).frame()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 1, len(tcp4.frame()), map[int]uint64{dropSourceRange: 1})
				wantStats(t, d, 6, 1, len(tcp6.frame()), map[int]uint64{dropSourceRange: 1})
			},
		},
		{
			// An IPv6 range never covers an IPv4 client: ::/0 is all of
			// IPv6, IPv4-mapped addresses included, and none of IPv4.
			name: "source ranges keep the families apart",
			services: []service{
				{id: 1, vip: vip4, proto: protoTCP, flags: svcSourceRanges, backends: []backend{be4a}},
				{id: 6, vip: vip6, proto: protoTCP, flags: svcSourceRanges, backends: []backend{be6a}},
			},
			steps: []step{
				func() step {
					s := drop("v4 client outside the v4 ranges", syn(netip.MustParseAddrPort("10.200.1.2:40000"), vip4).frame())
					s.before = func(d *datapath) {
						for _, id := range []uint32{1, 6} {
							d.allowSource(id, netip.MustParsePrefix("203.0.113.0/24"))
							d.allowSource(id, netip.MustParsePrefix("::/0"))
						}
					}
					return s
				}(),
				forward("v4 client in a v4 range", syn(netip.MustParseAddrPort("203.0.113.9:40000"), vip4), be4a.addr),
				forward("v6 client in ::/0", syn(netip.MustParseAddrPort("[2001:db8:2::7]:40000"), vip6), be6a.addr),
				// An IPv6 packet from an IPv4-mapped source is an IPv6
				// client: the IPv6 ranges decide, here ::/0.
				forward("v6 client ::ffff:10.200.1.2 in ::/0", syn(netip.MustParseAddrPort("[::ffff:10.200.1.2]:40000"), vip6), be6a.addr),
				func() step {
					s := drop("v6 client ::ffff:203.0.113.9 is not in the v4 range 203.0.113.0/24",
						syn(netip.MustParseAddrPort("[::ffff:203.0.113.9]:40000"), vip6).frame())
					s.before = func(d *datapath) { d.denySource(6, netip.MustParsePrefix("::/0")) }
					return s
				}(),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 1, len(syn(client4, vip4).frame()), map[int]uint64{dropSourceRange: 1})
				wantStats(t, d, 6, 2, 2*len(syn(client6, vip6).frame()), map[int]uint64{dropSourceRange: 1})
			},
		},
		{
			name:     "a VIP port without a service is dropped",
			services: []service{svc4},
			steps: []step{
				drop("tcp/81", syn(client4, netip.AddrPortFrom(vip4.Addr(), 81)).frame()),
				drop("udp/80", udp4.frame()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropUnknownPort: 2})
				wantStats(t, d, 1, 0, 0, nil)
			},
		},
		{
			name:     "traffic not for a VIP passes unchanged",
			services: []service{svc4, svc6},
			steps: []step{
				pass("tcp to another address", syn(client4, other4).frame()),
				pass("udp to another address", udp(client6, netip.MustParseAddrPort("[2001:db8::99]:80"), "x").frame()),
				pass("ICMP echo to another address", icmpMessage(client4.Addr(), other4.Addr(), icmpEcho)),
				pass("IPv6 extension header to another address", withExtension(syn(client6, netip.MustParseAddrPort("[2001:db8::99]:80")), protoHopByHop)),
				pass("VLAN-tagged", func() []byte {
					f := tcp4.frame()
					return append(append(append([]byte{}, f[:12]...), 0x81, 0x00, 0x00, 0x05), f[12:]...)
				}()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 0, 0, 0, nil)
				wantStats(t, d, 1, 0, 0, nil)
			},
		},
		{
			name:     "unmapped fragments and truncated headers to a VIP are dropped",
			services: []service{svc4},
			steps: []step{
				func() step {
					s := tcp4
					s.fragOff = 0x0010 // offset 128, and no first fragment
					return drop("later fragment", s.frame())
				}(),
				func() step {
					s := syn(client4, other4)
					s.fragOff = 0x2000
					return pass("fragment to another address", s.frame())
				}(),
				drop("truncated TCP header", func() []byte {
					f := tcp4.frame()
					return truncateIPv4(f, 14+20+12)
				}()),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 0, 0, nil)
				wantStats(t, d, 0, 0, 0, map[int]uint64{dropFragment: 1, dropMalformed: 1})
			},
		},
		{
			name: "TCP and UDP on one VIP and port are two services",
			services: []service{
				{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}},
				{id: 2, vip: vip4, proto: protoUDP, backends: []backend{be4b}},
			},
			steps: []step{
				forward("tcp", tcp4, be4a.addr),
				forward("udp", udp4, be4b.addr),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 1, len(tcp4.frame()), nil)
				wantStats(t, d, 2, 1, len(udp4.frame()), nil)
			},
		},
		{
			name:     "no backend in the Maglev slot",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}, table: []uint32{42, 42, 42, 42, 42, 42, 42}}},
			steps:    []step{drop("syn", tcp4.frame())},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 0, 0, map[int]uint64{dropNoBackend: 1})
			},
		},
		{
			name:     "a backend of the other family is not used",
			services: []service{{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be6a}}},
			steps:    []step{drop("syn", tcp4.frame())},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 1, 0, 0, map[int]uint64{dropBackendFamily: 1})
			},
		},
		{
			// The reply key has no VIP: a client port reused for another
			// VIP with the same backend address takes the reply entry
			// over, and the first flow's next packet must take it back;
			// then the second flow's takes it back again.
			name: "a client port reused for two VIPs with one backend address",
			services: []service{
				{id: 1, vip: vip4, proto: protoUDP, backends: []backend{be4a}},
				{id: 2, vip: vip4b, proto: protoUDP, backends: []backend{{id: 3, addr: be4a.addr}}},
			},
			steps: []step{
				forward("to the first VIP", udp4, be4a.addr),
				forward("same port to the second VIP", udp(client4, vip4b, "hello"), be4a.addr),
				forward("the first flow again", udp4, be4a.addr),
				reply("the backend answers the first flow", udp(be4a.addr, client4, "pong"), vip4),
				forward("the second flow again", udp(client4, vip4b, "hello"), be4a.addr),
				reply("the backend answers the second flow", udp(be4a.addr, client4, "pong"), vip4b),
			},
			check: func(t *testing.T, d *datapath) {
				// The first flow lost the entry last: it is marked, the
				// second flow, which took it back, is not.
				for _, c := range []struct {
					vip  netip.AddrPort
					lost bool
				}{{vip4, true}, {vip4b, false}} {
					e, ok := d.ct(ctKey(client4, c.vip, protoUDP, ctForward))
					if !ok || (e.Flags&ctFReplyLost != 0) != c.lost {
						t.Errorf("forward entry to %s = %+v (found %v), want reply-lost %v", c.vip, e, ok, c.lost)
					}
				}
			},
		},
		{
			// The service is looked up before the reply entry; a
			// backend's answer to a client whose address and port are
			// also a VIP:port must still be reverse-NATed, not balanced.
			name: "a backend's reply wins over a service on the client's address and port",
			services: []service{
				svc4,
				{id: 2, vip: client4, proto: protoTCP, backends: []backend{be4b}},
			},
			steps: []step{
				forward("syn", tcp4, be4a.addr),
				reply("syn-ack", synAck4, vip4),
			},
			check: func(t *testing.T, d *datapath) {
				wantStats(t, d, 2, 0, 0, nil)
			},
		},
	}

	runScenarios(t, scenarios)
}

// runScenarios runs each scenario on a fresh datapath: every step's
// verdict and output frame must be what it wants, byte for byte.
func runScenarios(t *testing.T, scenarios []scenario) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			d := newDatapath(t)
			for _, s := range sc.services {
				d.addService(s)
			}
			runSteps(t, d, sc.steps)
			if sc.check != nil {
				sc.check(t, d)
			}
		})
	}
}

// runSteps runs the steps on d in order.
func runSteps(t *testing.T, d *datapath, steps []step) {
	t.Helper()
	for _, st := range steps {
		if st.before != nil {
			st.before(d)
		}
		verdict, out := d.run(st.in)
		if verdict != st.verdict {
			t.Fatalf("%s: verdict %d, want %d", st.name, int32(verdict), int32(st.verdict))
		}
		want := st.want
		if want == nil {
			want = st.in
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("%s: packet differs\n got: %s\nwant: %s", st.name, hex.EncodeToString(out), hex.EncodeToString(want))
		}
		if verdict != verdictDrop {
			verifyChecksums(t, st.name, out)
		}
	}
}

// truncateIPv4 cuts the frame to n bytes and makes the IPv4 header agree.
func truncateIPv4(f []byte, n int) []byte {
	f = append([]byte{}, f[:n]...)
	ip := f[14:]
	ip[2], ip[3] = byte((n-14)>>8), byte(n-14)
	ip[10], ip[11] = 0, 0
	c := checksum(ip[:20])
	ip[10], ip[11] = byte(c>>8), byte(c)
	return f
}

func wantStats(t *testing.T, d *datapath, id uint32, packets, bytes int, drops map[int]uint64) {
	t.Helper()
	got := d.stats(id)
	var want L4xdsLbStats
	want.Packets = uint64(packets)
	want.Bytes = uint64(bytes)
	for r, n := range drops {
		want.Drops[r] = n
	}
	if got != want {
		t.Errorf("stats of service %d = %+v, want %+v", id, got, want)
	}
}

// monotonicNow is bpf_ktime_get_ns() as seen from user space.
func monotonicNow(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}
