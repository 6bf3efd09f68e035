// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// A frontend that does not fit the maps is marked Error, naming the limit
// and the flag that raises it; what serves keeps serving as it was, and the
// frontend is written once room is made.
func TestMapCapacityFake(t *testing.T) {
	fake := NewFakeMaps()
	a := startAgentWith(t, smallMaps(DefaultConfig), Hooks{FakeMaps: fake})
	testMapCapacity(t, a, func(t *testing.T) (services, backends int) {
		c := fake.Counts()
		return c.Services, c.Backends
	})
}

// The same on real maps sized by the flags.
func TestPrivilegedMapCapacity(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	a := startAgent(t, smallMaps(testConfig(root)))
	c := readMaps(t, root)
	for _, m := range []struct {
		name string
		m    *ebpf.Map
		want uint32
	}{
		{bpf.L4xdsMapL4xdsServices, c.maps.services, 2},
		{bpf.L4xdsMapL4xdsMaglev, c.maps.maglev, 2},
		{bpf.L4xdsMapL4xdsVips, c.maps.vips, 2},
		{bpf.L4xdsMapL4xdsBackends, c.maps.backends, 4},
	} {
		if got := m.m.MaxEntries(); got != m.want {
			t.Errorf("%s: %d entries, want %d", m.name, got, m.want)
		}
	}
	testMapCapacity(t, a, func(t *testing.T) (services, backends int) {
		c := readMaps(t, root)
		return len(c.services), len(c.backends)
	})
}

// smallMaps: two frontends, four backends, three Maglev slots.
func smallMaps(c Config) Config {
	c.LBServiceMapMax, c.LBBackendMapMax, c.LBMaglevTableSize = 2, 4, 3
	return c
}

func testMapCapacity(t *testing.T, a *agent, count func(*testing.T) (services, backends int)) {
	web, db, extra := fe("10.0.0.1:80/TCP"), fe("10.0.0.2:3306/TCP"), fe("10.0.0.3:80/TCP")
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, web.String())
	a.setBackends(t, "web", "192.168.0.1:80", "192.168.0.2:80")
	a.upsert(t, &lb.Service{Name: "db", Source: lb.SourceXDS}, db.String())
	a.setBackends(t, "db", "192.168.1.1:3306")
	a.initialize(t)
	a.reconciled(t)

	// A third frontend: the service map holds two.
	a.upsert(t, &lb.Service{Name: "extra", Source: lb.SourceXDS}, extra.String())
	a.setBackends(t, "extra", "192.168.2.1:80")
	a.failsWith(t, extra, "the service map is full: it holds 2 frontends; --lb-service-map-max raises the limit")

	// Two more backends for db: one entry of four is free.
	a.setBackends(t, "db", "192.168.1.1:3306", "192.168.1.2:3306", "192.168.1.3:3306")
	a.failsWith(t, db, "2 new backends do not fit the backend map: 1 of its 4 entries are free; --lb-backend-map-max raises the limit")

	// Four usable backends for web: its Maglev table has three slots.
	a.setBackends(t, "web", "192.168.0.1:80", "192.168.0.2:80", "192.168.0.3:80", "192.168.0.4:80")
	a.failsWith(t, web, "4 usable backends do not fit a Maglev table of 3 slots; --lb-maglev-table-size raises it (a prime)")

	// Nothing of it was written: web and db serve as they did.
	if s, b := count(t); s != 2 || b != 3 {
		t.Errorf("after the refused changes: %d services and %d backends in the maps, want 2 and 3 as before", s, b)
	}

	// Room is made: db goes, web is back to two backends. The reconciler
	// retries extra, which now fits.
	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "db"); return err })
	a.setBackends(t, "db")
	a.setBackends(t, "web", "192.168.0.1:80", "192.168.0.2:80")
	eventually(t, "every frontend written once room is made", func() bool {
		for fe := range a.w.Frontends().All(a.db.ReadTxn()) {
			if fe.Status.Kind != reconciler.StatusKindDone {
				return false
			}
		}
		return true
	})
	if s, b := count(t); s != 2 || b != 3 {
		t.Errorf("after making room: %d services and %d backends in the maps, want 2 and 3 (web and extra)", s, b)
	}
}

// failsWith waits until the frontend's status is an error that ends with
// want (after "frontend ADDR: ").
func (a *agent) failsWith(t *testing.T, addr lb.L3n4Addr, want string) {
	t.Helper()
	want = "frontend " + addr.String() + ": " + want
	var last string
	eventually(t, "frontend "+addr.String()+" to fail with "+want, func() bool {
		f, _, ok := a.w.Frontends().Get(a.db.ReadTxn(), lb.FrontendByAddress.Query(addr))
		if !ok {
			return false
		}
		last = f.Status.GetError()
		return f.Status.Kind == reconciler.StatusKindError && strings.Contains(last, want)
	})
}

// A restarted agent with larger map sizes makes the ID maps anew at the
// new sizes, with the pinned entries copied: the frontends keep their IDs,
// which established flows' conntrack entries name, and the flows their
// entries. The previous program forwards with the pinned maps until the
// new ones are filled.
func TestPrivilegedPinnedMapsGrowWithTheirIDs(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	a := startAgent(t, smallMaps(testConfig(root)))
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, "10.0.0.1:80/TCP")
	a.setBackends(t, "web", "192.168.0.1:80", "192.168.0.2:80")
	a.initialize(t)
	a.reconciled(t)
	before := readMaps(t, root)
	flow := bpf.L4xdsLbCtKey{Sport: 40000, Dport: 80, Proto: 6}
	writeEntry(t, root, bpf.L4xdsMapL4xdsCt, flow, bpf.L4xdsLbCtEntry{BackendId: 1, SvcId: before.services[fe("10.0.0.1:80/TCP")].ID})
	a.stop(t)

	bigger := testConfig(root)
	bigger.LBMaglevTableSize = 3
	a = startAgent(t, bigger)
	if !strings.Contains(a.logs.String(), "Entries copied into the map made anew") {
		t.Errorf("no copy of the pinned entries")
	}
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, "10.0.0.1:80/TCP")
	a.setBackends(t, "web", "192.168.0.1:80", "192.168.0.2:80")
	a.upsert(t, &lb.Service{Name: "db", Source: lb.SourceXDS}, "10.0.0.2:80/TCP")
	a.upsert(t, &lb.Service{Name: "extra", Source: lb.SourceXDS}, "10.0.0.3:80/TCP")
	a.initialize(t)
	a.reconciled(t)
	// Each map the test reads pinned in place of the old one (Commit
	// replaces the pins one by one).
	eventually(t, "the new maps pinned", func() bool {
		pinned := map[string]bool{}
		for _, line := range strings.Split(a.logs.String(), "\n") {
			if _, name, ok := strings.Cut(line, "New map pinned in place of the incompatible one\" module=datapath map="); ok {
				pinned[name] = true
			}
		}
		for _, name := range []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsBackends, bpf.L4xdsMapL4xdsMaglev,
			bpf.L4xdsMapL4xdsSrcrange, bpf.L4xdsMapL4xdsVips, bpf.L4xdsMapL4xdsStats, bpf.L4xdsMapL4xdsCt} {
			if !pinned[name] {
				return false
			}
		}
		return true
	})
	c := readMaps(t, root)
	if got := c.maps.backends.MaxEntries(); got != uint32(bigger.LBBackendMapMax) {
		t.Errorf("%s: %d entries after the restart, want %d", bpf.L4xdsMapL4xdsBackends, got, bigger.LBBackendMapMax)
	}
	if got := c.maps.stats.MaxEntries(); got != uint32(bigger.LBServiceMapMax)+1 {
		t.Errorf("%s: %d entries after the restart, want %d", bpf.L4xdsMapL4xdsStats, got, bigger.LBServiceMapMax+1)
	}
	if got, want := c.services[fe("10.0.0.1:80/TCP")].ID, before.services[fe("10.0.0.1:80/TCP")].ID; got != want {
		t.Errorf("web's service ID %d after the restart, want %d as before", got, want)
	}
	for id, be := range before.backends {
		if got := c.backends[id]; got.Address != be.Address {
			t.Errorf("backend %d is %v after the restart, want %v as before", id, got.Address, be.Address)
		}
	}
	// The Maglev tables are not copied: the reconciler writes them anew
	// before the new program is attached.
	if _, ok, err := c.maps.MaglevTable(c.services[fe("10.0.0.1:80/TCP")].ID); !ok || err != nil {
		t.Errorf("web has no Maglev table after the resize (%v)", err)
	}
	if len(c.services) != 3 {
		t.Errorf("%d services after the restart, want web, db and extra", len(c.services))
	}
	ct, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsCt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	var entry bpf.L4xdsLbCtEntry
	if err := ct.Lookup(flow, &entry); err != nil || entry.BackendId != 1 {
		t.Errorf("the established flow's conntrack entry after the resize: %+v, %v", entry, err)
	}
}

// A smaller size than the highest ID in use would orphan the frontends
// above it: the pinned maps keep their size, with a warning that names it.
func TestPrivilegedPinnedMapsKeepTheirSizeBelowTheHighestID(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBServiceMapMax, cfg.LBMaglevTableSize = 10, 3
	a := startAgent(t, cfg)
	for i, addr := range []string{"10.0.0.1:80/TCP", "10.0.0.2:80/TCP", "10.0.0.3:80/TCP"} {
		name := fmt.Sprint("s", i)
		a.upsert(t, &lb.Service{Name: lb.ServiceName(name), Source: lb.SourceXDS}, addr)
		a.setBackends(t, name, "192.168.0.1:80")
	}
	a.initialize(t)
	a.reconciled(t)
	a.stop(t)

	cfg.LBServiceMapMax = 2
	a = startAgent(t, cfg)
	if !strings.Contains(a.logs.String(), "A pinned map keeps its size") || !strings.Contains(a.logs.String(), "highest_id=3") {
		t.Errorf("no warning that the pinned maps keep their sizes, naming the highest ID")
	}
	if got := readMaps(t, root).maps.services.MaxEntries(); got != 10 {
		t.Errorf("%s: %d entries after the restart, want the pinned 10", bpf.L4xdsMapL4xdsServices, got)
	}
}
