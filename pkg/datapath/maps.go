// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// PinDir is the directory of the pinned maps and links under the BPF
// filesystem root (--bpf-root).
const PinDir = "l4xds"

// Maps are the datapath's maps. The agent writes them through the
// reconciler; the read methods below are for inspection (l4xds-dbg, tests)
// and work on the pinned maps of a running or stopped agent (OpenPinnedMaps).
type Maps struct {
	services *ebpf.Map
	backends *ebpf.Map
	maglev   *ebpf.Map
	srcRange *ebpf.Map
	vips     *ebpf.Map
	oldVIPs  *ebpf.Map // nil when opened read-only
	stats    *ebpf.Map

	// removedVIPGrace is how long a removed VIP stays in l4xds_old_vips
	// (--lb-removed-vip-grace).
	removedVIPGrace time.Duration

	// maglevInner makes the per-service tables (nil when opened read-only).
	maglevInner *ebpf.MapSpec
	possibleCPU int

	// tables makes the new Maglev tables; slotKeys are the keys
	// 0..size-1 of a table, for filling one.
	tables   *tableMaker
	slotKeys []uint32

	// parked are the VIPs in l4xds_old_vips as far as the agent knows:
	// read from the map once, then kept with its writes. A VIP that comes
	// back is deleted from it only if parked there, which spares every new
	// VIP a delete (nil: not read yet; see parkedVIP).
	parked map[[4]uint32]struct{}

	// Buffers of the writes.
	vipKeys    [][4]uint32
	batchKeys  []uint32
	batchFDs   []uint32
	zeroCounts []bpf.L4xdsLbStats
}

func newMaps(objs *bpf.L4xdsMaps, maglevInner *ebpf.MapSpec) (*Maps, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs, for %s: %w", bpf.L4xdsMapL4xdsStats, err)
	}
	if maglevInner != nil {
		// Without BTF, making a table is one syscall rather than loading
		// and freeing a BTF blob each time; an array of u32 needs none.
		maglevInner = maglevInner.Copy()
		maglevInner.Key, maglevInner.Value = nil, nil
	}
	m := &Maps{
		services:    objs.L4xdsServices,
		backends:    objs.L4xdsBackends,
		maglev:      objs.L4xdsMaglev,
		srcRange:    objs.L4xdsSrcrange,
		vips:        objs.L4xdsVips,
		oldVIPs:     objs.L4xdsOldVips,
		stats:       objs.L4xdsStats,
		maglevInner: maglevInner,
		possibleCPU: cpus,
	}
	if maglevInner != nil {
		m.slotKeys = make([]uint32, maglevInner.MaxEntries)
		for i := range m.slotKeys {
			m.slotKeys[i] = uint32(i)
		}
	}
	return m, nil
}

// OpenPinnedMaps opens the maps pinned under <bpfRoot>/l4xds for reading.
func OpenPinnedMaps(bpfRoot string) (*Maps, error) {
	dir := filepath.Join(bpfRoot, PinDir)
	var objs bpf.L4xdsMaps
	for _, p := range []struct {
		name string
		m    **ebpf.Map
	}{
		{bpf.L4xdsMapL4xdsServices, &objs.L4xdsServices},
		{bpf.L4xdsMapL4xdsBackends, &objs.L4xdsBackends},
		{bpf.L4xdsMapL4xdsMaglev, &objs.L4xdsMaglev},
		{bpf.L4xdsMapL4xdsSrcrange, &objs.L4xdsSrcrange},
		{bpf.L4xdsMapL4xdsVips, &objs.L4xdsVips},
		{bpf.L4xdsMapL4xdsStats, &objs.L4xdsStats},
	} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, p.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			objs.Close() // closing a nil *ebpf.Map is a no-op
			return nil, fmt.Errorf("open pinned map %s: %w", p.name, err)
		}
		*p.m = m
	}
	m, err := newMaps(&objs, nil)
	if err != nil {
		objs.Close()
	}
	return m, err
}

// Close closes the handles; the pinned maps stay.
func (m *Maps) Close() error {
	if m.tables != nil {
		m.tables.stop()
	}
	return errors.Join(m.services.Close(), m.backends.Close(), m.maglev.Close(),
		m.srcRange.Close(), m.vips.Close(), m.oldVIPs.Close(), m.stats.Close())
}

//
// Reading, for inspection.
//

// ServiceEntry is an entry of l4xds_services.
type ServiceEntry struct {
	Frontend        lb.L3n4Addr
	ID              uint32
	SourceRanges    bool // only clients in the service's source ranges
	Affinity        bool
	AffinityTimeout time.Duration
	// Count is the number of backends for new flows: 0 rejects new
	// flows.
	Count uint32
	// Backend is, with Count 1, that backend's ID: the service has no
	// Maglev table. 0: new flows follow the Maglev table.
	Backend uint32
}

// BackendEntry is an entry of l4xds_backends.
type BackendEntry struct {
	ID        uint32
	Address   netip.AddrPort
	State     lb.BackendState
	ServiceID uint32
}

// SourceRangeEntry is an entry of l4xds_srcrange.
type SourceRangeEntry struct {
	ServiceID uint32
	Prefix    netip.Prefix
}

// Stats are a service's counters, summed over the CPUs (index 0: what no
// service can be charged with).
type Stats struct {
	Packets, Bytes uint64
	// Drops by reason.
	Drops [NumDropReasons]uint64
}

// DropReason indexes Stats.Drops: LB_DROP_* of bpf/l4xds.h.
type DropReason int

const (
	DropNoBackend DropReason = iota
	DropSourceRange
	DropUnknownPort
	DropFragment
	DropMalformed
	DropBackendFamily
	DropProtocol
	DropICMP
	DropIPv6Extension
	DropRemovedVIP
	// DropRejectLimit: refused as DropNoBackend, but over the reject
	// limit (--lb-reject-rate, --lb-reject-burst): no reject sent.
	DropRejectLimit
	NumDropReasons
)

// The programs count as many drop reasons as named here.
var _ [NumDropReasons]uint64 = bpf.L4xdsLbStats{}.Drops

var dropReasonNames = [NumDropReasons]string{"no backend", "source range", "unknown port", "fragment", "malformed", "backend family",
	"protocol", "icmp", "ipv6 extension", "removed vip", "reject limit"}

func (r DropReason) String() string {
	if r >= 0 && r < NumDropReasons {
		return dropReasonNames[r]
	}
	return fmt.Sprintf("reason %d", int(r))
}

// collect returns the entries of a map; iterating a hash map while
// deleting from it may skip entries, so the callers that delete collect
// first.
func collect[K, V any](m *ebpf.Map) (keys []K, values []V, err error) {
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys, values = append(keys, k), append(values, v)
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("iterate %s: %w", mapName(m), err)
	}
	return keys, values, nil
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return m.String()
}

// Services returns the entries of l4xds_services. An error ends the
// sequence.
func (m *Maps) Services() iter.Seq2[ServiceEntry, error] {
	return func(yield func(ServiceEntry, error) bool) {
		keys, values, err := collect[bpf.L4xdsLbSvcKey, bpf.L4xdsLbSvc](m.services)
		if err != nil {
			yield(ServiceEntry{}, err)
			return
		}
		for i, k := range keys {
			fe, err := svcKeyFromBPF(k)
			if err != nil {
				err = fmt.Errorf("%s: service %d: %w", bpf.L4xdsMapL4xdsServices, values[i].Id, err)
			}
			v := values[i]
			e := ServiceEntry{
				Frontend:        fe,
				ID:              v.Id,
				SourceRanges:    v.Flags&svcFlagSourceRanges != 0,
				Affinity:        v.Flags&svcFlagAffinity != 0,
				AffinityTimeout: time.Duration(v.AffinityTimeout) * time.Second,
				Count:           v.Count,
				Backend:         v.BackendId,
			}
			if !yield(e, err) || err != nil {
				return
			}
		}
	}
}

// Backends returns the entries of l4xds_backends. An error ends the
// sequence.
func (m *Maps) Backends() iter.Seq2[BackendEntry, error] {
	return func(yield func(BackendEntry, error) bool) {
		keys, values, err := collect[uint32, bpf.L4xdsLbBackend](m.backends)
		if err != nil {
			yield(BackendEntry{}, err)
			return
		}
		for i, id := range keys {
			v := values[i]
			e := BackendEntry{ID: id, Address: backendAddrFromBPF(v), State: lb.BackendState(v.State), ServiceID: v.SvcId}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// SourceRanges returns the entries of l4xds_srcrange. An error ends the
// sequence.
func (m *Maps) SourceRanges() iter.Seq2[SourceRangeEntry, error] {
	return func(yield func(SourceRangeEntry, error) bool) {
		keys, _, err := collect[bpf.L4xdsLbSrcRangeKey, uint8](m.srcRange)
		if err != nil {
			yield(SourceRangeEntry{}, err)
			return
		}
		for _, k := range keys {
			p, err := srcRangeFromBPF(k)
			if !yield(SourceRangeEntry{ServiceID: k.SvcId, Prefix: p}, err) || err != nil {
				return
			}
		}
	}
}

// VIPs returns l4xds_vips: the number of services of each VIP.
func (m *Maps) VIPs() (map[netip.Addr]uint32, error) {
	keys, counts, err := collect[[4]uint32, uint32](m.vips)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]uint32, len(keys))
	for i, k := range keys {
		out[addrFromBPF(k)] = counts[i]
	}
	return out, nil
}

// MaglevTable returns the Maglev table of a service: the backend ID of
// each slot. ok is false when the service has none.
func (m *Maps) MaglevTable(svcID uint32) (table []uint32, ok bool, err error) {
	var inner *ebpf.Map
	if err := m.maglev.Lookup(svcID, &inner); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("%s: service %d: %w", bpf.L4xdsMapL4xdsMaglev, svcID, err)
	}
	defer inner.Close()
	table = make([]uint32, inner.MaxEntries())
	for i := range table {
		if err := inner.Lookup(uint32(i), &table[i]); err != nil {
			return nil, false, fmt.Errorf("%s: service %d: slot %d: %w", bpf.L4xdsMapL4xdsMaglev, svcID, i, err)
		}
	}
	return table, true, nil
}

// MaglevServiceIDs returns the IDs of the services that have a Maglev
// table in l4xds_maglev: one that no service of l4xds_services has is a
// table the agent left behind.
func (m *Maps) MaglevServiceIDs() ([]uint32, error) {
	// From user space a map-in-map's value is the inner map's ID.
	ids, _, err := collect[uint32, uint32](m.maglev)
	return ids, err
}

// ServiceStats returns a service's counters summed over the CPUs.
func (m *Maps) ServiceStats(svcID uint32) (Stats, error) {
	var perCPU []bpf.L4xdsLbStats
	if err := m.stats.Lookup(svcID, &perCPU); err != nil {
		return Stats{}, fmt.Errorf("%s: service %d: %w", bpf.L4xdsMapL4xdsStats, svcID, err)
	}
	var s Stats
	for _, c := range perCPU {
		s.Packets += c.Packets
		s.Bytes += c.Bytes
		for i, d := range c.Drops {
			s.Drops[i] += d
		}
	}
	return s, nil
}

//
// Writing, for the reconciler. Errors name the map and the entry.
//

// mapWriter is what the reconciler writes through: *Maps, or FakeMaps where
// there are no BPF maps (benchmarks without root).
type mapWriter interface {
	putService(key bpf.L4xdsLbSvcKey, v bpf.L4xdsLbSvc) error
	deleteService(key bpf.L4xdsLbSvcKey, id uint32) error
	putBackends(ids []uint32, values []bpf.L4xdsLbBackend) (n int, err error)
	deleteBackend(id uint32) error
	newMaglev(svcID uint32, table []uint32) error
	buildMaglev(svcID uint32, b *maglevBuilder, size uint32) error
	insertMaglevs() error
	rewriteMaglev(svcID uint32, table []uint32) (found bool, err error)
	deleteMaglevs(svcIDs []uint32) error
	putSourceRange(svcID uint32, p netip.Prefix) error
	deleteSourceRange(svcID uint32, p netip.Prefix) error
	setVIP(vip netip.Addr, n uint32) error
	// zeroStats clears the counters of service IDs, as the batches above.
	zeroStats(svcIDs []uint32) (n int, err error)
	// The writes of many services in one batch: the first n entries
	// are written, and err is entry n's error (n < len(keys)); the rest
	// are not tried. See eachBatch.
	putServices(keys []bpf.L4xdsLbSvcKey, values []bpf.L4xdsLbSvc) (n int, err error)
	putVIPs(vips []netip.Addr, counts []uint32) (n int, err error)
}

var _ mapWriter = (*Maps)(nil)

func (m *Maps) putService(key bpf.L4xdsLbSvcKey, v bpf.L4xdsLbSvc) error {
	if err := m.services.Put(&key, &v); err != nil {
		return fmt.Errorf("write %s: service %d: %w", bpf.L4xdsMapL4xdsServices, v.Id, full(m.services, err))
	}
	return nil
}

// putServices writes the entries of a round's services in one syscall
// (where the kernel has batch operations), the rest as putService.
func (m *Maps) putServices(keys []bpf.L4xdsLbSvcKey, values []bpf.L4xdsLbSvc) (int, error) {
	return batchPut(m.services, keys, values,
		func(i int) error { return m.putService(keys[i], values[i]) },
		func(i int, err error) error {
			return fmt.Errorf("write %s: service %d: %w", bpf.L4xdsMapL4xdsServices, values[i].Id, full(m.services, err))
		})
}

// batchPut writes keys with values (one value, or a CPU's worth of a
// per-CPU map's, per key) in one syscall where the kernel has batch
// operations, else one at a time with put. The first n are written; err is
// entry n's error (batchErr names the entry of a failed batch); the rest are
// not tried.
func batchPut[K any](m *ebpf.Map, keys []K, values any, put func(i int) error, batchErr func(i int, err error) error) (int, error) {
	if len(keys) > 1 {
		n, err := m.BatchUpdate(keys, values, nil)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			n = min(n, len(keys)-1)
			return n, batchErr(n, err)
		}
	}
	for i := range keys {
		if err := put(i); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

// full says that a hash map is full where the kernel's E2BIG does, an
// error cilium/ebpf words as a key too big for the map: an operator
// reading it would look for the wrong cause.
func full(m *ebpf.Map, err error) error {
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("the map is full (%d entries): %w", m.MaxEntries(), unix.E2BIG)
	}
	return err
}

func (m *Maps) deleteService(key bpf.L4xdsLbSvcKey, id uint32) error {
	if err := m.services.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: service %d: %w", bpf.L4xdsMapL4xdsServices, id, err)
	}
	return nil
}

func (m *Maps) putBackend(id uint32, v bpf.L4xdsLbBackend) error {
	if err := m.backends.Put(id, &v); err != nil {
		return fmt.Errorf("write %s: backend %s (id %d): %w", bpf.L4xdsMapL4xdsBackends, backendAddrFromBPF(v), id, full(m.backends, err))
	}
	return nil
}

// putBackends writes the entries in one batch where the kernel supports
// it: a service's hundred backends are one syscall, not a hundred. The
// first n are written; err is entry n's error.
func (m *Maps) putBackends(ids []uint32, values []bpf.L4xdsLbBackend) (int, error) {
	return batchPut(m.backends, ids, values,
		func(i int) error { return m.putBackend(ids[i], values[i]) },
		func(i int, err error) error {
			return fmt.Errorf("write %s: backend %s (id %d): %w", bpf.L4xdsMapL4xdsBackends, backendAddrFromBPF(values[i]), ids[i], full(m.backends, err))
		})
}

func (m *Maps) deleteBackend(id uint32) error {
	if err := m.backends.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: backend id %d: %w", bpf.L4xdsMapL4xdsBackends, id, err)
	}
	return nil
}

// The Maglev tables. Every write to a map of maps from user space waits
// for an RCU grace period (milliseconds), a batch of them once: a new
// service's table is made and filled by newMaglev, and inserted with the
// others of the reconciler's round by insertMaglevs. A table that exists is
// rewritten in place instead of swapped: the reconciler writes a service's
// new backends before its table and deletes the old ones after, so that
// every slot names a live backend of the service throughout, and a packet
// that sees some old slots and some new ones is served either way.

// newMaglev makes a table for svcID holding table, to be inserted by
// insertMaglevs. Making a table costs about 20 µs of kernel time (filling
// it through its memory mapping, a few of them), so tables are made on
// every CPU while the reconciler goes on; an error shows in insertMaglevs.
func (m *Maps) newMaglev(svcID uint32, table []uint32) error {
	if len(table) != len(m.slotKeys) {
		return fmt.Errorf("write %s: service %d: a table of %d slots, not %d", bpf.L4xdsMapL4xdsMaglev, svcID, len(table), len(m.slotKeys))
	}
	if m.tables == nil {
		m.tables = newTableMaker(m, runtime.GOMAXPROCS(0))
	}
	m.tables.make(svcID, table)
	return nil
}

// buildMaglev is newMaglev of the table of size slots of the backends
// added to b, built by a worker too; b is left reset, with buffers of its
// own.
func (m *Maps) buildMaglev(svcID uint32, b *maglevBuilder, size uint32) error {
	if int(size) != len(m.slotKeys) {
		b.reset()
		return fmt.Errorf("write %s: service %d: a table of %d slots, not %d", bpf.L4xdsMapL4xdsMaglev, svcID, size, len(m.slotKeys))
	}
	if m.tables == nil {
		m.tables = newTableMaker(m, runtime.GOMAXPROCS(0))
	}
	m.tables.build(svcID, b)
	return nil
}

// insertMaglevs inserts the tables made since the last call, replacing
// those the services had. If one of them could not be made, none is
// inserted.
func (m *Maps) insertMaglevs() error {
	if m.tables == nil {
		return nil
	}
	made, err := m.tables.wait()
	if len(made) == 0 || err != nil {
		for _, t := range made {
			t.inner.Close()
		}
		return err
	}
	defer func() {
		for _, t := range made {
			t.inner.Close()
		}
	}()
	keys, fds := m.batchKeys[:0], m.batchFDs[:0]
	for _, t := range made {
		keys, fds = append(keys, t.svcID), append(fds, uint32(t.inner.FD()))
	}
	m.batchKeys, m.batchFDs = keys, fds
	_, err = m.maglev.BatchUpdate(keys, fds, nil)
	if errors.Is(err, ebpf.ErrNotSupported) {
		for _, t := range made {
			if err = m.maglev.Put(t.svcID, t.inner); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %d tables from service %d: %w", bpf.L4xdsMapL4xdsMaglev, len(keys), keys[0], err)
	}
	return nil
}

// tableMaker builds (for buildMaglev), makes and fills tables on its
// workers, one per CPU, with a few buffers of slots and builders in
// flight.
type tableMaker struct {
	m        *Maps
	jobs     chan tableJob
	free     chan []uint32
	builders chan *maglevBuilder
	pending  sync.WaitGroup
	workers  sync.WaitGroup
	// regions are the workers' mappings of the tables they filled.
	regions []*tableRegion

	mu   sync.Mutex
	made []newTable
	err  error
}

// tableJob is a table to make: of slots, or else of the backends added
// to builder.
type tableJob struct {
	svcID   uint32
	slots   []uint32
	builder *maglevBuilder
}

type newTable struct {
	svcID uint32
	inner *ebpf.Map
}

func newTableMaker(m *Maps, workers int) *tableMaker {
	t := &tableMaker{m: m, jobs: make(chan tableJob), free: make(chan []uint32, 2*workers), builders: make(chan *maglevBuilder, 2*workers)}
	for range cap(t.free) {
		t.free <- make([]uint32, len(m.slotKeys))
		t.builders <- new(maglevBuilder)
	}
	t.workers.Add(workers)
	for range workers {
		r := &tableRegion{tableBytes: tableBytes(len(m.slotKeys))}
		t.regions = append(t.regions, r)
		go t.work(r)
	}
	return t
}

func (t *tableMaker) make(svcID uint32, table []uint32) {
	slots := <-t.free
	copy(slots, table)
	t.pending.Add(1)
	t.jobs <- tableJob{svcID: svcID, slots: slots}
}

// build hands b's backends to a worker, and b a reset builder in their
// place.
func (t *tableMaker) build(svcID uint32, b *maglevBuilder) {
	nb := <-t.builders
	*nb, *b = *b, *nb
	t.pending.Add(1)
	t.jobs <- tableJob{svcID: svcID, builder: nb}
}

func (t *tableMaker) work(r *tableRegion) {
	defer t.workers.Done()
	for j := range t.jobs {
		slots := j.slots
		if j.builder != nil {
			slots = j.builder.build(uint32(len(t.m.slotKeys)))
		}
		inner, err := ebpf.NewMap(t.m.maglevInner)
		if err == nil && len(slots) == 0 {
			inner.Close()
			err = errors.New("no backends")
		}
		if err != nil {
			err = fmt.Errorf("write %s: service %d: create table: %w", bpf.L4xdsMapL4xdsMaglev, j.svcID, err)
		} else if err = t.fill(r, inner, slots); err != nil {
			inner.Close()
			err = fmt.Errorf("write %s: service %d: fill table: %w", bpf.L4xdsMapL4xdsMaglev, j.svcID, err)
		}
		if j.builder != nil {
			t.builders <- j.builder
		} else {
			t.free <- j.slots
		}
		t.mu.Lock()
		if err != nil {
			t.err = cmp.Or(t.err, err)
		} else {
			t.made = append(t.made, newTable{j.svcID, inner})
		}
		t.mu.Unlock()
		t.pending.Done()
	}
}

// wait returns the tables made since the last wait and the first error.
// The workers are idle then: it unmaps the tables they filled.
func (t *tableMaker) wait() ([]newTable, error) {
	t.pending.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	made, err := t.made, t.err
	for _, r := range t.regions {
		if rerr := r.release(); rerr != nil && err == nil {
			err = fmt.Errorf("write %s: %w", bpf.L4xdsMapL4xdsMaglev, rerr)
		}
	}
	t.made, t.err = nil, nil
	return made, err
}

func (t *tableMaker) stop() {
	made, _ := t.wait()
	for _, nt := range made {
		nt.inner.Close()
	}
	close(t.jobs)
	t.workers.Wait()
	for _, r := range t.regions {
		r.free()
	}
}

// tableRegion is where a worker maps the new tables it fills: side by
// side in a range of addresses it reserves, so that one mapping over the
// range unmaps a round's tables with one TLB flush. Unmapping each table
// on its own flushed the TLB of every CPU that runs the agent, a
// round-trip of interrupts per table.
type tableRegion struct {
	tableBytes uintptr        // a table's mapping: its slots, page-aligned
	base       unsafe.Pointer // the reserved range; nil until the first table
	tables     int            // its room, in tables
	used       int            // the tables mapped in it
}

// regionBytes is the address range a worker reserves (no memory: it
// reserves addresses only, and the tables' pages are the kernel's).
var regionBytes uintptr = 16 << 20

// tableBytes is the size of the mapping of a table of n slots: the kernel
// lays an array's values out 8-byte aligned, from offset 0.
func tableBytes(n int) uintptr {
	return uintptr(n*slotStride+pageSize-1) &^ uintptr(pageSize-1)
}

const slotStride = 8

// fill writes values into a new table: through its mapping in the
// worker's region, or by fillArray for a table the region does not fit
// (one without BPF_F_MMAPABLE).
func (t *tableMaker) fill(r *tableRegion, inner *ebpf.Map, values []uint32) error {
	if inner.Flags()&unix.BPF_F_MMAPABLE == 0 || tableBytes(int(inner.MaxEntries())) != r.tableBytes || len(values) > int(inner.MaxEntries()) {
		return t.m.fillArray(inner, values)
	}
	return r.fill(inner, values)
}

// fill writes values into a new table through a mapping of it in the
// region. No program reads the table before it is inserted, and the
// insert follows release.
func (r *tableRegion) fill(inner *ebpf.Map, values []uint32) error {
	if r.base == nil {
		r.tables = max(1, int(regionBytes/r.tableBytes))
		base, err := unix.MmapPtr(-1, 0, nil, uintptr(r.tables)*r.tableBytes, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return fmt.Errorf("reserve addresses for the tables: %w", err)
		}
		r.base = base
	}
	if r.used == r.tables {
		if err := r.release(); err != nil {
			return err
		}
	}
	at := unsafe.Add(r.base, uintptr(r.used)*r.tableBytes)
	if _, err := unix.MmapPtr(inner.FD(), 0, at, r.tableBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		return fmt.Errorf("map the table: %w", err)
	}
	r.used++
	for i, v := range values {
		*(*uint32)(unsafe.Add(at, i*slotStride)) = v
	}
	return nil
}

// release unmaps the tables of the region (a mapped table stays allocated
// even once deleted), keeping the addresses reserved.
func (r *tableRegion) release() error {
	if r.used == 0 {
		return nil
	}
	n := uintptr(r.used) * r.tableBytes
	r.used = 0
	if _, err := unix.MmapPtr(-1, 0, r.base, n, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED); err != nil {
		return fmt.Errorf("unmap the tables: %w", err)
	}
	return nil
}

// free gives the reserved addresses back.
func (r *tableRegion) free() {
	if r.base != nil {
		unix.MunmapPtr(r.base, uintptr(r.tables)*r.tableBytes)
		r.base = nil
	}
}

// rewriteMaglev writes table over the slots of svcID's table. found is
// false when the service has none (or one of another size, from before a
// change of --lb-maglev-table-size): newMaglev replaces it.
func (m *Maps) rewriteMaglev(svcID uint32, table []uint32) (found bool, err error) {
	var inner *ebpf.Map
	if err := m.maglev.Lookup(svcID, &inner); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("write %s: service %d: open table: %w", bpf.L4xdsMapL4xdsMaglev, svcID, err)
	}
	defer inner.Close()
	if int(inner.MaxEntries()) != len(table) {
		return false, nil
	}
	if err := m.fillArray(inner, table); err != nil {
		return false, fmt.Errorf("write %s: service %d: %w", bpf.L4xdsMapL4xdsMaglev, svcID, err)
	}
	return true, nil
}

// fillArray writes values into the array map's slots 0..len-1. Safe for
// concurrent use.
func (m *Maps) fillArray(inner *ebpf.Map, values []uint32) error {
	if len(values) > len(m.slotKeys) || len(values) > int(inner.MaxEntries()) {
		return fmt.Errorf("%d slots, more than the %d of a table", len(values), min(len(m.slotKeys), int(inner.MaxEntries())))
	}
	if inner.Flags()&unix.BPF_F_MMAPABLE != 0 {
		return storeArray(inner, values)
	}
	// A table from before the tables were mappable.
	if _, err := inner.BatchUpdate(m.slotKeys[:len(values)], values, nil); err == nil {
		return nil
	} else if !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	for i, v := range values {
		if err := inner.Put(uint32(i), v); err != nil {
			return err
		}
	}
	return nil
}

// storeArray writes values into the slots of a BPF_F_MMAPABLE array of
// u32 through a memory mapping of it: stores, where a batch update costs
// the kernel about 100 ns a slot. The programs read each slot with one
// aligned 4-byte load, and each slot is written with one aligned store, so
// a packet reads the old backend ID or the new one, never a torn value;
// the munmap orders the stores before the deletion of the old backends
// that follows.
// (Not ebpf.Map.Memory: it keeps the mapping, and so the table, until the
// garbage collector unmaps it.)
func storeArray(inner *ebpf.Map, values []uint32) error {
	mem, err := unix.Mmap(inner.FD(), 0, int(tableBytes(int(inner.MaxEntries()))), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map the table: %w", err)
	}
	for i, v := range values {
		slot := (*uint32)(unsafe.Pointer(&mem[i*slotStride]))
		if *slot != v { // a rewrite leaves the slots that keep their backend
			*slot = v
		}
	}
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("unmap the table: %w", err)
	}
	return nil
}

var pageSize = os.Getpagesize()

// deleteMaglevs deletes the tables of the services, those that exist.
func (m *Maps) deleteMaglevs(svcIDs []uint32) error {
	// A batch stops at a key that does not exist: skip it, go on.
	for len(svcIDs) > 0 {
		n, err := m.maglev.BatchDelete(svcIDs, nil)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ebpf.ErrKeyNotExist):
			svcIDs = svcIDs[min(n+1, len(svcIDs)):]
		case errors.Is(err, ebpf.ErrNotSupported):
			for _, id := range svcIDs {
				if err := m.maglev.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("delete from %s: service %d: %w", bpf.L4xdsMapL4xdsMaglev, id, err)
				}
			}
			return nil
		default:
			return fmt.Errorf("delete from %s: service %d: %w", bpf.L4xdsMapL4xdsMaglev, svcIDs[min(n, len(svcIDs)-1)], err)
		}
	}
	return nil
}

func (m *Maps) putSourceRange(svcID uint32, p netip.Prefix) error {
	if err := m.srcRange.Put(srcRangeToBPF(svcID, p), uint8(1)); err != nil {
		return fmt.Errorf("write %s: service %d: %s: %w", bpf.L4xdsMapL4xdsSrcrange, svcID, p, err)
	}
	return nil
}

func (m *Maps) deleteSourceRange(svcID uint32, p netip.Prefix) error {
	if err := m.srcRange.Delete(srcRangeToBPF(svcID, p)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: service %d: %s: %w", bpf.L4xdsMapL4xdsSrcrange, svcID, p, err)
	}
	return nil
}

// setVIP writes the number of services of a VIP; 0 deletes its entry,
// and keeps the VIP in l4xds_old_vips for the grace period first, so that
// its packets are dropped throughout rather than passed to the stack.
func (m *Maps) setVIP(vip netip.Addr, n uint32) error {
	key := addrToBPF(vip)
	if n == 0 {
		if m.removedVIPGrace > 0 && m.oldVIPs != nil {
			now, err := Ktime()
			if err != nil {
				return fmt.Errorf("write %s: %s: %w", bpf.L4xdsMapL4xdsOldVips, vip, err)
			}
			if err := m.oldVIPs.Put(&key, uint64(now+m.removedVIPGrace)); err != nil {
				return fmt.Errorf("write %s: %s: %w", bpf.L4xdsMapL4xdsOldVips, vip, err)
			}
			m.park(key)
		}
		if err := m.vips.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %s: %w", bpf.L4xdsMapL4xdsVips, vip, err)
		}
		return nil
	}
	if err := m.vips.Put(&key, n); err != nil {
		return fmt.Errorf("write %s: %s: %w", bpf.L4xdsMapL4xdsVips, vip, full(m.vips, err))
	}
	// A VIP again: the program reads l4xds_vips first, the entry is only
	// left over.
	if m.oldVIPs != nil && m.parkedVIP(key) {
		if err := m.oldVIPs.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %s: %w", bpf.L4xdsMapL4xdsOldVips, vip, err)
		}
		delete(m.parked, key)
	}
	return nil
}

// putVIPs writes the counts of VIPs that have services (counts[i] > 0) in
// one syscall where it can, then takes those parked in l4xds_old_vips out
// of it, as setVIP. A VIP written before the entry that failed may be
// written again: the write is the same.
func (m *Maps) putVIPs(vips []netip.Addr, counts []uint32) (int, error) {
	keys := m.vipKeys[:0]
	for _, vip := range vips {
		keys = append(keys, addrToBPF(vip))
	}
	m.vipKeys = keys
	wrap := func(i int, err error) error {
		return fmt.Errorf("write %s: %s: %w", bpf.L4xdsMapL4xdsVips, vips[i], full(m.vips, err))
	}
	n, err := batchPut(m.vips, keys, counts,
		func(i int) error {
			if err := m.vips.Put(&keys[i], counts[i]); err != nil {
				return wrap(i, err)
			}
			return nil
		}, wrap)
	if i, perr := m.unparkVIPs(vips[:n], keys[:n]); perr != nil {
		return i, perr
	}
	return n, err
}

// unparkVIPs deletes the VIPs just written from l4xds_old_vips, those that
// are parked there: the first n are done, and err is entry n's error.
func (m *Maps) unparkVIPs(vips []netip.Addr, keys [][4]uint32) (int, error) {
	if m.oldVIPs == nil {
		return len(vips), nil
	}
	for i, key := range keys {
		if !m.parkedVIP(key) {
			continue
		}
		if err := m.oldVIPs.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return i, fmt.Errorf("delete from %s: %s: %w", bpf.L4xdsMapL4xdsOldVips, vips[i], err)
		}
		delete(m.parked, key)
	}
	return len(vips), nil
}

// parkedVIP reports whether l4xds_old_vips may hold key: what the map held
// when first asked (a previous agent's entries), and what was put since.
// Entries the LRU evicts stay in the set; their delete finds nothing. If
// the map cannot be read, every VIP may be there.
func (m *Maps) parkedVIP(key [4]uint32) bool {
	if m.parked == nil {
		keys, _, err := collect[[4]uint32, uint64](m.oldVIPs)
		if err != nil {
			return true
		}
		m.parked = make(map[[4]uint32]struct{}, len(keys))
		for _, k := range keys {
			m.parked[k] = struct{}{}
		}
	}
	_, ok := m.parked[key]
	return ok
}

// park records a VIP put in l4xds_old_vips. The set is read again from the
// map once it holds twice the map's entries: the rest were evicted.
func (m *Maps) park(key [4]uint32) {
	if m.parked == nil {
		return // read from the map, with this entry, when first asked
	}
	if len(m.parked) >= 2*int(m.oldVIPs.MaxEntries()) {
		m.parked = nil
		return
	}
	m.parked[key] = struct{}{}
}

// zeroStats clears the counters of service IDs before they are reused, in
// one syscall where it can.
func (m *Maps) zeroStats(svcIDs []uint32) (int, error) {
	if need := len(svcIDs) * m.possibleCPU; len(m.zeroCounts) < need {
		m.zeroCounts = make([]bpf.L4xdsLbStats, need)
	}
	wrap := func(i int, err error) error {
		return fmt.Errorf("write %s: service %d: %w", bpf.L4xdsMapL4xdsStats, svcIDs[i], err)
	}
	return batchPut(m.stats, svcIDs, m.zeroCounts[:len(svcIDs)*m.possibleCPU],
		func(i int) error {
			if err := m.stats.Put(svcIDs[i], m.zeroCounts[:m.possibleCPU]); err != nil {
				return wrap(i, err)
			}
			return nil
		}, wrap)
}
