// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// tcxDrop is the verdict TCX_DROP.
const tcxDrop = 2

// failingRanges are maps whose source ranges cannot be written.
type failingRanges struct{ *Maps }

func (failingRanges) putSourceRange(svcID uint32, p netip.Prefix) error {
	return errors.New("write l4xds_srcrange: injected failure")
}

func rangedFrontend(addr string, ranges ...string) *lb.Frontend {
	svc := &lb.Service{Name: "db", Source: lb.SourceXDS}
	for _, r := range ranges {
		svc.SourceRanges = append(svc.SourceRanges, netip.MustParsePrefix(r))
	}
	return &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe(addr)}, Service: svc,
		Backends: []*lb.Backend{be("192.168.1.10:3306")}}
}

// A service whose source ranges cannot be written is closed, not left open
// to every client: its entry is removed until a retry writes the ranges
// and then the entry.
func TestPrivilegedAFailedSourceRangeWriteClosesTheService(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	if got := dp.capacity(1021).sourceRanges; got != sourceRangeMapMax {
		t.Errorf("capacity of the loaded source-range map: %d, want %d", got, sourceRangeMapMax)
	}
	o, db := restoredOps(t, dp)
	vip := netip.MustParseAddrPort("10.1.2.3:3306")
	outside := netip.MustParseAddrPort("10.200.1.2:40000")
	inside := netip.MustParseAddrPort("203.0.113.9:40000")
	syn := func(src netip.AddrPort) int32 {
		t.Helper()
		ret, err := dp.objs.L4xdsIngress.Run(&ebpf.RunOptions{Data: tcp4Frame(src, vip, tcpSYN, 0, 0)})
		if err != nil {
			t.Fatalf("BPF_PROG_RUN %s -> %s: %v", src, vip, err)
		}
		return int32(ret)
	}
	update := func(f *lb.Frontend) error {
		return o.Update(context.Background(), db.ReadTxn(), statedb.Revision(1), f)
	}

	// Open to everyone: no source ranges.
	if err := update(rangedFrontend("10.1.2.3:3306/TCP")); err != nil {
		t.Fatal(err)
	}
	if v := syn(outside); v == tcxDrop {
		t.Fatalf("a service without source ranges dropped %s", outside)
	}

	// Its first range cannot be written.
	o.maps = failingRanges{dp.Maps}
	err := update(rangedFrontend("10.1.2.3:3306/TCP", "203.0.113.0/24"))
	if err == nil || !strings.Contains(err.Error(), "frontend 10.1.2.3:3306/TCP: ") || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("update with a failed range write: %v, want an error naming the frontend and the failure", err)
	}
	for _, src := range []netip.AddrPort{outside, inside} {
		if v := syn(src); v != tcxDrop {
			t.Errorf("%s -> %s once the ranges failed to be written: verdict %d, want %d (dropped: the service is closed)", src, vip, v, tcxDrop)
		}
	}

	// The retry writes them: the range's clients only.
	o.maps = dp.Maps
	if err := update(rangedFrontend("10.1.2.3:3306/TCP", "203.0.113.0/24")); err != nil {
		t.Fatal(err)
	}
	if v := syn(inside); v == tcxDrop {
		t.Errorf("%s in the written range: dropped", inside)
	}
	before, err := dp.Maps.ServiceStats(o.reg.services[fe("10.1.2.3:3306/TCP")].id)
	if err != nil {
		t.Fatal(err)
	}
	if v := syn(outside); v != tcxDrop {
		t.Errorf("%s outside the written range: verdict %d, want %d", outside, v, tcxDrop)
	}
	after, _ := dp.Maps.ServiceStats(o.reg.services[fe("10.1.2.3:3306/TCP")].id)
	if n := after.Drops[DropSourceRange] - before.Drops[DropSourceRange]; n != 1 {
		t.Errorf("%d source-range drops counted for one packet", n)
	}
}

// The source-range map's room is checked before anything of a service is
// written: a service whose ranges do not fit is refused with an error that
// names it and the field, and what serves keeps serving.
func TestSourceRangesMustFitTheirMap(t *testing.T) {
	db := statedb.New()
	w, err := lb.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger(t)
	c := DefaultConfig.capacity()
	c.sourceRanges = 3
	o := newOps(log, db, w.Frontends(), c)
	fake := NewFakeMaps()
	o.useFake(fake)
	update := func(f *lb.Frontend) error {
		return o.Update(context.Background(), db.ReadTxn(), statedb.Revision(1), f)
	}

	if err := update(rangedFrontend("10.0.0.1:3306/TCP", "10.0.0.0/8", "2001:db8::/32")); err != nil {
		t.Fatal(err)
	}
	big := rangedFrontend("10.0.0.2:3306/TCP", "192.0.2.0/24", "198.51.100.0/24")
	big.Service.Name = "big"
	err = update(big)
	want := `frontend 10.0.0.2:3306/TCP: service "big": source_ranges: 2 new ranges do not fit the source-range map: 1 of its 3 entries are free`
	if err == nil || err.Error() != want {
		t.Errorf("update of a service whose ranges do not fit: %v, want %q", err, want)
	}
	if _, ok := fake.Service(fe("10.0.0.2:3306/TCP")); ok || fake.Counts().SourceRanges != 2 {
		t.Errorf("the refused service was written: %+v", fake.Counts())
	}
	// Ranges replaced by as many others fit: the old ones go first.
	if err := update(rangedFrontend("10.0.0.1:3306/TCP", "172.16.0.0/12", "fd00::/8")); err != nil {
		t.Errorf("replacing a service's ranges: %v", err)
	}
	if n := fake.Counts().SourceRanges; n != 2 {
		t.Errorf("%d source ranges after replacing two by two, want 2", n)
	}
	if err := update(rangedFrontend("10.0.0.2:3306/TCP", "192.0.2.0/24")); err != nil {
		t.Errorf("a service whose one range fits: %v", err)
	}
}

// trieBefore614 is the source-range map as Linux before 6.14 keeps it: an
// LPM trie that holds its max entries refuses every update with ENOSPC,
// one of a key it holds included (fixed by "bpf: Handle in-place update
// for full LPM trie correctly").
type trieBefore614 struct {
	*FakeMaps
	max int
}

func (f trieBefore614) putSourceRange(svcID uint32, p netip.Prefix) error {
	if f.Counts().SourceRanges >= f.max {
		return fmt.Errorf("write l4xds_srcrange: service %d: %s: %w", svcID, p, syscall.ENOSPC)
	}
	return f.FakeMaps.putSourceRange(svcID, p)
}

// A periodic refresh rewrites a service's source ranges. In a full map,
// which older kernels refuse even the rewrite of an entry they hold, the
// service must go on serving as it did: a range it holds can only admit,
// never one it does not, and the service's ranges admit no one more.
func TestARefreshInAFullSourceRangeMapKeepsTheService(t *testing.T) {
	db := statedb.New()
	w, err := lb.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger(t)
	c := DefaultConfig.capacity()
	c.sourceRanges = 2
	o := newOps(log, db, w.Frontends(), c)
	fake := NewFakeMaps()
	o.useFake(fake)
	o.maps = trieBefore614{fake, 2}
	f := rangedFrontend("10.0.0.1:3306/TCP", "10.0.0.0/8", "2001:db8::/32")
	if err := o.Update(context.Background(), db.ReadTxn(), 1, f); err != nil {
		t.Fatal(err)
	}
	refresh := *f
	refresh.Status = reconciler.StatusRefreshing()
	if err := o.Update(context.Background(), db.ReadTxn(), 2, &refresh); err != nil {
		t.Errorf("refresh of a service whose ranges fill the map: %v", err)
	}
	if _, ok := fake.Service(fe("10.0.0.1:3306/TCP")); !ok {
		t.Errorf("the service is closed by the refresh")
	}
}
