// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"testing"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
)

// ownerChecking is the tables' sink refusing backends for a service of
// another source, as the Cilium sink does (ErrServiceOwned), with one
// backend set at a time.
type ownerChecking struct{ Sink }

type ownerCheckingTxn struct{ tablesTxn }

func (s ownerChecking) WriteTxn() SinkTxn { return ownerCheckingTxn{s.Sink.WriteTxn().(tablesTxn)} }

func (s ownerChecking) RegisterInitializer(name string) func(SinkTxn) {
	done := s.Sink.RegisterInitializer(name)
	return func(txn SinkTxn) { done(txn.(ownerCheckingTxn).tablesTxn) }
}

func (t ownerCheckingTxn) SetBackends(name loadbalancer.ServiceName, bes ...loadbalancer.BackendParams) error {
	if svc, _, found := t.w.Services().Get(t.txn, loadbalancer.ServiceByName.Query(name)); found && len(bes) > 0 && svc.Source != loadbalancer.SourceXDS {
		return loadbalancer.ErrServiceOwned
	}
	return t.tablesTxn.SetBackends(name, bes...)
}

// SetBackendsOf hides the tables' one: the controller sets backends one
// service at a time.
func (t ownerCheckingTxn) SetBackendsOf() {}

// takeOver makes another source's service of name replace ours, as a
// Kubernetes Service does inside Cilium: our frontends go, our backends
// stay.
func (f *fixture) takeOver(name loadbalancer.ServiceName) {
	f.t.Helper()
	txn := f.w.WriteTxn()
	if _, err := f.w.DeleteServiceAndFrontends(txn, name); err != nil {
		f.t.Fatal(err)
	}
	if err := f.w.UpsertServiceAndFrontends(txn, &loadbalancer.Service{Name: name, Source: "k8s"}); err != nil {
		f.t.Fatal(err)
	}
	txn.Commit()
}

func (f *fixture) giveBack(name loadbalancer.ServiceName) {
	f.t.Helper()
	txn := f.w.WriteTxn()
	if _, err := f.w.DeleteServiceAndFrontends(txn, name); err != nil {
		f.t.Fatal(err)
	}
	txn.Commit()
}

// A service of ours that another source took over refuses its backends,
// and ours leave it (they would serve its frontends); another cluster of the
// same ClusterLoadAssignment still gets them.
func TestControllerOwnedServiceDoesNotHoldBackOthersOfItsCLA(t *testing.T) {
	f := newFixtureWith(t, func(s Sink) Sink { return ownerChecking{s} })
	noRejections(t, f.cds(nil,
		edsCluster("a", `{vip: 10.1.2.3, port: 5432, service: a, namespace: platform}`, "shared"),
		edsCluster("b", `{vip: 10.1.2.4, port: 5432}`, "shared"),
	))
	noRejections(t, f.eds(nil, claOf("shared", ep("10.0.0.1", 5432, ""))))
	f.takeOver("platform/a")

	rejectedWith(t, f.eds(nil, claOf("shared", ep("10.0.0.2", 5432, ""))), map[string]string{
		"shared": `cluster_load_assignment "shared": cluster "a": service owned by another source`,
	})
	f.expect(`
		service b source=xds
		service platform/a source=k8s
		frontend 10.1.2.4:5432/TCP b -> [10.0.0.2:5432]
		backend b 10.0.0.2:5432 weight=1 active
	`)
}

// Once the other source lets the name go, the cluster's next change writes
// it with the endpoints of the ClusterLoadAssignment its service refused
// meanwhile, not those it had before.
func TestControllerOwnedServiceComesBackWithItsLatestEndpoints(t *testing.T) {
	f := newFixtureWith(t, func(s Sink) Sink { return ownerChecking{s} })
	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.3, port: 5432, service: a, namespace: platform}`, "")))
	noRejections(t, f.eds(nil, claOf("a", ep("10.0.0.1", 5432, ""))))
	f.takeOver("platform/a")
	rejectedWith(t, f.eds(nil, claOf("a", ep("10.0.0.2", 5432, ""))), map[string]string{
		"a": `cluster_load_assignment "a": cluster "a": service owned by another source`,
	})
	f.giveBack("platform/a")

	noRejections(t, f.cds(nil, edsCluster("a", `{vip: 10.1.2.5, port: 5432, service: a, namespace: platform}`, "")))
	f.expect(`
		service platform/a source=xds
		frontend 10.1.2.5:5432/TCP platform/a -> [10.0.0.2:5432]
		backend platform/a 10.0.0.2:5432 weight=1 active
	`)
}

// A rename to a name another source has is refused before anything is
// written: the cluster's rows under its old name stay as they were, not
// deleted and written again (the datapath would program them again with
// every CDS update, each offering the rejected cluster again).
func TestControllerRenameToOwnedNameRewritesNothing(t *testing.T) {
	f := newFixture(t)
	noRejections(t, f.cds(nil, staticOwnedCluster("a", "a")))
	txn := f.w.WriteTxn()
	if err := f.w.UpsertServiceAndFrontends(txn, &loadbalancer.Service{Name: "platform/b", Source: "k8s"}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	rev := func() uint64 {
		_, r, _ := f.w.Frontends().Get(f.w.ReadTxn(), loadbalancer.FrontendByAddress.Query(feAddr(t, "10.1.2.3:5432/TCP")))
		return r
	}
	was := rev()
	rejectedWith(t, f.cds(nil, staticOwnedCluster("a", "b")), map[string]string{
		"a": `cluster "a": service "platform/b" is source "k8s"'s: service owned by another source`,
	})
	if now := rev(); now != was {
		t.Errorf("frontend rewritten by a refused rename: revision %d, was %d", now, was)
	}
	f.expect(`
		service platform/a source=xds
		service platform/b source=k8s
		frontend 10.1.2.3:5432/TCP platform/a -> [10.0.0.1:5432]
		backend platform/a 10.0.0.1:5432 weight=1 active
	`)
}

func staticOwnedCluster(name, service string) string {
	return "name: " + name + "\ntype: STATIC\nmetadata: {filter_metadata: {io.cilium.l4lb: {vip: 10.1.2.3, port: 5432, service: " + service + ", namespace: platform}}}\n" +
		"load_assignment: {cluster_name: " + name + ", endpoints: [{lb_endpoints: [" + ep("10.0.0.1", 5432, "") + "]}]}\n"
}

func feAddr(t *testing.T, s string) loadbalancer.L3n4Addr {
	t.Helper()
	a, err := loadbalancer.ParseL3n4Addr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
