// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// A VIP whose last frontend is removed stays in l4xds_old_vips for
// --lb-removed-vip-grace: its packets are dropped and counted rather than
// passed to the stack, which would route them back out; a frontend on it
// again takes it back.
func TestPrivilegedARemovedVIPIsDroppedForItsGrace(t *testing.T) {
	needRoot(t)
	for _, grace := range []time.Duration{time.Minute, 0} {
		t.Run(grace.String(), func(t *testing.T) {
			cfg := testConfig(bpffs(t))
			cfg.LBRemovedVIPGrace = grace
			dp := load(t, cfg)
			defer dp.Close()
			o, db := restoredOps(t, dp)
			f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:3306/TCP")}, Backends: []*lb.Backend{be("192.168.1.10:3306")}}
			client, vip := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.1.2.3:3306")
			syn := func() int32 {
				t.Helper()
				ret, err := dp.objs.L4xdsIngress.Run(&ebpf.RunOptions{Data: tcp4Frame(client, vip, tcpSYN, 0, 0)})
				if err != nil {
					t.Fatal(err)
				}
				return int32(ret)
			}
			removedDrops := func() uint64 {
				t.Helper()
				s, err := dp.Maps.ServiceStats(0)
				if err != nil {
					t.Fatal(err)
				}
				return s.Drops[DropRemovedVIP]
			}
			oldVIP := func() (time.Duration, bool) {
				t.Helper()
				key := addrToBPF(vip.Addr())
				var until uint64
				err := dp.Maps.oldVIPs.Lookup(&key, &until)
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					return 0, false
				}
				if err != nil {
					t.Fatalf("%s: %v", bpf.L4xdsMapL4xdsOldVips, err)
				}
				return time.Duration(until), true
			}

			if err := o.Update(context.Background(), db.ReadTxn(), statedb.Revision(1), f); err != nil {
				t.Fatal(err)
			}
			before, _ := Ktime()
			if err := o.Delete(context.Background(), db.ReadTxn(), statedb.Revision(2), f); err != nil {
				t.Fatal(err)
			}
			after, _ := Ktime()
			until, ok := oldVIP()
			v := syn()
			if grace == 0 {
				if ok || v == tcxDrop || removedDrops() != 0 {
					t.Errorf("without a grace period: old VIP entry %v, verdict %d, %d removed-VIP drops; want none, passed", ok, v, removedDrops())
				}
				return
			}
			if !ok || until < before+grace || until > after+grace {
				t.Errorf("%s entry of the removed VIP: until %s (found %v), want between %s and %s", bpf.L4xdsMapL4xdsOldVips, until, ok, before+grace, after+grace)
			}
			if v != tcxDrop || removedDrops() != 1 {
				t.Errorf("SYN to the removed VIP: verdict %d and %d removed-VIP drops, want %d and 1", v, removedDrops(), tcxDrop)
			}

			// A frontend on the VIP again.
			if err := o.Update(context.Background(), db.ReadTxn(), statedb.Revision(3), f); err != nil {
				t.Fatal(err)
			}
			if _, ok := oldVIP(); ok {
				t.Errorf("the VIP is served again, and still in %s", bpf.L4xdsMapL4xdsOldVips)
			}
			if v := syn(); v == tcxDrop {
				t.Errorf("SYN to the VIP served again: dropped")
			}
		})
	}
}

// A VIP parked in the pinned l4xds_old_vips by the agent before a restart
// is taken out of it when a frontend on it comes back, although the new
// agent parked nothing: it learns what is parked from the map. Two VIPs
// come back in one round, so that their counts are written in one batch.
func TestPrivilegedAVIPParkedBeforeARestartIsTakenBack(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBRemovedVIPGrace = time.Hour
	fes := []*lb.Frontend{
		{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:3306/TCP")}, Backends: []*lb.Backend{be("192.168.1.10:3306")}},
		{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.4:3306/TCP")}, Backends: []*lb.Backend{be("192.168.1.11:3306")}},
	}
	batch := func(rev statedb.Revision) []reconciler.BatchEntry[*lb.Frontend] {
		var b []reconciler.BatchEntry[*lb.Frontend]
		for _, f := range fes {
			b = append(b, reconciler.BatchEntry[*lb.Frontend]{Object: f, Revision: rev})
		}
		return b
	}
	parked := func(dp *Datapath) (n int) {
		t.Helper()
		for _, f := range fes {
			key := addrToBPF(f.Address.Addr)
			var until uint64
			if dp.Maps.oldVIPs.Lookup(&key, &until) == nil {
				n++
			}
		}
		return n
	}

	dp := load(t, cfg)
	o, db := restoredOps(t, dp)
	b := batch(1)
	o.UpdateBatch(context.Background(), db.ReadTxn(), b)
	for _, e := range b {
		if e.Result != nil {
			t.Fatal(e.Result)
		}
	}
	b = batch(2)
	o.DeleteBatch(context.Background(), db.ReadTxn(), b)
	for _, e := range b {
		if e.Result != nil {
			t.Fatal(e.Result)
		}
	}
	if n := parked(dp); n != len(fes) {
		t.Fatalf("%d of the %d removed VIPs parked in %s", n, len(fes), bpf.L4xdsMapL4xdsOldVips)
	}
	dp.Close()

	// The restart.
	dp = load(t, cfg)
	defer dp.Close()
	o, db = restoredOps(t, dp)
	b = batch(3)
	o.UpdateBatch(context.Background(), db.ReadTxn(), b)
	for _, e := range b {
		if e.Result != nil {
			t.Fatal(e.Result)
		}
	}
	if n := parked(dp); n != 0 {
		t.Errorf("after the restart, %d VIPs served again still parked in %s", n, bpf.L4xdsMapL4xdsOldVips)
	}
	vips, err := dp.Maps.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fes {
		if vips[f.Address.Addr] != 1 {
			t.Errorf("VIP %s: count %d, want 1", f.Address.Addr, vips[f.Address.Addr])
		}
	}
}
