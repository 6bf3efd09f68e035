// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// MaxServiceID is the highest service ID: the stats array has 65536 slots,
// and slot 0 is for what no service can be charged with. Backend IDs go up
// to --lb-backend-map-max; backend 0 is never used.
const MaxServiceID = 1<<16 - 1

// idPool hands out the IDs 1..max. The next ID is the first free one after
// the last handed out, wrapping, so that a just-freed ID is not reused at
// once: a conntrack entry that still names it then finds it gone rather
// than taken by another backend.
type idPool struct {
	max  uint32
	last uint32
	used map[uint32]struct{}
}

func newIDPool(max uint32) *idPool {
	return &idPool{max: max, used: map[uint32]struct{}{}}
}

func (p *idPool) acquire() (uint32, error) {
	if len(p.used) >= int(p.max) {
		return 0, fmt.Errorf("all %d IDs are in use", p.max)
	}
	id := p.last
	for {
		id = id%p.max + 1
		if _, taken := p.used[id]; !taken {
			break
		}
	}
	p.used[id] = struct{}{}
	p.last = id
	return id, nil
}

// reserve takes an ID restored from the maps; new IDs continue after the
// highest one restored.
func (p *idPool) reserve(id uint32) error {
	if id == 0 || id > p.max {
		return fmt.Errorf("ID %d is out of range 1..%d", id, p.max)
	}
	if _, taken := p.used[id]; taken {
		return fmt.Errorf("ID %d is used twice", id)
	}
	p.used[id] = struct{}{}
	p.last = max(p.last, id)
	return nil
}

func (p *idPool) release(id uint32) { delete(p.used, id) }

// free is the number of IDs not in use.
func (p *idPool) free() int { return max(int(p.max)-len(p.used), 0) }

// service is what the maps hold for one frontend, as far as the agent
// knows: written by the reconciler, or restored from the pinned maps.
type service struct {
	id       uint32
	frontend lb.L3n4Addr
	key      bpf.L4xdsLbSvcKey
	// value is the l4xds_services entry, valid when written.
	value   bpf.L4xdsLbSvc
	written bool
	// zeroed: the ID's counters are the service's, cleared when it got
	// the ID (or restored with it).
	zeroed bool
	// table says whether l4xds_maglev has a table for the service;
	// tableCount is the number of its entries: the backends of non-zero
	// backend.weight, and the reject share if its weight, reject, is not 0.
	table      tableState
	tableCount uint32
	reject     uint16
	// backends are the service's l4xds_backends entries.
	backends backendSet
	// ranges are its l4xds_srcrange entries; nil for none, as most
	// services have none.
	ranges map[netip.Prefix]struct{}
}

// addRange records a source range of the service as written.
func (r *registry) addRange(svc *service, p netip.Prefix) {
	if _, ok := svc.ranges[p]; ok {
		return
	}
	if svc.ranges == nil {
		svc.ranges = map[netip.Prefix]struct{}{}
	}
	svc.ranges[p] = struct{}{}
	r.ranges++
}

// removeRange records a source range of the service as deleted.
func (r *registry) removeRange(svc *service, p netip.Prefix) {
	if _, ok := svc.ranges[p]; ok {
		delete(svc.ranges, p)
		r.ranges--
	}
}

type tableState uint8

const (
	// tableUnknown: restored, or a write failed; the next update writes
	// the table, in place if there is one.
	tableUnknown tableState = iota
	tableNone
	tableWritten
)

// backend is an l4xds_backends entry; the rest of its value follows from
// its service and address.
type backend struct {
	id    uint32
	state lb.BackendState
	// standby is LB_BACKEND_F_STANDBY as written.
	standby bool
	written bool
	// weight is its weight in the Maglev table as written, 0 if it is not
	// in it.
	weight uint16
}

// registry holds the IDs and the agent's view of the maps. Only the
// reconciler uses it, from one goroutine.
type registry struct {
	serviceIDs *idPool
	backendIDs *idPool
	services   map[lb.L3n4Addr]*service
	byID       map[uint32]*service
	// vips counts the services of each VIP (l4xds_vips).
	vips map[netip.Addr]uint32
	// ranges counts the l4xds_srcrange entries of all services.
	ranges int
}

func newRegistry(c capacity) *registry {
	return &registry{
		serviceIDs: newIDPool(c.services),
		backendIDs: newIDPool(c.backends),
		services:   map[lb.L3n4Addr]*service{},
		byID:       map[uint32]*service{},
		vips:       map[netip.Addr]uint32{},
	}
}

// service returns the frontend's service, allocating an ID for a new one
// (isNew).
func (r *registry) service(fe lb.L3n4Addr) (svc *service, isNew bool, err error) {
	if svc, ok := r.services[fe]; ok {
		return svc, false, nil
	}
	key, err := svcKeyToBPF(fe)
	if err != nil {
		return nil, false, err
	}
	id, err := r.serviceIDs.acquire()
	if err != nil {
		return nil, false, fmt.Errorf("allocate a service ID: %w", err)
	}
	svc = r.add(id, fe, key)
	svc.table = tableNone
	return svc, true, nil
}

func (r *registry) add(id uint32, fe lb.L3n4Addr, key bpf.L4xdsLbSvcKey) *service {
	svc := &service{
		id:       id,
		frontend: fe,
		key:      key,
	}
	r.services[fe] = svc
	r.byID[id] = svc
	r.vips[fe.Addr]++
	return svc
}

// remove forgets a service and frees its IDs.
func (r *registry) remove(svc *service) {
	for _, e := range svc.backends {
		r.backendIDs.release(e.id)
	}
	r.ranges -= len(svc.ranges)
	delete(r.services, svc.frontend)
	delete(r.byID, svc.id)
	r.serviceIDs.release(svc.id)
	if r.vips[svc.frontend.Addr]--; r.vips[svc.frontend.Addr] == 0 {
		delete(r.vips, svc.frontend.Addr)
	}
}

// backend returns the service's backend at addr, allocating an ID for a
// new one. Changes to it are kept with setBackend.
func (r *registry) backend(svc *service, addr netip.AddrPort) (backend, error) {
	if be, ok := svc.backends.get(addr); ok {
		return be, nil
	}
	id, err := r.backendIDs.acquire()
	if err != nil {
		return backend{}, fmt.Errorf("backend %s: allocate a backend ID: %w", addr, err)
	}
	be := backend{id: id}
	svc.backends.set(addr, be)
	return be, nil
}

func (r *registry) removeBackend(svc *service, addr netip.AddrPort) {
	if be, ok := svc.backends.get(addr); ok {
		r.backendIDs.release(be.id)
		svc.backends.remove(addr)
	}
}

// backendSet is a service's backends sorted by address: a slice, not a
// map, because most services have a few (a map of one entry costs about
// ten times the entry), and the reconciler walks a frontend's backends in
// that order.
type backendSet []backendEntry

type backendEntry struct {
	addr netip.AddrPort
	backend
}

func (s backendSet) find(addr netip.AddrPort) (int, bool) {
	return slices.BinarySearchFunc(s, addr, func(e backendEntry, a netip.AddrPort) int { return e.addr.Compare(a) })
}

func (s backendSet) get(addr netip.AddrPort) (backend, bool) {
	if i, ok := s.find(addr); ok {
		return s[i].backend, true
	}
	return backend{}, false
}

// set adds or replaces the backend at addr.
func (s *backendSet) set(addr netip.AddrPort, be backend) {
	i, ok := s.find(addr)
	if ok {
		(*s)[i].backend = be
		return
	}
	*s = slices.Insert(*s, i, backendEntry{addr, be})
}

func (s *backendSet) remove(addr netip.AddrPort) {
	if i, ok := s.find(addr); ok {
		*s = slices.Delete(*s, i, i+1)
	}
}

//
// Restore from the pinned maps: a restarted agent keeps its IDs, so the
// entries it rewrites are the same and conntrack entries stay valid.
//

func (r *registry) restoreService(key bpf.L4xdsLbSvcKey, v bpf.L4xdsLbSvc) error {
	fe, err := svcKeyFromBPF(key)
	if err != nil {
		return fmt.Errorf("service %d: %w", v.Id, err)
	}
	if err := r.serviceIDs.reserve(v.Id); err != nil {
		return fmt.Errorf("frontend %s: service %w", fe, err)
	}
	svc := r.add(v.Id, fe, key)
	svc.value, svc.written, svc.zeroed = v, true, true
	return nil
}

// restoreBackend adds a backend to its service. A backend of no known
// service is left to Prune.
func (r *registry) restoreBackend(id uint32, v bpf.L4xdsLbBackend) error {
	addr := backendAddrFromBPF(v)
	svc, ok := r.byID[v.SvcId]
	if !ok {
		return fmt.Errorf("backend %s (id %d): service %d does not exist", addr, id, v.SvcId)
	}
	if _, dup := svc.backends.get(addr); dup {
		return fmt.Errorf("backend %s (id %d): service %d has it already", addr, id, v.SvcId)
	}
	if err := r.backendIDs.reserve(id); err != nil {
		return fmt.Errorf("backend %s: %w", addr, err)
	}
	svc.backends.set(addr, backend{id: id, state: lb.BackendState(v.State), standby: v.Flags&backendFlagStandby != 0, written: true})
	return nil
}

func (r *registry) restoreSourceRange(k bpf.L4xdsLbSrcRangeKey) error {
	p, err := srcRangeFromBPF(k)
	if err != nil {
		return err
	}
	svc, ok := r.byID[k.SvcId]
	if !ok {
		return fmt.Errorf("source range %s: service %d does not exist", p, k.SvcId)
	}
	r.addRange(svc, p)
	return nil
}
