// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// Affinity keeps a client on its backend only while that backend takes
// new flows: once a better priority is back (failover undone), or the
// backend's weight is 0, a client's new flow goes where the Maglev table
// says, as everyone else's.
func TestPrivilegedAffinityYieldsToPriorityFailover(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	o, db := restoredOps(t, dp)
	vip := netip.MustParseAddrPort("10.1.2.3:3306")
	client := netip.MustParseAddr("10.0.0.2")
	primary, secondary := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11")
	update := func(backends ...string) {
		t.Helper()
		f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe(vip.String() + "/TCP")},
			Service: &lb.Service{Name: "db", SessionAffinity: true, SessionAffinityTimeout: time.Hour}}
		for _, b := range backends {
			f.Backends = append(f.Backends, be(b))
		}
		if err := o.Update(context.Background(), db.ReadTxn(), statedb.Revision(1), f); err != nil {
			t.Fatal(err)
		}
	}
	// newFlow opens a connection from the client's port (SYN, the
	// backend's SYN-ACK, the client's ACK: affinity is written once a flow
	// is established) and returns the address it was sent on to.
	newFlow := func(port uint16) netip.Addr {
		t.Helper()
		src := netip.AddrPortFrom(client, port)
		run := func(what string, frame []byte) []byte {
			t.Helper()
			opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, 256)}
			ret, err := dp.objs.L4xdsIngress.Run(&opts)
			if err != nil || int32(ret) == tcxDrop {
				t.Fatalf("%s of port %d: verdict %d, %v", what, port, int32(ret), err)
			}
			return opts.DataOut
		}
		out := run("SYN", tcp4Frame(src, vip, tcpSYN, 0, 0))
		dst, _ := netip.AddrFromSlice(out[14+16 : 14+20])
		run("SYN-ACK", tcp4Frame(netip.AddrPortFrom(dst, vip.Port()), src, tcpSYN|tcpACK, 5000, 1))
		run("ACK", tcp4Frame(src, vip, tcpACK, 1, 5001))
		return dst
	}

	// The primary is down: the secondary priority takes the flows, and
	// the client's affinity.
	update("192.168.1.10:3306/quarantined,p=0", "192.168.1.11:3306,p=1")
	if got := newFlow(40000); got != secondary {
		t.Fatalf("with the primary down: sent to %s, want the secondary %s", got, secondary)
	}

	// The primary is back: the client's new flows go to it.
	update("192.168.1.10:3306,p=0", "192.168.1.11:3306,p=1")
	if got := newFlow(40001); got != primary {
		t.Errorf("with the primary back: a new flow of the client with affinity sent to %s, want the primary %s", got, primary)
	}

	// The same for a backend of weight 0 (no new flows), in a table of two.
	update("192.168.1.10:3306,p=0", "192.168.1.11:3306,p=0", "192.168.1.12:3306,p=0")
	sticky := newFlow(41000) // the client's backend now
	var rest []string
	for _, b := range []string{"192.168.1.10:3306", "192.168.1.11:3306", "192.168.1.12:3306"} {
		if netip.MustParseAddrPort(b).Addr() == sticky {
			b += ",w=0"
		}
		rest = append(rest, b+",p=0")
	}
	update(rest...)
	if got := newFlow(42000); got == sticky {
		t.Errorf("a new flow of the client with affinity to %s, now of weight 0: sent to it", sticky)
	}
}
