// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/test/netns"
)

// The cost of the program per packet, as the kernel measures it around the
// program in BPF_PROG_RUN (no syscall, no copy of the packet in or out).
//
// BPF_PROG_RUN with a repeat count runs the program again on the skb the
// previous run left behind: after one DNAT the packet is no longer for the
// VIP, and a new flow's second run finds the first one's conntrack entry.
// So every counted run is its own BPF_PROG_RUN with repeat 1 on an input
// that makes the program do the work the path's name claims, and the
// verdict and output of every run are checked: the benchmark fails rather
// than time a path other than the one it names.
//
// The program is loaded as the agent loads it, translated packets going
// straight to their next hop, and runs in a namespace with routes to the
// clients and backends (routedNetns): established, reply and new-flow
// packets take the FIB lookup and come out with TCX_REDIRECT.

// benchCTEntries holds the conntrack entries of about a million new flows
// (two each) without LRU eviction.
const benchCTEntries = 1 << 21

var (
	other6 = netip.MustParseAddrPort("[2001:db8:ffff::1]:80")
	// Clients of the new-flow runs: each run takes the next source port,
	// and the next address when the ports run out.
	newFlowPorts = [2]uint16{1024, 65535}
)

// benchCase is one path of the program for one family and protocol.
type benchCase struct {
	family, proto string
	vip, client   netip.AddrPort
	other         netip.AddrPort // not a VIP
	backends      []backend
	protoNum      uint8
}

func benchCases() []benchCase {
	var cases []benchCase
	for _, fam := range []string{"ipv4", "ipv6"} {
		for _, proto := range []string{"tcp", "udp"} {
			c := benchCase{family: fam, proto: proto, vip: vip4, client: client4, other: other4,
				backends: []backend{be4a, be4b}, protoNum: protoTCP}
			if fam == "ipv6" {
				c.vip, c.client, c.other, c.backends = vip6, client6, other6, []backend{be6a, be6b}
			}
			if proto == "udp" {
				c.protoNum = protoUDP
			}
			cases = append(cases, c)
		}
	}
	return cases
}

// first is the packet that opens a flow: a SYN, or a datagram.
func (c benchCase) first(src netip.AddrPort) segment {
	if c.protoNum == protoTCP {
		return syn(src, c.vip)
	}
	return udp(src, c.vip, "0123456789abcdef")
}

// data is a packet of an established flow from the client.
func (c benchCase) data(src, dst netip.AddrPort) segment {
	if c.protoNum == protoTCP {
		return segment{src: src, dst: dst, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: []byte("0123456789abcdef")}
	}
	return udp(src, dst, "0123456789abcdef")
}

func (c benchCase) backendAt(a netip.AddrPort) bool {
	return slices.ContainsFunc(c.backends, func(b backend) bool { return b.addr == a })
}

func (c benchCase) service() service {
	return service{id: 1, vip: c.vip, proto: c.protoNum, backends: c.backends}
}

func BenchmarkProgRun(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: loads BPF programs and runs them with BPF_PROG_RUN")
	}
	if s, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err == nil && strings.TrimSpace(string(s)) != "0" {
		b.Log("kernel.bpf_stats_enabled is on: every run also pays for the kernel's run-time accounting")
	}
	ns := routedNetns(b)
	in := func(bench func(b *testing.B)) func(b *testing.B) {
		return func(b *testing.B) { netns.Do(b, ns, func() { bench(b) }) }
	}
	b.Run("path=empty", in(benchEmpty))
	for _, c := range benchCases() {
		name := "/family=" + c.family + "/proto=" + c.proto
		b.Run("path=passthrough"+name, in(func(b *testing.B) { benchPassthrough(b, c) }))
		b.Run("path=established"+name, in(func(b *testing.B) { benchEstablished(b, c) }))
		b.Run("path=reply"+name, in(func(b *testing.B) { benchReply(b, c) }))
		b.Run("path=new"+name, in(func(b *testing.B) { benchNew(b, c) }))
		if c.family == "ipv4" {
			b.Run("path=flood"+name, in(func(b *testing.B) { benchFlood(b, c) }))
		}
	}
}

// benchEmpty runs a program that only returns TCX_NEXT, through the same
// BPF_PROG_RUN: the fixed cost every measured path includes.
func benchEmpty(b *testing.B) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "empty",
		Type:         ebpf.SchedCLS,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer prog.Close()
	in := syn(client4, vip4).frame()
	var r runs
	for b.Loop() {
		out := r.run(b, prog, in, verdictNext)
		if !bytes.Equal(out, in) {
			b.Fatalf("the empty program changed the packet")
		}
	}
	r.report(b, "path=empty family=ipv4 proto=tcp")
}

// benchPassthrough: a packet to an address that is no VIP, with a service
// loaded. It must come out unchanged with TCX_NEXT.
func benchPassthrough(b *testing.B, c benchCase) {
	d := newDatapathWith(b, loadOptions{ctEntries: benchCTEntries, fibRedirect: true})
	d.addService(c.service())
	in := c.data(c.client, c.other).frame()
	var r runs
	for b.Loop() {
		if out := r.run(b, d.objs.L4xdsIngress, in, verdictNext); !bytes.Equal(out, in) {
			b.Fatalf("a packet to %s (no VIP) was changed", c.other)
		}
	}
	if st := d.stats(1); st.Packets != 0 {
		b.Fatalf("pass-through packets were counted as the service's: %+v", st)
	}
	r.report(b, c.line("passthrough"))
}

// benchEstablished: the flow is opened once; every counted run is a data
// packet of it, which must come out DNATed to the flow's backend.
func benchEstablished(b *testing.B, c benchCase) {
	d := newDatapathWith(b, loadOptions{ctEntries: benchCTEntries, fibRedirect: true})
	d.addService(c.service())
	be := c.open(b, d, c.client)
	in := c.data(c.client, c.vip).frame()
	want := hop(c.data(c.client, be)).frame()
	var r runs
	for b.Loop() {
		if out := r.run(b, d.objs.L4xdsIngress, in, verdictRedirect); !bytes.Equal(out, want) {
			b.Fatalf("a packet of the established flow did not come out DNATed to %s", be)
		}
	}
	if st := d.stats(1); st.Packets != uint64(r.n()+1) {
		b.Fatalf("service counted %d packets, want %d (%d runs and the flow's first)", st.Packets, r.n()+1, r.n())
	}
	r.report(b, c.line("established"))
}

// benchReply: the flow is opened once; every counted run is its backend's
// answer, which must come out with the VIP as source.
func benchReply(b *testing.B, c benchCase) {
	d := newDatapathWith(b, loadOptions{ctEntries: benchCTEntries, fibRedirect: true})
	d.addService(c.service())
	be := c.open(b, d, c.client)
	answer := c.data(be, c.client)
	in := answer.frame()
	want := hop(answer.from(c.vip)).frame()
	var r runs
	for b.Loop() {
		if out := r.run(b, d.objs.L4xdsIngress, in, verdictRedirect); !bytes.Equal(out, want) {
			b.Fatalf("the backend's answer did not come out from the VIP %s", c.vip)
		}
	}
	r.report(b, c.line("reply"))
}

// benchNew: every counted run is the first packet of a flow never seen
// (its own client address and port), which must come out DNATed to a
// backend and leave conntrack entries.
func benchNew(b *testing.B, c benchCase) {
	d := newDatapathWith(b, loadOptions{ctNewEntries: benchCTEntries, fibRedirect: true})
	d.addService(c.service())
	client := c.client.Addr()
	sport := newFlowPorts[0]
	var r runs
	for b.Loop() {
		src := netip.AddrPortFrom(client, sport)
		in := c.first(src).frame()
		out := r.run(b, d.objs.L4xdsIngress, in, verdictRedirect)
		if be := dstOf(out); !c.backendAt(be) {
			b.Fatalf("new flow %d from %s went to %s, not to a backend", r.n(), src, be)
		}
		if r.n()%4096 == 0 {
			if _, ok := d.ctNew(ctKey(src, c.vip, c.protoNum, ctForward)); !ok {
				b.Fatalf("new flow %d from %s left no conntrack entry", r.n(), src)
			}
		}
		if sport++; sport == newFlowPorts[1] {
			sport, client = newFlowPorts[0], client.Next()
		}
	}
	if st := d.stats(1); st.Packets != uint64(r.n()) {
		b.Fatalf("service counted %d packets, want one per new flow (%d)", st.Packets, r.n())
	}
	r.report(b, c.line("new"))
}

// benchFlood: every counted run is a spoofed SYN or datagram from a random
// source, while the maps of new flows and of established ones are small
// (floodCTEntries) and the former is full: each run evicts an entry. The
// flows established before the flood must still be reverse-NATed after it.
func benchFlood(b *testing.B, c benchCase) {
	d := newDatapathWith(b, loadOptions{ctEntries: floodCTEntries, ctNewEntries: floodCTEntries, fibRedirect: true})
	d.addService(c.service())
	type flow struct{ client, backend netip.AddrPort }
	var flows []flow
	for i := range 128 {
		client := netip.AddrPortFrom(c.client.Addr(), uint16(20000+i))
		be := c.open(b, d, client)
		first := c.first(client)
		if c.protoNum == protoTCP {
			synAck := segment{src: be, dst: client, proto: protoTCP, flags: tcpSYN | tcpACK, seq: 5000, ack: first.seq + 1}
			d.run(synAck.frame())
			d.run(segment{src: client, dst: c.vip, proto: protoTCP, flags: tcpACK, seq: first.seq + 1, ack: 5001}.frame())
		} else {
			d.run(udp(be, client, "answer").frame())
		}
		flows = append(flows, flow{client, be})
	}
	rng := rand.New(rand.NewPCG(21, 4))
	spoofed := func() netip.AddrPort {
		a := 100<<24 | 64<<16 | rng.Uint32N(1<<22)
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), uint16(1024+rng.IntN(64512)))
	}
	// Fill the map of new flows: the counted runs evict.
	for range 4 * floodCTEntries {
		if v, _ := d.run(c.first(spoofed()).frame()); v != verdictRedirect {
			b.Fatalf("a spoofed packet: verdict %d, want TCX_REDIRECT", int32(v))
		}
	}
	var r runs
	for b.Loop() {
		src := spoofed()
		out := r.run(b, d.objs.L4xdsIngress, c.first(src).frame(), verdictRedirect)
		if be := dstOf(out); !c.backendAt(be) {
			b.Fatalf("spoofed flow %d from %s went to %s, not to a backend", r.n(), src, be)
		}
	}
	for _, f := range flows {
		answer := c.data(f.backend, f.client)
		if v, out := d.run(answer.frame()); v != verdictRedirect || !bytes.Equal(out, hop(answer.from(c.vip)).frame()) {
			b.Fatalf("after %d spoofed packets, the answer of %s to %s: verdict %d, not from the VIP", r.n(), f.backend, f.client, int32(v))
		}
	}
	r.report(b, c.line("flood"))
}

// open sends the first packet of the client's flow (not counted) and
// returns the backend it went to.
func (c benchCase) open(b *testing.B, d *datapath, client netip.AddrPort) netip.AddrPort {
	b.Helper()
	verdict, out := d.run(c.first(client).frame())
	be := dstOf(out)
	if verdict != verdictRedirect || !c.backendAt(be) {
		b.Fatalf("opening the flow from %s: verdict %d, to %s; want TCX_REDIRECT to a backend", client, int32(verdict), be)
	}
	return be
}

// hop is s as a router forwards it: one hop less to live.
func hop(s segment) segment {
	s.ttl = 63
	return s
}

func (c benchCase) line(path string) string {
	return fmt.Sprintf("path=%s family=%s proto=%s", path, c.family, c.proto)
}

// dstOf is the destination address and port of an IPv4 or IPv6 TCP or UDP
// frame (without IP options or extension headers).
func dstOf(f []byte) netip.AddrPort {
	if len(f) < 14 {
		return netip.AddrPort{}
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		if len(f) < 14+20+4 {
			return netip.AddrPort{}
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(f[30:34])), binary.BigEndian.Uint16(f[36:]))
	case 0x86dd:
		if len(f) < 14+40+4 {
			return netip.AddrPort{}
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(f[38:54])), binary.BigEndian.Uint16(f[56:]))
	}
	return netip.AddrPort{}
}

// runs collects the kernel-measured duration of every counted run.
type runs struct {
	ns  []uint32
	out []byte
}

func (r *runs) n() int { return len(r.ns) }

// run runs prog once on in, fails unless it returns verdict, and returns
// the packet as the program left it.
func (r *runs) run(b *testing.B, prog *ebpf.Program, in []byte, verdict uint32) []byte {
	if cap(r.out) < len(in)+256 {
		r.out = make([]byte, len(in)+256)
	}
	got, ns, out, err := progRun(prog, in, r.out[:cap(r.out)])
	if err != nil {
		b.Fatalf("BPF_PROG_RUN: %v", err)
	}
	if got != verdict {
		b.Fatalf("run %d: verdict %d, want %d", len(r.ns), int32(got), int32(verdict))
	}
	r.ns = append(r.ns, ns)
	return out
}

// report prints the mean and median duration per packet as a BENCH line
// and as the benchmark's ns/pkt.
func (r *runs) report(b *testing.B, what string) {
	if len(r.ns) == 0 {
		b.Fatal("no runs")
	}
	var sum uint64
	for _, ns := range r.ns {
		sum += uint64(ns)
	}
	mean := float64(sum) / float64(len(r.ns))
	sorted := slices.Clone(r.ns)
	slices.Sort(sorted)
	b.ReportMetric(mean, "ns/pkt")
	fmt.Printf("BENCH bpf %s ns_per_pkt=%.1f median_ns=%d p99_ns=%d runs=%d\n",
		what, mean, sorted[len(sorted)/2], sorted[len(sorted)*99/100], len(r.ns))
}

// progRunAttr is the BPF_PROG_RUN part of union bpf_attr. cilium/ebpf's
// Program.Run returns no duration, and Program.Benchmark no output; this
// gives both for one run.
type progRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      unsafe.Pointer
	dataOut     unsafe.Pointer
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       unsafe.Pointer
	ctxOut      unsafe.Pointer
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// progRun runs prog once on in and returns its verdict, the duration the
// kernel measured around the program (ns), and the packet it left in out.
func progRun(prog *ebpf.Program, in, out []byte) (uint32, uint32, []byte, error) {
	attr := progRunAttr{
		progFD:      uint32(prog.FD()),
		dataSizeIn:  uint32(len(in)),
		dataSizeOut: uint32(len(out)),
		dataIn:      unsafe.Pointer(&in[0]),
		dataOut:     unsafe.Pointer(&out[0]),
		repeat:      1,
	}
	// No retry on EINTR: the program may have run, and a second run of a
	// new flow's packet would find its conntrack entry.
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	if errno != 0 {
		return 0, 0, nil, errno
	}
	if int(attr.dataSizeOut) > len(out) {
		return 0, 0, nil, fmt.Errorf("output of %d bytes does not fit %d", attr.dataSizeOut, len(out))
	}
	return attr.retval, attr.duration, out[:attr.dataSizeOut], nil
}
