// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/model"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/test/netns"
)

// FuzzDatapath runs packets through the program (BPF_PROG_RUN) and through
// the reference model (pkg/datapath/model), and fails on any difference in
// the verdict, the frame that leaves, the counters, or the conntrack,
// affinity and fragment state. The input decodes into a scenario: a
// service table of both families (source ranges of both families,
// affinity, priorities, draining and maintenance backends, reject shares,
// removed VIPs), written into the maps by the reconciler as the agent
// writes them; conntrack and affinity entries already there; and a short
// sequence of packets, hostile ones included (fragments, IP options, IPv6
// extension headers, ICMP errors and echo, other protocols, bad lengths,
// truncated headers).
func FuzzDatapath(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: loads the BPF program and runs packets through it with BPF_PROG_RUN")
	}
	// The seeds are in testdata/fuzz/FuzzDatapath (fuzzSeeds).
	cfg := testConfig(netns.MountBPFFS(f))
	// Small maps: every run starts from empty ones.
	cfg.LBMaglevTableSize = fzMaglevSize
	cfg.LBServiceMapMax = 64
	cfg.LBBackendMapMax = 1024
	cfg.LBConntrackMax, cfg.LBConntrackNewMax, cfg.LBAffinityMax = MinFlowMapMax, MinFlowMapMax, MinFlowMapMax
	// A reject limit of a few rejects a run (a CPU's share of 4, then one
	// every few seconds): the limit's drops and its refill, never its
	// timing, decide.
	cfg.LBRejectRate, cfg.LBRejectBurst = 1, 4
	cpus, err := onlineCPUs()
	if err != nil {
		f.Fatal(err)
	}
	interval, burst := rejectLimit(cfg.LBRejectRate, cfg.LBRejectBurst, cpus)
	dp, err := Load(slog.New(slog.DiscardHandler), cfg)
	if err != nil {
		f.Fatalf("load: %v", err)
	}
	f.Cleanup(func() { dp.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		fzRun(t, &fzDatapath{Datapath: dp, limit: model.RejectLimit{Interval: interval, Burst: burst}}, decodeScenario(data))
	})
}

const (
	fzMaglevSize = 13
	// fzMaxServiceID bounds the service IDs a run can use (counters are
	// compared and zeroed up to it).
	fzMaxServiceID = 16
)

// The pools the scenarios draw from: small, so that packets meet the
// services, backends and flows of the table.
var (
	fzVIPs    = addrs("10.1.2.3", "10.1.2.4", "2001:db8::1", "2001:db8::2")
	fzPktDsts = append(addrs("::ffff:10.1.2.3", "10.9.9.9", "2001:db8::9"), fzVIPs...)
	fzPorts   = []uint16{80, 53}
	fzDports  = []uint16{80, 53, 81}
	fzBackend = addrPorts("192.168.1.10:8080", "192.168.1.11:8080", "192.168.1.12:80", "10.0.0.2:8080",
		"[fd00::10]:8080", "[fd00::11]:8080", "[fd00::12]:80", "[2001:db8::1]:80")
	// Clients, and sources that name no single host (refused by no
	// refusal), among them an IPv6 one of IPv4-mapped multicast, which is
	// not IPv6 multicast.
	fzClients = addrs("10.0.0.2", "203.0.113.9", "2001:db8:c::2", "::ffff:10.0.0.2", "192.168.1.10", "fd00::10",
		"224.0.0.1", "::ffff:224.0.0.1", "ff02::1")
	fzCports = []uint16{40000, 40001}
	fzRanges = prefixes("10.0.0.0/8", "203.0.113.0/24", "0.0.0.0/0", "::/0", "2001:db8:c::/48", "::ffff:0:0/96",
		"::ffff:10.0.0.0/104", "::/8", "10.0.0.2/32", "2001:db8:c::2/128")
	fzStates = []lb.BackendState{lb.BackendStateActive, lb.BackendStateActive, lb.BackendStateActive,
		lb.BackendStateTerminating, lb.BackendStateQuarantined, lb.BackendStateMaintenance}
	fzWeights    = []uint16{1, 1, 2, 0}
	fzPriorities = []uint32{0, 0, 1, 2}
	fzAffinity   = []time.Duration{0, 0, 30 * time.Minute, 1500 * time.Millisecond}
	fzRejects    = []uint16{0, 0, 0, 1, 2}
	// Ages of the entries already there, far from every lifetime and
	// refresh boundary: fresh, to be refreshed, past a closing flow's and a
	// new flow's lifetime, past everything.
	fzAges     = []time.Duration{0, 2 * time.Second, 30 * time.Second, 90 * time.Second, 7 * time.Hour}
	fzSeqs     = []uint32{0, 1000, 1001, 5000, 5001, 0xffffffff}
	fzTCPFlags = []uint8{fzSYN, fzACK, fzSYN | fzACK, fzFIN | fzACK, fzRST, fzRST | fzACK, 0x08 | fzACK, 0, fzFIN}
	fzPayloads = []int{0, 1, 7, 100}
	// fzRejectAhead: none, within the fuzzer's burst (4 s of a CPU's
	// share or more), and far beyond it.
	fzRejectAhead = []time.Duration{0, 0, time.Second, time.Hour, 48 * time.Hour}
)

const (
	fzFIN = 0x01
	fzSYN = 0x02
	fzRST = 0x04
	fzACK = 0x10
)

func addrs(s ...string) (out []netip.Addr) {
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func addrPorts(s ...string) (out []netip.AddrPort) {
	for _, a := range s {
		out = append(out, netip.MustParseAddrPort(a))
	}
	return out
}

func prefixes(s ...string) (out []netip.Prefix) {
	for _, a := range s {
		out = append(out, netip.MustParsePrefix(a))
	}
	return out
}

// fzInput hands out the fuzzer's bytes; past the end, zeros.
type fzInput struct {
	b []byte
}

func (in *fzInput) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fzInput) pick(n int) int { return int(in.byte()) % n }

func pick[T any](in *fzInput, s []T) T { return s[in.pick(len(s))] }

// scenario is what one fuzzer input decodes into.
type scenario struct {
	frontends []*lb.Frontend
	// removed are frontends deleted once written: their VIPs are removed
	// ones if no other frontend has them.
	removed map[int]bool
	// expiredVIP is a VIP removed long ago (its grace period over), if
	// valid.
	expiredVIP netip.Addr
	flows      []seedFlow
	affinity   []seedAffinity
	packets    []fzPacket
	// rejectAhead: the reject bucket's time this far ahead of now, as a
	// larger limit left it (0: a full bucket).
	rejectAhead time.Duration
}

// seedFlow is a conntrack entry there before the packets, both its
// directions: of a frontend, to a backend (below 6 an index among the
// frontend's, else among all).
type seedFlow struct {
	frontend    int
	client      netip.AddrPort
	backend     int
	established bool
	flags       model.FlowFlags
	synAckAck   uint32
	age         time.Duration
	// staleReply: the reply entry is of another backend than the
	// forward entry (the flow went elsewhere since, its old backend's
	// entry left behind).
	staleReply bool
	// forwardEstablished: a flow not established yet whose forward
	// entry is in the established map (established on another CPU
	// meanwhile), its reply entry in the new-flow map.
	forwardEstablished bool
}

type seedAffinity struct {
	client   netip.Addr
	frontend int
	backend  int
	age      time.Duration
}

// fzPacket is one packet of the sequence, and how it is mangled.
type fzPacket struct {
	desc    string
	frame   []byte
	gsoSize uint32
}

func decodeScenario(data []byte) *scenario {
	in := &fzInput{b: data}
	s := &scenario{removed: map[int]bool{}}
	seen := map[lb.L3n4Addr]bool{}
	for range 1 + in.pick(4) {
		proto := lb.TCP
		if in.pick(2) == 1 {
			proto = lb.UDP
		}
		addr := lb.NewL3n4Addr(pick(in, fzVIPs), pick(in, fzPorts), proto)
		svc := &lb.Service{Name: lb.ServiceName(fmt.Sprintf("svc%d", len(s.frontends))), Source: lb.SourceXDS}
		fe := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: addr}, Service: svc}
		used := map[netip.AddrPort]bool{}
		for range in.pick(5) {
			a := fzPeer(in, fzBackend, addr.Addr)
			b := &lb.Backend{BackendParams: lb.BackendParams{
				Address: lb.NewL3n4Addr(a.Addr(), a.Port(), proto), State: pick(in, fzStates),
				Weight: pick(in, fzWeights), Priority: pick(in, fzPriorities)}}
			if !used[a] {
				used[a] = true
				fe.Backends = append(fe.Backends, b)
			}
		}
		for range []int{0, 0, 1, 2}[in.pick(4)] {
			svc.SourceRanges = append(svc.SourceRanges, pick(in, fzRanges))
		}
		if a := pick(in, fzAffinity); a > 0 {
			svc.SessionAffinity, svc.SessionAffinityTimeout = true, a
		}
		svc.RejectWeight = pick(in, fzRejects)
		if seen[addr] {
			continue
		}
		seen[addr] = true
		if in.pick(5) == 0 {
			s.removed[len(s.frontends)] = true
		}
		s.frontends = append(s.frontends, fe)
	}
	if in.pick(4) == 0 {
		s.expiredVIP = pick(in, fzVIPs)
	}
	for range in.pick(4) {
		fe := in.pick(len(s.frontends))
		fl := seedFlow{
			frontend:    fe,
			client:      netip.AddrPortFrom(fzPeer(in, fzClients, s.frontends[fe].Address.Addr), pick(in, fzCports)),
			backend:     in.pick(8),
			established: in.pick(2) == 0,
			age:         pick(in, fzAges),
		}
		flags := in.byte()
		if flags&1 != 0 {
			fl.flags |= model.Closing
		}
		if fl.established {
			if flags&2 != 0 {
				fl.flags |= model.ReplyLost
			}
		} else {
			fl.flags |= model.New
			if flags&4 != 0 {
				fl.flags |= model.SynAckSeen
				fl.synAckAck = pick(in, fzSeqs)
			}
			if flags&8 != 0 {
				fl.flags |= model.WithAffinity
			}
			fl.forwardEstablished = flags&32 != 0
		}
		fl.staleReply = flags&16 != 0
		s.flows = append(s.flows, fl)
	}
	for range in.pick(3) {
		fe := in.pick(len(s.frontends))
		s.affinity = append(s.affinity, seedAffinity{client: fzPeer(in, fzClients, s.frontends[fe].Address.Addr), frontend: fe,
			backend: in.pick(8), age: pick(in, fzAges)})
	}
	var firstFrags []fzIP
	for range 1 + in.pick(4) {
		s.packets = append(s.packets, decodePacket(in, s, &firstFrags))
	}
	// Last, so that the inputs found before it decode as they did.
	s.rejectAhead = pick(in, fzRejectAhead)
	return s
}

// Kinds of packets.
const (
	pktToVIP = iota
	pktFromBackend
	pktICMPError
	pktICMPOther
	pktOtherProto
	pktLaterFragment
	numPktKinds
)

// fzKinds weighs the kinds of packets: mostly those of flows.
var fzKinds = []int{pktToVIP, pktToVIP, pktToVIP, pktFromBackend, pktFromBackend, pktICMPError, pktICMPError,
	pktICMPOther, pktOtherProto, pktLaterFragment}

// fzMangling is a set of manglings (bits) for one packet in three.
func fzMangling(in *fzInput) byte {
	if in.pick(3) != 0 {
		return 0
	}
	return in.byte()
}

// fzPeer picks from the pool an address of a's family, but one time in
// six any.
func fzPeer[T netip.Addr | netip.AddrPort](in *fzInput, pool []T, a netip.Addr) T {
	if in.pick(6) == 0 {
		return pick(in, pool)
	}
	var same []T
	for _, p := range pool {
		var pa netip.Addr
		switch p := any(p).(type) {
		case netip.Addr:
			pa = p
		case netip.AddrPort:
			pa = p.Addr()
		}
		if pa.Is4() == a.Is4() {
			same = append(same, p)
		}
	}
	return pick(in, same)
}

// decodePacket makes one packet: its kind, addresses and ports from the
// pools, then its mangling. firstFrags are the first fragments so far,
// which later fragments follow.
func decodePacket(in *fzInput, s *scenario, firstFrags *[]fzIP) fzPacket {
	kind := pick(in, fzKinds)
	ip := fzIP{ttl: []uint8{64, 1, 2}[in.pick(3)], id: uint32(in.pick(3)), ext: 0xff}
	l4 := fzL4{proto: 6, flags: pick(in, fzTCPFlags), seq: pick(in, fzSeqs), ack: pick(in, fzSeqs)}
	if in.pick(2) == 1 {
		l4.proto = 17
	}
	l4.payload = make([]byte, pick(in, fzPayloads))
	for i := range l4.payload {
		l4.payload[i] = byte(i)
	}
	// The destination: one time in four any of the pool, else a
	// frontend of the table (its VIP, port and protocol) and a backend
	// of it.
	dst, dport := pick(in, fzPktDsts), pick(in, fzDports)
	b := fzPeer(in, fzBackend, dst)
	if len(s.frontends) > 0 && in.pick(4) != 0 {
		fe := s.frontends[in.pick(len(s.frontends))]
		dst, dport, l4.proto = fe.Address.Addr, fe.Address.Port, fzProto(fe.Address.Protocol)
		if len(fe.Backends) > 0 {
			be := fe.Backends[in.pick(len(fe.Backends))]
			b = netip.AddrPortFrom(be.Address.Addr, be.Address.Port)
		}
	}
	client := netip.AddrPortFrom(fzPeer(in, fzClients, dst), pick(in, fzCports))
	var desc string
	var payload []byte
	switch kind {
	case pktToVIP, pktOtherProto:
		ip.src, ip.dst = client.Addr(), dst
		l4.sport, l4.dport = client.Port(), dport
		desc = fmt.Sprintf("%s -> %s", client, netip.AddrPortFrom(ip.dst, l4.dport))
		if kind == pktOtherProto {
			l4.proto = []uint8{47, 132, 50, 0}[in.pick(4)]
			desc = fmt.Sprintf("IP protocol %d %s -> %s", l4.proto, ip.src, ip.dst)
		}
	case pktFromBackend:
		ip.src, ip.dst = b.Addr(), client.Addr()
		l4.sport, l4.dport = b.Port(), client.Port()
		desc = fmt.Sprintf("%s -> %s", b, client)
	case pktICMPError, pktICMPOther:
		return decodeICMP(in, kind, netip.AddrPortFrom(dst, dport), b, client, l4)
	case pktLaterFragment:
		if len(*firstFrags) > 0 {
			ip = (*firstFrags)[in.pick(len(*firstFrags))]
		} else {
			ip.src, ip.dst = client.Addr(), dst
			ip.proto = l4.proto
		}
		desc = fmt.Sprintf("later fragment %s -> %s id %d", ip.src, ip.dst, ip.id)
	}
	ip.v6 = !(ip.src.Is4() && ip.dst.Is4())
	if kind != pktLaterFragment {
		ip.proto = l4.proto
		payload = l4.bytes(ip.v6, ip.src, ip.dst)
	} else {
		// Offset 8 bytes; the last fragment or one in the middle.
		if ip.v6 {
			ip.fragHdr, ip.fragOff = true, 1<<3|uint16(in.pick(2))
		} else {
			ip.fragOff = 1 | uint16(in.pick(2))<<13
		}
		payload = make([]byte, 16)
	}

	// Mangling, by the bits of a byte.
	m := fzMangling(in)
	if m&1 != 0 && kind != pktLaterFragment { // the first fragment of a datagram
		if ip.v6 {
			ip.fragHdr, ip.fragOff = true, 1
		} else {
			ip.fragOff = 0x2000
		}
		*firstFrags = append(*firstFrags, ip)
		desc += ", first fragment"
	}
	if m&2 != 0 {
		if ip.v6 {
			ip.ext = []uint8{0, 60, 43, 51, fzJumbo}[in.pick(5)]
			desc += fmt.Sprintf(", extension header %d", ip.ext)
		} else {
			ip.options = []byte{1, 1, 1, 0}
			if in.pick(2) == 1 {
				ip.options = append(ip.options, 1, 1, 1, 0)
			}
			desc += fmt.Sprintf(", %d bytes of IP options", len(ip.options))
		}
	}
	if m&4 != 0 && l4.proto == 6 && kind != pktLaterFragment { // a bad data offset
		l4.doff = []uint8{4, 15, 6}[in.pick(3)]
		payload = l4.bytes(ip.v6, ip.src, ip.dst)
		desc += fmt.Sprintf(", TCP data offset %d", l4.doff)
	}
	if m&8 != 0 && l4.proto == 17 && kind != pktLaterFragment {
		l4.noChecksum = true
		payload = l4.bytes(ip.v6, ip.src, ip.dst)
		desc += ", no UDP checksum"
	}
	frame := fzEther(ip.v6, ip.bytes(payload))
	if m&16 != 0 { // a bad L4 checksum: the program updates, never checks
		frame[len(frame)-1] ^= 0x5a
		desc += ", bad checksum"
	}
	var gso uint32
	frame, desc, gso = mangleLengths(in, m, ip.v6, frame, desc)
	return fzPacket{desc: desc, frame: frame, gsoSize: gso}
}

// mangleLengths sets a bad IP length (too short, too long, 0) or
// truncates the frame, or makes a GSO packet of it (BIG TCP: its IP length
// field 0).
func mangleLengths(in *fzInput, m byte, v6 bool, frame []byte, desc string) ([]byte, string, uint32) {
	off := 14 + 2
	if v6 {
		off = 14 + 4
	}
	var gso uint32
	if m&128 != 0 {
		gso = 1448
		frame[off], frame[off+1] = 0, 0
		desc += ", GSO, IP length field 0"
	}
	if m&32 != 0 {
		if len(frame) >= off+2 {
			n := []int{0, 1, 20, 0xffff, len(frame) - 14 - 1, 48}[in.pick(6)]
			frame[off], frame[off+1] = byte(n>>8), byte(n)
			desc += fmt.Sprintf(", IP length field %d", n)
		}
	}
	if m&64 != 0 {
		// BPF_PROG_RUN takes no frame shorter than its IP header's
		// fixed part; the cuts are in what follows.
		fixed := 14 + 20
		if v6 {
			fixed = 14 + 40
		}
		n := fixed + []int{0, 4, 8, 10, 19, len(frame) - 3 - fixed}[in.pick(6)]
		if n >= fixed && n < len(frame) {
			frame = frame[:n]
			desc += fmt.Sprintf(", cut to %d bytes", n)
		}
	}
	return frame, desc, gso
}

// decodeICMP makes an ICMP or ICMPv6 message: an error quoting a packet of
// a flow in either direction (a backend's or a router's error to a client,
// a client's error to the VIP), or echo and others.
func decodeICMP(in *fzInput, kind int, vip, b, client netip.AddrPort, l4 fzL4) fzPacket {
	var outer, inner fzIP
	var desc string
	l4.payload = nil
	if in.pick(2) == 0 {
		// The quoted packet went client -> backend (after DNAT); the
		// error comes from the backend, or a router, to the client.
		inner = fzIP{src: client.Addr(), dst: b.Addr(), ttl: 63, ext: 0xff}
		l4.sport, l4.dport = client.Port(), b.Port()
		outer = fzIP{src: []netip.Addr{b.Addr(), netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00::1")}[in.pick(3)], dst: client.Addr(), ttl: 64, ext: 0xff}
		desc = fmt.Sprintf("ICMP from %s to %s quoting %s -> %s", outer.src, outer.dst, client, b)
	} else {
		// The quoted packet went VIP -> client (a reply after reverse
		// NAT); the client's error goes to the VIP.
		inner = fzIP{src: vip.Addr(), dst: client.Addr(), ttl: 63, ext: 0xff}
		l4.sport, l4.dport = vip.Port(), client.Port()
		outer = fzIP{src: client.Addr(), dst: vip.Addr(), ttl: 64, ext: 0xff}
		desc = fmt.Sprintf("ICMP from %s to %s quoting %s -> %s", outer.src, outer.dst, vip, client)
	}
	outer.v6 = !(outer.src.Is4() && outer.dst.Is4())
	inner.v6 = !(inner.src.Is4() && inner.dst.Is4())
	inner.proto = l4.proto
	// How much of it is quoted: all, the IP header and 8 bytes, or
	// enough for a TCP checksum (the quote is made once its fragmenting,
	// read with the mangling, is known).
	cut := in.pick(4)
	var typ, code uint8
	if kind == pktICMPError {
		if outer.v6 {
			typ, code = []uint8{1, 2, 3}[in.pick(3)], 0
		} else {
			typ, code = []uint8{3, 11}[in.pick(2)], []uint8{4, 3, 1}[in.pick(3)]
		}
	} else {
		if outer.v6 {
			typ = []uint8{128, 129, 135, 4}[in.pick(4)]
		} else {
			typ = []uint8{8, 0, 5}[in.pick(3)]
		}
		desc = fmt.Sprintf("ICMP type %d %s -> %s", typ, outer.src, outer.dst)
	}
	outer.proto = 1
	if outer.v6 {
		outer.proto = 58
	}
	m := fzMangling(in)
	if m&1 != 0 && !outer.v6 {
		outer.fragOff = 0x2000
		desc += ", fragment"
	}
	// An ICMPv6 error may quote a fragment (PMTU discovery of a datagram
	// its sender fragmented): the first, or (m&2) a later one.
	if m&1 != 0 && outer.v6 {
		later := m&2 != 0
		if inner.v6 {
			inner.fragHdr, inner.fragOff = true, 1
			if later {
				inner.fragOff = 1 << 3
			}
		} else {
			inner.fragOff = 0x2000
			if later {
				inner.fragOff = 1
			}
		}
		desc += fmt.Sprintf(", quoting a fragment (later %v)", later)
	}
	quoted := inner.bytes(l4.bytes(inner.v6, inner.src, inner.dst))
	ihl := 20
	if inner.v6 {
		ihl = 40
		if inner.fragHdr {
			ihl += 8
		}
	}
	if n := []int{len(quoted), ihl + 8, ihl + 18, ihl + 4}[cut]; n < len(quoted) {
		quoted = quoted[:n]
	}
	frame := fzEther(outer.v6, outer.bytes(fzICMP(outer.v6, outer.src, outer.dst, typ, code, quoted)))
	if m&16 != 0 {
		frame[len(frame)-1] ^= 0x5a
		desc += ", bad checksum"
	}
	frame, desc, gso := mangleLengths(in, m, outer.v6, frame, desc)
	return fzPacket{desc: fmt.Sprintf("%s (type %d code %d)", desc, typ, code), frame: frame, gsoSize: gso}
}

func (s *scenario) String() string {
	var b strings.Builder
	for i, fe := range s.frontends {
		fmt.Fprintf(&b, "  frontend %s", fe.Address)
		if s.removed[i] {
			b.WriteString(" (removed)")
		}
		svc := fe.Service
		if len(svc.SourceRanges) > 0 {
			fmt.Fprintf(&b, " ranges %v", svc.SourceRanges)
		}
		if svc.SessionAffinity {
			fmt.Fprintf(&b, " affinity %s", svc.SessionAffinityTimeout)
		}
		if svc.RejectWeight > 0 {
			fmt.Fprintf(&b, " reject %d", svc.RejectWeight)
		}
		b.WriteString("\n")
		for _, be := range fe.Backends {
			fmt.Fprintf(&b, "    backend %s %s w=%d p=%d\n", netip.AddrPortFrom(be.Address.Addr, be.Address.Port), be.State, be.Weight, be.Priority)
		}
	}
	if s.expiredVIP.IsValid() {
		fmt.Fprintf(&b, "  removed long ago: %s\n", s.expiredVIP)
	}
	for _, f := range s.flows {
		fmt.Fprintf(&b, "  flow %s -> frontend %d, backend #%d, established %v, flags %#x, age %s", f.client, f.frontend, f.backend, f.established, f.flags, f.age)
		if f.staleReply {
			b.WriteString(", reply entry of the next backend")
		}
		if f.forwardEstablished {
			b.WriteString(", forward entry established")
		}
		b.WriteString("\n")
	}
	for _, a := range s.affinity {
		fmt.Fprintf(&b, "  affinity %s of frontend %d -> backend #%d, age %s\n", a.client, a.frontend, a.backend, a.age)
	}
	if s.rejectAhead > 0 {
		fmt.Fprintf(&b, "  reject bucket %s ahead\n", s.rejectAhead)
	}
	for i, p := range s.packets {
		fmt.Fprintf(&b, "  packet %d: %s\n", i, p.desc)
	}
	return b.String()
}

// fzRun writes the scenario's table and state, then runs its packets.
func fzRun(t *testing.T, fd *fzDatapath, s *scenario) {
	dp := fd.Datapath
	// The reject limit's bucket is per CPU: the packets run on one.
	cpu := fzPinCPU(t)
	fzReset(t, dp)
	o, db := fzOps(t, dp)
	ids := map[int]uint32{}
	for i, fe := range s.frontends {
		if err := o.Update(context.Background(), db.ReadTxn(), 1, fe); err != nil {
			t.Fatalf("write frontend %s: %v\n%s", fe.Address, err, s)
		}
		ids[i] = o.reg.services[fe.Address].id
	}
	m := &model.Datapath{Table: &model.Table{}, State: model.NewState(), RejectLimit: fd.limit}
	backends := fzBackends(t, dp)
	m.Table.Services = fzModelServices(t, dp, s, ids)
	for i, fe := range s.frontends {
		if s.removed[i] {
			if err := o.Delete(context.Background(), db.ReadTxn(), 1, fe); err != nil {
				t.Fatalf("delete frontend %s: %v", fe.Address, err)
			}
		}
	}
	if s.expiredVIP.IsValid() && !fzLive(s, s.expiredVIP) {
		key := addrToBPF(s.expiredVIP)
		if err := dp.objs.L4xdsOldVips.Put(&key, uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	m.Table.RemovedVIPs = fzRemovedVIPs(t, dp)
	for i, svc := range m.Table.Services {
		if slot, id, ok := svc.CheckTable(); !ok {
			t.Fatalf("the Maglev table of %s (service %d) names backend %d in slot %d, which takes no new flows\n%s",
				s.frontends[i].Address, svc.ID, id, slot, s)
		}
	}
	fzSeed(t, dp, m, s, ids, backends)

	var runs []fzWindow
	for i, pkt := range s.packets {
		now := fzKtime(t)
		want := m.Process(model.Packet{Frame: pkt.frame, GSOSize: pkt.gsoSize}, now)
		if fzRuleHook != nil {
			fzRuleHook(want.Verdict.String() + ": " + want.Rule)
		}
		verdict, out := fzProgRun(t, dp, pkt.frame, pkt.gsoSize)
		runs = append(runs, fzWindow{now, fzKtime(t)})
		diffs := fzDiffResult(want, verdict, out)
		got := fzReadState(t, dp)
		got.RejectTAT = fzRejectTAT(t, dp, cpu)
		diffs = append(diffs, fzDiffState(m.State, got, fzReadFrags(t, dp), runs, fd.limit)...)
		if len(diffs) > 0 {
			t.Fatalf("packet %d (%s): the program and the model differ (model: %s, %s):\n  %s\n\nscenario:\n%s\nframe:\n%s",
				i, pkt.desc, want.Verdict, want.Rule, strings.Join(diffs, "\n  "), s, fzHex(pkt.frame))
		}
	}
}

// fzOps is the reconciler's operations on the maps, as the agent runs
// them, for the fuzzer's Maglev table size.
func fzOps(t *testing.T, dp *Datapath) (*ops, *statedb.DB) {
	db := statedb.New()
	w, err := lb.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	o := newOps(slog.New(slog.DiscardHandler), db, w.Frontends(), dp.capacity(fzMaglevSize))
	if err := o.restore(dp.Maps); err != nil {
		t.Fatal(err)
	}
	return o, db
}

var fzRuleHook func(string)

// fzDatapath is the loaded program and maps, and the reject limit of one
// CPU the loader gave it.
type fzDatapath struct {
	*Datapath
	limit model.RejectLimit
}

// fzPinCPU keeps the test's goroutine on one CPU until it ends, and
// returns it: BPF_PROG_RUN runs the program on the caller's CPU.
func fzPinCPU(t *testing.T) int {
	runtime.LockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !all.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.SchedSetaffinity(0, &all)
		runtime.UnlockOSThread()
	})
	return cpu
}

// fzLive says whether some frontend left has a.
func fzLive(s *scenario, a netip.Addr) bool {
	for i, fe := range s.frontends {
		if !s.removed[i] && fe.Address.Addr == a {
			return true
		}
	}
	return false
}

func fzKtime(t *testing.T) uint64 {
	now, err := Ktime()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(now)
}

func fzHex(b []byte) string {
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		fmt.Fprintf(&s, "  %04x  % x\n", i, b[i:min(i+16, len(b))])
	}
	return s.String()
}
