// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// agent is the datapath cell in a hive with the tables, as the agent runs
// it, with an initializer the test completes.
type agent struct {
	h    *hive.Hive
	w    *lb.Writer
	db   *statedb.DB
	r    reconciler.Reconciler[*lb.Frontend]
	done func(lb.WriteTxn)
	logs *logBuffer
}

func startAgent(t *testing.T, cfg Config) *agent {
	t.Helper()
	return startAgentWith(t, cfg, Hooks{})
}

// startAgentWith starts the datapath in a hive of its own; cells join its
// module (a metrics registry, say).
func startAgentWith(t *testing.T, cfg Config, hooks Hooks, cells ...cell.Cell) *agent {
	t.Helper()
	a := &agent{}
	log, logs := testLogger(t)
	a.logs = logs
	a.h = hive.New(
		job.Cell,
		statedb.Cell,
		health.Cell,
		lb.Cell,
		cell.Module("datapath", "Datapath under test", append([]cell.Cell{
			cell.Provide(func() Config { return cfg }, func() Hooks { return hooks }),
			cell.Invoke(func(p params, w *lb.Writer) (err error) {
				a.w, a.db = w, p.DB
				a.done = w.RegisterInitializer("test")
				a.r, err = register(p)
				return err
			}),
		}, cells...)...),
	)
	if err := a.h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *agent) stop(t *testing.T) {
	if a.h != nil {
		log, _ := testLogger(t)
		if err := a.h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
		a.h = nil
	}
}

func (a *agent) write(t *testing.T, f func(lb.WriteTxn) error) {
	t.Helper()
	txn := a.w.WriteTxn()
	if err := f(txn); err != nil {
		txn.Abort()
		t.Fatal(err)
	}
	txn.Commit()
}

func (a *agent) initialize(t *testing.T) {
	a.write(t, func(txn lb.WriteTxn) error { a.done(txn); return nil })
}

// reconciled waits until the reconciler has processed every change so far.
func (a *agent) reconciled(t *testing.T) {
	t.Helper()
	rev := a.w.Frontends().Revision(a.db.ReadTxn())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := a.r.WaitUntilReconciled(ctx, rev); err != nil {
		t.Fatalf("waiting for the reconciler: %v", err)
	}
	for fe := range a.w.Frontends().All(a.db.ReadTxn()) {
		if fe.Status.Kind != reconciler.StatusKindDone {
			t.Fatalf("frontend %s: status %s %s", fe.Address, fe.Status.Kind, fe.Status.GetError())
		}
	}
}

func (a *agent) upsert(t *testing.T, svc *lb.Service, frontends ...string) {
	t.Helper()
	fes := make([]lb.FrontendParams, len(frontends))
	for i, s := range frontends {
		fes[i] = lb.FrontendParams{Address: fe(s)}
	}
	a.write(t, func(txn lb.WriteTxn) error { return a.w.UpsertServiceAndFrontends(txn, svc, fes...) })
}

func (a *agent) setBackends(t *testing.T, name string, backends ...string) {
	t.Helper()
	params := make([]lb.BackendParams, len(backends))
	for i, s := range backends {
		params[i] = be(s).BackendParams
	}
	a.write(t, func(txn lb.WriteTxn) error {
		return a.w.SetBackends(txn, lb.ServiceName(name), lb.SourceXDS, params...)
	})
}

// contents is what the maps hold, printed for comparison.
type contents struct {
	services map[lb.L3n4Addr]ServiceEntry
	backends map[uint32]BackendEntry
	ranges   []SourceRangeEntry
	vips     map[netip.Addr]uint32
	maps     *Maps
}

func readMaps(t *testing.T, root string) contents {
	t.Helper()
	m, err := OpenPinnedMaps(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	c := contents{services: map[lb.L3n4Addr]ServiceEntry{}, backends: map[uint32]BackendEntry{}, maps: m}
	for e, err := range m.Services() {
		if err != nil {
			t.Fatal(err)
		}
		c.services[e.Frontend] = e
	}
	for e, err := range m.Backends() {
		if err != nil {
			t.Fatal(err)
		}
		c.backends[e.ID] = e
	}
	for e, err := range m.SourceRanges() {
		if err != nil {
			t.Fatal(err)
		}
		c.ranges = append(c.ranges, e)
	}
	if c.vips, err = m.VIPs(); err != nil {
		t.Fatal(err)
	}
	return c
}

// backendsOf prints a service's backends as "addr/state" sorted.
func (c contents) backendsOf(svcID uint32) string {
	var out []string
	for _, b := range c.backends {
		if b.ServiceID == svcID {
			out = append(out, fmt.Sprintf("%s/%s", b.Address, b.State))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func (c contents) backendID(svcID uint32, addr string) uint32 {
	for _, b := range c.backends {
		if b.ServiceID == svcID && b.Address.String() == addr {
			return b.ID
		}
	}
	return 0
}

func (c contents) rangesOf(svcID uint32) string {
	var out []string
	for _, r := range c.ranges {
		if r.ServiceID == svcID {
			out = append(out, r.Prefix.String())
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// shares returns each backend's percentage of the service's Maglev table.
// shares are the backends' shares of a service's new flows, in percent: of
// its Maglev table, or all of them for the one backend that a service
// entry names instead of a table.
func (c contents) shares(t *testing.T, svcID uint32) map[string]float64 {
	t.Helper()
	table, ok, err := c.maps.MaglevTable(svcID)
	for _, svc := range c.services {
		if svc.ID != svcID || svc.Backend == 0 {
			continue
		}
		b, known := c.backends[svc.Backend]
		switch {
		case svc.Count != 1 || !known || b.ServiceID != svcID:
			t.Fatalf("service %d: count %d, its one backend %d is %+v (found %v)", svcID, svc.Count, svc.Backend, b, known)
		case ok || err != nil:
			t.Fatalf("service %d: one backend named, and a Maglev table (%v)", svcID, err)
		}
		return map[string]float64{b.Address.String(): 100}
	}
	if err != nil || !ok {
		t.Fatalf("Maglev table of service %d: found %v, %v", svcID, ok, err)
	}
	out := map[string]float64{}
	for _, id := range table {
		if id == 0 {
			out["reject"] += 100 / float64(len(table))
			continue
		}
		b, ok := c.backends[id]
		if !ok || b.ServiceID != svcID {
			t.Fatalf("service %d: the Maglev table names backend %d, not one of its backends", svcID, id)
		}
		out[b.Address.String()] += 100 / float64(len(table))
	}
	return out
}

var dbService = &lb.Service{
	Name:                   "db",
	Source:                 lb.SourceXDS,
	SourceRanges:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
	SessionAffinity:        true,
	SessionAffinityTimeout: 3 * time.Hour,
}

func TestPrivilegedReconcilerProgramsTheMapsAndSurvivesARestart(t *testing.T) {
	needRoot(t)
	root, dev := bpffs(t), testDevice(t)
	cfg := testConfig(root, dev)
	v4, v6 := fe("10.1.2.3:3306/TCP"), fe("[2001:db8::1]:3306/TCP")

	a := startAgent(t, cfg)
	// A service that goes away, so that db's IDs are not the first ones (a
	// restart that forgot them would allocate others).
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, "10.5.5.5:80/TCP")
	a.setBackends(t, "web", "192.168.5.5:80")
	a.upsert(t, dbService, v4.String(), v6.String())
	a.setBackends(t, "db", "192.168.1.10:3306,w=70", "192.168.1.11:3306,w=30", "[2001:db8::10]:3306")

	// Before the first full state, nothing is written.
	eventually(t, "the reconciler waiting for the first full state", func() bool {
		return strings.Contains(a.logs.String(), "waits for the first full state")
	})
	if c := readMaps(t, root); len(c.services) != 0 || len(c.backends) != 0 {
		t.Fatalf("maps written before the frontends table is initialized: %+v %+v", c.services, c.backends)
	}

	a.initialize(t)
	a.reconciled(t)
	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "web"); return err })
	a.setBackends(t, "web")
	a.reconciled(t)
	c := readMaps(t, root)
	s4, s6 := c.services[v4], c.services[v6]
	if len(c.services) != 2 || s4.ID <= 1 || s6.ID <= 1 || s4.ID == s6.ID {
		t.Fatalf("services %+v", c.services)
	}
	want := ServiceEntry{Frontend: v4, ID: s4.ID, SourceRanges: true, Affinity: true, AffinityTimeout: 3 * time.Hour, Count: 2}
	if s4 != want {
		t.Errorf("service %s: %+v, want %+v", v4, s4, want)
	}
	if s6.Count != 1 {
		t.Errorf("service %s: %d backends, want 1 (the IPv6 one)", v6, s6.Count)
	}
	if got, want := c.backendsOf(s4.ID), "192.168.1.10:3306/active 192.168.1.11:3306/active"; got != want {
		t.Errorf("backends of %s: %s, want %s", v4, got, want)
	}
	if got, want := c.backendsOf(s6.ID), "[2001:db8::10]:3306/active"; got != want {
		t.Errorf("backends of %s: %s, want %s", v6, got, want)
	}
	shares := c.shares(t, s4.ID)
	if s := shares["192.168.1.10:3306"]; s < 69 || s > 71 {
		t.Errorf("Maglev shares of %s: %v, want 70/30 ± 1", v4, shares)
	}
	for _, id := range []uint32{s4.ID, s6.ID} {
		if got := c.rangesOf(id); got != "10.0.0.0/8 2001:db8::/32" {
			t.Errorf("source ranges of service %d: %s", id, got)
		}
	}
	if fmt.Sprint(c.vips) != "map[10.1.2.3:1 2001:db8::1:1]" {
		t.Errorf("VIPs %v", c.vips)
	}

	// A draining backend leaves the table and keeps its entry and ID.
	drainingID := c.backendID(s4.ID, "192.168.1.11:3306")
	a.setBackends(t, "db", "192.168.1.10:3306,w=70", "192.168.1.11:3306/terminating,w=30", "[2001:db8::10]:3306")
	a.reconciled(t)
	c = readMaps(t, root)
	if c.services[v4].Count != 1 || c.backendsOf(s4.ID) != "192.168.1.10:3306/active 192.168.1.11:3306/terminating" ||
		c.backendID(s4.ID, "192.168.1.11:3306") != drainingID {
		t.Errorf("after draining: service %+v backends %s", c.services[v4], c.backendsOf(s4.ID))
	}
	if shares := c.shares(t, s4.ID); shares["192.168.1.10:3306"] < 99.9 {
		t.Errorf("after draining: Maglev shares %v, want all on 192.168.1.10:3306", shares)
	}

	// Prune removes what no frontend accounts for.
	orphan, _ := svcKeyToBPF(fe("10.9.9.9:80/TCP"))
	writeEntry(t, root, bpf.L4xdsMapL4xdsServices, &orphan, &bpf.L4xdsLbSvc{Id: 999, Count: 1})
	writeEntry(t, root, bpf.L4xdsMapL4xdsBackends, uint32(4242), backendToBPF(999, netip.MustParseAddrPort("192.168.9.9:80"), 0))
	a.r.Prune()
	eventually(t, "the orphan entries pruned", func() bool {
		c := readMaps(t, root)
		_, svc := c.services[fe("10.9.9.9:80/TCP")]
		_, be := c.backends[4242]
		return !svc && !be
	})
	if c := readMaps(t, root); len(c.services) != 2 || len(c.backends) != 3 {
		t.Errorf("Prune removed live entries: %+v %+v", c.services, c.backends)
	}

	// The agent stops: the program stays attached, the maps as they are.
	before := readMaps(t, root)
	a.stop(t)
	if a := attachedAt(t, dev); len(a.tcx)+len(a.tc) != 1 {
		t.Fatalf("after the agent stopped: %s, want one program", a)
	}

	// A new agent whose control plane has sent only the cluster yet: the
	// restored entries keep forwarding.
	a = startAgent(t, cfg)
	a.upsert(t, dbService, v4.String(), v6.String())
	eventually(t, "the restarted reconciler waiting for the first full state", func() bool {
		return strings.Contains(a.logs.String(), "waits for the first full state")
	})
	if c := readMaps(t, root); !sameEntries(c, before) {
		t.Fatalf("maps changed before the first full state:\n%+v\nwant\n%+v", c.services, before.services)
	}

	// The full state: the same IDs as before the restart.
	a.setBackends(t, "db", "192.168.1.10:3306,w=70", "192.168.1.11:3306/terminating,w=30", "[2001:db8::10]:3306")
	a.initialize(t)
	a.reconciled(t)
	if c := readMaps(t, root); !sameEntries(c, before) {
		t.Errorf("after restart:\n%+v %+v\nwant\n%+v %+v", c.services, c.backends, before.services, before.backends)
	}

	// Deleting the service empties the maps.
	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "db"); return err })
	a.reconciled(t)
	c = readMaps(t, root)
	if len(c.services) != 0 || len(c.backends) != 0 || len(c.ranges) != 0 || len(c.vips) != 0 {
		t.Errorf("after delete: services %+v backends %+v ranges %+v vips %v", c.services, c.backends, c.ranges, c.vips)
	}
	for _, id := range []uint32{s4.ID, s6.ID} {
		if _, ok, err := c.maps.MaglevTable(id); ok || err != nil {
			t.Errorf("after delete: service %d still has a Maglev table (%v)", id, err)
		}
	}
}

// sameEntries compares the services and backends of two readings.
func sameEntries(a, b contents) bool {
	return fmt.Sprint(a.services) == fmt.Sprint(b.services) && fmt.Sprint(a.backends) == fmt.Sprint(b.backends) &&
		fmt.Sprint(a.vips) == fmt.Sprint(b.vips)
}

// writeEntry writes to a pinned map behind the agent's back.
func writeEntry(t *testing.T, root, name string, key, value any) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Put(key, value); err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
}

// restoredOps are the reconciler's operations on dp's maps, restored as at
// the agent's start, over a database of their own.
func restoredOps(t *testing.T, dp *Datapath) (*ops, *statedb.DB) {
	t.Helper()
	db := statedb.New()
	w, err := lb.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger(t)
	o := newOps(log, db, w.Frontends(), DefaultConfig.capacity())
	if err := o.restore(dp.Maps); err != nil {
		t.Fatal(err)
	}
	return o, db
}

func TestPrivilegedUpdateErrorsNameTheFrontendAndTheMap(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	o, db := restoredOps(t, dp)
	f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:3306/TCP")}, Backends: []*lb.Backend{be("192.168.1.10:3306")}}
	dp.Maps.backends.Close() // every write to l4xds_backends fails
	err := o.Update(context.Background(), db.ReadTxn(), 1, f)
	want := "frontend 10.1.2.3:3306/TCP: write l4xds_backends: backend 192.168.1.10:3306 (id 1): "
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want it to start with %q", err, want)
	}
}

func TestPrivilegedANewServiceIDStartsWithZeroCounters(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	// Counters left by a service that had ID 1 before.
	stale := make([]bpf.L4xdsLbStats, dp.Maps.possibleCPU)
	stale[0].Packets, stale[0].Drops[0] = 10, 3
	if err := dp.Maps.stats.Put(uint32(1), stale); err != nil {
		t.Fatal(err)
	}
	o, db := restoredOps(t, dp)
	f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:3306/TCP")}, Backends: []*lb.Backend{be("192.168.1.10:3306")}}
	if err := o.Update(context.Background(), db.ReadTxn(), 1, f); err != nil {
		t.Fatal(err)
	}
	if id := o.reg.services[f.Address].id; id != 1 {
		t.Fatalf("service ID %d, want 1", id)
	}
	if s, err := dp.Maps.ServiceStats(1); err != nil || s != (Stats{}) {
		t.Errorf("counters of the new service 1: %+v, %v; want zero", s, err)
	}
}

// A round's new services get their Maglev tables together; a table that
// exists is rewritten in place (same inner map), not swapped.
func TestPrivilegedTablesAreInsertedTogetherAndRewrittenInPlace(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	a := startAgent(t, testConfig(root))
	const n = 40
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		a.upsert(t, &lb.Service{Name: lb.ServiceName(name), Source: lb.SourceXDS}, fmt.Sprintf("10.0.0.%d:80/TCP", i+1))
		a.setBackends(t, name, fmt.Sprintf("192.168.%d.1:80", i), fmt.Sprintf("192.168.%d.2:80", i))
	}
	a.initialize(t)
	a.reconciled(t)
	c := readMaps(t, root)
	if len(c.services) != n || len(c.backends) != 2*n {
		t.Fatalf("%d services and %d backends, want %d and %d", len(c.services), len(c.backends), n, 2*n)
	}
	for _, s := range c.services {
		if shares := c.shares(t, s.ID); len(shares) != 2 {
			t.Errorf("service %s: Maglev shares %v, want two backends", s.Frontend, shares)
		}
	}

	first := c.services[fe("10.0.0.1:80/TCP")]
	innerID := func() uint32 {
		var id uint32
		if err := c.maps.maglev.Lookup(first.ID, &id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	before := innerID()
	a.setBackends(t, "svc-0", "192.168.0.1:80,w=70", "192.168.0.2:80,w=30", "192.168.0.3:80/terminating")
	a.reconciled(t)
	if after := innerID(); after != before {
		t.Errorf("the table of %s was swapped (inner map %d, then %d), want it rewritten in place", first.Frontend, before, after)
	}
	c = readMaps(t, root)
	if s := c.shares(t, first.ID)["192.168.0.1:80"]; s < 69 || s > 71 {
		t.Errorf("after the weight change: share %.1f%%, want 70 ± 1", s)
	}
	if got := c.backendsOf(first.ID); got != "192.168.0.1:80/active 192.168.0.2:80/active 192.168.0.3:80/terminating" {
		t.Errorf("backends %s", got)
	}

	// Emptying a service and deleting another remove their tables.
	a.setBackends(t, "svc-0")
	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "svc-1"); return err })
	a.reconciled(t)
	c = readMaps(t, root)
	tables, _, err := collect[uint32, uint32](c.maps.maglev)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != n-2 || slices.Contains(tables, first.ID) {
		t.Errorf("%d tables (service %d's among them: %v), want %d", len(tables), first.ID, slices.Contains(tables, first.ID), n-2)
	}
	if got := c.backendsOf(first.ID); got != "" || c.services[first.Frontend].Count != 0 {
		t.Errorf("emptied service: backends %q, count %d", got, c.services[first.Frontend].Count)
	}
}

// A reject share is slots of backend 0 in the service's table, weighed
// against the backends; one backend with a reject share needs a table.
func TestPrivilegedRejectShareIsSlotsOfBackendZero(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	a := startAgent(t, testConfig(root))
	svc := func(reject uint16) *lb.Service {
		return &lb.Service{Name: "route", Source: lb.SourceXDS, RejectWeight: reject}
	}
	a.upsert(t, svc(30), "10.0.0.1:80/UDP")
	a.setBackends(t, "route", "192.168.0.1:80,w=70")
	a.initialize(t)
	a.reconciled(t)
	near := func(got, want float64) bool { return got > want-1 && got < want+1 }
	check := func(when string, want map[string]float64) {
		t.Helper()
		c := readMaps(t, root)
		s := c.services[fe("10.0.0.1:80/UDP")]
		got := c.shares(t, s.ID)
		if len(got) != len(want) {
			t.Fatalf("%s: shares %v, want %v", when, got, want)
		}
		for k, w := range want {
			if !near(got[k], w) {
				t.Errorf("%s: share of %s %.1f%%, want %.0f ± 1 (all: %v)", when, k, got[k], w, got)
			}
		}
	}
	check("one backend of weight 70, reject 30", map[string]float64{"192.168.0.1:80": 70, "reject": 30})

	a.setBackends(t, "route", "192.168.0.1:80,w=40", "192.168.0.2:80,w=30")
	a.reconciled(t)
	check("two backends, reject 30", map[string]float64{"192.168.0.1:80": 40, "192.168.0.2:80": 30, "reject": 30})

	a.upsert(t, svc(0), "10.0.0.1:80/UDP")
	a.reconciled(t)
	check("reject 0", map[string]float64{"192.168.0.1:80": 57.1, "192.168.0.2:80": 42.9})

	a.upsert(t, svc(30), "10.0.0.1:80/UDP")
	a.setBackends(t, "route", "192.168.0.1:80,w=70")
	a.reconciled(t)
	a.upsert(t, svc(0), "10.0.0.1:80/UDP")
	a.reconciled(t)
	// The one backend again, with no table.
	check("one backend, reject 0", map[string]float64{"192.168.0.1:80": 100})
}
