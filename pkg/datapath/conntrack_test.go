// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/test/netns"
)

func TestCTEntryDecodesBothDirections(t *testing.T) {
	client := netip.MustParseAddrPort("10.0.0.2:40000")
	vip := netip.MustParseAddrPort("10.1.2.3:3306")
	backend := netip.MustParseAddrPort("[2001:db8::10]:3306")
	key := func(src, dst netip.AddrPort, proto, dir uint8) bpf.L4xdsLbCtKey {
		return bpf.L4xdsLbCtKey{
			Saddr: addrToBPF(src.Addr()), Daddr: addrToBPF(dst.Addr()),
			Sport: portToBPF(src.Port()), Dport: portToBPF(dst.Port()), Proto: proto, Dir: dir,
		}
	}
	for _, c := range []struct {
		name string
		k    bpf.L4xdsLbCtKey
		v    bpf.L4xdsLbCtEntry
		want CTEntry
		life time.Duration
		err  string
	}{
		{
			name: "forward TCP",
			k:    key(client, vip, ipprotoTCP, ctForward),
			v:    bpf.L4xdsLbCtEntry{LastSeen: 5e9, BackendId: 7, SvcId: 2},
			want: CTEntry{Protocol: lb.TCP, Client: client, Frontend: vip, BackendID: 7, ServiceID: 2, LastSeen: 5 * time.Second},
			life: CTLifetimeTCP,
		},
		{
			name: "reply TCP closing",
			k:    key(backend, client, ipprotoTCP, ctReply),
			v:    bpf.L4xdsLbCtEntry{LastSeen: 5e9, BackendId: 7, SvcId: 2, Vip: addrToBPF(vip.Addr()), VipPort: portToBPF(vip.Port()), Flags: ctFlagClosing},
			want: CTEntry{Reply: true, Protocol: lb.TCP, Client: client, Frontend: vip, Backend: backend, BackendID: 7, ServiceID: 2, Closing: true, LastSeen: 5 * time.Second},
			life: CTLifetimeTCPClosing,
		},
		{
			name: "forward UDP",
			k:    key(client, vip, ipprotoUDP, ctForward),
			v:    bpf.L4xdsLbCtEntry{LastSeen: 5e9, BackendId: 7, SvcId: 2},
			want: CTEntry{Protocol: lb.UDP, Client: client, Frontend: vip, BackendID: 7, ServiceID: 2, LastSeen: 5 * time.Second},
			life: CTLifetimeNonTCP,
		},
		{
			name: "new TCP",
			k:    key(client, vip, ipprotoTCP, ctForward),
			v:    bpf.L4xdsLbCtEntry{LastSeen: 5e9, BackendId: 7, SvcId: 2, Flags: ctFlagNew},
			want: CTEntry{New: true, Protocol: lb.TCP, Client: client, Frontend: vip, BackendID: 7, ServiceID: 2, LastSeen: 5 * time.Second},
			life: CTLifetimeNew,
		},
		{
			name: "new TCP closing",
			k:    key(client, vip, ipprotoTCP, ctForward),
			v:    bpf.L4xdsLbCtEntry{LastSeen: 5e9, BackendId: 7, SvcId: 2, Flags: ctFlagNew | ctFlagClosing},
			want: CTEntry{New: true, Closing: true, Protocol: lb.TCP, Client: client, Frontend: vip, BackendID: 7, ServiceID: 2, LastSeen: 5 * time.Second},
			life: CTLifetimeTCPClosing,
		},
		{
			name: "unknown direction",
			k:    key(client, vip, ipprotoUDP, 9),
			err:  "l4xds_ct: entry 10.0.0.2:40000 -> 10.1.2.3:3306: direction 9 is not CT_FORWARD or CT_REPLY",
		},
		{
			name: "unknown protocol",
			k:    key(client, vip, 1, ctForward),
			err:  "l4xds_ct: entry 10.0.0.2:40000 -> 10.1.2.3:3306: IP protocol 1 is not TCP or UDP",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ctEntryFromBPF(bpf.L4xdsMapL4xdsCt, c.k, c.v)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v\nwant %+v", got, err, c.want)
			}
			if got.Lifetime() != c.life {
				t.Errorf("lifetime %s, want %s", got.Lifetime(), c.life)
			}
			if r := got.Remaining(got.LastSeen + time.Second); r != c.life-time.Second {
				t.Errorf("remaining a second after last seen: %s, want %s", r, c.life-time.Second)
			}
		})
	}
}

func TestKtimeIsMonotonic(t *testing.T) {
	a, err := Ktime()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Ktime()
	if a <= 0 || b < a {
		t.Errorf("Ktime %s then %s", a, b)
	}
}

// Verdicts of BPF_PROG_RUN.
const (
	tcxNext     = -1 // translated, passed on to the stack
	tcxRedirect = 7  // translated, sent to the next hop the FIB lookup found
)

// The program itself writes the entries of a flow (BPF_PROG_RUN), and the
// reader finds the client, the VIP, the backend and the lifetime left. The
// program's FIB lookup runs in the namespace of the thread: each case sets
// up its own, for either path.
func TestPrivilegedConntrackReadsTheEntriesOfAFlow(t *testing.T) {
	needRoot(t)
	t.Run("forwarding off: passed on", func(t *testing.T) {
		ns := netns.Add(t, "net.ipv4.ip_forward=0")
		netns.Do(t, ns, func() { conntrackOfAFlow(t, tcxNext) })
	})
	t.Run("forwarding on, routes to both ends: redirected", func(t *testing.T) {
		ns := netns.Add(t, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
		for _, l := range []struct{ dev, addr string }{{"lan", "192.168.1.1/24"}, {"wan", "10.0.0.1/24"}} {
			netns.IP(t, "-n", ns, "link", "add", l.dev, "type", "veth", "peer", "name", l.dev+"p")
			netns.IP(t, "-n", ns, "addr", "add", l.addr, "dev", l.dev)
			netns.IP(t, "-n", ns, "link", "set", l.dev+"p", "up")
			netns.IP(t, "-n", ns, "link", "set", l.dev, "up")
		}
		netns.Do(t, ns, func() { conntrackOfAFlow(t, tcxRedirect) })
	})
}

// conntrackOfAFlow runs a flow through the program, each packet getting
// verdict, and reads its entries.
func conntrackOfAFlow(t *testing.T, verdict int32) {
	t.Helper()
	root := bpffs(t)
	dp := load(t, testConfig(root))
	defer dp.Close()
	o, db := restoredOps(t, dp)
	f := &lb.Frontend{
		FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:3306/TCP")},
		Service:        &lb.Service{Name: "db", SessionAffinity: true, SessionAffinityTimeout: time.Minute},
		Backends:       []*lb.Backend{be("192.168.1.10:3306")},
	}
	if err := o.Update(context.Background(), db.ReadTxn(), 1, f); err != nil {
		t.Fatal(err)
	}
	svcID := o.reg.services[f.Address].id

	client := netip.MustParseAddrPort("10.0.0.2:40000")
	vip := netip.MustParseAddrPort("10.1.2.3:3306")
	backend := netip.MustParseAddrPort("192.168.1.10:3306")
	run := func(src, dst netip.AddrPort, flags uint8, seq, ack uint32) {
		t.Helper()
		ret, err := dp.objs.L4xdsIngress.Run(&ebpf.RunOptions{Data: tcp4Frame(src, dst, flags, seq, ack)})
		if err != nil || int32(ret) != verdict {
			t.Fatalf("BPF_PROG_RUN %s -> %s: verdict %d, %v; want %d", src, dst, int32(ret), err, verdict)
		}
	}
	entries := func() []CTEntry {
		t.Helper()
		flows, err := OpenPinnedFlows(root)
		if err != nil {
			t.Fatal(err)
		}
		defer flows.Close()
		var out []CTEntry
		for e, err := range flows.Conntrack() {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
		slices.SortFunc(out, func(a, b CTEntry) int { return boolCmp(a.Reply, b.Reply) })
		return out
	}
	affinity := func() []AffinityEntry {
		t.Helper()
		flows, err := OpenPinnedFlows(root)
		if err != nil {
			t.Fatal(err)
		}
		defer flows.Close()
		var out []AffinityEntry
		for e, err := range flows.Affinity() {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
		return out
	}

	// A SYN: the flow is new, both entries in l4xds_ct_new, and no
	// affinity yet.
	before, _ := Ktime()
	run(client, vip, tcpSYN, 0, 0)
	after, _ := Ktime()
	got := entries()
	if len(got) != 2 {
		t.Fatalf("after a SYN: %d entries, want a forward and a reply one: %+v", len(got), got)
	}
	backendID := got[0].BackendID
	want := []CTEntry{
		{New: true, Protocol: lb.TCP, Client: client, Frontend: vip, BackendID: backendID, ServiceID: svcID, LastSeen: got[0].LastSeen},
		{New: true, Reply: true, Protocol: lb.TCP, Client: client, Frontend: vip, Backend: backend, BackendID: backendID, ServiceID: svcID, LastSeen: got[1].LastSeen},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entries after a SYN:\n%+v\nwant\n%+v", got, want)
	}
	for _, e := range got {
		if e.LastSeen < before || e.LastSeen > after {
			t.Errorf("last seen %s, not between the clock's %s and %s: not bpf_ktime_get_ns?", e.LastSeen, before, after)
		}
		if r := e.Remaining(after); r <= CTLifetimeNew-time.Second || r > CTLifetimeNew {
			t.Errorf("%+v: %s left right after the SYN, want about %s", e, r, CTLifetimeNew)
		}
	}
	if aff := affinity(); len(aff) != 0 {
		t.Errorf("affinity entries after a SYN alone: %+v, want none", aff)
	}

	// The backend's SYN-ACK, the client's ACK of it: established.
	run(backend, client, tcpSYN|tcpACK, 5000, 1)
	before, _ = Ktime()
	run(client, vip, tcpACK, 1, 5001)
	after, _ = Ktime()
	got = entries()
	for i := range want {
		want[i].New, want[i].LastSeen = false, got[i].LastSeen
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entries after the handshake:\n%+v\nwant\n%+v", got, want)
	}
	for _, e := range got {
		if r := e.Remaining(after); e.LastSeen < before || r <= CTLifetimeTCP-time.Second || r > CTLifetimeTCP {
			t.Errorf("%+v: %s left right after the handshake, want about %s", e, r, CTLifetimeTCP)
		}
	}

	// The backend's FIN closes the flow: both entries short-lived.
	run(backend, client, tcpFIN|tcpACK, 5001, 1)
	now, _ := Ktime()
	for _, e := range entries() {
		if !e.Closing || e.Remaining(now) > CTLifetimeTCPClosing {
			t.Errorf("after the backend's FIN: %+v with %s left, want closing with at most %s", e, e.Remaining(now), CTLifetimeTCPClosing)
		}
	}

	aff := affinity()
	if len(aff) != 1 || aff[0].Client != client.Addr() || aff[0].ServiceID != svcID || aff[0].BackendID != backendID {
		t.Errorf("affinity entries %+v, want %s on backend %d of service %d", aff, client.Addr(), backendID, svcID)
	}
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpACK = 0x10
)

// tcp4Frame is an Ethernet frame of a TCP segment without payload. The
// checksums are left zero: the program updates them incrementally and
// never checks them.
func tcp4Frame(src, dst netip.AddrPort, flags uint8, seq, ack uint32) []byte {
	b := make([]byte, 14+20+20)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 40)
	ip[8], ip[9] = 64, ipprotoTCP
	copy(ip[12:], src.Addr().AsSlice())
	copy(ip[16:], dst.Addr().AsSlice())
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	return b
}
