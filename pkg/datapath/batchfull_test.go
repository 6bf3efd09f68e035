// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// A batch into a full map (an orphan entry the registry does not know
// takes the room, until Prune) writes the entries before the one that does
// not fit, names that one in its error, and writes none after it: the
// kernel stops there and says how many it wrote.
func TestPrivilegedABatchStopsAtAFullMap(t *testing.T) {
	needRoot(t)
	dp := load(t, smallMaps(testConfig(bpffs(t))))
	defer dp.Close()
	m := dp.Maps

	orphan, err := svcKeyToBPF(fe("10.9.9.9:1/TCP"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.putService(orphan, bpf.L4xdsLbSvc{Id: 9}); err != nil {
		t.Fatal(err)
	}
	var keys []bpf.L4xdsLbSvcKey
	var values []bpf.L4xdsLbSvc
	for i, a := range []string{"10.0.0.1:80/TCP", "10.0.0.2:80/TCP", "10.0.0.3:80/TCP"} {
		k, err := svcKeyToBPF(fe(a))
		if err != nil {
			t.Fatal(err)
		}
		keys, values = append(keys, k), append(values, bpf.L4xdsLbSvc{Id: uint32(i + 1)})
	}
	n, err := m.putServices(keys, values)
	if n != 1 || err == nil || !strings.Contains(err.Error(), "service 2:") {
		t.Fatalf("putServices into a map with room for one: %d written, error %v; want 1, and service 2's error", n, err)
	}
	var v bpf.L4xdsLbSvc
	for i, k := range keys {
		found := m.services.Lookup(&k, &v) == nil
		if found != (i == 0) {
			t.Errorf("service %d: in the map %v, want %v", values[i].Id, found, i == 0)
		}
	}
	// The rest of the batch, as eachBatch goes on after the failure: the
	// entry written is rewritten in place, a full map or not.
	if n, err := m.putServices(keys[:1], values[:1]); n != 1 || err != nil {
		t.Errorf("rewrite of an entry of a full map: %d, %v", n, err)
	}

	// The VIPs likewise (room for two).
	vips := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")}
	if n, err := m.putVIPs(vips, []uint32{1, 1, 1}); n != 2 || err == nil || !strings.Contains(err.Error(), "10.0.0.3") {
		t.Errorf("putVIPs into a map with room for two: %d written, error %v; want 2, and 10.0.0.3's error", n, err)
	}

	// The backends (room for four).
	ids := []uint32{1, 2, 3, 4, 5, 6}
	bes := make([]bpf.L4xdsLbBackend, len(ids))
	for i := range bes {
		bes[i] = backendToBPF(1, netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 168, 0, byte(i + 1)}), 80), 0)
	}
	if n, err := m.putBackends(ids, bes); n != 4 || err == nil || !strings.Contains(err.Error(), "(id 5)") {
		t.Errorf("putBackends into a map with room for four: %d written, error %v; want 4, and id 5's error", n, err)
	}
}

// The counters a service ID kept from the service that had it before are
// cleared before a new service's entry counts anything: a round's new
// services in one batch of the per-CPU map, every CPU's slot.
func TestPrivilegedARoundClearsItsNewServicesCounters(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	o, db := restoredOps(t, dp)

	const n = 3
	left := make([]bpf.L4xdsLbStats, dp.Maps.possibleCPU)
	for i := range left {
		left[i].Packets, left[i].Bytes, left[i].Drops[DropNoBackend] = 7, 700, 3
	}
	var batch []reconciler.BatchEntry[*lb.Frontend]
	for i := 1; i <= n; i++ {
		// The IDs the registry hands out first: 1..n.
		if err := dp.Maps.stats.Put(uint32(i), left); err != nil {
			t.Fatal(err)
		}
		f := &lb.Frontend{
			FrontendParams: lb.FrontendParams{Address: fe(fmt.Sprintf("10.1.2.%d:80/TCP", i))},
			Backends:       []*lb.Backend{be(fmt.Sprintf("192.168.1.%d:80", i))},
		}
		batch = append(batch, reconciler.BatchEntry[*lb.Frontend]{Object: f, Revision: 1})
	}
	o.UpdateBatch(context.Background(), db.ReadTxn(), batch)
	for _, e := range batch {
		if e.Result != nil {
			t.Fatal(e.Result)
		}
		svc := o.reg.services[e.Object.Address]
		s, err := dp.Maps.ServiceStats(svc.id)
		if err != nil {
			t.Fatal(err)
		}
		if s != (Stats{}) {
			t.Errorf("frontend %s (service %d): counters %+v, want zero", e.Object.Address, svc.id, s)
		}
	}
}

// A round whose service entries no longer fit the map (an orphan the
// registry does not know takes the last room, until Prune deletes it):
// the frontends before the one that does not fit are served, that one's
// error says the map is full, not that its key is too big, and Prune
// makes the room its retry takes.
func TestPrivilegedAFullServiceMapFailsTheFrontendThatDoesNotFit(t *testing.T) {
	needRoot(t)
	dp := load(t, smallMaps(testConfig(bpffs(t))))
	defer dp.Close()
	o, db := restoredOps(t, dp)
	orphan, err := svcKeyToBPF(fe("10.9.9.9:1/TCP"))
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.putService(orphan, bpf.L4xdsLbSvc{Id: 9}); err != nil {
		t.Fatal(err)
	}
	var batch []reconciler.BatchEntry[*lb.Frontend]
	for i := 1; i <= 2; i++ {
		f := &lb.Frontend{
			FrontendParams: lb.FrontendParams{Address: fe(fmt.Sprintf("10.1.2.%d:80/TCP", i))},
			Backends:       []*lb.Backend{be(fmt.Sprintf("192.168.1.%d:80", i))},
		}
		batch = append(batch, reconciler.BatchEntry[*lb.Frontend]{Object: f, Revision: 1})
	}
	o.UpdateBatch(context.Background(), db.ReadTxn(), batch)
	if err := batch[0].Result; err != nil {
		t.Errorf("frontend %s: %v, want it served", batch[0].Object.Address, err)
	}
	err = batch[1].Result
	if err == nil || !strings.Contains(err.Error(), "frontend 10.1.2.2:80/TCP: write l4xds_services: service 2: the map is full") {
		t.Errorf("frontend %s: error %v, want it to say that l4xds_services is full", batch[1].Object.Address, err)
	}

	objs := func(yield func(*lb.Frontend, statedb.Revision) bool) {
		for _, e := range batch {
			if !yield(e.Object, e.Revision) {
				return
			}
		}
	}
	if err := o.Prune(context.Background(), db.ReadTxn(), objs); err != nil {
		t.Fatal(err)
	}
	if err := o.Update(context.Background(), db.ReadTxn(), 1, batch[1].Object); err != nil {
		t.Errorf("retry after the prune: %v", err)
	}
	for _, e := range batch {
		var v bpf.L4xdsLbSvc
		if err := dp.Maps.services.Lookup(ptr(o.reg.services[e.Object.Address].key), &v); err != nil {
			t.Errorf("frontend %s: %v", e.Object.Address, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }
