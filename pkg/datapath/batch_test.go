// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// The backend and service entries of a round are written in batches; an
// entry that fails is the error of its frontend alone: the entries before
// and after it are written, and the frontend's retry writes it.
func TestABatchWriteFailsItsFrontendAlone(t *testing.T) {
	db := statedb.New()
	w, err := lb.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger(t)
	o := newOps(log, db, w.Frontends(), DefaultConfig.capacity())
	fake := NewFakeMaps()
	o.useFake(fake)

	const n = 5
	txn := w.WriteTxn()
	for i := 1; i <= n; i++ {
		name := lb.ServiceName(fmt.Sprintf("svc-%d", i))
		if err := w.UpsertServiceAndFrontends(txn, &lb.Service{Name: name, Source: lb.SourceXDS}, lb.FrontendParams{Address: fe(fmt.Sprintf("10.0.0.%d:80/TCP", i))}); err != nil {
			t.Fatal(err)
		}
		be := lb.BackendParams{Address: lb.NewL3n4Addr(netip.AddrFrom4([4]byte{192, 168, 0, byte(i)}), 80, lb.ANY), Weight: 1}
		if err := w.SetBackends(txn, name, lb.SourceXDS, be); err != nil {
			t.Fatal(err)
		}
	}
	rtxn := txn.Commit()

	failing, failingBackend := fe("10.0.0.3:80/TCP"), fe("10.0.0.2:80/TCP")
	failingKey, err := svcKeyToBPF(failing)
	if err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected")
	fake.failService = func(k bpf.L4xdsLbSvcKey) error {
		if k == failingKey {
			return injected
		}
		return nil
	}
	fake.failBackend = func(v bpf.L4xdsLbBackend) error {
		if backendAddrFromBPF(v) == netip.MustParseAddrPort("192.168.0.2:80") {
			return injected
		}
		return nil
	}
	var batch []reconciler.BatchEntry[*lb.Frontend]
	for f, rev := range w.Frontends().All(rtxn) {
		batch = append(batch, reconciler.BatchEntry[*lb.Frontend]{Object: f.Clone(), Revision: rev})
	}
	o.UpdateBatch(context.Background(), rtxn, batch)
	for _, e := range batch {
		addr := e.Object.Address
		entry, written := fake.Service(addr)
		if addr == failing || addr == failingBackend {
			if want := "frontend " + addr.String() + ": injected"; e.Result == nil || e.Result.Error() != want || !errors.Is(e.Result, injected) {
				t.Errorf("frontend %s: error %v, want %q", addr, e.Result, want)
			}
			if written {
				t.Errorf("frontend %s: its entry is written although the write failed: %+v", addr, entry)
			}
			continue
		}
		if e.Result != nil || !written || entry.Count != 1 {
			t.Errorf("frontend %s: error %v, entry %+v (written %v); want it written, with its backend", addr, e.Result, entry, written)
		}
	}

	if c := fake.Counts(); c.Backends != n-1 {
		t.Errorf("%d backend entries, want %d: all but the one that failed", c.Backends, n-1)
	}

	fake.failService, fake.failBackend = nil, nil
	for _, e := range batch {
		if a := e.Object.Address; a == failing || a == failingBackend {
			if err := o.Update(context.Background(), rtxn, e.Revision, e.Object); err != nil {
				t.Fatalf("retry of %s: %v", a, err)
			}
			if entry, ok := fake.Service(a); !ok || entry.Count != 1 {
				t.Errorf("after the retry, frontend %s: %+v (written %v)", a, entry, ok)
			}
		}
	}
	if c := fake.Counts(); c.Services != n || c.Backends != n || c.VIPs != n {
		t.Errorf("maps %+v, want %d services, backends and VIPs", c, n)
	}
}

// Each batch of a round (backend entries, counter clears, VIP counts,
// service entries) fails the frontend of the entry that failed alone,
// in the middle of the batch: the frontends before and after it are
// served, its entry is not written, and its retry serves it.
func TestEachBatchFailsItsFrontendAlone(t *testing.T) {
	injected := errors.New("injected")
	failing := fe("10.0.0.3:80/TCP")
	failingKey, err := svcKeyToBPF(failing)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		inject func(f *FakeMaps, id uint32, on bool)
	}{
		{"backend", func(f *FakeMaps, _ uint32, on bool) {
			f.failBackend = nil
			if on {
				f.failBackend = func(v bpf.L4xdsLbBackend) error {
					if backendAddrFromBPF(v) == netip.MustParseAddrPort("192.168.0.3:80") {
						return injected
					}
					return nil
				}
			}
		}},
		{"counters", func(f *FakeMaps, id uint32, on bool) {
			f.failZero = nil
			if on {
				f.failZero = func(got uint32) error {
					if got == id {
						return injected
					}
					return nil
				}
			}
		}},
		{"vip", func(f *FakeMaps, _ uint32, on bool) {
			f.failVIP = nil
			if on {
				f.failVIP = func(vip netip.Addr) error {
					if vip == failing.Addr {
						return injected
					}
					return nil
				}
			}
		}},
		{"service", func(f *FakeMaps, _ uint32, on bool) {
			f.failService = nil
			if on {
				f.failService = func(k bpf.L4xdsLbSvcKey) error {
					if k == failingKey {
						return injected
					}
					return nil
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := statedb.New()
			w, err := lb.NewWriter(db)
			if err != nil {
				t.Fatal(err)
			}
			log, _ := testLogger(t)
			o := newOps(log, db, w.Frontends(), DefaultConfig.capacity())
			fake := NewFakeMaps()
			o.useFake(fake)
			const n = 5
			var batch []reconciler.BatchEntry[*lb.Frontend]
			for i := 1; i <= n; i++ {
				f := &lb.Frontend{
					FrontendParams: lb.FrontendParams{Address: fe(fmt.Sprintf("10.0.0.%d:80/TCP", i))},
					Backends:       []*lb.Backend{be(fmt.Sprintf("192.168.0.%d:80", i))},
				}
				batch = append(batch, reconciler.BatchEntry[*lb.Frontend]{Object: f, Revision: 1})
			}
			// The registry hands out the IDs 1..n in order.
			tc.inject(fake, 3, true)
			o.UpdateBatch(context.Background(), db.ReadTxn(), batch)
			for _, e := range batch {
				addr := e.Object.Address
				_, written := fake.Service(addr)
				if addr == failing {
					if !errors.Is(e.Result, injected) || written {
						t.Errorf("frontend %s: error %v, entry written %v; want the injected error, no entry", addr, e.Result, written)
					}
					continue
				}
				if e.Result != nil || !written {
					t.Errorf("frontend %s: error %v, entry written %v; want it served", addr, e.Result, written)
				}
			}
			tc.inject(fake, 3, false)
			if err := o.Update(context.Background(), db.ReadTxn(), 1, batch[2].Object); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if c := fake.Counts(); c.Services != n || c.Backends != n || c.VIPs != n {
				t.Errorf("after the retry: %+v, want %d services, backends and VIPs", c, n)
			}
		})
	}
}
