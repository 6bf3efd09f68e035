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

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// ops reconciles the frontends table into the maps. The statedb reconciler
// calls it from one goroutine, so the registry needs no lock.
type ops struct {
	log        *slog.Logger
	db         *statedb.DB
	frontends  statedb.Table[*lb.Frontend]
	maglevSize uint32

	// maps is set, and the registry restored, by restore (or useFake)
	// before the reconciler starts; pinned is nil with fake maps.
	maps   mapWriter
	pinned *Maps
	reg    *registry

	// written, if set, is told of every frontend written (Hooks.Written).
	written func(lb.L3n4Addr)

	waitLogged bool
}

var _ reconciler.Operations[*lb.Frontend] = (*ops)(nil)

func newOps(log *slog.Logger, db *statedb.DB, frontends statedb.Table[*lb.Frontend], maglevSize uint32) *ops {
	return &ops{log: log, db: db, frontends: frontends, maglevSize: maglevSize}
}

// restore reads the IDs and entries of the pinned maps, so that the
// frontends get the IDs they had. An entry that cannot be restored is
// logged and left to Prune.
func (o *ops) restore(maps *Maps) error {
	o.maps, o.pinned = maps, maps
	o.reg = newRegistry()
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
	o.reg = newRegistry()
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
	if ok, err := o.ready(ctx, txn, fe, rev, false); !ok || err != nil {
		return err
	}
	// A periodic refresh rewrites everything, in case the maps were
	// changed behind the agent's back.
	if err := o.update(fe, fe.Status.Kind == reconciler.StatusKindRefreshing); err != nil {
		return fmt.Errorf("frontend %s: %w", fe.Address, err)
	}
	if o.written != nil {
		o.written(fe.Address)
	}
	return nil
}

func (o *ops) update(fe *lb.Frontend, force bool) error {
	d := desire(fe)
	svc, isNew, err := o.reg.service(fe.Address)
	if err != nil {
		return err
	}
	if isNew {
		// A freed ID's counters belong to the service that had it.
		if err := o.maps.zeroStats(svc.id); err != nil {
			o.reg.remove(svc)
			return err
		}
	}

	// The backends first: a Maglev table names only written backends.
	for _, want := range d.backends {
		be, err := o.reg.backend(svc, want.addr)
		if err != nil {
			return err
		}
		v := backendToBPF(svc.id, want.addr, want.state)
		if force || be.value != v {
			if err := o.maps.putBackend(be.id, v); err != nil {
				return err
			}
			be.value = v
		}
	}

	table := d.maglevBackends(func(a netip.AddrPort) uint32 { return svc.backends[a].id })
	if len(table) > 0 && (force || !svc.maglevKnown || !slices.Equal(table, svc.maglev)) {
		if err := o.maps.putMaglev(svc.id, BuildMaglev(table, o.maglevSize)); err != nil {
			return err
		}
		svc.maglev, svc.maglevKnown = table, true
	}

	// New source ranges before the entry that enables them.
	for _, p := range d.ranges {
		if _, ok := svc.ranges[p]; force || !ok {
			if err := o.maps.putSourceRange(svc.id, p); err != nil {
				return err
			}
			svc.ranges[p] = struct{}{}
		}
	}

	v := bpf.L4xdsLbSvc{Id: svc.id, Flags: d.flags, Count: uint32(d.usable), AffinityTimeout: d.affinityTimeout}
	if force || !svc.written || svc.value != v {
		if err := o.maps.putService(svc.key, v); err != nil {
			return err
		}
		svc.value, svc.written = v, true
	}

	// With count 0 written, the table is no longer read.
	if len(table) == 0 && (force || !svc.maglevKnown || svc.maglev != nil) {
		if err := o.maps.deleteMaglev(svc.id); err != nil {
			return err
		}
		svc.maglev, svc.maglevKnown = nil, true
	}

	for p := range svc.ranges {
		if !slices.Contains(d.ranges, p) {
			if err := o.maps.deleteSourceRange(svc.id, p); err != nil {
				return err
			}
			delete(svc.ranges, p)
		}
	}

	if err := o.maps.setVIP(fe.Address.Addr, o.reg.vips[fe.Address.Addr]); err != nil {
		return err
	}

	// The backends no longer listed, now that no table names them.
	for addr, be := range svc.backends {
		if !slices.ContainsFunc(d.backends, func(want desiredBackend) bool { return want.addr == addr }) {
			if err := o.maps.deleteBackend(be.id); err != nil {
				return err
			}
			o.reg.removeBackend(svc, addr)
		}
	}
	return nil
}

func (o *ops) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, fe *lb.Frontend) error {
	if ok, err := o.ready(ctx, txn, fe, rev, true); !ok || err != nil {
		return err
	}
	svc, ok := o.reg.services[fe.Address]
	if !ok {
		return nil
	}
	if err := o.delete(svc); err != nil {
		return fmt.Errorf("frontend %s: %w", fe.Address, err)
	}
	return nil
}

// delete removes a service from the maps, its entry first so that no new
// packet looks up the rest, and frees its IDs.
func (o *ops) delete(svc *service) error {
	if err := o.maps.deleteService(svc.key, svc.id); err != nil {
		return err
	}
	svc.written = false
	if err := o.maps.deleteMaglev(svc.id); err != nil {
		return err
	}
	svc.maglev, svc.maglevKnown = nil, true
	for addr, be := range svc.backends {
		if err := o.maps.deleteBackend(be.id); err != nil {
			return err
		}
		o.reg.removeBackend(svc, addr)
	}
	for p := range svc.ranges {
		if err := o.maps.deleteSourceRange(svc.id, p); err != nil {
			return err
		}
		delete(svc.ranges, p)
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
	var errs []error
	for addr, svc := range o.reg.services {
		if _, ok := live[addr]; !ok {
			o.log.Info("Pruning a service no frontend has", "frontend", addr, "id", svc.id)
			if err := o.delete(svc); err != nil {
				errs = append(errs, fmt.Errorf("frontend %s: %w", addr, err))
			}
		}
	}
	errs = append(errs, o.pruneMaps())
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
			be, known := svc.backends[backendAddrFromBPF(bes[i])]
			ok = known && be.id == id
		}
		if !ok {
			errs = append(errs, o.maps.deleteBackend(id))
		}
	}

	svcIDs, _, err := collect[uint32, uint32](o.pinned.maglev)
	errs = append(errs, err)
	for _, id := range svcIDs {
		if svc, ok := o.reg.byID[id]; !ok || (svc.maglevKnown && svc.maglev == nil) {
			errs = append(errs, o.maps.deleteMaglev(id))
		}
	}

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
