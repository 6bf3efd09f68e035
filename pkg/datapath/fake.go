// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"github.com/cilium/hive/job"
	"net/netip"
	"sync"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// Hooks adapt the datapath cell for benchmarks and tests. The agent
// provides none; a hive that provides a Hooks (cell.Provide) gets them.
type Hooks struct {
	// FakeMaps, if set, take the place of the BPF maps: nothing is loaded
	// or attached, and the reconciler writes into them. It needs no root.
	FakeMaps *FakeMaps
	// Written, if set, is called by the reconciler after it has written a
	// frontend's entries into the maps (every write of the update done).
	Written func(frontend lb.L3n4Addr)
	// CountMaps, if set, is the trigger of the count of the maps' entries
	// (l4xds_datapath_map_pressure), besides its period: a test counts
	// when it has written.
	CountMaps job.Trigger
}

// FakeMaps stand in for the BPF maps where there are none: the reconciler
// writes into them what it would write into the maps. Of a Maglev table
// only its existence is kept, not its slots, so that the fake adds little
// to the heap of a benchmark (in the real maps the tables are kernel
// memory).
type FakeMaps struct {
	mu       sync.Mutex
	services map[bpf.L4xdsLbSvcKey]bpf.L4xdsLbSvc
	backends map[uint32]bpf.L4xdsLbBackend
	maglev   map[uint32]struct{}
	// newTables are made, not yet inserted.
	newTables []uint32
	ranges    map[bpf.L4xdsLbSrcRangeKey]struct{}
	vips      map[netip.Addr]uint32
	// failService, if set, is the error of writing a service's entry
	// (tests of the reconciler's errors).
	failService func(bpf.L4xdsLbSvcKey) error
	// failBackend, if set, is the error of writing a backend's entry.
	failBackend func(bpf.L4xdsLbBackend) error
	// failVIP and failZero, if set, are the errors of writing a VIP's
	// count in a round's batch and of clearing a service ID's counters.
	failVIP  func(netip.Addr) error
	failZero func(svcID uint32) error
}

var _ mapWriter = (*FakeMaps)(nil)

func NewFakeMaps() *FakeMaps {
	return &FakeMaps{
		services: map[bpf.L4xdsLbSvcKey]bpf.L4xdsLbSvc{},
		backends: map[uint32]bpf.L4xdsLbBackend{},
		maglev:   map[uint32]struct{}{},
		ranges:   map[bpf.L4xdsLbSrcRangeKey]struct{}{},
		vips:     map[netip.Addr]uint32{},
	}
}

// FakeCounts are the numbers of entries of each map.
type FakeCounts struct {
	Services, Backends, MaglevTables, SourceRanges, VIPs int
}

func (f *FakeMaps) Counts() FakeCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FakeCounts{len(f.services), len(f.backends), len(f.maglev), len(f.ranges), len(f.vips)}
}

// Service returns the entry of a frontend.
func (f *FakeMaps) Service(fe lb.L3n4Addr) (ServiceEntry, bool) {
	key, err := svcKeyToBPF(fe)
	if err != nil {
		return ServiceEntry{}, false
	}
	f.mu.Lock()
	v, ok := f.services[key]
	f.mu.Unlock()
	return ServiceEntry{Frontend: fe, ID: v.Id, Count: v.Count, Backend: v.BackendId}, ok
}

func (f *FakeMaps) putService(key bpf.L4xdsLbSvcKey, v bpf.L4xdsLbSvc) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failService != nil {
		if err := f.failService(key); err != nil {
			return err
		}
	}
	f.services[key] = v
	return nil
}

// putServices stops at the first entry that fails, as the kernel's batch.
func (f *FakeMaps) putServices(keys []bpf.L4xdsLbSvcKey, values []bpf.L4xdsLbSvc) (int, error) {
	for i := range keys {
		if err := f.putService(keys[i], values[i]); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

func (f *FakeMaps) putVIPs(vips []netip.Addr, counts []uint32) (int, error) {
	for i, vip := range vips {
		if f.failVIP != nil {
			if err := f.failVIP(vip); err != nil {
				return i, err
			}
		}
		if err := f.setVIP(vip, counts[i]); err != nil {
			return i, err
		}
	}
	return len(vips), nil
}

func (f *FakeMaps) deleteService(key bpf.L4xdsLbSvcKey, _ uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.services, key)
	return nil
}

func (f *FakeMaps) putBackends(ids []uint32, values []bpf.L4xdsLbBackend) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, id := range ids {
		if f.failBackend != nil {
			if err := f.failBackend(values[i]); err != nil {
				return i, err
			}
		}
		f.backends[id] = values[i]
	}
	return len(ids), nil
}

func (f *FakeMaps) deleteBackend(id uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.backends, id)
	return nil
}

func (f *FakeMaps) newMaglev(svcID uint32, table []uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.newTables = append(f.newTables, svcID)
	return nil
}

// buildMaglev builds the table, as the workers of Maps do, and keeps
// nothing of it.
func (f *FakeMaps) buildMaglev(svcID uint32, b *maglevBuilder, size uint32) error {
	return f.newMaglev(svcID, b.build(size))
}

func (f *FakeMaps) insertMaglevs() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range f.newTables {
		f.maglev[id] = struct{}{}
	}
	f.newTables = f.newTables[:0]
	return nil
}

func (f *FakeMaps) rewriteMaglev(svcID uint32, _ []uint32) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.maglev[svcID]
	return ok, nil
}

func (f *FakeMaps) deleteMaglevs(svcIDs []uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range svcIDs {
		delete(f.maglev, id)
	}
	return nil
}

func (f *FakeMaps) putSourceRange(svcID uint32, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ranges[srcRangeToBPF(svcID, p)] = struct{}{}
	return nil
}

func (f *FakeMaps) deleteSourceRange(svcID uint32, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ranges, srcRangeToBPF(svcID, p))
	return nil
}

func (f *FakeMaps) setVIP(vip netip.Addr, n uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n == 0 {
		delete(f.vips, vip)
	} else {
		f.vips[vip] = n
	}
	return nil
}

func (f *FakeMaps) zeroStats(ids []uint32) (int, error) {
	for i, id := range ids {
		if f.failZero != nil {
			if err := f.failZero(id); err != nil {
				return i, err
			}
		}
	}
	return len(ids), nil
}
