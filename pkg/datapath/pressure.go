// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// mapPressureInterval is how often the maps' entries are counted for
// l4xds_datapath_map_pressure.
//
// The entries are counted from user space, periodically, rather than in
// the datapath: an LRU map evicts entries inside the kernel without the
// program seeing it, so a count the program keeps would drift from the
// truth, and a shared counter would add an atomic operation on a
// contended cache line to every new flow, which is what a flood sends.
// A count reads the hash maps in batches (CountEntries): a full conntrack
// map of 2^20 entries is 256 syscalls, which hold each bucket's lock only
// while copying it, so the datapath never waits for more than a bucket.
// Pressure moves with traffic over minutes; every 30 s is as often as
// Prometheus scrapes, and countDutyCycle spaces the counts of large maps.
const mapPressureInterval = 30 * time.Second

// countDutyCycle bounds the time spent counting: after a count that took
// d, the next one waits at least countDutyCycle × d, so that maps sized
// for tens of millions of entries cost at most 1 % of a CPU (a count takes
// about 0.3 s of kernel time per million entries).
const countDutyCycle = 100

// mapSampler holds the maps' usage, counted every mapPressureInterval,
// for the metrics and the table MapsTableName.
type mapSampler struct {
	log   *slog.Logger
	db    *statedb.DB
	table statedb.RWTable[*MapUsage]

	// next is when the next count may start (countDutyCycle).
	next time.Time

	mu   sync.Mutex
	maps map[string]*ebpf.Map // by pin name; nil before start and after stop
	// usages are the maps' usages, with the entries of the last count.
	usages MapUsages
}

// set gives the sampler the loaded maps and their usage, not counted;
// set(nil, nil) when they are closed.
func (s *mapSampler) set(objs *bpf.L4xdsMaps, us MapUsages) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maps, s.usages = nil, us
	s.publish(us)
	if objs == nil {
		return nil
	}
	s.maps = map[string]*ebpf.Map{}
	for _, u := range us {
		m, err := mapByName(objs, u.Pin)
		if err != nil {
			return err
		}
		s.maps[u.Pin] = m
	}
	return nil
}

// sample counts the entries of every map but the arrays.
func (s *mapSampler) sample(ctx context.Context) error {
	s.mu.Lock()
	wait := time.Until(s.next)
	s.mu.Unlock()
	if wait > 0 {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maps == nil {
		return nil
	}
	start := time.Now()
	us := make(MapUsages, len(s.usages))
	copy(us, s.usages)
	for i, u := range us {
		m := s.maps[u.Pin]
		if !counted(m.Type()) {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		n, err := CountEntries(m)
		if err != nil {
			// Keep the last count of the map; the job reports the error.
			return fmt.Errorf("count the entries of %s: %w", u.Pin, err)
		}
		us[i].Entries, us[i].Counted = n, time.Now()
	}
	s.usages = us
	s.publish(us)
	took := time.Since(start)
	s.next = start.Add(countDutyCycle * took)
	s.log.Debug("Counted the datapath maps' entries", "duration", took)
	return nil
}

// publish writes us into the table, if there is one.
func (s *mapSampler) publish(us MapUsages) {
	if s.table == nil {
		return
	}
	txn := s.db.WriteTxn(s.table)
	s.table.DeleteAll(txn)
	for i := range us {
		u := us[i]
		s.table.Insert(txn, &u)
	}
	txn.Commit()
}

// snapshot is the usage of the last count.
func (s *mapSampler) snapshot() MapUsages {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usages
}
