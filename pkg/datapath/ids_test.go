// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

func TestIDPoolHandsOutTheNextFreeIDAfterTheLast(t *testing.T) {
	p := newIDPool(4)
	var got []uint32
	acquire := func() uint32 {
		t.Helper()
		id, err := p.acquire()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
		return id
	}
	acquire()
	two := acquire()
	acquire()
	p.release(two)
	acquire() // 4, not the just-freed 2
	acquire() // wraps to the only free one: 2
	if want := "[1 2 3 4 2]"; fmt.Sprint(got) != want {
		t.Errorf("IDs %v, want %s", got, want)
	}
	if _, err := p.acquire(); err == nil || !strings.Contains(err.Error(), "all 4 IDs are in use") {
		t.Errorf("acquire from a full pool: %v", err)
	}
}

func TestIDPoolReserveContinuesAfterTheRestoredIDs(t *testing.T) {
	p := newIDPool(MaxServiceID)
	for _, id := range []uint32{7, 3} {
		if err := p.reserve(id); err != nil {
			t.Fatal(err)
		}
	}
	if id, _ := p.acquire(); id != 8 {
		t.Errorf("first ID after restoring 7 and 3: %d, want 8", id)
	}
	for _, c := range []struct {
		id   uint32
		want string
	}{
		{0, "ID 0 is out of range 1..65535"},
		{65536, "ID 65536 is out of range 1..65535"},
		{7, "ID 7 is used twice"},
	} {
		if err := p.reserve(c.id); err == nil || err.Error() != c.want {
			t.Errorf("reserve(%d): %v, want %q", c.id, err, c.want)
		}
	}
}

func fe(s string) lb.L3n4Addr {
	a, err := lb.ParseL3n4Addr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// snapshot is what the pinned maps hold for the registry's services, as the
// reconciler writes them.
type snapshot struct {
	svcKeys  []bpf.L4xdsLbSvcKey
	svcs     []bpf.L4xdsLbSvc
	beIDs    []uint32
	bes      []bpf.L4xdsLbBackend
	srcRange []bpf.L4xdsLbSrcRangeKey
}

func snapshotOf(r *registry) snapshot {
	var s snapshot
	for _, svc := range r.services {
		s.svcKeys = append(s.svcKeys, svc.key)
		s.svcs = append(s.svcs, bpf.L4xdsLbSvc{Id: svc.id})
		for _, be := range svc.backends {
			s.beIDs = append(s.beIDs, be.id)
			s.bes = append(s.bes, backendToBPF(svc.id, be.addr, lb.BackendStateActive))
		}
		for p := range svc.ranges {
			s.srcRange = append(s.srcRange, srcRangeToBPF(svc.id, p))
		}
	}
	return s
}

func restored(t *testing.T, s snapshot) *registry {
	t.Helper()
	r := newRegistry(DefaultConfig.capacity())
	for i := range s.svcKeys {
		if err := r.restoreService(s.svcKeys[i], s.svcs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range s.beIDs {
		if err := r.restoreBackend(s.beIDs[i], s.bes[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range s.srcRange {
		if err := r.restoreSourceRange(k); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func TestRegistryRestoresTheSameIDs(t *testing.T) {
	r := newRegistry(DefaultConfig.capacity())
	frontends := []lb.L3n4Addr{fe("10.1.2.3:3306/TCP"), fe("10.1.2.3:53/UDP"), fe("[2001:db8::1]:53/UDP")}
	backends := []netip.AddrPort{netip.MustParseAddrPort("192.168.1.10:3306"), netip.MustParseAddrPort("192.168.1.11:3306")}
	svcIDs := map[lb.L3n4Addr]uint32{}
	beIDs := map[lb.L3n4Addr]map[netip.AddrPort]uint32{}
	for _, f := range frontends {
		svc, isNew, err := r.service(f)
		if err != nil || !isNew {
			t.Fatalf("service(%s): new %v, %v", f, isNew, err)
		}
		svcIDs[f] = svc.id
		beIDs[f] = map[netip.AddrPort]uint32{}
		for _, a := range backends {
			be, err := r.backend(svc, a)
			if err != nil {
				t.Fatal(err)
			}
			beIDs[f][a] = be.id
		}
		r.addRange(svc, netip.MustParsePrefix("10.0.0.0/8"))
	}
	// The same address is the same service and backend.
	if svc, isNew, _ := r.service(frontends[0]); isNew || svc.id != svcIDs[frontends[0]] {
		t.Errorf("second lookup of %s: id %d new %v, want id %d", frontends[0], svc.id, isNew, svcIDs[frontends[0]])
	}
	if r.vips[netip.MustParseAddr("10.1.2.3")] != 2 {
		t.Errorf("VIP 10.1.2.3 has %d services, want 2", r.vips[netip.MustParseAddr("10.1.2.3")])
	}

	// A restarted agent finds every ID again, and allocates after them.
	r2 := restored(t, snapshotOf(r))
	for _, f := range frontends {
		svc, isNew, err := r2.service(f)
		if err != nil || isNew || svc.id != svcIDs[f] {
			t.Fatalf("restored service %s: id %d new %v err %v, want id %d", f, svc.id, isNew, err, svcIDs[f])
		}
		for _, a := range backends {
			if be, _ := r2.backend(svc, a); be.id != beIDs[f][a] {
				t.Errorf("restored backend %s of %s: id %d, want %d", a, f, be.id, beIDs[f][a])
			}
		}
		if _, ok := svc.ranges[netip.MustParsePrefix("10.0.0.0/8")]; !ok || len(svc.ranges) != 1 {
			t.Errorf("restored source ranges of %s: %v", f, svc.ranges)
		}
	}
	if r2.vips[netip.MustParseAddr("10.1.2.3")] != 2 || r2.vips[netip.MustParseAddr("2001:db8::1")] != 1 {
		t.Errorf("restored VIP counts %v", r2.vips)
	}
	svc, isNew, _ := r2.service(fe("10.9.9.9:80/TCP"))
	if !isNew || svc.id != 4 {
		t.Errorf("new service after restore: id %d new %v, want id 4", svc.id, isNew)
	}
	if be, _ := r2.backend(svc, backends[0]); be.id != 7 {
		t.Errorf("new backend after restore: id %d, want 7", be.id)
	}
}

func TestRegistryFreesIDsAndLeavesOrphansToPrune(t *testing.T) {
	r := newRegistry(DefaultConfig.capacity())
	svc, _, _ := r.service(fe("10.1.2.3:80/TCP"))
	a := netip.MustParseAddrPort("192.168.1.10:80")
	be, _ := r.backend(svc, a)
	r.removeBackend(svc, a)
	if _, used := r.backendIDs.used[be.id]; used {
		t.Error("a removed backend keeps its ID")
	}
	r.backend(svc, a)
	r.remove(svc)
	if len(r.serviceIDs.used) != 0 || len(r.backendIDs.used) != 0 || len(r.vips) != 0 || len(r.byID) != 0 {
		t.Errorf("after remove: services %v backends %v vips %v", r.serviceIDs.used, r.backendIDs.used, r.vips)
	}

	err := r.restoreBackend(9, backendToBPF(42, a, lb.BackendStateActive))
	if err == nil || err.Error() != "backend 192.168.1.10:80 (id 9): service 42 does not exist" {
		t.Errorf("orphan backend: %v", err)
	}
	err = r.restoreSourceRange(srcRangeToBPF(42, netip.MustParsePrefix("10.0.0.0/8")))
	if err == nil || err.Error() != "source range 10.0.0.0/8: service 42 does not exist" {
		t.Errorf("orphan source range: %v", err)
	}
	key, _ := svcKeyToBPF(fe("10.1.2.3:80/TCP"))
	key.Proto = 1
	if err := r.restoreService(key, bpf.L4xdsLbSvc{Id: 5}); err == nil || !strings.Contains(err.Error(), "IP protocol 1 is not TCP or UDP") {
		t.Errorf("service of an unknown protocol: %v", err)
	}
}
