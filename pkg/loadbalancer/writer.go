// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// ErrServiceNotFound: the service to delete does not exist.
var ErrServiceNotFound = errors.New("service not found")

// WriteTxn is a write transaction that holds the services, frontends and
// backends tables (and whatever else was asked for). Only the Writer makes
// them, so holding one proves the tables are locked.
type WriteTxn struct{ statedb.WriteTxn }

// Writer is the only way to change the services, frontends and backends
// tables. It keeps them consistent: every frontend belongs to an existing
// service, an address has at most one owner, and each frontend carries the
// backends of its service.
//
// Rows are immutable once written: the *Service given to
// UpsertServiceAndFrontends becomes a row and must not be modified after.
//
// The Writer's methods are called with a WriteTxn from Writer.WriteTxn; the
// table locks it holds also serialize the use of the Writer's scratch space.
type Writer struct {
	db        *statedb.DB
	services  statedb.RWTable[*Service]
	frontends statedb.RWTable[*Frontend]
	backends  statedb.RWTable[*Backend]

	// Scratch buffers, reused under the table locks.
	svcBackends []*Backend
	portBuf     []Backend
	paramsBuf   []BackendParams
	plans       []backendsPlan
	staleBuf    []*Backend
	feBuf       []*Frontend
	mergeBuf    []mergeEntry
}

// NewWriter creates the three tables, registers them with db and returns
// their writer.
func NewWriter(db *statedb.DB) (*Writer, error) {
	svcs, err := NewServicesTable(db)
	if err != nil {
		return nil, err
	}
	fes, err := NewFrontendsTable(db)
	if err != nil {
		return nil, err
	}
	bes, err := NewBackendsTable(db)
	if err != nil {
		return nil, err
	}
	return &Writer{db: db, services: svcs, frontends: fes, backends: bes}, nil
}

// WriteTxn locks the services, frontends and backends tables, plus extra.
func (w *Writer) WriteTxn(extra ...statedb.TableMeta) WriteTxn {
	tables := make([]statedb.TableMeta, 0, 3+len(extra))
	tables = append(tables, w.services, w.frontends, w.backends)
	return WriteTxn{w.db.WriteTxn(append(tables, extra...)...)}
}

// ReadTxn returns a snapshot of the database.
func (w *Writer) ReadTxn() statedb.ReadTxn { return w.db.ReadTxn() }

func (w *Writer) Services() statedb.Table[*Service]   { return w.services }
func (w *Writer) Frontends() statedb.Table[*Frontend] { return w.frontends }
func (w *Writer) Backends() statedb.Table[*Backend]   { return w.backends }

// RegisterInitializer registers an initializer on the three tables. They
// report Initialized only once every initializer called its done func: the
// datapath prunes nothing before that. Register before the hive starts.
func (w *Writer) RegisterInitializer(name string) (done func(WriteTxn)) {
	txn := w.WriteTxn()
	dones := [...]func(statedb.WriteTxn){
		w.services.RegisterInitializer(txn, name),
		w.frontends.RegisterInitializer(txn, name),
		w.backends.RegisterInitializer(txn, name),
	}
	txn.Commit()
	return func(txn WriteTxn) {
		for _, d := range dones {
			d(txn)
		}
	}
}

// UpsertServiceAndFrontends upserts svc and makes fes its exact set of
// frontends: the service's frontends not in fes are deleted. Each frontend's
// ServiceName is svc.Name and its Type defaults to LoadBalancer.
//
// If an address in fes is owned by another service, the service's name by
// another source, or the input is invalid, nothing is written and the error
// says which address, name or field; a conflict wraps ErrFrontendConflict or
// ErrServiceOwned. Unchanged rows are not rewritten.
func (w *Writer) UpsertServiceAndFrontends(txn WriteTxn, svc *Service, fes ...FrontendParams) error {
	if err := validateService(svc); err != nil {
		return err
	}
	oldSvc, _, found := w.services.Get(txn, ServiceByName.Query(svc.Name))
	if found && oldSvc.Source != svc.Source {
		return ownedError(oldSvc)
	}

	// Validate everything and find the current rows before writing anything.
	var oldBuf [4]*Frontend
	olds := oldBuf[:0]
	for i := range fes {
		fe := &fes[i]
		if err := validateFrontend(svc.Name, fe); err != nil {
			return err
		}
		for j := range i {
			if fes[j].Address == fe.Address {
				return fmt.Errorf("service %q: frontend %s: listed twice", svc.Name, fe.Address)
			}
		}
		old, _, found := w.frontends.Get(txn, FrontendByAddress.Query(fe.Address))
		if found && old.ServiceName != svc.Name {
			return fmt.Errorf("frontend %s is owned by service %q: %w", fe.Address, old.ServiceName, ErrFrontendConflict)
		}
		olds = append(olds, old) // nil when not found
	}

	svcChanged := !found || !oldSvc.equal(svc)
	if svcChanged {
		if _, _, err := w.services.Insert(txn, svc); err != nil {
			return err
		}
	} else {
		svc = oldSvc
	}

	// Frontends exist only with their service: a new service has none to
	// delete, which spares the lookup on the common path.
	if found {
		for fe := range w.frontends.List(txn, FrontendByServiceName.Query(svc.Name)) {
			if !slices.ContainsFunc(fes, func(p FrontendParams) bool { return p.Address == fe.Address }) {
				if _, _, err := w.frontends.Delete(txn, fe); err != nil {
					return err
				}
			}
		}
	}

	var svcBackends, shared []*Backend
	loaded := false
	for i, params := range fes {
		params.ServiceName = svc.Name
		if params.Type == "" {
			params.Type = SVCTypeLoadBalancer
		}
		if old := olds[i]; !svcChanged && old != nil && old.FrontendParams == params {
			// Every backend change refreshes the frontends, so an
			// unchanged frontend has its backends already.
			continue
		}
		if !loaded {
			svcBackends, loaded = w.serviceBackends(txn, svc.Name), true
		}
		if err := w.writeFrontend(txn, svc, params, olds[i], svcBackends, &shared); err != nil {
			return err
		}
	}
	return nil
}

// CheckFrontends returns the conflict UpsertServiceAndFrontends would
// return for svc with fes, and writes nothing.
func (w *Writer) CheckFrontends(txn statedb.ReadTxn, svc *Service, fes ...FrontendParams) error {
	if old, _, found := w.services.Get(txn, ServiceByName.Query(svc.Name)); found && old.Source != svc.Source {
		return ownedError(old)
	}
	for _, fe := range fes {
		old, _, found := w.frontends.Get(txn, FrontendByAddress.Query(fe.Address))
		if found && old.ServiceName != svc.Name {
			return fmt.Errorf("frontend %s is owned by service %q: %w", fe.Address, old.ServiceName, ErrFrontendConflict)
		}
	}
	return nil
}

func ownedError(old *Service) error {
	return fmt.Errorf("service %q is source %q's: %w", old.Name, old.Source, ErrServiceOwned)
}

// DeleteServiceAndFrontends deletes the service and its frontends. Its
// backends stay: they belong to their source, which deletes them with
// SetBackends or DeleteBackendsBySource.
func (w *Writer) DeleteServiceAndFrontends(txn WriteTxn, name ServiceName) (*Service, error) {
	svc, _, found := w.services.Get(txn, ServiceByName.Query(name))
	if !found {
		return nil, fmt.Errorf("service %q: %w", name, ErrServiceNotFound)
	}
	if err := w.deleteService(txn, svc); err != nil {
		return nil, err
	}
	return svc, nil
}

func (w *Writer) deleteService(txn WriteTxn, svc *Service) error {
	for fe := range w.frontends.List(txn, FrontendByServiceName.Query(svc.Name)) {
		if _, _, err := w.frontends.Delete(txn, fe); err != nil {
			return err
		}
	}
	_, _, err := w.services.Delete(txn, svc)
	return err
}

// DeleteServicesBySource deletes the services of source and their frontends.
func (w *Writer) DeleteServicesBySource(txn WriteTxn, source Source) error {
	for svc := range w.services.All(txn) {
		if svc.Source == source {
			if err := w.deleteService(txn, svc); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetBackends replaces the backends of (name, source) with bes; none deletes
// them. The service need not exist yet: its frontends get the backends when
// it is upserted. Addresses are protocol-less (a backend serves whatever
// protocol its frontend speaks), so the protocol of bes is dropped. Weight 0
// is valid and means the backend gets no new flows.
func (w *Writer) SetBackends(txn WriteTxn, name ServiceName, source Source, bes ...BackendParams) error {
	sets := [1]ServiceBackends{{Name: name, Backends: bes}}
	var errs [1]error
	w.setBackends(txn, source, sets[:], errs[:])
	return errs[0]
}

// ServiceBackends are the backends of one service, for SetBackendsOf.
type ServiceBackends struct {
	Name     ServiceName
	Backends []BackendParams
}

// SetBackendsOf is SetBackends for each of sets, in one pass: errs[i] is
// the error of sets[i], which is then left as it was; the others are set.
//
// Many services at once cost less than one at a time: a statedb write
// transaction freezes a table's index tree whenever it is iterated (so that
// the iteration sees it unchanged), and the next insert then copies the
// nodes on its path. One service at a time iterates and inserts in turn, a
// copy of the path per service; SetBackendsOf first reads what every
// service has, then writes, and each node is copied once.
func (w *Writer) SetBackendsOf(txn WriteTxn, source Source, sets []ServiceBackends) (errs []error) {
	errs = make([]error, len(sets))
	names := make(map[ServiceName]struct{}, len(sets))
	for _, set := range sets {
		names[set.Name] = struct{}{}
	}
	if len(names) < len(sets) {
		// A service listed twice: its second set reads what the first
		// wrote, so they go one at a time.
		for i := range sets {
			w.setBackends(txn, source, sets[i:i+1], errs[i:i+1])
		}
		return errs
	}
	w.setBackends(txn, source, sets, errs)
	return errs
}

// backendsPlan is what setBackends found for one service before writing.
type backendsPlan struct {
	// stale are the rows of the source no longer listed, in
	// staleBuf[staleLo:staleHi]; fes its frontends, in feBuf[feLo:feHi].
	staleLo, staleHi int
	feLo, feHi       int
	// rows are the new or changed rows.
	rows []Backend
	// backends are the service's backends after the change, from all
	// sources, as serviceBackends returns them; set when it has frontends.
	backends []*Backend
}

// mergeEntry is one of a service's backends after the change: a row it
// keeps, or the new row rows[k].
type mergeEntry struct {
	row *Backend
	k   int
}

// setBackends sets the backends of sets (distinct services), each error in
// errs: first it validates every set and reads its rows and frontends, then
// it writes.
func (w *Writer) setBackends(txn WriteTxn, source Source, sets []ServiceBackends, errs []error) {
	plans := slices.Grow(w.plans[:0], len(sets))[:len(sets)]
	staleBuf, feBuf := w.staleBuf[:0], w.feBuf[:0]
	for i := range sets {
		plans[i] = backendsPlan{}
		errs[i] = w.planBackends(txn, source, sets[i], &plans[i], &staleBuf, &feBuf)
	}
	for i := range sets {
		if errs[i] == nil {
			errs[i] = w.applyBackends(txn, sets[i].Name, &plans[i], staleBuf, feBuf)
		}
		plans[i] = backendsPlan{}
	}
	clear(staleBuf)
	clear(feBuf)
	w.plans, w.staleBuf, w.feBuf = plans[:0], staleBuf[:0], feBuf[:0]
	if cap(plans) > keptScratch {
		// A large batch (the first state of thousands of services) does
		// not leave its room behind.
		w.plans, w.staleBuf, w.feBuf = nil, nil, nil
	}
}

// keptScratch is the largest number of services whose scratch space the
// writer keeps from one batch to the next.
const keptScratch = 1024

// planBackends validates one set and finds, without writing, the rows to
// delete and to write and the frontends to refresh.
func (w *Writer) planBackends(txn WriteTxn, source Source, set ServiceBackends, plan *backendsPlan, staleBuf *[]*Backend, feBuf *[]*Frontend) error {
	name := set.Name
	if err := validateServiceName(name); err != nil {
		return err
	}
	if source == "" {
		return fmt.Errorf("service %q: backends: source is empty", name)
	}
	// A sorted copy of the backends, merged with the service's rows (which
	// the index yields sorted by address, then source), finds duplicates,
	// stale rows and changes without a map or a lookup per backend.
	news := append(w.paramsBuf[:0], set.Backends...)
	w.paramsBuf = news[:0]
	for i := range news {
		if err := validateBackend(name, &news[i]); err != nil {
			return err
		}
		news[i].Address = backendAddr(news[i].Address)
	}
	byAddress := func(a, b BackendParams) int { return a.Address.Compare(b.Address) }
	if !slices.IsSortedFunc(news, byAddress) {
		slices.SortFunc(news, byAddress)
	}
	for i := 1; i < len(news); i++ {
		if news[i].Address == news[i-1].Address {
			return fmt.Errorf("service %q: backend %s: listed twice", name, news[i].Address)
		}
	}

	// Compact news to the backends that are new or changed, note the
	// source's rows that are not in news, and list the service's backends
	// after the change.
	plan.staleLo = len(*staleBuf)
	ents := w.mergeBuf[:0]
	i, n := 0, 0
	for old := range w.backends.Prefix(txn, backendsOfService.Query(name)) {
		for ; i < len(news) && news[i].Address.Compare(old.Address) < 0; i++ {
			news[n] = news[i]
			ents = append(ents, mergeEntry{k: n})
			n++
		}
		if old.Source != source {
			ents = append(ents, mergeEntry{row: old})
			continue
		}
		if i < len(news) && news[i].Address == old.Address {
			if news[i] != old.BackendParams {
				news[n] = news[i]
				ents = append(ents, mergeEntry{k: n})
				n++
			} else {
				ents = append(ents, mergeEntry{row: old})
			}
			i++
			continue
		}
		*staleBuf = append(*staleBuf, old)
	}
	for ; i < len(news); i++ {
		news[n] = news[i]
		ents = append(ents, mergeEntry{k: n})
		n++
	}
	w.mergeBuf = ents[:0]
	defer clear(ents) // the scratch space holds no row
	plan.staleHi = len(*staleBuf)
	if n == 0 && plan.staleHi == plan.staleLo {
		return nil
	}

	// The new rows are allocated together, in a block of exactly their
	// number: a row keeps its whole block alive.
	plan.rows = make([]Backend, n)
	for j, params := range news[:n] {
		plan.rows[j] = Backend{BackendParams: params, ServiceName: name, Source: source}
	}

	plan.feLo = len(*feBuf)
	for fe := range w.frontends.List(txn, FrontendByServiceName.Query(name)) {
		*feBuf = append(*feBuf, fe)
	}
	plan.feHi = len(*feBuf)
	if plan.feHi > plan.feLo {
		plan.backends = mergedBackends(ents, plan.rows)
	}
	return nil
}

// mergedBackends resolves the entries (sorted by address) into the
// service's backends, one per address: as serviceBackends, the row of the
// first source in name order.
func mergedBackends(ents []mergeEntry, rows []Backend) []*Backend {
	row := func(e mergeEntry) *Backend {
		if e.row != nil {
			return e.row
		}
		return &rows[e.k]
	}
	n := 0
	for j := range ents {
		if j == 0 || row(ents[j]).Address != row(ents[j-1]).Address {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]*Backend, 0, n)
	for _, e := range ents {
		be := row(e)
		if last := len(out) - 1; last >= 0 && out[last].Address == be.Address {
			if be.Source < out[last].Source {
				out[last] = be
			}
			continue
		}
		out = append(out, be)
	}
	return out
}

// applyBackends writes what planBackends found.
func (w *Writer) applyBackends(txn WriteTxn, name ServiceName, plan *backendsPlan, staleBuf []*Backend, feBuf []*Frontend) error {
	for _, old := range staleBuf[plan.staleLo:plan.staleHi] {
		if _, _, err := w.backends.Delete(txn, old); err != nil {
			return fmt.Errorf("service %q: backend %s: %w", name, old.Address, err)
		}
	}
	for j := range plan.rows {
		if _, _, err := w.backends.Insert(txn, &plan.rows[j]); err != nil {
			return fmt.Errorf("service %q: backend %s: %w", name, plan.rows[j].Address, err)
		}
	}
	// The frontends share plan.backends: it is made for them.
	shared := plan.backends
	for _, fe := range feBuf[plan.feLo:plan.feHi] {
		if err := w.writeFrontend(txn, fe.Service, fe.FrontendParams, fe, plan.backends, &shared); err != nil {
			return err
		}
	}
	return nil
}

// DeleteBackendsBySource deletes the backends of source from every service.
func (w *Writer) DeleteBackendsBySource(txn WriteTxn, source Source) error {
	var affected []ServiceName
	for be := range w.backends.All(txn) {
		if be.Source != source {
			continue
		}
		if _, _, err := w.backends.Delete(txn, be); err != nil {
			return err
		}
		// Rows come sorted by service name.
		if n := len(affected); n == 0 || affected[n-1] != be.ServiceName {
			affected = append(affected, be.ServiceName)
		}
	}
	for _, name := range affected {
		if err := w.refreshFrontends(txn, name); err != nil {
			return err
		}
	}
	return nil
}

// refreshFrontends recomputes the backends of the frontends of a service.
// (Writing rows while listing them is safe: statedb iterates a frozen
// snapshot.)
func (w *Writer) refreshFrontends(txn WriteTxn, name ServiceName) error {
	var svcBackends, shared []*Backend
	loaded := false
	for fe := range w.frontends.List(txn, FrontendByServiceName.Query(name)) {
		if !loaded {
			svcBackends, loaded = w.serviceBackends(txn, name), true
		}
		if err := w.writeFrontend(txn, fe.Service, fe.FrontendParams, fe, svcBackends, &shared); err != nil {
			return err
		}
	}
	return nil
}

// serviceBackends returns the backends of a service from all sources,
// sorted by address, one per address (the first source in name order wins
// if two sources list the same address). The result lives in scratch space
// until the next call.
func (w *Writer) serviceBackends(txn statedb.ReadTxn, name ServiceName) []*Backend {
	clear(w.svcBackends)
	bes := w.svcBackends[:0]
	// The index yields the rows sorted by their primary key: address, then
	// source.
	for be := range w.backends.Prefix(txn, backendsOfService.Query(name)) {
		if n := len(bes); n > 0 && bes[n-1].Address == be.Address {
			continue
		}
		bes = append(bes, be)
	}
	w.svcBackends = bes
	return bes
}

// writeFrontend writes the frontend with params and the backends derived
// from svcBackends, unless old already has exactly those. A write resets the
// status to pending so that the datapath reconciles it. *shared caches the
// persistent copy of svcBackends across the frontends of one service.
func (w *Writer) writeFrontend(txn WriteTxn, svc *Service, params FrontendParams, old *Frontend, svcBackends []*Backend, shared *[]*Backend) error {
	unchanged := old != nil && old.Service == svc && old.FrontendParams == params
	var backends []*Backend
	if params.ServicePort == 0 || len(svcBackends) == 0 {
		if unchanged && backendsEqual(old.Backends, svcBackends) {
			return nil
		}
		if *shared == nil && len(svcBackends) > 0 {
			*shared = slices.Clone(svcBackends)
		}
		backends = *shared
	} else {
		ported := w.portBackends(svcBackends, params.ServicePort)
		if unchanged && portedEqual(old.Backends, ported) {
			return nil
		}
		block := slices.Clone(ported)
		backends = make([]*Backend, len(block))
		for i := range block {
			backends[i] = &block[i]
		}
	}

	fe := &Frontend{
		FrontendParams: params,
		Service:        svc,
		Backends:       backends,
		Status:         reconciler.StatusPending(),
	}
	_, _, err := w.frontends.Insert(txn, fe)
	return err
}

// portBackends returns copies of bes (sorted, as from serviceBackends) with
// the port replaced by port, one per address, in scratch space. Only the port
// changes, so the copies stay sorted and the addresses that differed only in
// port are adjacent: the first, the one with the lowest port, is kept.
func (w *Writer) portBackends(bes []*Backend, port uint16) []Backend {
	out := w.portBuf[:0]
	for _, be := range bes {
		if n := len(out); n > 0 && out[n-1].Address.Addr == be.Address.Addr {
			continue
		}
		c := *be
		c.Address.Port = port
		out = append(out, c)
	}
	w.portBuf = out
	return out
}

func backendsEqual(a, b []*Backend) bool {
	return slices.EqualFunc(a, b, func(x, y *Backend) bool { return x == y || *x == *y })
}

func portedEqual(a []*Backend, b []Backend) bool {
	return slices.EqualFunc(a, b, func(x *Backend, y Backend) bool { return *x == y })
}

// backendAddr is the address as stored for a backend: without protocol.
func backendAddr(a L3n4Addr) L3n4Addr {
	return NewL3n4Addr(a.Addr, a.Port, ANY)
}

//
// Validation. Errors name the service, the frontend or backend, and the field.
//

func validateServiceName(name ServiceName) error {
	if name == "" {
		return errors.New("service name is empty")
	}
	if strings.IndexByte(string(name), 0) >= 0 {
		return fmt.Errorf("service %q: name contains a NUL byte", name)
	}
	return nil
}

func validateService(svc *Service) error {
	if svc == nil {
		return errors.New("service is nil")
	}
	if err := validateServiceName(svc.Name); err != nil {
		return err
	}
	if svc.Source == "" {
		return fmt.Errorf("service %q: source is empty", svc.Name)
	}
	for _, p := range svc.SourceRanges {
		if !p.IsValid() {
			return fmt.Errorf("service %q: source range %q is not a valid prefix", svc.Name, p)
		}
	}
	if svc.SessionAffinityTimeout < 0 {
		return fmt.Errorf("service %q: session affinity timeout %s is negative", svc.Name, svc.SessionAffinityTimeout)
	}
	return nil
}

// validateAddress checks what frontend and backend addresses share.
func validateAddress(name ServiceName, kind string, a L3n4Addr) error {
	switch {
	case !a.Addr.IsValid():
		return fmt.Errorf("service %q: %s %s: address is not a valid IP", name, kind, a)
	case a.Port == 0:
		return fmt.Errorf("service %q: %s %s: port is zero", name, kind, a)
	case a.Addr.Zone() != "":
		// Keys leave the zone out: two zones would be one key.
		return fmt.Errorf("service %q: %s %s: address has a zone, which is not supported", name, kind, a)
	}
	return nil
}

func validateFrontend(name ServiceName, fe *FrontendParams) error {
	if err := validateAddress(name, "frontend", fe.Address); err != nil {
		return err
	}
	switch {
	case fe.Address.Protocol != TCP && fe.Address.Protocol != UDP:
		return fmt.Errorf("service %q: frontend %s: protocol %q is not TCP or UDP", name, fe.Address, fe.Address.Protocol)
	case fe.Address.Addr.Is4In6():
		// Keys are built from unmapped addresses; a mapped one would be a
		// second key for the same frontend.
		return fmt.Errorf("service %q: frontend %s: address is IPv4-mapped IPv6, use NewL3n4Addr", name, fe.Address)
	case fe.ServiceName != "" && fe.ServiceName != name:
		return fmt.Errorf("service %q: frontend %s: service name is %q", name, fe.Address, fe.ServiceName)
	case fe.Type != "" && fe.Type != SVCTypeLoadBalancer:
		return fmt.Errorf("service %q: frontend %s: type %q is not %s", name, fe.Address, fe.Type, SVCTypeLoadBalancer)
	}
	return nil
}

func validateBackend(name ServiceName, be *BackendParams) error {
	if err := validateAddress(name, "backend", be.Address); err != nil {
		return err
	}
	switch {
	case be.State > BackendStateMaintenance:
		return fmt.Errorf("service %q: backend %s: state %s is not valid", name, be.Address, be.State)
	}
	return nil
}
