// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"encoding/binary"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// skbLayout is where struct __sk_buff holds the GSO fields that
// BPF_PROG_RUN takes from its context, read from the program's BTF.
var skbLayout = sync.OnceValues(func() (skbFields, error) {
	spec, err := LoadL4xds()
	if err != nil {
		return skbFields{}, err
	}
	var s *btf.Struct
	if err := spec.Types.TypeByName("__sk_buff", &s); err != nil {
		return skbFields{}, err
	}
	f := skbFields{size: s.Size}
	for _, m := range s.Members {
		switch m.Name {
		case "gso_size":
			f.gsoSize = m.Offset.Bytes()
		case "gso_segs":
			f.gsoSegs = m.Offset.Bytes()
		}
	}
	return f, nil
})

type skbFields struct {
	size, gsoSize, gsoSegs uint32
}

// runGSO runs the program once on frame as a GSO packet of segments of
// gsoSize bytes, as GRO (or a guest's virtio-net header) makes them.
func (d *datapath) runGSO(frame []byte, gsoSize, gsoSegs uint32) (uint32, []byte) {
	d.t.Helper()
	f, err := skbLayout()
	d.must(err, "__sk_buff layout")
	if f.gsoSize == 0 || f.gsoSegs == 0 {
		d.t.Fatalf("__sk_buff has no gso_size or gso_segs in the program's BTF")
	}
	ctx := make([]byte, f.size)
	binary.NativeEndian.PutUint32(ctx[f.gsoSize:], gsoSize)
	binary.NativeEndian.PutUint32(ctx[f.gsoSegs:], gsoSegs)
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
	verdict, err := d.objs.L4xdsIngress.Run(&opts)
	d.must(err, "run")
	return verdict, opts.DataOut
}

// Length fields of BIG TCP (the GRO and GSO packets of more than 64 KiB
// that Linux makes since 5.19 for IPv4 and 6.0 for IPv6): an IPv4 total
// length of 0, an IPv6 payload length of 0, without (Linux 7.0 on) or with
// (6.0 to 6.19) a Hop-by-Hop header of a Jumbo Payload option; the
// length is the skb's.

// zeroTotLen is an IPv4 frame with a total length of 0 (and the header
// checksum that goes with it).
func zeroTotLen(f []byte) []byte {
	f = append([]byte{}, f...)
	ip := f[14:]
	binary.BigEndian.PutUint16(ip[2:], 0)
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], checksum(ip[:int(ip[0]&0x0f)*4]))
	return f
}

// zeroPayloadLen is an IPv6 frame with a payload length of 0.
func zeroPayloadLen(f []byte) []byte {
	f = append([]byte{}, f...)
	binary.BigEndian.PutUint16(f[14+4:], 0)
	return f
}

// withJumbo is an IPv6 frame as GRO makes it before Linux 7.0: payload
// length 0, then a Hop-by-Hop header of one Jumbo Payload option (RFC
// 2675) with the length of all that follows the fixed header.
func withJumbo(f []byte) []byte {
	ip := f[14:]
	hbh := []byte{ip[6], 0, 0xc2, 4}
	hbh = binary.BigEndian.AppendUint32(hbh, uint32(len(ip)-40+8))
	out := append([]byte{}, f[:14+40]...)
	out[14+6] = protoHopByHop
	binary.BigEndian.PutUint16(out[14+4:], 0)
	out = append(out, hbh...)
	return append(out, ip[40:]...)
}

// BIG TCP packets (GSO, more than the length fields hold, which say 0) are
// translated like any other; a length of 0 on a packet that is not GSO is
// malformed. BPF_PROG_RUN makes packets of at most a page: these are
// smaller than a real BIG TCP packet, which does not change their path.
func TestBigTCP(t *testing.T) {
	const mss = 1448
	payload := []byte(strings.Repeat("b", 2*mss))
	data4 := segment{src: client4, dst: vip4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: payload}
	data6 := segment{src: client6, dst: vip6, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 1001, ack: 5001, payload: payload}
	reply4 := segment{src: be4a.addr, dst: client4, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 5001, ack: 3897, payload: payload}
	reply6 := segment{src: be6a.addr, dst: client6, proto: protoTCP, flags: tcpACK | tcpPSH, seq: 5001, ack: 3897, payload: payload}
	udp4 := udp(client4, vip4, string(payload))
	svcs := []service{
		{id: 1, vip: vip4, proto: protoTCP, backends: []backend{be4a}},
		{id: 2, vip: vip4, proto: protoUDP, backends: []backend{{id: 3, addr: be4a.addr}}},
		{id: 6, vip: vip6, proto: protoTCP, backends: []backend{be6a}},
	}

	type gsoStep struct {
		name    string
		in      []byte
		gso     bool
		verdict uint32
		want    []byte
	}
	fwd := func(name string, in, want []byte) gsoStep {
		return gsoStep{name: name, in: in, gso: true, verdict: verdictNext, want: want}
	}
	steps := []gsoStep{
		// The flows begin (SYNs, not GSO) so that the backends' replies
		// have their conntrack entries.
		{name: "syn v4", in: syn(client4, vip4).frame(), verdict: verdictNext, want: syn(client4, vip4).to(be4a.addr).frame()},
		{name: "syn v6", in: syn(client6, vip6).frame(), verdict: verdictNext, want: syn(client6, vip6).to(be6a.addr).frame()},
		fwd("IPv4 total length 0", zeroTotLen(data4.frame()), zeroTotLen(data4.to(be4a.addr).frame())),
		fwd("IPv4 total length 0 from the backend", zeroTotLen(reply4.frame()), zeroTotLen(reply4.from(vip4).frame())),
		fwd("IPv6 payload length 0", zeroPayloadLen(data6.frame()), zeroPayloadLen(data6.to(be6a.addr).frame())),
		fwd("IPv6 payload length 0 from the backend", zeroPayloadLen(reply6.frame()), zeroPayloadLen(reply6.from(vip6).frame())),
		fwd("IPv6 Jumbo Payload option", withJumbo(data6.frame()), withJumbo(data6.to(be6a.addr).frame())),
		fwd("IPv6 Jumbo Payload option from the backend", withJumbo(reply6.frame()), withJumbo(reply6.from(vip6).frame())),
		// Not GSO: the length fields are the packet's.
		{name: "IPv4 total length 0, not GSO", in: zeroTotLen(data4.frame()), verdict: verdictDrop},
		{name: "IPv6 payload length 0, not GSO", in: zeroPayloadLen(data6.frame()), verdict: verdictDrop},
		{name: "IPv6 Jumbo Payload option, not GSO", in: withJumbo(data6.frame()), verdict: verdictDrop},
		// BIG TCP is TCP's: a UDP datagram's own length field holds no
		// more than 64 KiB.
		{name: "UDP with IPv4 total length 0", in: zeroTotLen(udp4.frame()), gso: true, verdict: verdictDrop},
		// A Jumbo Payload option that is not the packet's length.
		{name: "IPv6 Jumbo Payload option of another length", in: func() []byte {
			f := withJumbo(data6.frame())
			binary.BigEndian.PutUint32(f[14+40+4:], uint32(len(f)-14-40+8))
			return f
		}(), gso: true, verdict: verdictDrop},
		{name: "IPv6 Hop-by-Hop header cut short", in: withJumbo(data6.frame())[:14+40+4], gso: true, verdict: verdictDrop},
	}

	d := newDatapath(t)
	for _, s := range svcs {
		d.addService(s)
	}
	for _, st := range steps {
		var verdict uint32
		var out []byte
		if st.gso {
			verdict, out = d.runGSO(st.in, mss, 2)
		} else {
			verdict, out = d.run(st.in)
		}
		if verdict != st.verdict {
			t.Errorf("%s: verdict %d, want %d", st.name, int32(verdict), int32(st.verdict))
			continue
		}
		if st.verdict == verdictDrop {
			continue
		}
		if i := firstDifference(out, st.want); i >= 0 {
			t.Errorf("%s: packet differs from byte %d on (%d bytes, want %d)\n got: %x\nwant: %x",
				st.name, i, len(out), len(st.want), out[i:min(i+16, len(out))], st.want[i:min(i+16, len(st.want))])
			continue
		}
		verifyChecksums(t, st.name, out)
	}
	bytes := func(frames ...[]byte) int {
		n := 0
		for _, f := range frames {
			n += len(f)
		}
		return n
	}
	wantStats(t, d, 1, 3, bytes(syn(client4, vip4).frame(), steps[2].in, steps[3].in), nil)
	wantStats(t, d, 6, 5, bytes(syn(client6, vip6).frame(), steps[4].in, steps[5].in, steps[6].in, steps[7].in), nil)
	wantStats(t, d, 2, 0, 0, nil)
	// Headers it cannot read: the ports are not known, no service is
	// charged.
	wantStats(t, d, 0, 0, 0, map[int]uint64{dropMalformed: 3, dropExtension: 3})
}

// firstDifference is the offset of the first byte where a and b differ,
// or -1 when they are equal.
func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
