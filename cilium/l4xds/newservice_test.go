// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	cmtypes "github.com/cilium/cilium/pkg/clustermesh/types"
	"github.com/cilium/cilium/pkg/datapath/tables"
	k8sTestutils "github.com/cilium/cilium/pkg/k8s/testutils"
	"github.com/cilium/cilium/pkg/k8s/version"
	clb "github.com/cilium/cilium/pkg/loadbalancer"
	lbmaps "github.com/cilium/cilium/pkg/loadbalancer/maps"
	"github.com/cilium/cilium/pkg/loadbalancer/writer"

	nodeTypes "github.com/cilium/cilium/pkg/node/types"
	"github.com/l4xds/l4xds/cilium/sink"
	"github.com/l4xds/l4xds/pkg/controlplane/cptest"
	"github.com/l4xds/l4xds/pkg/l4lb"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// newServiceWriter is the sink's one-step write of a held cluster's service
// (l4lb's newServiceWriter).
type newServiceWriter interface {
	UpsertNewService(svc *lb.Service, fes []lb.FrontendParams, bes []lb.BackendParams) error
}

// nsAgent is one agent of TestUpsertNewServiceCases: its tables, its sink
// and Cilium's writer.
type nsAgent struct {
	db *statedb.DB
	sk l4lb.Sink
	w  *writer.Writer
	na statedb.RWTable[tables.NodeAddress]
}

func startNSAgent(t *testing.T) nsAgent {
	t.Helper()
	var a nsAgent
	srv := cptest.Start(t)
	h, err := newAgent(srv, xds.ProtocolSotW, nil, lbmaps.NewFakeLBMaps(),
		cell.Invoke(func(d *statedb.DB, s l4lb.Sink, wr *writer.Writer, na statedb.RWTable[tables.NodeAddress]) {
			a.db, a.sk, a.w, a.na = d, s, wr, na
		}))
	if err != nil {
		t.Fatal(err)
	}
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	return a
}

// dump is everything of an agent the two ways could differ in: Cilium's
// three tables, every field but the reconciler's status. (What the sink
// keeps of a service shows in the changes that follow.)
func (a nsAgent) dump() string {
	var out []string
	rtxn := a.db.ReadTxn()
	beText := func(be *clb.Backend) string {
		zone := "-"
		if be.Zone != nil {
			zone = fmt.Sprintf("%+v", *be.Zone)
		}
		return fmt.Sprintf("%s %s ports=%v w=%d state=%d node=%q zone=%s src=%s cl=%d unhealthy=%v",
			be.ServiceName, be.Address.StringWithProtocol(), be.PortNames, be.Weight, be.State, be.NodeName, zone, be.Source, be.ClusterID, be.Unhealthy)
	}
	for svc := range a.w.Services().All(rtxn) {
		out = append(out, fmt.Sprintf("svc %s src=%s labels=%v ann=%v ext=%s int=%s aff=%v/%s ranges=%v portnames=%v",
			svc.Name, svc.Source, svc.Labels, svc.Annotations, svc.ExtTrafficPolicy, svc.IntTrafficPolicy,
			svc.SessionAffinity, svc.SessionAffinityTimeout, svc.SourceRanges, svc.PortNames))
	}
	for fe := range a.w.Frontends().All(rtxn) {
		var bes []string
		for be := range fe.Backends {
			bes = append(bes, beText(be))
		}
		var hc []string
		for be := range fe.HealthCheckBackends {
			hc = append(hc, beText(be))
		}
		out = append(out, fmt.Sprintf("fe %s %s svc=%s(%s) portname=%s svcport=%d redirect=%v backends=%v hc=%v",
			fe.Address.StringWithProtocol(), fe.Type, fe.ServiceName, fe.Service.Name, fe.PortName, fe.ServicePort, fe.RedirectTo, bes, hc))
	}
	for be := range a.w.Backends().All(rtxn) {
		out = append(out, "be "+beText(be))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func (a nsAgent) sink(fn func(l4lb.SinkTxn) error) error {
	txn := a.sk.WriteTxn()
	defer txn.Commit()
	return fn(txn)
}

func (a nsAgent) cilium(t *testing.T, fn func(writer.WriteTxn) error) {
	t.Helper()
	txn := a.w.WriteTxn()
	defer txn.Commit()
	if err := fn(txn); err != nil {
		t.Fatal(err)
	}
}

// twoSteps is what the controller gives a sink without UpsertNewService.
var twoSteps = l4lb.UpsertThenSetBackends

// TestUpsertNewServiceCases writes the same services on two agents, the
// two steps on one and UpsertNewService on the other, in the situations a
// held cluster meets, then changes them the same way on both: their tables,
// the sink's state and the errors stay the same.
func TestUpsertNewServiceCases(t *testing.T) {
	version.Force(k8sTestutils.DefaultVersion)
	nodeTypes.SetName("testnode")
	mountBPFFS(t)
	two, one := startNSAgent(t), startNSAgent(t)
	both := func(fn func(a nsAgent)) { fn(two); fn(one) }
	compare := func(t *testing.T, step string) {
		t.Helper()
		if d2, d1 := two.dump(), one.dump(); d2 != d1 {
			t.Errorf("%s: the two steps left\n%s\nthe one step\n%s", step, d2, d1)
		}
	}
	ip := netip.MustParseAddr
	fe := func(vip string, port uint16, proto lb.L4Type, target uint16) lb.FrontendParams {
		return lb.FrontendParams{Address: lb.NewL3n4Addr(ip(vip), port, proto), Type: lb.SVCTypeLoadBalancer, ServicePort: target}
	}
	be := func(addr string, port uint16, weight uint16, state lb.BackendState, prio uint32) lb.BackendParams {
		return lb.BackendParams{Address: lb.NewL3n4Addr(ip(addr), port, lb.TCP), Weight: weight, State: state, Priority: prio}
	}
	act := lb.BackendStateActive
	node := tables.NodeAddress{Addr: ip("192.168.0.5"), NodePort: true, Primary: true, DeviceName: "eth0"}
	both(func(a nsAgent) {
		txn := a.db.WriteTxn(a.na)
		a.na.Insert(txn, node)
		txn.Commit()
	})

	type tc struct {
		name  string
		svc   lb.Service
		fes   []lb.FrontendParams
		bes   []lb.BackendParams
		setup func(t *testing.T, a nsAgent)
	}
	k8sSvc := func(name clb.ServiceName, vips ...string) func(*testing.T, nsAgent) {
		return func(t *testing.T, a nsAgent) {
			a.cilium(t, func(txn writer.WriteTxn) error {
				var fes []clb.FrontendParams
				for _, v := range vips {
					fes = append(fes, clb.FrontendParams{
						Address:     clb.NewL3n4Addr(clb.TCP, cmtypes.MustParseAddrCluster(v), 80, clb.ScopeExternal),
						Type:        clb.SVCTypeClusterIP,
						ServiceName: name,
					})
				}
				return a.w.UpsertServiceAndFrontends(txn, &clb.Service{Name: name, Source: "k8s"}, fes...)
			})
		}
	}
	cases := []tc{
		{name: "basic",
			fes: []lb.FrontendParams{fe("10.9.0.1", 80, lb.TCP, 0), fe("10.9.0.1", 53, lb.UDP, 5353)},
			bes: []lb.BackendParams{be("10.1.0.1", 8080, 1, act, 0), be("10.1.0.2", 8080, 3, act, 0), be("10.1.0.3", 8080, 7, act, 0)}},
		{name: "v6",
			fes: []lb.FrontendParams{fe("2001:db8::1", 443, lb.TCP, 0)},
			bes: []lb.BackendParams{be("2001:db8:1::1", 8443, 1, act, 0), be("2001:db8:1::2", 8443, 2, act, 1)}},
		{name: "dual",
			fes: []lb.FrontendParams{fe("10.9.0.2", 80, lb.TCP, 0), fe("2001:db8::2", 80, lb.TCP, 0), fe("10.9.0.2", 81, lb.TCP, 9090)},
			bes: []lb.BackendParams{
				be("10.1.1.1", 8080, 1, act, 0), be("10.1.1.2", 8080, 0, act, 0), be("10.1.1.3", 8080, 5, act, 1),
				be("2001:db8:1::3", 8080, 0, act, 0), be("2001:db8:1::4", 8080, 2, act, 2), be("2001:db8:1::5", 8080, 2, lb.BackendStateTerminating, 1),
				be("::ffff:10.1.1.9", 8080, 4, act, 0)}},
		{name: "unusable",
			fes: []lb.FrontendParams{fe("10.9.0.3", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.2.1", 8080, 0, act, 0), be("10.1.2.2", 8080, 1, lb.BackendStateTerminating, 0),
				be("10.1.2.3", 8080, 1, lb.BackendStateQuarantined, 0), be("10.1.2.4", 8080, 1, lb.BackendStateMaintenance, 0)}},
		{name: "merge",
			fes: []lb.FrontendParams{fe("10.9.0.4", 80, lb.TCP, 0), fe("10.9.0.4", 81, lb.TCP, 8080), fe("10.9.0.4", 82, lb.TCP, 9000)},
			bes: []lb.BackendParams{be("10.1.3.1", 8080, 2, act, 0), be("10.1.3.2", 7000, 3, act, 0), be("10.1.3.2", 7001, 4, act, 0),
				be("10.1.3.3", 7000, 1, lb.BackendStateTerminating, 0), be("10.1.3.3", 7001, 6, act, 0)}},
		{name: "weight-error",
			fes: []lb.FrontendParams{fe("10.9.0.5", 80, lb.TCP, 0), fe("10.9.0.5", 81, lb.TCP, 8080)},
			bes: []lb.BackendParams{be("10.1.4.1", 8080, 1, act, 0), be("10.1.4.1", 9090, 1, act, 0)}},
		{name: "bad-state",
			fes: []lb.FrontendParams{fe("10.9.0.6", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.5.1", 8080, 1, act, 0), be("10.1.5.2", 8080, 1, lb.BackendState(200), 0)}},
		{name: "bad-proto",
			fes: []lb.FrontendParams{fe("10.9.0.7", 80, lb.L4Type("SCTP"), 0)},
			bes: []lb.BackendParams{be("10.1.6.1", 8080, 1, act, 0)}},
		{name: "no-backends",
			fes: []lb.FrontendParams{fe("10.9.0.8", 80, lb.TCP, 0)}},
		{name: "empty-backends",
			fes: []lb.FrontendParams{fe("10.9.0.9", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{}},
		{name: "k8s-owned",
			fes:   []lb.FrontendParams{fe("10.9.0.10", 80, lb.TCP, 0)},
			bes:   []lb.BackendParams{be("10.1.7.1", 8080, 1, act, 0)},
			setup: k8sSvc(sink.ServiceName("k8s-owned"), "10.9.1.10")},
		{name: "k8s-vip",
			fes:   []lb.FrontendParams{fe("10.9.0.11", 80, lb.TCP, 0)},
			bes:   []lb.BackendParams{be("10.1.8.1", 8080, 1, act, 0)},
			setup: k8sSvc(clb.NewServiceName("default", "web"), "10.9.0.11")},
		{name: "xds-vip",
			fes: []lb.FrontendParams{fe("10.9.0.12", 80, lb.TCP, 0), fe("10.9.0.20", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.9.1", 8080, 1, act, 0)},
			setup: func(t *testing.T, a nsAgent) {
				a.sink(func(txn l4lb.SinkTxn) error {
					return twoSteps(txn, &lb.Service{Name: "vip-holder", Source: lb.SourceXDS}, []lb.FrontendParams{fe("10.9.0.20", 80, lb.TCP, 0)}, []lb.BackendParams{be("10.1.9.2", 8080, 1, act, 0)})
				})
			}},
		{name: "nodeport",
			fes: []lb.FrontendParams{fe("192.168.0.5", 30080, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.10.1", 8080, 1, act, 0)}},
		{name: "k8s-backends",
			fes: []lb.FrontendParams{fe("10.9.0.13", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.11.1", 8080, 1, act, 0), be("10.1.11.2", 8080, 1, act, 0)},
			setup: func(t *testing.T, a nsAgent) {
				a.cilium(t, func(txn writer.WriteTxn) error {
					return a.w.SetBackends(txn, sink.ServiceName("k8s-backends"), "k8s",
						clb.Backend{Address: clb.NewL3n4Addr(clb.TCP, cmtypes.MustParseAddrCluster("10.1.11.1"), 8080, clb.ScopeExternal), Weight: 9, State: clb.BackendStateActive},
						clb.Backend{Address: clb.NewL3n4Addr(clb.TCP, cmtypes.MustParseAddrCluster("10.1.11.7"), 8080, clb.ScopeExternal), Weight: 9, State: clb.BackendStateActive})
				})
			}},
		{name: "platform/qualified", svc: lb.Service{Namespace: "platform", Cluster: "", SessionAffinity: true, SessionAffinityTimeout: 30 * time.Second,
			Labels: map[string]string{"version": "7"}, SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, PortNames: map[string]uint16{"http": 80}, RejectWeight: 3},
			fes: []lb.FrontendParams{fe("10.9.0.14", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.12.1", 8080, 1, act, 0)}},
		{name: "c1/platform/incluster", svc: lb.Service{Namespace: "platform", Cluster: "c1"},
			fes: []lb.FrontendParams{fe("10.9.0.15", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.13.1", 8080, 1, act, 0)}},
		// A name the sink has state for: backends set before the service
		// (a SetBackends of a name never upserted).
		{name: "state-left",
			fes: []lb.FrontendParams{fe("10.9.0.16", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.14.1", 8080, 1, act, 0)},
			setup: func(t *testing.T, a nsAgent) {
				a.sink(func(txn l4lb.SinkTxn) error {
					return txn.SetBackends("state-left", be("10.1.14.9", 8080, 1, act, 0))
				})
			}},
		// A service removed with its frontends but not its backends yet.
		{name: "deleted-kept",
			fes: []lb.FrontendParams{fe("10.9.0.17", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.15.1", 8080, 1, act, 0)},
			setup: func(t *testing.T, a nsAgent) {
				a.sink(func(txn l4lb.SinkTxn) error {
					svc := &lb.Service{Name: "deleted-kept", Source: lb.SourceXDS}
					if err := twoSteps(txn, svc, []lb.FrontendParams{fe("10.9.0.17", 80, lb.TCP, 0)}, []lb.BackendParams{be("10.1.15.2", 8080, 1, act, 0)}); err != nil {
						return err
					}
					return txn.DeleteServiceAndFrontends(svc.Name)
				})
			}},
		// Two of our names, one Cilium name (xds/alias).
		{name: "xds/alias", svc: lb.Service{Namespace: "xds"},
			fes: []lb.FrontendParams{fe("10.9.0.18", 80, lb.TCP, 0)},
			bes: []lb.BackendParams{be("10.1.16.1", 8080, 1, act, 0)},
			setup: func(t *testing.T, a nsAgent) {
				a.sink(func(txn l4lb.SinkTxn) error {
					return twoSteps(txn, &lb.Service{Name: "alias", Source: lb.SourceXDS}, []lb.FrontendParams{fe("10.9.0.19", 80, lb.TCP, 0)}, []lb.BackendParams{be("10.1.16.2", 8080, 1, act, 0)})
				})
			}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			if c.setup != nil {
				both(func(a nsAgent) { c.setup(t, a) })
				compare(t, "after the setup")
			}
			svc := c.svc
			svc.Name, svc.Source = lb.ServiceName(c.name), lb.SourceXDS
			for i := range c.fes {
				c.fes[i].ServiceName = svc.Name
			}
			err2 := two.sink(func(txn l4lb.SinkTxn) error { return twoSteps(txn, svc.Clone(), slices.Clone(c.fes), c.bes) })
			err1 := one.sink(func(txn l4lb.SinkTxn) error {
				return txn.(newServiceWriter).UpsertNewService(svc.Clone(), slices.Clone(c.fes), c.bes)
			})
			t.Logf("error: %v", err1)
			if fmt.Sprint(err2) != fmt.Sprint(err1) {
				t.Errorf("the two steps: %v\nthe one step: %v", err2, err1)
			}
			for _, is := range []error{lb.ErrFrontendConflict, lb.ErrServiceOwned} {
				if errors.Is(err2, is) != errors.Is(err1, is) {
					t.Errorf("errors.Is(%v): the two steps %v, the one step %v", is, errors.Is(err2, is), errors.Is(err1, is))
				}
			}
			compare(t, "written")
			if err2 != nil {
				return
			}
			// Then the same changes on both: a new target port, other
			// backends, a reject share, and the removal.
			fes2 := slices.Clone(c.fes)
			fes2[0].ServicePort = 6000
			steps := []struct {
				what string
				fn   func(l4lb.SinkTxn) error
			}{
				{"a target port", func(txn l4lb.SinkTxn) error { return txn.UpsertServiceAndFrontends(svc.Clone(), slices.Clone(fes2)...) }},
				{"other backends", func(txn l4lb.SinkTxn) error {
					return txn.SetBackends(svc.Name, append(slices.Clone(c.bes), be("10.1.200.1", 8080, 2, act, 0))...)
				}},
				{"back to the frontends", func(txn l4lb.SinkTxn) error {
					return txn.UpsertServiceAndFrontends(svc.Clone(), slices.Clone(c.fes)...)
				}},
				{"a reject share", func(txn l4lb.SinkTxn) error {
					s := svc.Clone()
					s.RejectWeight = 5
					return txn.UpsertServiceAndFrontends(s, slices.Clone(c.fes)...)
				}},
				{"removed", func(txn l4lb.SinkTxn) error {
					if err := txn.DeleteServiceAndFrontends(svc.Name); err != nil {
						return err
					}
					return txn.SetBackends(svc.Name)
				}},
			}
			for _, s := range steps {
				e2, e1 := two.sink(s.fn), one.sink(s.fn)
				if fmt.Sprint(e2) != fmt.Sprint(e1) {
					t.Errorf("%s: the two steps' service: %v\nthe one step's: %v", s.what, e2, e1)
				}
				compare(t, s.what)
			}
		})
	}
}
