// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"sync"
	"testing"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// The fake maps run the reconciler as the agent does, without root: what
// it writes follows the frontends, and Written names every frontend once
// its entries are written.
func TestFakeMapsFollowTheFrontends(t *testing.T) {
	fake := NewFakeMaps()
	var mu sync.Mutex
	written := map[lb.L3n4Addr]int{}
	a := startAgentWith(t, DefaultConfig, Hooks{FakeMaps: fake, Written: func(fe lb.L3n4Addr) {
		mu.Lock()
		written[fe]++
		mu.Unlock()
	}})
	web, db := fe("10.5.5.5:80/TCP"), fe("10.1.2.3:3306/TCP")
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, web.String())
	a.setBackends(t, "web", "192.168.5.5:80")
	a.upsert(t, dbService, db.String())
	a.setBackends(t, "db", "192.168.1.10:3306,w=70", "192.168.1.11:3306,w=30", "192.168.1.12:3306/terminating")
	a.initialize(t)
	a.reconciled(t)

	// web has one backend: its entry names it, no table.
	want := FakeCounts{Services: 2, Backends: 4, MaglevTables: 1, SourceRanges: 2, VIPs: 2}
	if got := fake.Counts(); got != want {
		t.Errorf("after the first state: %+v, want %+v", got, want)
	}
	if e, ok := fake.Service(db); !ok || e.Count != 2 || e.ID == 0 {
		t.Errorf("service %s: %+v (found %v), want 2 usable backends", db, e, ok)
	}
	mu.Lock()
	if written[web] == 0 || written[db] == 0 {
		t.Errorf("Written was called for %v, want both frontends", written)
	}
	mu.Unlock()

	a.setBackends(t, "db")
	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "web"); return err })
	a.reconciled(t)
	want = FakeCounts{Services: 1, VIPs: 1, SourceRanges: 2}
	if got := fake.Counts(); got != want {
		t.Errorf("after deleting web and emptying db: %+v, want %+v", got, want)
	}
	if e, _ := fake.Service(db); e.Count != 0 {
		t.Errorf("service %s: %d usable backends, want 0", db, e.Count)
	}
}
