// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"syscall"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// ops reconciles the frontends table into the maps. The statedb reconciler
// calls it from one goroutine, so the registry needs no lock.
type ops struct {
	log       *slog.Logger
	db        *statedb.DB
	frontends statedb.Table[*lb.Frontend]
	capacity  capacity

	// maps is set, and the registry restored, by restore (or useFake)
	// before the reconciler starts; pinned is nil with fake maps.
	maps   mapWriter
	pinned *Maps
	reg    *registry

	// written, if set, is told of every frontend written (Hooks.Written).
	written func(lb.L3n4Addr)

	// Buffers reused from one frontend, or round, to the next.
	desired desiredService
	maglev  maglevBuilder
	steps   []step
	listed  map[netip.AddrPort]struct{}
	// The backend entries of one service, written together.
	beIDs    []uint32
	beValues []bpf.L4xdsLbBackend
	beAddrs  []netip.AddrPort
	// The steps a round finishes, and the entries it writes in batches.
	live        []*step
	batchSteps  []*step
	batchIDs    []uint32
	batchVIPs   []netip.Addr
	batchCounts []uint32
	batchKeys   []bpf.L4xdsLbSvcKey
	batchValues []bpf.L4xdsLbSvc

	// rangesReserved are the source-range map entries that the round's
	// prepared frontends will add once finished (see fits).
	rangesReserved int

	waitLogged bool
}

var (
	_ reconciler.Operations[*lb.Frontend]      = (*ops)(nil)
	_ reconciler.BatchOperations[*lb.Frontend] = (*ops)(nil)
)

func newOps(log *slog.Logger, db *statedb.DB, frontends statedb.Table[*lb.Frontend], c capacity) *ops {
	return &ops{log: log, db: db, frontends: frontends, capacity: c, listed: map[netip.AddrPort]struct{}{}}
}

// restore reads the IDs and entries of the pinned maps, so that the
// frontends get the IDs they had. An entry that cannot be restored is
// logged and left to Prune.
func (o *ops) restore(maps *Maps) error {
	o.maps, o.pinned = maps, maps
	o.reg = newRegistry(o.capacity)
	var skipped []error
	keys, values, err := collect[bpf.L4xdsLbSvcKey, bpf.L4xdsLbSvc](maps.services)
	if err != nil {
		return err
	}
	for i := range keys {
		if err := o.reg.restoreService(keys[i], values[i]); err != nil {
			skipped = append(skipped, fmt.Errorf("%s: %w", bpf.L4xdsMapL4xdsServices, err))
		}
	}
	ids, bes, err := collect[uint32, bpf.L4xdsLbBackend](maps.backends)
	if err != nil {
		return err
	}
	for i := range ids {
		if err := o.reg.restoreBackend(ids[i], bes[i]); err != nil {
			skipped = append(skipped, fmt.Errorf("%s: %w", bpf.L4xdsMapL4xdsBackends, err))
		}
	}
	ranges, _, err := collect[bpf.L4xdsLbSrcRangeKey, uint8](maps.srcRange)
	if err != nil {
		return err
	}
	for _, k := range ranges {
		if err := o.reg.restoreSourceRange(k); err != nil {
			skipped = append(skipped, fmt.Errorf("%s: %w", bpf.L4xdsMapL4xdsSrcrange, err))
		}
	}
	o.log.Info("Restored the datapath's IDs from the pinned maps",
		"services", len(o.reg.services), "backends", len(o.reg.backendIDs.used))
	if len(skipped) > 0 {
		o.log.Warn("Pinned map entries not restored; they are pruned once the frontends are known",
			"entries", len(skipped), "first", skipped[0])
	}
	return nil
}

// useFake makes the reconciler write into f, starting from nothing.
func (o *ops) useFake(f *FakeMaps) {
	o.maps, o.pinned = f, nil
	o.reg = newRegistry(o.capacity)
}

// ready waits until the frontends table is initialized (the first full
// state from the control plane) before the maps are touched: until then the
// restored entries keep forwarding, and a cluster seen before its endpoints
// does not empty a live service. It reports whether the object of revision
// rev is still current (present, for a delete: absent): a stale one is
// skipped, its successor comes next.
func (o *ops) ready(ctx context.Context, txn statedb.ReadTxn, fe *lb.Frontend, rev statedb.Revision, deleted bool) (bool, error) {
	if init, _ := o.frontends.Initialized(txn); init {
		return true, nil
	}
	if init, watch := o.frontends.Initialized(o.db.ReadTxn()); !init {
		if !o.waitLogged {
			o.waitLogged = true
			o.log.Info("Datapath waits for the first full state of the frontends before changing the maps; the pinned maps keep forwarding")
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	_, curRev, found := o.frontends.Get(o.db.ReadTxn(), lb.FrontendByAddress.Query(fe.Address))
	if deleted {
		return !found, nil
	}
	return found && curRev == rev, nil
}

func (o *ops) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, fe *lb.Frontend) error {
	batch := []reconciler.BatchEntry[*lb.Frontend]{{Object: fe, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

// UpdateBatch writes a round of frontends in two halves around one insert
// of the new Maglev tables (see insertMaglevs): first each frontend's
// backends and table, then, once every table is in, each one's service
// entry and the removals.
func (o *ops) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*lb.Frontend]) {
	steps := o.steps[:0]
	o.rangesReserved = 0
	for i := range batch {
		e := &batch[i]
		ok, err := o.ready(ctx, txn, e.Object, e.Revision, false)
		if !ok || err != nil {
			e.Result = err
			continue
		}
		// A periodic refresh rewrites everything, in case the maps were
		// changed behind the agent's back.
		st := step{entry: e, force: e.Object.Status.Kind == reconciler.StatusKindRefreshing}
		if err := o.prepare(&st); err != nil {
			e.Result = fmt.Errorf("frontend %s: %w", e.Object.Address, err)
			continue
		}
		steps = append(steps, st)
	}
	o.steps = steps

	o.writeBackends(steps)
	err := o.maps.insertMaglevs()
	live := o.live[:0]
	for i := range steps {
		st := &steps[i]
		if st.failed {
			continue
		}
		if st.newTable {
			if err != nil {
				st.svc.table = tableUnknown
				st.fail(err)
				continue
			}
			st.svc.table = tableWritten
		}
		live = append(live, st)
	}
	o.finish(live)
	clear(live)
	o.live = live[:0]
	clear(o.steps)
}

// fail records the error of the step's frontend.
func (st *step) fail(err error) {
	st.entry.Result = fmt.Errorf("frontend %s: %w", st.entry.Object.Address, err)
	st.failed = true
}

// step is one frontend's update between its two halves.
type step struct {
	entry *reconciler.BatchEntry[*lb.Frontend]
	force bool
	svc   *service
	isNew bool
	// newTable: its Maglev table waits for insertMaglevs.
	newTable bool
	// What finish writes: the service entry's fields, the source ranges
	// and the number of backends of the VIP's family.
	usable          int
	flags           uint32
	affinityTimeout uint32
	// single is the one usable backend's ID when there is one and no
	// reject share: the service then has no Maglev table (every slot
	// would name it).
	single uint32
	// tableless: none or one of backends and reject share; no table.
	tableless bool
	ranges    []netip.Prefix
	// removed are the backends no longer listed.
	removed []netip.AddrPort
	// failed: entry.Result says why; finish writes no more of it.
	failed bool
	// beLo and beHi are its backend entries in the round's ops.beIDs,
	// for writeBackends: those of a service without a table.
	beLo, beHi int
	// value is the service entry finish writes.
	value bpf.L4xdsLbSvc
}

// prepare writes the frontend's backends, new ones first (a Maglev table
// names only written backends), then its Maglev table if its inputs
// changed: in place, or made for insertMaglevs.
func (o *ops) prepare(st *step) (err error) {
	fe, force := st.entry.Object, st.force
	d := &o.desired
	d.set(fe)
	o.maglev.reset()
	if err := o.fits(fe, d); err != nil {
		return err
	}
	svc, isNew, err := o.reg.service(fe.Address)
	if err != nil {
		return err
	}
	st.svc, st.isNew = svc, isNew
	defer func() {
		// The backends' weights may be ahead of the table: rewrite it.
		if err != nil {
			svc.table = tableUnknown
		}
	}()
	st.usable, st.flags, st.affinityTimeout = d.usable, d.flags, d.affinityTimeout
	entries := d.tableEntries()
	st.tableless = entries <= 1
	if len(d.ranges) > 0 || len(svc.ranges) > 0 {
		st.ranges = slices.Clone(d.ranges)
	}

	// The table changes if a backend joins it, leaves it or changes
	// weight: a backend left out of the loop below leaves it if the
	// count of those in it differs.
	changed := force || svc.table != tableWritten || svc.tableCount != uint32(entries) || svc.reject != d.reject
	lo := len(o.beIDs)
	ids, values, addrs := o.beIDs, o.beValues, o.beAddrs
	for _, want := range d.backends {
		be, err := o.reg.backend(svc, want.addr)
		if err != nil {
			unwritten(svc, addrs[lo:])
			o.beIDs, o.beValues, o.beAddrs = ids[:lo], values[:lo], addrs[:lo]
			return err
		}
		standby := want.state == lb.BackendStateActive && !want.usable
		if force || !be.written || be.state != want.state || be.standby != standby {
			v := backendToBPF(svc.id, want.addr, want.state)
			if standby {
				v.Flags |= backendFlagStandby
			}
			ids = append(ids, be.id)
			values = append(values, v)
			addrs = append(addrs, want.addr)
			be.state, be.standby, be.written = want.state, standby, true
		}
		var weight uint16
		if want.usable {
			weight = max(want.weight, 1)
			o.maglev.addAddr(be.id, want.addr, want.weight)
			if entries == 1 {
				st.single = be.id
			}
		}
		if be.weight != weight {
			be.weight, changed = weight, true
		}
		svc.backends.set(want.addr, be)
	}
	o.beIDs, o.beValues, o.beAddrs = ids, values, addrs
	switch {
	case len(ids) == lo:
	case st.tableless:
		// No table names them: written with the round's (writeBackends),
		// before any entry.
		st.beLo, st.beHi = lo, len(ids)
	default:
		// Before the table that names them.
		_, err := o.maps.putBackends(ids[lo:], values[lo:])
		o.beIDs, o.beValues, o.beAddrs = ids[:lo], values[:lo], addrs[:lo]
		if err != nil {
			unwritten(svc, addrs[lo:])
			return err
		}
	}
	// Every listed backend is in svc.backends now: any more are no longer
	// listed.
	if len(svc.backends) > len(d.backends) {
		clear(o.listed)
		for _, want := range d.backends {
			o.listed[want.addr] = struct{}{}
		}
		for _, e := range svc.backends {
			if _, ok := o.listed[e.addr]; !ok {
				st.removed = append(st.removed, e.addr)
			}
		}
	}
	// No table for none or one backend: finish deletes one left over.
	if st.tableless || !changed {
		o.maglev.reset()
		return nil
	}
	if d.reject > 0 {
		o.maglev.add(0, rejectKey, d.reject)
	}
	svc.tableCount, svc.reject = uint32(entries), d.reject
	if svc.table == tableNone {
		// A new table is built, not only made, while the reconciler goes
		// on: the build is most of a new service's time here.
		if err := o.maps.buildMaglev(svc.id, &o.maglev, o.capacity.maglevSize); err != nil {
			return err
		}
		st.newTable = true
		return nil
	}
	table := o.maglev.build(o.capacity.maglevSize)
	found, err := o.maps.rewriteMaglev(svc.id, table)
	if err != nil {
		return err
	}
	if found {
		svc.table = tableWritten
		return nil
	}
	if err := o.maps.newMaglev(svc.id, table); err != nil {
		return err
	}
	st.newTable = true
	return nil
}

// unwritten marks backends whose entries may not be written.
func unwritten(svc *service, addrs []netip.AddrPort) {
	for _, addr := range addrs {
		if i, ok := svc.backends.find(addr); ok {
			svc.backends[i].written = false
		}
	}
}

// writeBackends writes the backend entries that prepare left to the round
// (those of services without a table) in one batch. An entry that fails is
// its frontend's error: its service's other entries are not written, and
// the batch goes on with the next service's.
func (o *ops) writeBackends(steps []step) {
	ids, values := o.beIDs, o.beValues
	next := 0 // the steps before it own entries before lo
	for lo := 0; lo < len(ids); {
		n, err := o.maps.putBackends(ids[lo:], values[lo:])
		if err == nil {
			break
		}
		bad := lo + n
		for next < len(steps) && steps[next].beHi <= bad {
			next++
		}
		if next == len(steps) {
			break // no step owns it: cannot happen
		}
		st := &steps[next]
		unwritten(st.svc, o.beAddrs[st.beLo:st.beHi])
		// The backends' weights may be ahead of the table: rewrite it.
		st.svc.table = tableUnknown
		st.fail(err)
		lo = st.beHi
	}
	clear(o.beAddrs)
	o.beIDs, o.beValues, o.beAddrs = ids[:0], values[:0], o.beAddrs[:0]
}

// fits reports why a frontend's desired state does not fit the maps, before
// anything of it is allocated or written: what serves already keeps serving
// as it was, and the reconciler retries the frontend once room is made.
// Backends a change drops are freed after its new ones are written, so a
// change needs room for the new ones first.
func (o *ops) fits(fe *lb.Frontend, d *desiredService) error {
	svc := o.reg.services[fe.Address]
	if svc == nil && o.reg.serviceIDs.free() == 0 {
		return fmt.Errorf("the service map is full: it holds %d frontends; --lb-service-map-max raises the limit", o.capacity.services)
	}
	if d.tableEntries() > int(o.capacity.maglevSize) {
		return fmt.Errorf("%d usable backends do not fit a Maglev table of %d slots; --lb-maglev-table-size raises it (a prime)", d.usable, o.capacity.maglevSize)
	}
	if err := o.rangesFit(fe, svc, d); err != nil {
		return err
	}
	free := o.reg.backendIDs.free()
	if len(d.backends) <= free {
		return nil
	}
	added := 0
	for _, want := range d.backends {
		if svc == nil {
			added = len(d.backends)
			break
		}
		if _, ok := svc.backends.get(want.addr); !ok {
			added++
		}
	}
	if added > free {
		return fmt.Errorf("%d new backends do not fit the backend map: %d of its %d entries are free; --lb-backend-map-max raises the limit",
			added, free, o.capacity.backends)
	}
	return nil
}

// rangesFit reports whether the frontend's new source ranges fit the
// source-range map, with those of the round's frontends prepared before
// it, and reserves their room. A service's ranges no longer listed are
// deleted before its new ones are written (finish): they make room.
func (o *ops) rangesFit(fe *lb.Frontend, svc *service, d *desiredService) error {
	added, removed := 0, 0
	for _, p := range d.ranges {
		if svc == nil {
			added = len(d.ranges)
			break
		}
		if _, ok := svc.ranges[p]; !ok {
			added++
		}
	}
	if svc != nil && len(d.ranges) > 0 {
		for p := range svc.ranges {
			if !slices.Contains(d.ranges, p) {
				removed++
			}
		}
	}
	free := int(o.capacity.sourceRanges) - o.reg.ranges - o.rangesReserved
	if added-removed > free {
		name := ""
		if fe.Service != nil {
			name = string(fe.Service.Name)
		}
		return fmt.Errorf("service %q: source_ranges: %d new ranges do not fit the source-range map: %d of its %d entries are free",
			name, added, max(free, 0), o.capacity.sourceRanges)
	}
	o.rangesReserved += max(added-removed, 0)
	return nil
}

// finish writes the rest of a round's frontends once their tables are in:
// for each, its VIP's count, its source ranges, the service entry that
// enables them, then what is no longer listed. The VIP counts, then the
// service entries, of the whole round are written in one batch each
// (eachBatch); a write that fails is the error of its frontend alone, and
// the frontend's later writes are not made.
//
// A service with source ranges fails closed: if its ranges cannot all be
// written (or a range no longer listed deleted), its entry is removed, so
// that no client is served, rather than left admitting clients the ranges
// do not (yet, or no longer) name; the retry writes the ranges, then the
// entry.
func (o *ops) finish(steps []*step) {
	// A freed ID's counters belong to the service that had it: a new
	// service's are cleared before its entry counts anything.
	zeroSteps, ids := o.batchSteps[:0], o.batchIDs[:0]
	for _, st := range steps {
		if !st.svc.zeroed {
			zeroSteps, ids = append(zeroSteps, st), append(ids, st.svc.id)
		}
	}
	eachBatch(zeroSteps, func(lo int) (int, error) { return o.maps.zeroStats(ids[lo:]) }, func(st *step) { st.svc.zeroed = true })
	o.batchIDs = ids[:0]

	// The VIP's count changes only with a new service (or a delete); it
	// is written again while the service's entry is not (a retry).
	// Written first: until the service's entry is, packets to the VIP are
	// dropped, not passed to the stack.
	vipSteps, vips, counts := zeroSteps[:0], o.batchVIPs[:0], o.batchCounts[:0]
	for _, st := range steps {
		if st.failed {
			continue
		}
		if st.isNew || st.force || !st.svc.written {
			addr := st.svc.frontend.Addr
			vipSteps, vips, counts = append(vipSteps, st), append(vips, addr), append(counts, o.reg.vips[addr])
		}
	}
	eachBatch(vipSteps, func(lo int) (int, error) { return o.maps.putVIPs(vips[lo:], counts[lo:]) }, nil)

	entrySteps, keys, values := vipSteps[:0], o.batchKeys[:0], o.batchValues[:0]
	for _, st := range steps {
		if st.failed {
			continue
		}
		if err := o.writeRanges(st); err != nil {
			st.fail(err)
			continue
		}
		svc := st.svc
		v := bpf.L4xdsLbSvc{Id: svc.id, Flags: st.flags, Count: uint32(st.usable), AffinityTimeout: st.affinityTimeout, BackendId: st.single}
		if st.force || !svc.written || svc.value != v {
			st.value = v
			entrySteps, keys, values = append(entrySteps, st), append(keys, svc.key), append(values, v)
			continue
		}
		o.finishRest(st)
	}
	eachBatch(entrySteps, func(lo int) (int, error) { return o.maps.putServices(keys[lo:], values[lo:]) }, func(st *step) {
		st.svc.value, st.svc.written = st.value, true
		o.finishRest(st)
	})

	clear(entrySteps[:cap(entrySteps)])
	o.batchSteps, o.batchVIPs, o.batchCounts, o.batchKeys, o.batchValues = entrySteps[:0], vips[:0], counts[:0], keys[:0], values[:0]
}

// eachBatch writes one entry per step with write, which writes the entries
// from lo on as one batch: the first n of them are written, and err is the
// error of the next, whose step fails; the batch then goes on after it.
// done, if set, is called for each step whose entry is written.
func eachBatch(steps []*step, write func(lo int) (n int, err error), done func(*step)) {
	for lo := 0; lo < len(steps); {
		n, err := write(lo)
		if done != nil {
			for _, st := range steps[lo : lo+n] {
				done(st)
			}
		}
		if err == nil {
			return
		}
		steps[lo+n].fail(err)
		lo += n + 1
	}
}

// writeRanges writes the source ranges of a service that has them, the
// ones no longer listed first: they admit no one from now on, and make
// room for the new ones.
func (o *ops) writeRanges(st *step) error {
	svc, force := st.svc, st.force
	if st.flags&svcFlagSourceRanges == 0 {
		return nil
	}
	for p := range svc.ranges {
		if !slices.Contains(st.ranges, p) {
			if err := o.maps.deleteSourceRange(svc.id, p); err != nil {
				return o.closeService(svc, err)
			}
			o.reg.removeRange(svc, p)
		}
	}
	for _, p := range st.ranges {
		_, held := svc.ranges[p]
		if held && !force {
			continue
		}
		err := o.maps.putSourceRange(svc.id, p)
		// A refresh's rewrite of a range the map holds: Linux before
		// 6.14 refuses any update of a full LPM trie, the rewrite of a
		// held entry included. The entry is there, and a range missing
		// could only admit fewer clients.
		if held && errors.Is(err, syscall.ENOSPC) {
			continue
		}
		if err != nil {
			return o.closeService(svc, err)
		}
		o.reg.addRange(svc, p)
	}
	return nil
}

// finishRest writes what follows the service entry, and tells Hooks.Written.
func (o *ops) finishRest(st *step) {
	if err := o.afterEntry(st); err != nil {
		st.fail(err)
		return
	}
	if o.written != nil {
		o.written(st.entry.Object.Address)
	}
}

// afterEntry removes what the service entry no longer names.
func (o *ops) afterEntry(st *step) error {
	svc, force := st.svc, st.force
	// With count 0, or a single backend, written, the table is no longer
	// read.
	if st.tableless && (force || svc.table != tableNone) {
		if err := o.maps.deleteMaglevs([]uint32{svc.id}); err != nil {
			return err
		}
		svc.table, svc.tableCount, svc.reject = tableNone, 0, 0
	}

	// Without source ranges the entry admits every client: the ranges
	// left are no longer read.
	if st.flags&svcFlagSourceRanges == 0 {
		for p := range svc.ranges {
			if err := o.maps.deleteSourceRange(svc.id, p); err != nil {
				return err
			}
			o.reg.removeRange(svc, p)
		}
	}

	// The backends no longer listed, now that no table names them.
	for _, addr := range st.removed {
		if be, ok := svc.backends.get(addr); ok {
			if err := o.maps.deleteBackend(be.id); err != nil {
				return err
			}
			o.reg.removeBackend(svc, addr)
		}
	}
	return nil
}

// closeService removes the entry of a service whose source ranges could
// not be written, with err, the reason.
func (o *ops) closeService(svc *service, err error) error {
	if !svc.written {
		return err
	}
	if derr := o.maps.deleteService(svc.key, svc.id); derr != nil {
		return fmt.Errorf("%w; and the service could not be closed: %w", err, derr)
	}
	svc.written = false
	return fmt.Errorf("%w; the service is closed until its source ranges are written", err)
}

func (o *ops) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, fe *lb.Frontend) error {
	batch := []reconciler.BatchEntry[*lb.Frontend]{{Object: fe, Revision: rev}}
	o.DeleteBatch(ctx, txn, batch)
	return batch[0].Result
}

// DeleteBatch deletes the services of a round's frontends, their Maglev
// tables together at the end (see insertMaglevs).
func (o *ops) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*lb.Frontend]) {
	var tables []uint32
	for i := range batch {
		e := &batch[i]
		ok, err := o.ready(ctx, txn, e.Object, e.Revision, true)
		if !ok || err != nil {
			e.Result = err
			continue
		}
		svc, ok := o.reg.services[e.Object.Address]
		if !ok {
			continue
		}
		if svc.table != tableNone {
			tables = append(tables, svc.id)
		}
		if err := o.delete(svc); err != nil {
			e.Result = fmt.Errorf("frontend %s: %w", e.Object.Address, err)
		}
	}
	// A table left behind names no service any more: Prune deletes it.
	if err := o.maps.deleteMaglevs(tables); err != nil {
		o.log.Warn("Maglev tables of deleted services not deleted; pruning deletes them", "error", err)
	}
}

// delete removes a service from the maps, its entry first so that no new
// packet looks up the rest, and frees its IDs. Its Maglev table is left to
// the caller.
func (o *ops) delete(svc *service) error {
	if err := o.maps.deleteService(svc.key, svc.id); err != nil {
		return err
	}
	svc.written = false
	// From the last, so that each removal leaves the rest in place.
	for i := len(svc.backends) - 1; i >= 0; i-- {
		e := svc.backends[i]
		if err := o.maps.deleteBackend(e.id); err != nil {
			return err
		}
		o.reg.removeBackend(svc, e.addr)
	}
	for p := range svc.ranges {
		if err := o.maps.deleteSourceRange(svc.id, p); err != nil {
			return err
		}
		o.reg.removeRange(svc, p)
	}
	vip := svc.frontend.Addr
	if err := o.maps.setVIP(vip, o.reg.vips[vip]-1); err != nil {
		return err
	}
	o.reg.remove(svc)
	return nil
}

// Prune removes what no frontend accounts for: the services of frontends
// gone while the agent was down, and any entry of the maps the registry
// does not know. The reconciler calls it only once the table is
// initialized.
func (o *ops) Prune(ctx context.Context, txn statedb.ReadTxn, objects iter.Seq2[*lb.Frontend, statedb.Revision]) error {
	live := map[lb.L3n4Addr]struct{}{}
	for fe := range objects {
		live[fe.Address] = struct{}{}
	}
	var (
		errs   []error
		tables []uint32
	)
	for addr, svc := range o.reg.services {
		if _, ok := live[addr]; !ok {
			o.log.Info("Pruning a service no frontend has", "frontend", addr, "id", svc.id)
			if svc.table != tableNone {
				tables = append(tables, svc.id)
			}
			if err := o.delete(svc); err != nil {
				errs = append(errs, fmt.Errorf("frontend %s: %w", addr, err))
			}
		}
	}
	errs = append(errs, o.maps.deleteMaglevs(tables), o.pruneMaps())
	return errors.Join(errs...)
}

// pruneMaps deletes the entries the registry does not know. Fake maps
// hold only what the registry wrote.
func (o *ops) pruneMaps() error {
	if o.pinned == nil {
		return nil
	}
	var errs []error
	keys, values, err := collect[bpf.L4xdsLbSvcKey, bpf.L4xdsLbSvc](o.pinned.services)
	errs = append(errs, err)
	for i, k := range keys {
		fe, _ := svcKeyFromBPF(k)
		svc, ok := o.reg.services[fe]
		switch {
		case !ok || !svc.written:
			o.log.Info("Pruning an orphan service entry", "frontend", fe, "id", values[i].Id)
			errs = append(errs, o.maps.deleteService(k, values[i].Id))
		case svc.value != values[i]:
			errs = append(errs, o.maps.putService(svc.key, svc.value))
		}
	}

	ids, bes, err := collect[uint32, bpf.L4xdsLbBackend](o.pinned.backends)
	errs = append(errs, err)
	for i, id := range ids {
		svc, ok := o.reg.byID[bes[i].SvcId]
		if ok {
			be, known := svc.backends.get(backendAddrFromBPF(bes[i]))
			ok = known && be.id == id
		}
		if !ok {
			errs = append(errs, o.maps.deleteBackend(id))
		}
	}

	svcIDs, _, err := collect[uint32, uint32](o.pinned.maglev)
	errs = append(errs, err)
	var orphans []uint32
	for _, id := range svcIDs {
		if svc, ok := o.reg.byID[id]; !ok || svc.table == tableNone {
			orphans = append(orphans, id)
		}
	}
	errs = append(errs, o.maps.deleteMaglevs(orphans))

	ranges, _, err := collect[bpf.L4xdsLbSrcRangeKey, uint8](o.pinned.srcRange)
	errs = append(errs, err)
	for _, k := range ranges {
		p, perr := srcRangeFromBPF(k)
		svc, ok := o.reg.byID[k.SvcId]
		if ok && perr == nil {
			_, ok = svc.ranges[p]
		}
		if !ok {
			if err := o.pinned.srcRange.Delete(k); err != nil {
				errs = append(errs, fmt.Errorf("delete from %s: service %d: %w", bpf.L4xdsMapL4xdsSrcrange, k.SvcId, err))
			}
		}
	}

	vips, err := o.pinned.VIPs()
	errs = append(errs, err)
	for vip, n := range vips {
		if o.reg.vips[vip] != n {
			errs = append(errs, o.maps.setVIP(vip, o.reg.vips[vip]))
		}
	}
	for vip, n := range o.reg.vips {
		if _, ok := vips[vip]; !ok && err == nil {
			errs = append(errs, o.maps.setVIP(vip, n))
		}
	}
	return errors.Join(errs...)
}
