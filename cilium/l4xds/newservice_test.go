// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"

	clb "github.com/cilium/cilium/pkg/loadbalancer"
	lbmaps "github.com/cilium/cilium/pkg/loadbalancer/maps"
	"github.com/cilium/cilium/pkg/loadbalancer/writer"

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

// TestUpsertNewServiceAsTwoSteps: the sink's one-step write of a new
// service with its backends (backends first, so that Cilium's writer
// writes each frontend once) leaves Cilium's tables as the two steps do,
// and when it is refused it leaves nothing.
func TestUpsertNewServiceAsTwoSteps(t *testing.T) {
	var (
		db *statedb.DB
		sk l4lb.Sink
		w  *writer.Writer
	)
	mountBPFFS(t)
	srv := cptest.Start(t)
	h, err := newAgent(srv, xds.ProtocolSotW, nil, lbmaps.NewFakeLBMaps(),
		cell.Invoke(func(d *statedb.DB, s l4lb.Sink, wr *writer.Writer) { db, sk, w = d, s, wr }))
	if err != nil {
		t.Fatal(err)
	}
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	// A service of two frontends, one with a target port, and backends
	// of several weights, one of them of both families' ports.
	service := func(name string, vip netip.Addr) (*lb.Service, []lb.FrontendParams, []lb.BackendParams) {
		svc := &lb.Service{Name: lb.ServiceName(name), Source: lb.SourceXDS}
		fes := []lb.FrontendParams{
			{Address: lb.NewL3n4Addr(vip, 80, lb.TCP), Type: lb.SVCTypeLoadBalancer, ServiceName: svc.Name},
			{Address: lb.NewL3n4Addr(vip, 53, lb.UDP), Type: lb.SVCTypeLoadBalancer, ServiceName: svc.Name, ServicePort: 5353},
		}
		var bes []lb.BackendParams
		for i, weight := range []uint16{1, 3, 7} {
			bes = append(bes, lb.BackendParams{
				Address: lb.NewL3n4Addr(netip.AddrFrom4([4]byte{10, 1, vip.As4()[3], byte(i + 1)}), 8080, lb.TCP),
				Weight:  weight,
				State:   lb.BackendStateActive,
			})
		}
		return svc, fes, bes
	}
	one := func(fn func(l4lb.SinkTxn) error) error {
		txn := sk.WriteTxn()
		defer txn.Commit()
		return fn(txn)
	}

	// The two steps, as the controller writes a cluster it does not hold.
	svc, fes, bes := service("two-steps", netip.MustParseAddr("192.0.2.1"))
	if err := one(func(txn l4lb.SinkTxn) error {
		if err := txn.UpsertServiceAndFrontends(svc, fes...); err != nil {
			return err
		}
		return txn.SetBackends(svc.Name, bes...)
	}); err != nil {
		t.Fatal(err)
	}
	svc, fes, bes = service("one-step", netip.MustParseAddr("192.0.2.2"))
	if err := one(func(txn l4lb.SinkTxn) error {
		return txn.(newServiceWriter).UpsertNewService(svc, fes, bes)
	}); err != nil {
		t.Fatal(err)
	}
	want, got := rows(t, db, w, "two-steps", "192.0.2.1", "10.1.1."), rows(t, db, w, "one-step", "192.0.2.2", "10.1.2.")
	if !slices.Equal(got, want) {
		t.Errorf("the one step wrote\n%s\nthe two steps\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(want) != 1+2+6 {
		t.Errorf("the two steps wrote %d rows, want a service, 2 frontends and 6 backends:\n%s", len(want), strings.Join(want, "\n"))
	}

	// What the sink keeps of each is the same too: a new target port
	// rewrites the backends it keeps.
	for _, sv := range []struct{ name, vip string }{{"two-steps", "192.0.2.1"}, {"one-step", "192.0.2.2"}} {
		svc, fes, _ := service(sv.name, netip.MustParseAddr(sv.vip))
		fes[1].ServicePort = 5300
		if err := one(func(txn l4lb.SinkTxn) error { return txn.UpsertServiceAndFrontends(svc, fes...) }); err != nil {
			t.Fatal(err)
		}
	}
	want, got = rows(t, db, w, "two-steps", "192.0.2.1", "10.1.1."), rows(t, db, w, "one-step", "192.0.2.2", "10.1.2.")
	if !slices.Equal(got, want) || !strings.Contains(strings.Join(want, " "), "5300") {
		t.Errorf("after a new target port, the one step's service has\n%s\nthe two steps'\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Refused: a frontend of another service's, then a name of another
	// source's. Nothing of the service is written.
	for _, tc := range []struct {
		name  string
		setup func(writer.WriteTxn) error
		is    error
	}{
		{"taken-vip", func(writer.WriteTxn) error { return nil }, lb.ErrFrontendConflict},
		{"k8s-owned", func(txn writer.WriteTxn) error {
			name := sink.ServiceName(lb.ServiceName("k8s-owned"))
			return w.UpsertServiceAndFrontends(txn, &clb.Service{Name: name, Source: "k8s"})
		}, lb.ErrServiceOwned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			txn := w.WriteTxn()
			if err := tc.setup(txn); err != nil {
				t.Fatal(err)
			}
			txn.Commit()
			vip := netip.MustParseAddr("192.0.2.3")
			if tc.name == "taken-vip" {
				vip = netip.MustParseAddr("192.0.2.1") // two-steps'
			}
			svc, fes, bes := service(tc.name, vip)
			err := one(func(txn l4lb.SinkTxn) error { return txn.(newServiceWriter).UpsertNewService(svc, fes, bes) })
			if !errors.Is(err, tc.is) {
				t.Fatalf("UpsertNewService: %v, want %v", err, tc.is)
			}
			rtxn := db.ReadTxn()
			for be := range w.Backends().All(rtxn) {
				if be.Source == sink.Source && strings.Contains(be.ServiceName.String(), tc.name) {
					t.Errorf("refused, but wrote the backend %s of %s", be.Address, be.ServiceName)
				}
			}
			for fe := range w.Frontends().All(rtxn) {
				if strings.Contains(fe.ServiceName.String(), tc.name) {
					t.Errorf("refused, but wrote the frontend %s", fe.Address)
				}
			}
		})
	}
}

// rows are a service's rows in Cilium's tables as text, its name, VIP and
// backends' prefix replaced by placeholders so that two services compare.
func rows(t *testing.T, db *statedb.DB, w *writer.Writer, name, vip, bePrefix string) []string {
	t.Helper()
	rtxn := db.ReadTxn()
	cname := sink.ServiceName(lb.ServiceName(name))
	neutral := func(s string) string {
		s = strings.ReplaceAll(s, cname.String(), "SVC")
		s = strings.ReplaceAll(s, vip, "VIP")
		return strings.ReplaceAll(s, bePrefix, "BE.")
	}
	var out []string
	svc, _, found := w.Services().Get(rtxn, clb.ServiceByName(cname))
	if !found {
		t.Fatalf("no service %s", cname)
	}
	out = append(out, neutral(strings.Join(svc.TableRow(), " | ")))
	for fe := range w.Frontends().List(rtxn, clb.FrontendByServiceName(cname)) {
		row := fe.TableRow()
		// The status and its time are the reconciler's.
		out = append(out, neutral(fe.Address.String()+" "+row[1]+" "+showFrontendBackends(fe)))
	}
	bes, _ := clb.ListBackendsByServiceName(rtxn, w.Backends(), cname)
	for be := range bes {
		out = append(out, neutral(strings.Join(be.TableRow(), " | ")))
	}
	slices.Sort(out[1:])
	return out
}

func showFrontendBackends(fe *clb.Frontend) string {
	var s []string
	for be := range fe.Backends {
		s = append(s, be.Address.String())
	}
	slices.Sort(s)
	return string(fe.PortName) + " [" + strings.Join(s, " ") + "]"
}
