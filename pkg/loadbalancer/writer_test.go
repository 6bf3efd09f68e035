// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

func newTestWriter(t testing.TB) *Writer {
	t.Helper()
	w, err := NewWriter(statedb.New())
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w
}

func addr(s string) L3n4Addr {
	a, err := ParseL3n4Addr(s)
	if err != nil {
		panic(err)
	}
	return a
}

func svc(name string) *Service { return &Service{Name: ServiceName(name), Source: SourceXDS} }

func fe(s string) FrontendParams { return FrontendParams{Address: addr(s)} }

func be(s string) BackendParams { return BackendParams{Address: addr(s), Weight: 1} }

// frontendRows prints the frontends as "address service [backends]".
func frontendRows(w *Writer, txn statedb.ReadTxn) []string {
	var rows []string
	for fe := range w.Frontends().All(txn) {
		rows = append(rows, fmt.Sprintf("%s %s [%s]", fe.Address, fe.ServiceName, formatBackends(fe.Backends)))
	}
	return rows
}

func backendRows(w *Writer, txn statedb.ReadTxn) []string {
	var rows []string
	for be := range w.Backends().All(txn) {
		rows = append(rows, fmt.Sprintf("%s %s %s", be.ServiceName, be.Address, be.Source))
	}
	return rows
}

func serviceRows(w *Writer, txn statedb.ReadTxn) []string {
	var rows []string
	for svc := range w.Services().All(txn) {
		rows = append(rows, string(svc.Name))
	}
	return rows
}

func TestWriter(t *testing.T) {
	type op func(w *Writer, txn WriteTxn) error
	upsert := func(name string, fes ...FrontendParams) op {
		return func(w *Writer, txn WriteTxn) error { return w.UpsertServiceAndFrontends(txn, svc(name), fes...) }
	}
	setBackends := func(name string, source Source, bes ...BackendParams) op {
		return func(w *Writer, txn WriteTxn) error { return w.SetBackends(txn, ServiceName(name), source, bes...) }
	}
	deleteService := func(name string) op {
		return func(w *Writer, txn WriteTxn) error {
			_, err := w.DeleteServiceAndFrontends(txn, ServiceName(name))
			return err
		}
	}
	withPort := func(p FrontendParams, port uint16) FrontendParams { p.ServicePort = port; return p }
	withState := func(p BackendParams, s BackendState) BackendParams { p.State = s; return p }

	tests := []struct {
		name string
		// setup runs and commits first; it must succeed.
		setup []op
		// last runs in its own transaction, which commits only without error.
		last          op
		wantErr       string
		wantServices  []string
		wantFrontends []string
		wantBackends  []string
	}{
		{
			name:          "new service and frontends",
			last:          upsert("a", fe("10.0.0.1:80/TCP"), fe("10.0.0.1:80/UDP"), fe("[2001:db8::1]:80/TCP")),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a []", "10.0.0.1:80/UDP a []", "[2001:db8::1]:80/TCP a []"},
		},
		{
			name:          "frontends replaced by the new set",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP"), fe("10.0.0.2:80/TCP"))},
			last:          upsert("a", fe("10.0.0.2:80/TCP"), fe("10.0.0.3:80/TCP")),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.2:80/TCP a []", "10.0.0.3:80/TCP a []"},
		},
		{
			name:          "no frontends deletes the service's frontends only",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP")), upsert("b", fe("10.0.0.2:80/TCP"))},
			last:          upsert("a"),
			wantServices:  []string{"a", "b"},
			wantFrontends: []string{"10.0.0.2:80/TCP b []"},
		},
		{
			name:          "conflict keeps the first owner and writes nothing",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP"))},
			last:          upsert("b", fe("10.0.0.9:80/TCP"), fe("10.0.0.1:80/TCP")),
			wantErr:       `frontend 10.0.0.1:80/TCP is owned by service "a": frontend already owned by another service`,
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a []"},
		},
		{
			name: "conflict leaves the existing service's frontends alone",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP")),
				upsert("b", fe("10.0.0.2:80/TCP")),
			},
			last:          upsert("b", fe("10.0.0.1:80/TCP")),
			wantErr:       `frontend 10.0.0.1:80/TCP is owned by service "a"`,
			wantServices:  []string{"a", "b"},
			wantFrontends: []string{"10.0.0.1:80/TCP a []", "10.0.0.2:80/TCP b []"},
		},
		{
			name:    "same address twice",
			last:    upsert("a", fe("10.0.0.1:80/TCP"), fe("10.0.0.1:80/TCP")),
			wantErr: `service "a": frontend 10.0.0.1:80/TCP: listed twice`,
		},
		{
			name:    "frontend port zero",
			last:    upsert("a", fe("10.0.0.1:0/TCP")),
			wantErr: `service "a": frontend 10.0.0.1:0/TCP: port is zero`,
		},
		{
			name:    "frontend without protocol",
			last:    upsert("a", fe("10.0.0.1:80")),
			wantErr: `service "a": frontend 10.0.0.1:80: protocol "" is not TCP or UDP`,
		},
		{
			name:    "frontend without address",
			last:    upsert("a", FrontendParams{Address: L3n4Addr{Port: 80, Protocol: TCP}}),
			wantErr: `address is not a valid IP`,
		},
		{
			// Keys leave the zone out, so fe80::1%a and fe80::1%b would be
			// one row.
			name:    "frontend with a zone",
			last:    upsert("a", fe("[fe80::1%eth0]:80/TCP")),
			wantErr: `service "a": frontend [fe80::1%eth0]:80/TCP: address has a zone, which is not supported`,
		},
		{
			name:    "frontend of another service",
			last:    upsert("a", FrontendParams{Address: addr("10.0.0.1:80/TCP"), ServiceName: "b"}),
			wantErr: `service "a": frontend 10.0.0.1:80/TCP: service name is "b"`,
		},
		{
			name: "service without source",
			last: func(w *Writer, txn WriteTxn) error {
				return w.UpsertServiceAndFrontends(txn, &Service{Name: "a"}, fe("10.0.0.1:80/TCP"))
			},
			wantErr: `service "a": source is empty`,
		},
		{
			name:    "service without name",
			last:    upsert("", fe("10.0.0.1:80/TCP")),
			wantErr: `service name is empty`,
		},
		{
			name:          "backends before the service",
			setup:         []op{setBackends("a", SourceXDS, be("10.1.0.2:3306"), be("10.1.0.1:3306"))},
			last:          upsert("a", fe("10.0.0.1:3306/TCP")),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:3306/TCP a [10.1.0.1:3306, 10.1.0.2:3306]"},
			wantBackends:  []string{"a 10.1.0.1:3306 xds", "a 10.1.0.2:3306 xds"},
		},
		{
			name:          "backends replaced",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP")), setBackends("a", SourceXDS, be("10.1.0.1:80"), be("10.1.0.2:80"))},
			last:          setBackends("a", SourceXDS, be("10.1.0.2:80"), withState(be("10.1.0.3:80"), BackendStateTerminating)),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a [10.1.0.2:80, 10.1.0.3:80/terminating]"},
			wantBackends:  []string{"a 10.1.0.2:80 xds", "a 10.1.0.3:80 xds"},
		},
		{
			name:          "no backends deletes them",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP")), setBackends("a", SourceXDS, be("10.1.0.1:80"))},
			last:          setBackends("a", SourceXDS),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a []"},
		},
		{
			name: "service port replaces the backend port on that frontend only",
			setup: []op{
				upsert("a", withPort(fe("10.0.0.1:53/UDP"), 5353), fe("10.0.0.1:53/TCP")),
			},
			last:         setBackends("a", SourceXDS, be("10.1.0.1:53"), be("[2001:db8::2]:53"), be("10.1.0.1:54")),
			wantServices: []string{"a"},
			wantFrontends: []string{
				"10.0.0.1:53/TCP a [10.1.0.1:53, 10.1.0.1:54, [2001:db8::2]:53]",
				// 10.1.0.1:53 and :54 are one backend once the port is 5353.
				"10.0.0.1:53/UDP a [10.1.0.1:5353, [2001:db8::2]:5353]",
			},
			wantBackends: []string{"a 10.1.0.1:53 xds", "a 10.1.0.1:54 xds", "a [2001:db8::2]:53 xds"},
		},
		{
			name: "backends of all sources, one per address",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP")),
				setBackends("a", "k8s", be("10.1.0.1:80"), be("10.1.0.2:80")),
			},
			last:          setBackends("a", SourceXDS, be("10.1.0.2:80"), be("10.1.0.3:80")),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a [10.1.0.1:80, 10.1.0.2:80, 10.1.0.3:80]"},
			wantBackends:  []string{"a 10.1.0.1:80 k8s", "a 10.1.0.2:80 k8s", "a 10.1.0.2:80 xds", "a 10.1.0.3:80 xds"},
		},
		{
			name: "backends of one source replaced, the other source's stay",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP")),
				setBackends("a", "k8s", be("10.1.0.1:80")),
				setBackends("a", SourceXDS, be("10.1.0.2:80")),
			},
			last:          setBackends("a", SourceXDS),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a [10.1.0.1:80]"},
			wantBackends:  []string{"a 10.1.0.1:80 k8s"},
		},
		{
			name:          "backend protocol is dropped",
			setup:         []op{upsert("a", fe("10.0.0.1:80/TCP"))},
			last:          setBackends("a", SourceXDS, be("10.1.0.1:80/UDP")),
			wantServices:  []string{"a"},
			wantFrontends: []string{"10.0.0.1:80/TCP a [10.1.0.1:80]"},
			wantBackends:  []string{"a 10.1.0.1:80 xds"},
		},
		{
			name:    "backend port zero",
			last:    setBackends("a", SourceXDS, be("10.1.0.1:0")),
			wantErr: `service "a": backend 10.1.0.1:0: port is zero`,
		},
		{
			name:    "backend with a zone",
			last:    setBackends("a", SourceXDS, be("[fe80::1%eth0]:80"), be("[fe80::1%eth1]:80")),
			wantErr: `service "a": backend [fe80::1%eth0]:80: address has a zone, which is not supported`,
		},
		{
			name:    "backend twice",
			last:    setBackends("a", SourceXDS, be("10.1.0.1:80/TCP"), be("10.1.0.1:80/UDP")),
			wantErr: `service "a": backend 10.1.0.1:80: listed twice`,
		},
		{
			name:    "backend state out of range",
			last:    setBackends("a", SourceXDS, withState(be("10.1.0.1:80"), 9)),
			wantErr: `service "a": backend 10.1.0.1:80: state unknown(9) is not valid`,
		},
		{
			name:    "backends without source",
			last:    setBackends("a", ""),
			wantErr: `service "a": backends: source is empty`,
		},
		{
			name:         "backend weight zero is allowed",
			last:         setBackends("a", SourceXDS, BackendParams{Address: addr("10.1.0.1:80")}),
			wantBackends: []string{"a 10.1.0.1:80 xds"},
		},
		{
			name: "delete service leaves its backends and other services",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP"), fe("10.0.0.1:443/TCP")),
				upsert("b", fe("10.0.0.2:80/TCP")),
				setBackends("a", SourceXDS, be("10.1.0.1:80")),
			},
			last:          deleteService("a"),
			wantServices:  []string{"b"},
			wantFrontends: []string{"10.0.0.2:80/TCP b []"},
			wantBackends:  []string{"a 10.1.0.1:80 xds"},
		},
		{
			name:    "delete unknown service",
			last:    deleteService("nope"),
			wantErr: `service "nope": service not found`,
		},
		{
			name: "delete services by source",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP")),
				upsert("b", fe("10.0.0.2:80/TCP")),
				func(w *Writer, txn WriteTxn) error {
					return w.UpsertServiceAndFrontends(txn, &Service{Name: "c", Source: "k8s"}, fe("10.0.0.3:80/TCP"))
				},
			},
			last:          func(w *Writer, txn WriteTxn) error { return w.DeleteServicesBySource(txn, SourceXDS) },
			wantServices:  []string{"c"},
			wantFrontends: []string{"10.0.0.3:80/TCP c []"},
		},
		{
			name: "delete backends by source recomputes frontends",
			setup: []op{
				upsert("a", fe("10.0.0.1:80/TCP")),
				upsert("b", fe("10.0.0.2:80/TCP")),
				setBackends("a", SourceXDS, be("10.1.0.1:80")),
				setBackends("a", "k8s", be("10.1.0.2:80")),
				setBackends("b", SourceXDS, be("10.1.0.3:80")),
			},
			last:          func(w *Writer, txn WriteTxn) error { return w.DeleteBackendsBySource(txn, SourceXDS) },
			wantServices:  []string{"a", "b"},
			wantFrontends: []string{"10.0.0.1:80/TCP a [10.1.0.2:80]", "10.0.0.2:80/TCP b []"},
			wantBackends:  []string{"a 10.1.0.2:80 k8s"},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWriter(t)
			for i, op := range tt.setup {
				txn := w.WriteTxn()
				if err := op(w, txn); err != nil {
					t.Fatalf("setup[%d]: %v", i, err)
				}
				txn.Commit()
			}
			txn := w.WriteTxn()
			err := tt.last(w, txn)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("no error, want %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("error %q, want %q", err, tt.wantErr)
			}
			// A failed operation must leave nothing behind even if the
			// transaction is committed.
			rtxn := txn.Commit()
			check := func(what string, got, want []string) {
				t.Helper()
				if !slices.Equal(got, want) {
					t.Errorf("%s:\n got %q\nwant %q", what, got, want)
				}
			}
			check("services", serviceRows(w, rtxn), tt.wantServices)
			check("frontends", frontendRows(w, rtxn), tt.wantFrontends)
			check("backends", backendRows(w, rtxn), tt.wantBackends)
		})
	}
}

func TestWriter_ConflictError(t *testing.T) {
	w := newTestWriter(t)
	txn := w.WriteTxn()
	if err := w.UpsertServiceAndFrontends(txn, svc("a"), fe("10.1.2.3:3306/TCP")); err != nil {
		t.Fatal(err)
	}
	err := w.UpsertServiceAndFrontends(txn, svc("b"), fe("10.1.2.3:3306/TCP"))
	if !errors.Is(err, ErrFrontendConflict) {
		t.Fatalf("error %v does not wrap ErrFrontendConflict", err)
	}
	want := `frontend 10.1.2.3:3306/TCP is owned by service "a": frontend already owned by another service`
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if _, err := w.DeleteServiceAndFrontends(txn, "nope"); !errors.Is(err, ErrServiceNotFound) {
		t.Fatalf("error %v does not wrap ErrServiceNotFound", err)
	}
	txn.Abort()
}

// A service name another source has is refused, by both the upsert and the
// check, and its service and frontends stay as they were.
func TestWriter_ServiceOwnedByAnotherSource(t *testing.T) {
	w := newTestWriter(t)
	txn := w.WriteTxn()
	k8s := &Service{Name: "platform/db", Source: "k8s"}
	if err := w.UpsertServiceAndFrontends(txn, k8s, fe("10.96.0.10:5432/TCP")); err != nil {
		t.Fatal(err)
	}
	ours := &Service{Name: "platform/db", Source: SourceXDS}
	const want = `service "platform/db" is source "k8s"'s: service owned by another source`
	for what, err := range map[string]error{
		"upsert": w.UpsertServiceAndFrontends(txn, ours, fe("10.1.2.3:5432/TCP")),
		"check":  w.CheckFrontends(txn, ours, fe("10.1.2.3:5432/TCP")),
	} {
		if !errors.Is(err, ErrServiceOwned) || err.Error() != want {
			t.Errorf("%s: error %v, want %q wrapping ErrServiceOwned", what, err, want)
		}
	}
	rtxn := txn.Commit()
	if got, _, _ := w.services.Get(rtxn, ServiceByName.Query("platform/db")); got != k8s {
		t.Errorf("service %+v, want %+v", got, k8s)
	}
	if got, want := frontendRows(w, rtxn), []string{"10.96.0.10:5432/TCP platform/db []"}; !slices.Equal(got, want) {
		t.Errorf("frontends %q, want %q", got, want)
	}
}

// TestWriter_NoRewrite checks that the writer leaves unchanged rows alone, so
// the datapath reconciler gets no needless work, and that a change makes the
// frontend pending again.
func TestWriter_NoRewrite(t *testing.T) {
	w := newTestWriter(t)
	feAddr := addr("10.0.0.1:80/TCP")
	params := []FrontendParams{{Address: feAddr, PortName: "http"}, {Address: addr("10.0.0.1:443/TCP"), ServicePort: 8443}}
	service := func() *Service {
		return &Service{
			Name: "a", Source: SourceXDS,
			Labels:       map[string]string{"version": "1"},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		}
	}
	bes := []BackendParams{be("10.1.0.1:80"), be("10.1.0.2:80")}

	apply := func(f func(txn WriteTxn) error) statedb.ReadTxn {
		t.Helper()
		txn := w.WriteTxn()
		if err := f(txn); err != nil {
			t.Fatal(err)
		}
		return txn.Commit()
	}
	upsert := func(txn WriteTxn) error { return w.UpsertServiceAndFrontends(txn, service(), params...) }
	setBackends := func(txn WriteTxn) error { return w.SetBackends(txn, "a", SourceXDS, bes...) }

	apply(upsert)
	rtxn := apply(setBackends)

	// The datapath reconciled the frontend.
	rtxn = apply(func(txn WriteTxn) error {
		fe, _, _ := w.frontends.Get(txn, FrontendByAddress.Query(feAddr))
		fe = fe.Clone().SetStatus(reconciler.StatusDone())
		_, _, err := w.frontends.Insert(txn, fe)
		return err
	})
	revs := func(txn statedb.ReadTxn) [3]statedb.Revision {
		return [3]statedb.Revision{w.services.Revision(txn), w.frontends.Revision(txn), w.backends.Revision(txn)}
	}
	before := revs(rtxn)

	rtxn = apply(upsert)
	rtxn = apply(setBackends)
	if after := revs(rtxn); after != before {
		t.Fatalf("unchanged upsert and SetBackends wrote rows: revisions %v, then %v", before, after)
	}

	bes[1].Weight = 5
	rtxn = apply(setBackends)
	fe, _, _ := w.Frontends().Get(rtxn, FrontendByAddress.Query(feAddr))
	if fe.Status.Kind != reconciler.StatusKindPending {
		t.Errorf("status after a backend change is %s, want Pending", fe.Status.Kind)
	}
	if got := fe.Backends[1].Weight; got != 5 {
		t.Errorf("backend weight on the frontend is %d, want 5", got)
	}
	if got := revs(rtxn); got[0] != before[0] {
		t.Errorf("a backend change rewrote the service")
	}
	// The frontend with a service port got copies: the backend rows keep
	// their own port.
	for be := range w.Backends().All(rtxn) {
		if be.Address.Port != 80 {
			t.Errorf("backend row %s was modified", be.Address)
		}
	}
	fe443, _, _ := w.Frontends().Get(rtxn, FrontendByAddress.Query(addr("10.0.0.1:443/TCP")))
	if got := formatBackends(fe443.Backends); got != "10.1.0.1:8443, 10.1.0.2:8443" {
		t.Errorf("backends of the 443 frontend are %q", got)
	}

	// A service change (what the datapath enforces: affinity, source
	// ranges) rewrites its frontends, pointing at the new service.
	before = revs(rtxn)
	rtxn = apply(func(txn WriteTxn) error {
		s := service()
		s.SessionAffinity, s.SessionAffinityTimeout = true, time.Minute
		return w.UpsertServiceAndFrontends(txn, s, params...)
	})
	after := revs(rtxn)
	if after[0] == before[0] || after[1] == before[1] || after[2] != before[2] {
		t.Errorf("service change: revisions %v, then %v; want the services and frontends tables to change", before, after)
	}
	fe, _, _ = w.Frontends().Get(rtxn, FrontendByAddress.Query(feAddr))
	if fe.Service == nil || !fe.Service.SessionAffinity || fe.Status.Kind != reconciler.StatusKindPending || len(fe.Backends) != 2 {
		t.Errorf("after a service change: frontend service %+v, status %s, %d backends", fe.Service, fe.Status.Kind, len(fe.Backends))
	}

	// A frontend change makes it pending.
	params[0].PortName = "web"
	rtxn = apply(upsert)
	fe, _, _ = w.Frontends().Get(rtxn, FrontendByAddress.Query(feAddr))
	if fe.PortName != "web" || fe.Status.Kind != reconciler.StatusKindPending {
		t.Errorf("after a frontend change: port name %q, status %s", fe.PortName, fe.Status.Kind)
	}
}

// TestWriter_SetBackendsAllocation checks that changing one backend of a
// large service allocates one row, not room for all of them: a row keeps the
// block it was allocated in alive for as long as it lives.
func TestWriter_SetBackendsAllocation(t *testing.T) {
	const n = 1000
	w := newTestWriter(t)
	bes := make([]BackendParams, n)
	for i := range bes {
		bes[i] = BackendParams{Address: NewL3n4Addr(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80, ANY), Weight: 1}
	}
	set := func() {
		t.Helper()
		txn := w.WriteTxn()
		if err := w.SetBackends(txn, "a", SourceXDS, bes...); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	txn := w.WriteTxn()
	if err := w.UpsertServiceAndFrontends(txn, svc("a"), fe("10.0.0.1:80/TCP")); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	set()
	set() // grows the scratch space

	// The frontend gets a new slice of n pointers; the rows must not cost
	// n more Backends.
	bes[0].Weight = 2
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	set()
	runtime.ReadMemStats(&after)
	rowsBytes := uint64(n) * uint64(unsafe.Sizeof(Backend{}))
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("changing 1 of %d backends allocated %d bytes", n, got)
	if got > rowsBytes/2 {
		t.Fatalf("changing 1 of %d backends allocated %d bytes, want well under %d (%d rows)", n, got, rowsBytes, n)
	}
	fe, _, _ := w.Frontends().Get(w.ReadTxn(), FrontendByAddress.Query(addr("10.0.0.1:80/TCP")))
	if len(fe.Backends) != n || fe.Backends[0].Weight != 2 {
		t.Fatalf("frontend has %d backends, the first of weight %d", len(fe.Backends), fe.Backends[0].Weight)
	}
}

func TestWriter_Initializers(t *testing.T) {
	w := newTestWriter(t)
	doneXDS := w.RegisterInitializer("xds")
	doneOther := w.RegisterInitializer("other")

	initialized := func() bool {
		txn := w.ReadTxn()
		for _, tbl := range []statedb.TableMeta{w.Services(), w.Frontends(), w.Backends()} {
			if ok, _ := tbl.Initialized(txn); !ok {
				return false
			}
		}
		return true
	}
	if initialized() {
		t.Fatal("initialized before any initializer is done")
	}
	_, watch := w.Frontends().Initialized(w.ReadTxn())

	txn := w.WriteTxn()
	doneXDS(txn)
	txn.Commit()
	if initialized() {
		t.Fatal("initialized with the \"other\" initializer pending")
	}
	if got := w.Frontends().PendingInitializers(w.ReadTxn()); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("pending initializers %v, want [other]", got)
	}

	txn = w.WriteTxn()
	doneOther(txn)
	txn.Commit()
	if !initialized() {
		t.Fatal("not initialized after every initializer is done")
	}
	select {
	case <-watch:
	default:
		t.Fatal("Initialized watch channel not closed")
	}
}

func TestTableRows(t *testing.T) {
	w := newTestWriter(t)
	txn := w.WriteTxn()
	s := &Service{
		Name: "db", Source: SourceXDS,
		Labels:                 map[string]string{"version": "3", "b": "x"},
		SourceRanges:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
		SessionAffinity:        true,
		SessionAffinityTimeout: 10 * time.Minute,
		PortNames:              map[string]uint16{"mysql": 3306},
	}
	if err := w.UpsertServiceAndFrontends(txn, s, FrontendParams{Address: addr("10.1.2.3:3306/TCP"), PortName: "mysql"}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(txn, "db", SourceXDS,
		BackendParams{Address: addr("192.168.1.10:3306"), Weight: 70, Zone: "a"},
		BackendParams{Address: addr("192.168.1.11:3306"), Weight: 30, State: BackendStateTerminating, Priority: 1},
	); err != nil {
		t.Fatal(err)
	}
	rtxn := txn.Commit()

	svcRow, _, _ := w.Services().Get(rtxn, ServiceByName.Query("db"))
	feRow, _, _ := w.Frontends().Get(rtxn, FrontendByAddress.Query(addr("10.1.2.3:3306/TCP")))
	beRow, _, _ := w.Backends().Get(rtxn, BackendByID.Query(BackendID{"db", addr("192.168.1.11:3306"), SourceXDS}))
	feFailed := feRow.Clone().SetStatus(reconciler.StatusError(errors.New("services map is full")))

	tests := []struct {
		header, row []string
		want        string
	}{
		{svcRow.TableHeader(), svcRow.TableRow(),
			"Name=db Source=xds PortNames=mysql=3306 SourceRanges=10.0.0.0/8, 2001:db8::/32 Labels=b=x, version=3 SessionAffinity=10m0s RejectWeight=0"},
		{feRow.TableHeader(), feRow.TableRow(),
			"Address=10.1.2.3:3306/TCP Type=LoadBalancer ServiceName=db PortName=mysql Backends=192.168.1.10:3306, 192.168.1.11:3306/terminating Status=Pending"},
		{feFailed.TableHeader(), feFailed.TableRow(),
			"Address=10.1.2.3:3306/TCP Type=LoadBalancer ServiceName=db PortName=mysql Backends=192.168.1.10:3306, 192.168.1.11:3306/terminating Status=Error: services map is full"},
		{beRow.TableHeader(), beRow.TableRow(),
			"Address=192.168.1.11:3306 ServiceName=db Weight=30 State=terminating Priority=1 Zone= Source=xds"},
	}
	for _, tt := range tests {
		if len(tt.header) != len(tt.row) {
			t.Fatalf("header %v and row %v differ in length", tt.header, tt.row)
		}
		var cols []string
		for i := range tt.header {
			cols = append(cols, tt.header[i]+"="+tt.row[i])
		}
		if got := strings.Join(cols, " "); got != tt.want {
			t.Errorf("row:\n got %s\nwant %s", got, tt.want)
		}
	}
}

func TestIndexFromString(t *testing.T) {
	w := newTestWriter(t)
	txn := w.WriteTxn()
	if err := w.UpsertServiceAndFrontends(txn, svc("db"), fe("10.1.2.3:3306/TCP"), fe("[2001:db8::1]:53/UDP")); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(txn, "db", SourceXDS, be("192.168.1.10:3306"), be("192.168.1.11:3306")); err != nil {
		t.Fatal(err)
	}
	rtxn := txn.Commit()

	tests := []struct {
		table, index, key string
		want              int
	}{
		{FrontendsTableName, "address", "10.1.2.3:3306/TCP", 1},
		{FrontendsTableName, "address", "[2001:db8::1]:53/UDP", 1},
		{FrontendsTableName, "address", "10.1.2.3:3306/UDP", 0},
		{FrontendsTableName, "service", "db", 2},
		{BackendsTableName, "id", "db 192.168.1.10:3306 xds", 1},
		{ServicesTableName, "name", "db", 1},
	}
	for _, tt := range tests {
		tbl := statedb.AnyTable{Meta: w.db.GetTable(rtxn, tt.table)}
		objs, err := tbl.List(rtxn, tt.index, tt.key)
		if err != nil {
			t.Fatalf("%s %s %q: %v", tt.table, tt.index, tt.key, err)
		}
		n := 0
		for range objs {
			n++
		}
		if n != tt.want {
			t.Errorf("%s by %s %q: %d rows, want %d", tt.table, tt.index, tt.key, n, tt.want)
		}
	}

	// A partial backend id is a prefix of the service's rows.
	tbl := statedb.AnyTable{Meta: w.db.GetTable(rtxn, BackendsTableName)}
	objs, err := tbl.Prefix(rtxn, "id", "db")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range objs {
		n++
	}
	if n != 2 {
		t.Errorf("prefix \"db\" of backends: %d rows, want 2", n)
	}
}

func TestCell(t *testing.T) {
	var (
		writer *Writer
		fes    statedb.Table[*Frontend]
		rwFes  statedb.RWTable[*Frontend]
	)
	h := hive.New(
		statedb.Cell,
		Cell,
		cell.Invoke(func(w *Writer, _ statedb.Table[*Service], f statedb.Table[*Frontend], _ statedb.Table[*Backend], rw statedb.RWTable[*Frontend]) {
			writer, fes, rwFes = w, f, rw
		}),
	)
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	txn := writer.WriteTxn()
	if err := writer.UpsertServiceAndFrontends(txn, svc("a"), fe("10.0.0.1:80/TCP")); err != nil {
		t.Fatal(err)
	}
	rtxn := txn.Commit()
	if fes.NumObjects(rtxn) != 1 || rwFes.NumObjects(rtxn) != 1 {
		t.Fatalf("the provided tables are not the writer's")
	}
}

// TestWriter_Concurrent writes from several goroutines: the table locks
// taken by WriteTxn serialize them (run with -race).
func TestWriter_Concurrent(t *testing.T) {
	w := newTestWriter(t)
	const workers, rounds = 4, 50
	errs := make(chan error, workers)
	for g := range workers {
		go func() {
			name := fmt.Sprintf("svc-%d", g)
			var err error
			for i := range rounds {
				txn := w.WriteTxn()
				err = w.UpsertServiceAndFrontends(txn, svc(name), fe(fmt.Sprintf("10.0.0.%d:80/TCP", g+1)))
				if err == nil {
					err = w.SetBackends(txn, ServiceName(name), SourceXDS, be(fmt.Sprintf("10.1.%d.%d:80", g, i)))
				}
				txn.Commit()
				if err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := frontendRows(w, w.ReadTxn())
	want := []string{
		"10.0.0.1:80/TCP svc-0 [10.1.0.49:80]",
		"10.0.0.2:80/TCP svc-1 [10.1.1.49:80]",
		"10.0.0.3:80/TCP svc-2 [10.1.2.49:80]",
		"10.0.0.4:80/TCP svc-3 [10.1.3.49:80]",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("frontends %q, want %q", got, want)
	}
}

// TestWriter_SetBackendsOf checks that setting the backends of many services
// at once leaves the tables as SetBackends one service at a time does, with
// each error at its set: random rounds over a few services with frontends
// (one with a target port, one with three), backends of a second source at some of the same
// addresses, invalid sets, and a service listed twice.
func TestWriter_SetBackendsOf(t *testing.T) {
	batched, single := newTestWriter(t), newTestWriter(t)
	for _, w := range []*Writer{batched, single} {
		txn := w.WriteTxn()
		for i, name := range []string{"s0", "s1", "s2", "s3"} {
			params := fe(fmt.Sprintf("10.0.0.%d:80/TCP", i+1))
			if name == "s2" {
				params.ServicePort = 9090
			}
			fes := []FrontendParams{params}
			if name == "s1" {
				// Two frontends share the service's backends.
				fes = append(fes, fe("10.0.0.2:80/UDP"), fe("10.0.0.12:8080/TCP"))
			}
			if err := w.UpsertServiceAndFrontends(txn, svc(name), fes...); err != nil {
				t.Fatal(err)
			}
		}
		txn.Commit()
	}
	rows := func(w *Writer) []string {
		rtxn := w.ReadTxn()
		var out []string
		for be := range w.Backends().All(rtxn) {
			out = append(out, fmt.Sprintf("%s %s %s w%d", be.ServiceName, be.Address, be.Source, be.Weight))
		}
		for fe := range w.Frontends().All(rtxn) {
			var bes []string
			for _, be := range fe.Backends {
				bes = append(bes, fmt.Sprintf("%s %s w%d", be.Address, be.Source, be.Weight))
			}
			out = append(out, fmt.Sprintf("%s %s %s %v", fe.Address, fe.ServiceName, fe.Status.Kind, bes))
		}
		return out
	}
	rng := rand.New(rand.NewPCG(1, 2))
	names := []ServiceName{"s0", "s1", "s2", "s3", "s4"} // s4 has no frontend
	for round := range 300 {
		var sets []ServiceBackends
		for _, name := range names {
			if rng.IntN(3) == 0 {
				continue
			}
			var bes []BackendParams
			for range rng.IntN(4) {
				b := be(fmt.Sprintf("10.1.0.%d:%d", rng.IntN(4), 80+rng.IntN(2)))
				b.Weight = uint16(rng.IntN(3))
				bes = append(bes, b) // may list an address twice: invalid
			}
			sets = append(sets, ServiceBackends{Name: name, Backends: bes})
		}
		if len(sets) > 0 && rng.IntN(10) == 0 {
			sets = append(sets, sets[0]) // listed twice
		}
		if len(sets) > 0 && rng.IntN(10) == 0 {
			// Listed twice, the second time with other backends: it
			// reads what the first wrote (two updates of one EDS
			// resource in one response).
			second := ServiceBackends{Name: sets[0].Name}
			for range rng.IntN(3) {
				second.Backends = append(second.Backends, be(fmt.Sprintf("10.1.0.%d:80", rng.IntN(4))))
			}
			sets = append(sets, second)
		}
		other := names[rng.IntN(len(names))]
		otherBes := []BackendParams{be(fmt.Sprintf("10.1.0.%d:80", rng.IntN(4)))}
		if rng.IntN(2) == 0 {
			otherBes = nil
		}

		txn := batched.WriteTxn()
		if err := batched.SetBackends(txn, other, "k8s", otherBes...); err != nil {
			t.Fatal(err)
		}
		errs := batched.SetBackendsOf(txn, SourceXDS, sets)
		txn.Commit()

		txn = single.WriteTxn()
		if err := single.SetBackends(txn, other, "k8s", otherBes...); err != nil {
			t.Fatal(err)
		}
		for i, set := range sets {
			err := single.SetBackends(txn, set.Name, SourceXDS, set.Backends...)
			if fmt.Sprint(err) != fmt.Sprint(errs[i]) {
				t.Fatalf("round %d, set %d (%s): error %v, one at a time %v", round, i, set.Name, errs[i], err)
			}
		}
		txn.Commit()

		if got, want := rows(batched), rows(single); !slices.Equal(got, want) {
			t.Fatalf("round %d: sets %+v:\n%s\nwant (one at a time)\n%s", round, sets, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// And the frontends have the backends the table lists.
		rtxn := batched.ReadTxn()
		for fe := range batched.Frontends().All(rtxn) {
			want := batched.serviceBackends(rtxn, fe.ServiceName)
			if fe.ServicePort != 0 {
				want = nil
				for _, be := range batched.portBackends(batched.serviceBackends(rtxn, fe.ServiceName), fe.ServicePort) {
					want = append(want, &be)
				}
			}
			if !backendsEqual(fe.Backends, want) {
				t.Fatalf("round %d: frontend %s has backends %v, the table %v", round, fe.Address, fe.Backends, want)
			}
		}
	}
}
