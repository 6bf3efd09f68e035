// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
)

// holdingFixture is a fixture whose controller holds new EDS clusters for
// their endpoints; the wait passes only when the test says (due).
func holdingFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.ctrl.SetNewClusterWait(time.Hour, nil)
	t.Cleanup(f.ctrl.Stop)
	return f
}

// due makes every held cluster's wait pass.
func (f *fixture) due() {
	f.ctrl.mu.Lock()
	for name := range f.ctrl.held {
		f.ctrl.held[name] = time.Time{}
	}
	f.ctrl.mu.Unlock()
	f.ctrl.writeDue()
}

func TestControllerHoldsNewClusters(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 3306}`, "")))
	f.expectNames("a")
	f.expect(``)

	// Its VIP is reserved: another cluster's claim is the conflict it
	// would be once written.
	rejectedWith(t, f.cds(nil, edsCluster("b", `{vip: 10.1.2.3, port: 3306}`, "")), map[string]string{
		"b": `cluster "b": frontend 10.1.2.3:3306/TCP is owned by service "a": frontend already owned by another service`,
	})

	// Its endpoints come: service, frontend and backends in one transaction.
	noRejections(t, f.eds(nil, claOf("a", ep("10.0.0.1", 3306, ""))))
	if !f.initialized() {
		t.Fatal("not initialized once the held cluster's CLA came")
	}
	f.expect(`
		service a source=xds
		frontend 10.1.2.3:3306/TCP a -> [10.0.0.1:3306]
		backend a 10.0.0.1:3306 weight=1 active
	`)

	// Written, it is updated at once as before: a new VIP is not held.
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.4, port: 3306}`, "")))
	f.expect(`
		service a source=xds
		frontend 10.1.2.4:3306/TCP a -> [10.0.0.1:3306]
		backend a 10.0.0.1:3306 weight=1 active
	`)
}

func TestControllerHeldClusterWithoutEndpoints(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil,
		edsCluster("gone", `{vip: 10.1.2.1, port: 80}`, ""),
		edsCluster("bad", `{vip: 10.1.2.2, port: 80}`, ""),
		edsCluster("late", `{vip: 10.1.2.3, port: 80}`, ""),
	))
	f.expect(``)

	// Found not to exist, or rejected: written without backends.
	noRejections(t, f.eds([]string{"gone"}))
	if len(f.eds(nil, claOf("bad", ep("10.0.0.1", 0, "")))) != 1 {
		t.Fatal("the bad CLA was not rejected")
	}
	f.expect(`
		service bad source=xds
		service gone source=xds
		frontend 10.1.2.1:80/TCP gone -> []
		frontend 10.1.2.2:80/TCP bad -> []
	`)

	// No answer: written without backends once the wait has passed; the
	// endpoints follow when they come.
	f.due()
	f.expect(`
		service bad source=xds
		service gone source=xds
		service late source=xds
		frontend 10.1.2.1:80/TCP gone -> []
		frontend 10.1.2.2:80/TCP bad -> []
		frontend 10.1.2.3:80/TCP late -> []
	`)
	noRejections(t, f.eds(nil, claOf("late", ep("10.0.0.3", 80, ""))))
	f.expect(`
		service bad source=xds
		service gone source=xds
		service late source=xds
		frontend 10.1.2.1:80/TCP gone -> []
		frontend 10.1.2.2:80/TCP bad -> []
		frontend 10.1.2.3:80/TCP late -> [10.0.0.3:80]
		backend late 10.0.0.3:80 weight=1 active
	`)
}

func TestControllerHeldClusterChanges(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 80}`, "")))

	// Updated while held: still held, under its new VIP, which frees the
	// old one.
	noRejections(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.4, port: 80}`, ""),
		edsCluster("b", `{vip: 10.1.2.3, port: 80}`, ""),
	))
	f.expect(``)

	// Removed while held: nothing was written, nothing is deleted, and its
	// VIP is free.
	noRejections(t, f.cds([]string{"a"}, edsCluster("c", `{vip: 10.1.2.4, port: 80}`, "")))
	f.expectNames("b", "c")

	// Not held: a STATIC cluster, and one whose EDS name another cluster
	// already asked for.
	noRejections(t, f.cds(nil,
		`
name: s
type: STATIC
metadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.5, port: 80}}}
load_assignment: {cluster_name: s, endpoints: [{lb_endpoints: [`+ep("10.0.0.5", 80, "")+`]}]}
`,
		edsCluster("d", `{vip: 10.1.2.6, port: 80}`, "b"),
	))
	f.expect(`
		service d source=xds
		service s source=xds
		frontend 10.1.2.5:80/TCP s -> [10.0.0.5:80]
		frontend 10.1.2.6:80/TCP d -> []
		backend s 10.0.0.5:80 weight=1 active
	`)
	noRejections(t, f.eds(nil, claOf("b", ep("10.0.0.2", 80, "")), claOf("c", ep("10.0.0.3", 80, ""))))
	f.expect(`
		service b source=xds
		service c source=xds
		service d source=xds
		service s source=xds
		frontend 10.1.2.3:80/TCP b -> [10.0.0.2:80]
		frontend 10.1.2.4:80/TCP c -> [10.0.0.3:80]
		frontend 10.1.2.5:80/TCP s -> [10.0.0.5:80]
		frontend 10.1.2.6:80/TCP d -> [10.0.0.2:80]
		backend b 10.0.0.2:80 weight=1 active
		backend c 10.0.0.3:80 weight=1 active
		backend d 10.0.0.2:80 weight=1 active
		backend s 10.0.0.5:80 weight=1 active
	`)
}

// Another source takes a held cluster's VIP: the CLA that would write it
// is refused, naming both, and the cluster waits for its next one.
func TestControllerHeldClusterLosesVIP(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 80}`, "")))
	other := &loadbalancer.Service{Name: "other", Source: "k8s"}
	txn := f.w.WriteTxn()
	if err := f.w.UpsertServiceAndFrontends(txn, other, loadbalancer.FrontendParams{Address: f.ctrl.clusters["a"].fes[0].Address}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()

	rejectedWith(t, f.eds(nil, claOf("a", ep("10.0.0.1", 80, ""))), map[string]string{
		"a": `cluster_load_assignment "a": cluster "a": frontend 10.1.2.3:80/TCP is owned by service "other": frontend already owned by another service`,
	})
	f.due() // stays held, without a deadline
	f.expect(`
		service other source=k8s
		frontend 10.1.2.3:80/TCP other -> []
	`)

	txn = f.w.WriteTxn()
	if _, err := f.w.DeleteServiceAndFrontends(txn, "other"); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	noRejections(t, f.eds(nil, claOf("a", ep("10.0.0.2", 80, ""))))
	f.expect(`
		service a source=xds
		frontend 10.1.2.3:80/TCP a -> [10.0.0.2:80]
		backend a 10.0.0.2:80 weight=1 active
	`)
}

// A held cluster whose wait passed while another source owned its VIP is
// written once that VIP is free, with the next update of either type, as a
// rejected cluster is offered again: not only with its own next update,
// which may never come.
func TestControllerHeldClusterBlockedRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(f *fixture) map[string]error
	}{
		{"cds", func(f *fixture) map[string]error {
			return f.cds(nil, edsCluster("z", `{vip: 10.9.9.9, port: 80}`, ""))
		}},
		{"eds", func(f *fixture) map[string]error {
			return f.eds(nil, claOf("y", ep("10.0.0.9", 80, "")))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := holdingFixture(t)
			h := &fakeHealth{}
			f.ctrl.SetHealth(h)
			noRejections(t, f.cds(nil,
				edsCluster("a", `{vip: 10.1.2.3, port: 80}`, ""),
				edsCluster("y", `{vip: 10.1.2.9, port: 80}`, ""),
			))
			other := &loadbalancer.Service{Name: "other", Source: "k8s"}
			txn := f.w.WriteTxn()
			if err := f.w.UpsertServiceAndFrontends(txn, other, loadbalancer.FrontendParams{Address: f.ctrl.clusters["a"].fes[0].Address}); err != nil {
				t.Fatal(err)
			}
			txn.Commit()
			// Its CLA is found not to exist while the VIP is taken (the
			// client drops a rejection of a removed name), then the wait
			// passes: a is written with neither.
			f.eds([]string{"a"})
			f.due()
			f.expect(`
				service other source=k8s
				service y source=xds
				frontend 10.1.2.3:80/TCP other -> []
				frontend 10.1.2.9:80/TCP y -> []
			`)
			// Its xDS rows say acked and does-not-exist: health says why
			// it is not written.
			if want := `degraded: 1 xDS cluster held for its endpoints cannot be written: cluster "a": frontend 10.1.2.3:80/TCP is owned by service "other": frontend already owned by another service`; h.last != want {
				t.Fatalf("health\n got: %s\nwant: %s", h.last, want)
			}

			txn = f.w.WriteTxn()
			if _, err := f.w.DeleteServiceAndFrontends(txn, "other"); err != nil {
				t.Fatal(err)
			}
			txn.Commit()
			noRejections(t, tc.next(f))
			if got := f.dump(); !strings.Contains(got, "frontend 10.1.2.3:80/TCP a -> []") {
				t.Fatalf("a not written once its VIP was free:\n%s", got)
			}
			if want := "ok: no held xDS cluster blocked"; h.last != want {
				t.Fatalf("health\n got: %s\nwant: %s", h.last, want)
			}
		})
	}
}

// A cluster removed while held writes nothing, then or later: not when its
// CLA comes, nor when the wait passes; it leaves nothing reserved.
func TestControllerHeldClusterRemoved(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 80}`, "")))
	noRejections(t, f.cds([]string{"a"}))
	f.expectNames()
	noRejections(t, f.eds(nil, claOf("a", ep("10.0.0.1", 80, ""))))
	f.due()
	f.expect(``)
	f.ctrl.mu.Lock()
	defer f.ctrl.mu.Unlock()
	if len(f.ctrl.held) != 0 || len(f.ctrl.reserved) != 0 || len(f.ctrl.clusters) != 0 || len(f.ctrl.owners) != 0 {
		t.Fatalf("left behind: held %v reserved %v clusters %v owners %v", f.ctrl.held, f.ctrl.reserved, f.ctrl.clusters, f.ctrl.owners)
	}
}

// fakeHealth keeps the last status reported.
type fakeHealth struct{ last string }

func (h *fakeHealth) OK(status string)      { h.last = "ok: " + status }
func (h *fakeHealth) Stopped(reason string) { h.last = "stopped: " + reason }
func (h *fakeHealth) Degraded(reason string, err error) {
	h.last = "degraded: " + reason + ": " + err.Error()
}
func (h *fakeHealth) NewScope(string) cell.Health { return h }
func (h *fakeHealth) Close()                      {}

// A held cluster updated again and again keeps its first deadline, under
// its last VIP and service name, and frees the ones it left.
func TestControllerHeldClusterDeadlineKept(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 80}`, "")))
	f.ctrl.mu.Lock()
	first := f.ctrl.held["a"]
	f.ctrl.mu.Unlock()
	for i, meta := range []string{
		`{vip: 10.1.2.4, port: 80}`,
		`{vip: 10.1.2.5, port: 80, service: a2}`,
		`{vip: 10.1.2.6, port: 80, service: a3}`,
	} {
		noRejections(t, f.cds(nil, edsCluster("a", meta, "")))
		f.ctrl.mu.Lock()
		until, reserved := f.ctrl.held["a"], len(f.ctrl.reserved)
		f.ctrl.mu.Unlock()
		if !until.Equal(first) || reserved != 1 {
			t.Fatalf("update %d: deadline %v (first %v), %d VIPs reserved", i, until, first, reserved)
		}
	}
	// The VIPs and names it left are free.
	noRejections(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.6, port: 80, service: a3}`, ""),
		edsCluster("b", `{vip: 10.1.2.3, port: 80, service: a2}`, ""),
	))
	f.due()
	f.expect(`
		service a2 source=xds
		service a3 source=xds
		frontend 10.1.2.3:80/TCP a2 -> []
		frontend 10.1.2.6:80/TCP a3 -> []
	`)
}

// A blocked cluster the server removes leaves nothing: not its reservation,
// nor the degraded health.
func TestControllerBlockedClusterRemoved(t *testing.T) {
	f := holdingFixture(t)
	h := &fakeHealth{}
	f.ctrl.SetHealth(h)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 80}`, "")))
	txn := f.w.WriteTxn()
	if err := f.w.UpsertServiceAndFrontends(txn, &loadbalancer.Service{Name: "other", Source: "k8s"}, loadbalancer.FrontendParams{Address: f.ctrl.clusters["a"].fes[0].Address}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	f.due()
	if !strings.HasPrefix(h.last, "degraded: ") {
		t.Fatalf("health: %s", h.last)
	}
	noRejections(t, f.cds([]string{"a"}))
	if h.last != "ok: no held xDS cluster blocked" {
		t.Fatalf("health: %s", h.last)
	}
	f.ctrl.mu.Lock()
	defer f.ctrl.mu.Unlock()
	if len(f.ctrl.held) != 0 || len(f.ctrl.reserved) != 0 || len(f.ctrl.blocked) != 0 || len(f.ctrl.clusters) != 0 {
		t.Fatalf("left behind: held %v reserved %v blocked %v clusters %v", f.ctrl.held, f.ctrl.reserved, f.ctrl.blocked, f.ctrl.clusters)
	}
}

// One EDS update feeds a held cluster and a written one of the same CLA,
// and lists that CLA twice: the held one is written whole, the written one
// gets the backends, both those of the CLA's last listing.
func TestControllerHeldAndWrittenClustersOfOneCLAInOneUpdate(t *testing.T) {
	f := holdingFixture(t)
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 3306}`, "e")))
	// b asks for a name another asked for: not held.
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 3306}`, "e"), edsCluster("b", `{vip: 10.1.2.4, port: 3306}`, "e")))
	f.expect(`
		service b source=xds
		frontend 10.1.2.4:3306/TCP b -> []
	`)
	noRejections(t, f.eds(nil, claOf("e", ep("10.0.0.1", 3306, "")), claOf("e", ep("10.0.0.2", 3306, ""))))
	f.expect(`
		service a source=xds
		service b source=xds
		frontend 10.1.2.3:3306/TCP a -> [10.0.0.2:3306]
		frontend 10.1.2.4:3306/TCP b -> [10.0.0.2:3306]
		backend a 10.0.0.2:3306 weight=1 active
		backend b 10.0.0.2:3306 weight=1 active
	`)
}

// A service name another source has (inside Cilium, a Kubernetes Service's)
// is never taken over: the cluster naming it is refused, naming the owner,
// and the other source's service stays. A held cluster whose name another
// source takes while it waits is written once the name is free, as one
// whose VIP was taken.
func TestControllerServiceNameOfAnotherSource(t *testing.T) {
	t.Run("backends of many", func(t *testing.T) { testServiceNameOfAnotherSource(t, holdingFixture(t)) })
	t.Run("as the Cilium sink", func(t *testing.T) {
		f := newFixtureWith(t, func(s Sink) Sink { return ownerChecking{s} })
		f.ctrl.SetNewClusterWait(time.Hour, nil)
		t.Cleanup(f.ctrl.Stop)
		testServiceNameOfAnotherSource(t, f)
	})
}

func testServiceNameOfAnotherSource(t *testing.T, f *fixture) {
	other := &loadbalancer.Service{Name: "platform/db", Source: "k8s"}
	txn := f.w.WriteTxn()
	if err := f.w.UpsertServiceAndFrontends(txn, other, loadbalancer.FrontendParams{Address: feAddr(t, "10.96.0.10:5432/TCP")}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	const owned = `service "platform/db" is source "k8s"'s: service owned by another source`
	rejectedWith(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 5432, service: db, namespace: platform}`, "")), map[string]string{
		"db": `cluster "db": ` + owned,
	})

	// Held, then taken: the CLA that would write it is refused, naming the
	// owner; once the name is free the next update of either type writes
	// it with that CLA's endpoints, which were not at fault.
	f.giveBack("platform/db")
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 5432, service: db, namespace: platform}`, "")))
	txn = f.w.WriteTxn()
	if err := f.w.UpsertServiceAndFrontends(txn, other); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	rejectedWith(t, f.eds(nil, claOf("db", ep("10.0.0.1", 5432, ""))), map[string]string{
		"db": `cluster_load_assignment "db": cluster "db": ` + owned,
	})
	f.due()
	f.expect(`
		service platform/db source=k8s
	`)
	f.giveBack("platform/db")
	noRejections(t, f.cds(nil, edsCluster("db", `{vip: 10.1.2.3, port: 5432, service: db, namespace: platform}`, "")))
	f.expect(`
		service platform/db source=xds
		frontend 10.1.2.3:5432/TCP platform/db -> [10.0.0.1:5432]
		backend platform/db 10.0.0.1:5432 weight=1 active
	`)
}
