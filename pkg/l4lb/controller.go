// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// NameSetter is the part of the xDS client the controller drives: the set of
// ClusterLoadAssignment names to request.
type NameSetter interface {
	SetNames(typeURL string, names []string)
}

// InitializerName is the initializer the controller registers on the
// load-balancing tables.
const InitializerName = "l4lb-xds"

// Controller turns CDS and EDS updates into services, frontends and
// backends. Each update is applied in one write transaction; a bad resource
// is rejected alone and keeps its last accepted rows.
//
// The tables are initialized (and the datapath may prune what it restored)
// once the first CDS update has been applied and every ClusterLoadAssignment
// it asks for has had an update, or was found not to exist. Until then a
// restarted agent keeps forwarding with its previous state.
//
// With a wait for new clusters (SetNewClusterWait; inside Cilium), a new EDS
// cluster whose ClusterLoadAssignment is not known yet is accepted (checked
// for conflicts, its VIPs reserved) but written only when that
// ClusterLoadAssignment arrives, is rejected or is found not to exist, in the
// same transaction as its backends, or without backends once the wait has
// passed: its frontends are programmed once, with their backends. Only new
// VIPs wait; nothing already written changes later than before.
type Controller struct {
	sink  Sink
	names NameSetter
	tr    *Translator
	log   *slog.Logger

	mu sync.Mutex
	// clusters are the accepted l4lb clusters, by cluster name.
	clusters map[string]cluster
	// owners are the clusters of the services: one each.
	owners map[loadbalancer.ServiceName]string
	// users are the clusters of each EDS name, in no order. Nearly always
	// one: a slice, not a set, costs a tenth of a small map per service.
	users map[string][]string
	// clas are the last accepted ClusterLoadAssignments of the requested
	// names, translated, so that a cluster switching to a CLA another
	// cluster already uses gets its backends at once. A name no longer
	// requested is forgotten, as the xDS client forgets it.
	clas map[string][]loadbalancer.BackendParams
	// requested are the EDS names last passed to SetNames, sorted.
	requested []string

	// Initialization: done is nil once called.
	done    func(SinkTxn)
	sawCDS  bool
	sawEDS  map[string]struct{}
	pending int // requested names not in sawEDS

	// wait is how long a new EDS cluster is held for its first
	// ClusterLoadAssignment; 0 writes it at once.
	wait time.Duration
	// held are the clusters accepted but not written yet, with the time
	// they are written without backends; reserved are their frontends'
	// addresses, so that no other cluster takes them meanwhile.
	held     map[string]time.Time
	reserved map[loadbalancer.L3n4Addr]string
	// blocked are the held clusters whose wait passed while another
	// source owned a VIP of theirs: tried again with every update, as
	// the xDS client offers a rejected resource again, since their own
	// next update may never come. Their errors are the health the
	// controller reports (SetHealth): their xDS rows say acked.
	blocked        map[string]error
	blockedChanged bool
	health, scope  cell.Health
	timer          *time.Timer
	stopped        bool

	// displaced are the written clusters whose service another source
	// took since (inside Cilium, a Kubernetes Service of its name): their
	// backends were refused and released, and are set again when their
	// service is written again.
	displaced map[string]struct{}
}

// cluster is what the controller remembers of an accepted cluster.
type cluster struct {
	// eds is its EDS name, "" for a STATIC cluster.
	eds string
	// svc and fes are its service as last written, to restore it if a
	// change of its name fails.
	svc *loadbalancer.Service
	fes []loadbalancer.FrontendParams
	// held: accepted, not written yet (Controller.held).
	held bool
}

// ErrServiceConflict: the service is named by another cluster.
var ErrServiceConflict = errors.New("service already named by another cluster")

// NewController registers the controller's initializer with sink. Its
// handlers are HandleClusters and HandleEndpoints; names receives the EDS
// names to request. It translates under DefaultConfig.
func NewController(sink Sink, names NameSetter) *Controller {
	return newController(defaultTranslator, sink, names)
}

// NewControllerWith is NewController translating under cfg.
func NewControllerWith(cfg Config, sink Sink, names NameSetter) (*Controller, error) {
	tr, err := NewTranslator(cfg)
	if err != nil {
		return nil, err
	}
	return newController(tr, sink, names), nil
}

func newController(tr *Translator, sink Sink, names NameSetter) *Controller {
	return &Controller{
		sink:      sink,
		names:     names,
		tr:        tr,
		clusters:  map[string]cluster{},
		owners:    map[loadbalancer.ServiceName]string{},
		users:     map[string][]string{},
		clas:      map[string][]loadbalancer.BackendParams{},
		done:      sink.RegisterInitializer(InitializerName),
		sawEDS:    map[string]struct{}{},
		log:       slog.New(slog.DiscardHandler),
		held:      map[string]time.Time{},
		reserved:  map[loadbalancer.L3n4Addr]string{},
		blocked:   map[string]error{},
		displaced: map[string]struct{}{},
	}
}

// SetNewClusterWait makes a new EDS cluster wait up to d for its first
// ClusterLoadAssignment before its service is written (see Controller);
// log says when a held service cannot be written. Set before the first
// update.
func (c *Controller) SetNewClusterWait(d time.Duration, log *slog.Logger) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wait = d
	if log != nil {
		c.log = log
	}
}

// SetHealth makes the controller report, in a scope of h, the held clusters
// that cannot be written (a VIP another source owns): their xDS rows say
// acked, their ClusterLoadAssignment's maybe does-not-exist. Set before the
// first update.
func (c *Controller) SetHealth(h cell.Health) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.health = h
}

// Stop ends the wait of held clusters: none is written by its deadline after
// it (an update still writes one, as the client stops after the controller).
func (c *Controller) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.timer != nil {
		c.timer.Stop()
	}
}

// ClusterHandler is HandleClusters as an xds.Handler.
func (c *Controller) ClusterHandler() xds.Handler { return xds.HandlerFunc(c.HandleClusters) }

// EndpointHandler is HandleEndpoints as an xds.Handler. A
// ClusterLoadAssignment is valid or not on its own, so it takes a large
// response in slices (xds.InSlices): each commits the services it carries,
// whole, and the decoded messages of a million endpoints are never all on
// the heap at once. With a wait for new clusters (inside Cilium, whose
// reconciler programs frontends at a pace of its own) the slices start
// small and grow (xds.InGrowingSlices), so that the reconciler starts at
// once; the standalone agent keeps the larger slices, which hold its heap
// lower. Call it after SetNewClusterWait.
func (c *Controller) EndpointHandler() xds.Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wait > 0 {
		return xds.InGrowingSlices(xds.HandlerFunc(c.HandleEndpoints))
	}
	return xds.InSlices(xds.HandlerFunc(c.HandleEndpoints))
}

// HandleClusters applies a CDS update.
func (c *Controller) HandleClusters(_ context.Context, u xds.Update) map[string]error {
	c.mu.Lock()
	defer c.mu.Unlock()

	rejected := map[string]error{}
	txn := c.sink.WriteTxn()
	// Removals first: they free the VIPs that a renamed cluster takes over.
	for _, name := range u.Removed {
		if err := c.deleteCluster(txn, name); err != nil {
			rejected[name] = err
		}
	}
	var conflicts []xds.Resource
	for _, r := range u.Upserted {
		if err := c.upsertCluster(txn, r); err != nil {
			rejected[r.Name] = err
			if errors.Is(err, loadbalancer.ErrFrontendConflict) || errors.Is(err, ErrServiceConflict) {
				conflicts = append(conflicts, r)
			}
		}
	}
	// A cluster may want a VIP or a service name that a later one in the
	// same update gives up: retry the conflicts while that makes progress. (Two clusters
	// swapping VIPs in one update still conflict.)
	for progress := true; progress && len(conflicts) > 0; {
		progress = false
		remaining := conflicts[:0]
		for _, r := range conflicts {
			if err := c.upsertCluster(txn, r); err != nil {
				rejected[r.Name] = err
				remaining = append(remaining, r)
			} else {
				delete(rejected, r.Name)
				progress = true
			}
		}
		conflicts = remaining
	}
	c.retryBlocked(txn)
	c.sawCDS = true
	c.updateNames()
	c.maybeInitialized(txn)
	txn.Commit()
	c.reportBlocked()
	return rejected
}

func (c *Controller) upsertCluster(txn SinkTxn, r xds.Resource) error {
	cl, ok := r.Message.(*clusterv3.Cluster)
	if !ok {
		return fmt.Errorf("cluster %q: message is a %T, not a Cluster", r.Name, r.Message)
	}
	spec, err := c.tr.Cluster(cl)
	if err != nil {
		return err
	}
	prev, had := c.clusters[r.Name]
	if spec == nil {
		// Not ours, or no longer ours: a cluster that lost its metadata
		// leaves nothing behind.
		if had {
			return c.deleteCluster(txn, r.Name)
		}
		return nil
	}
	if cl.GetName() != r.Name {
		return &Error{Kind: "cluster", Name: r.Name, Field: "name", Err: fmt.Errorf("%q differs from the resource name", cl.GetName())}
	}

	// One cluster per service: a second would overwrite the first's
	// frontends and backends.
	name := spec.Service.Name
	if owner, ok := c.owners[name]; ok && owner != r.Name {
		return fmt.Errorf("cluster %q: service %q is already named by cluster %q: %w", r.Name, name, owner, ErrServiceConflict)
	}
	for _, fe := range spec.Frontends {
		// Reserved by a held cluster: the same conflict as once written.
		if owner, ok := c.reserved[fe.Address]; ok && owner != r.Name {
			return fmt.Errorf("cluster %q: frontend %s is owned by service %q: %w", r.Name, fe.Address, c.clusters[owner].svc.Name, loadbalancer.ErrFrontendConflict)
		}
	}
	// A held cluster has written nothing: it is new again.
	wasHeld := had && prev.held
	if wasHeld {
		had = false
	}
	if c.holds(r.Name, spec, had) {
		if err := txn.CheckFrontends(spec.Service, spec.Frontends...); err != nil {
			return fmt.Errorf("cluster %q: %w", r.Name, err)
		}
		// An update keeps the deadline: the wait stays bounded.
		until := c.held[r.Name]
		if wasHeld {
			c.forgetCluster(r.Name, prev)
		}
		if until.IsZero() {
			until = time.Now().Add(c.wait)
		}
		c.addCluster(r.Name, cluster{eds: spec.EDSName, svc: spec.Service, fes: spec.Frontends, held: true}, until)
		return nil
	}
	renamed := had && prev.svc.Name != name
	if renamed {
		// A name or a new VIP another has is refused before anything
		// is deleted: else the old service, deleted and written again,
		// would be programmed again with every update that offers the
		// cluster again.
		fresh := slices.DeleteFunc(slices.Clone(spec.Frontends), func(fe loadbalancer.FrontendParams) bool {
			return slices.ContainsFunc(prev.fes, func(p loadbalancer.FrontendParams) bool { return p.Address == fe.Address })
		})
		if err := txn.CheckFrontends(spec.Service, fresh...); err != nil {
			return fmt.Errorf("cluster %q: %w", r.Name, err)
		}
		// Frees the VIPs the service keeps under its new name; the
		// backends stay until the new name has its frontends.
		if err := txn.DeleteServiceAndFrontends(prev.svc.Name); err != nil {
			return fmt.Errorf("cluster %q: %w", r.Name, err)
		}
	}
	// The sink checks everything before it writes, so a conflict leaves
	// this cluster's previous rows as they were.
	if err := txn.UpsertServiceAndFrontends(spec.Service, spec.Frontends...); err != nil {
		if renamed {
			// Its own VIPs were freed just above: the old service
			// goes back as it was.
			if rerr := txn.UpsertServiceAndFrontends(prev.svc, prev.fes...); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return fmt.Errorf("cluster %q: %w", r.Name, err)
	}

	switch {
	case spec.EDSName == "":
		err = txn.SetBackends(name, spec.Backends...)
	case renamed || !had || prev.eds != spec.EDSName:
		// The backends of the new CLA if known, none otherwise: the old
		// CLA's backends must not serve the new name.
		err = txn.SetBackends(name, c.clas[spec.EDSName]...)
	default:
		if _, ok := c.displaced[r.Name]; ok {
			// Written again after another source had its service:
			// the backends it refused meanwhile.
			err = txn.SetBackends(name, c.clas[spec.EDSName]...)
		}
	}
	if err == nil && renamed {
		err = txn.SetBackends(prev.svc.Name)
	}
	if err != nil {
		// The new frontends are written and their backends refused: what
		// served before comes back.
		err = fmt.Errorf("cluster %q: %w", r.Name, err)
		switch {
		case renamed:
			err = errors.Join(err, txn.DeleteServiceAndFrontends(name), txn.UpsertServiceAndFrontends(prev.svc, prev.fes...))
		case had:
			err = errors.Join(err, txn.UpsertServiceAndFrontends(prev.svc, prev.fes...))
		default:
			err = errors.Join(err, txn.DeleteServiceAndFrontends(name))
		}
		return err
	}

	if had || wasHeld {
		c.forgetCluster(r.Name, prev)
	}
	c.addCluster(r.Name, cluster{eds: spec.EDSName, svc: spec.Service, fes: spec.Frontends}, time.Time{})
	return nil
}

// holds says whether a cluster that has written nothing waits for its
// first ClusterLoadAssignment: one of an EDS name that no other cluster
// asked for, so that its answer is on its way. (Another's name has had its
// answer, or has it at once for every user.)
func (c *Controller) holds(name string, spec *ServiceSpec, had bool) bool {
	if c.wait <= 0 || had || spec.EDSName == "" {
		return false
	}
	if _, known := c.clas[spec.EDSName]; known {
		return false
	}
	return !slices.ContainsFunc(c.users[spec.EDSName], func(u string) bool { return u != name })
}

// addCluster records an accepted cluster; a held one reserves its
// frontends until it is written, at the latest at until.
func (c *Controller) addCluster(name string, cl cluster, until time.Time) {
	if cl.eds != "" {
		c.users[cl.eds] = append(c.users[cl.eds], name)
	}
	c.clusters[name] = cl
	c.owners[cl.svc.Name] = name
	if !cl.held {
		return
	}
	for _, fe := range cl.fes {
		c.reserved[fe.Address] = name
	}
	c.held[name] = until
	if c.timer == nil && !c.stopped {
		c.timer = time.AfterFunc(time.Until(until), c.writeDue)
	}
}

// forgetCluster undoes addCluster's bookkeeping of cl (not its rows).
func (c *Controller) forgetCluster(name string, cl cluster) {
	c.removeUser(cl.eds, name)
	delete(c.owners, cl.svc.Name)
	delete(c.displaced, name)
	if !cl.held {
		return
	}
	for _, fe := range cl.fes {
		if c.reserved[fe.Address] == name {
			delete(c.reserved, fe.Address)
		}
	}
	delete(c.held, name)
	c.unblock(name)
	c.shrinkHeld()
}

// shrinkHeld drops the emptied maps of the held clusters: a map keeps the
// room of its largest size, and nearly every cluster of a first state was
// held once.
func (c *Controller) shrinkHeld() {
	if len(c.held) == 0 {
		c.held = map[string]time.Time{}
	}
	if len(c.reserved) == 0 {
		c.reserved = map[loadbalancer.L3n4Addr]string{}
	}
}

// writeHeld writes a held cluster's service and frontends with bes, in
// one transaction: the datapath programs them once. On failure (another
// source took a VIP meanwhile) it stays held.
func (c *Controller) writeHeld(txn SinkTxn, name string, bes []loadbalancer.BackendParams) error {
	cl := c.clusters[name]
	var err error
	if nw, ok := txn.(newServiceWriter); ok {
		err = nw.UpsertNewService(cl.svc, cl.fes, bes)
	} else {
		err = UpsertThenSetBackends(txn, cl.svc, cl.fes, bes)
	}
	if err != nil {
		return fmt.Errorf("cluster %q: %w", name, err)
	}
	for _, fe := range cl.fes {
		delete(c.reserved, fe.Address)
	}
	delete(c.held, name)
	c.unblock(name)
	c.shrinkHeld()
	cl.held = false
	c.clusters[name] = cl
	return nil
}

// writeDue writes, without backends, the held clusters whose wait has
// passed, and waits for the next one.
func (c *Controller) writeDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	if c.stopped || len(c.held) == 0 {
		return
	}
	now := time.Now()
	var next time.Time
	txn := c.sink.WriteTxn()
	for name, until := range c.held {
		if until.After(now) {
			if next.IsZero() || until.Before(next) {
				next = until
			}
			continue
		}
		if err := c.writeHeld(txn, name, c.clas[c.clusters[name].eds]); err != nil {
			c.log.Warn("xDS cluster held for its endpoints cannot be written: retried with every update", "cluster", name, "error", err)
			// Held without a deadline: tried again with every
			// update (retryBlocked).
			delete(c.held, name)
			c.blocked[name], c.blockedChanged = err, true
			c.shrinkHeld()
		}
	}
	txn.Commit()
	c.reportBlocked()
	if !next.IsZero() {
		c.timer = time.AfterFunc(next.Sub(now), c.writeDue)
	}
}

// retryBlocked writes the blocked clusters whose VIPs are free again, with
// the backends known for them.
func (c *Controller) retryBlocked(txn SinkTxn) {
	if len(c.blocked) == 0 {
		return
	}
	for name, was := range c.blocked {
		err := c.writeHeld(txn, name, c.clas[c.clusters[name].eds])
		switch {
		case err == nil:
			c.log.Info("xDS cluster held for its endpoints written once its VIPs were free", "cluster", name)
		case err.Error() != was.Error():
			c.blocked[name], c.blockedChanged = err, true
		}
	}
	if len(c.blocked) == 0 {
		c.blocked = map[string]error{}
	}
}

func (c *Controller) unblock(name string) {
	if _, ok := c.blocked[name]; ok {
		delete(c.blocked, name)
		c.blockedChanged = true
	}
}

// reportBlocked reports the blocked clusters, if they changed: degraded
// while there are any. The scope is made with the first, so that an agent
// that never had one shows nothing.
func (c *Controller) reportBlocked() {
	if !c.blockedChanged || c.health == nil {
		return
	}
	c.blockedChanged = false
	if c.scope == nil {
		c.scope = c.health.NewScope("held-clusters")
	}
	if len(c.blocked) == 0 {
		c.scope.OK("no held xDS cluster blocked")
		return
	}
	names := slices.Sorted(maps.Keys(c.blocked))
	errs := make([]error, 0, 3)
	for _, name := range names[:min(len(names), cap(errs))] {
		errs = append(errs, c.blocked[name])
	}
	what := "1 xDS cluster held for its endpoints cannot be written"
	if len(names) > 1 {
		what = fmt.Sprintf("%d xDS clusters held for their endpoints cannot be written", len(names))
	}
	c.scope.Degraded(what, errors.Join(errs...))
}

func (c *Controller) deleteCluster(txn SinkTxn, name string) error {
	cl, had := c.clusters[name]
	if !had {
		return nil
	}
	if cl.held {
		c.forgetCluster(name, cl)
		delete(c.clusters, name)
		return nil
	}
	svc := cl.svc.Name
	if err := txn.DeleteServiceAndFrontends(svc); err != nil {
		return fmt.Errorf("cluster %q: %w", name, err)
	}
	if err := txn.SetBackends(svc); err != nil {
		return fmt.Errorf("cluster %q: %w", name, err)
	}
	c.forgetCluster(name, cl)
	delete(c.clusters, name)
	return nil
}

func (c *Controller) removeUser(edsName, cluster string) {
	if edsName == "" {
		return
	}
	users := slices.DeleteFunc(c.users[edsName], func(n string) bool { return n == cluster })
	if len(users) == 0 {
		delete(c.users, edsName)
	} else {
		c.users[edsName] = users
	}
}

// updateNames requests the EDS names of the accepted clusters, if they
// changed.
func (c *Controller) updateNames() {
	names := slices.Sorted(maps.Keys(c.users))
	if slices.Equal(names, c.requested) && c.requested != nil {
		return
	}
	if names == nil {
		names = []string{}
	}
	c.requested = names
	c.names.SetNames(xds.EndpointType, names)
	for name := range c.clas {
		if _, ok := c.users[name]; !ok {
			delete(c.clas, name)
		}
	}

	c.pending = 0
	for _, n := range names {
		if _, ok := c.sawEDS[n]; !ok {
			c.pending++
		}
	}
}

// ClustersSynced tells the controller that the first CDS response has been
// handled. The xDS client calls no handler for a response that changes
// nothing (such as a first response without clusters), so the cell calls
// this when the client reports the cluster type synced.
func (c *Controller) ClustersSynced() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		return
	}
	c.sawCDS = true
	if c.requested == nil {
		c.updateNames()
	}
	txn := c.sink.WriteTxn()
	c.maybeInitialized(txn)
	txn.Commit()
}

// HandleEndpoints applies an EDS update.
func (c *Controller) HandleEndpoints(_ context.Context, u xds.Update) map[string]error {
	c.mu.Lock()
	defer c.mu.Unlock()

	rejected := map[string]error{}
	// Translated before the transaction: its tables stay locked while it
	// is open, and a datapath's reconciler waits for them to write status.
	translated := make([]translatedCLA, len(u.Upserted))
	for i, r := range u.Upserted {
		translated[i].bes, translated[i].err = c.translateEndpoints(r)
	}
	txn := c.sink.WriteTxn()
	if many, ok := txn.(backendsOfMany); ok {
		c.upsertEndpointsOf(txn, many, u.Upserted, translated, rejected)
	} else {
		for i, r := range u.Upserted {
			// The server has answered, if badly: a broken CLA must not
			// hold back the initialization of every other service.
			c.sawEndpoints(r.Name)
			if err := c.upsertEndpoints(txn, r, translated[i]); err != nil {
				rejected[r.Name] = err
			}
		}
	}
	for _, name := range u.Removed {
		delete(c.clas, name)
		if _, err := c.setBackends(txn, name, nil, nil); err != nil {
			rejected[name] = err
		}
		c.sawEndpoints(name)
	}
	c.retryBlocked(txn)
	c.maybeInitialized(txn)
	txn.Commit()
	c.reportBlocked()
	return rejected
}

// translatedCLA is a ClusterLoadAssignment's backends, or why it has none.
type translatedCLA struct {
	bes []loadbalancer.BackendParams
	err error
}

func (c *Controller) upsertEndpoints(txn SinkTxn, r xds.Resource, t translatedCLA) error {
	bes, err := t.bes, t.err
	if err != nil {
		// Answered, if badly: a held cluster waits no longer.
		if werr := c.writeHeldUsers(txn, r.Name); werr != nil {
			return errors.Join(err, werr)
		}
		return err
	}
	old, known := c.clas[r.Name]
	c.clas[r.Name] = bes
	if refused, err := c.setBackends(txn, r.Name, bes, old); err != nil {
		if !refused {
			// Only a held cluster's VIPs or name are taken: it is
			// written with these endpoints once they are free.
			return err
		}
		// Refused: the name keeps the endpoints last accepted, those a
		// cluster that starts using it (or is renamed) gets.
		if known {
			c.clas[r.Name] = old
		} else {
			delete(c.clas, r.Name)
		}
		return err
	}
	return nil
}

// upsertEndpointsOf is upsertEndpoints for every resource of an update, the
// backends of all their written clusters set at once (a held cluster is
// written whole, as by setBackends). A resource is rejected with the first
// error of its clusters.
func (c *Controller) upsertEndpointsOf(txn SinkTxn, many backendsOfMany, upserted []xds.Resource, translated []translatedCLA, rejected map[string]error) {
	// Nearly always one cluster per resource.
	sets := make([]loadbalancer.ServiceBackends, 0, len(upserted))
	// The resource and cluster of each set.
	from := make([]struct{ eds, cluster string }, 0, len(upserted))
	for i, r := range upserted {
		// The server has answered, if badly: a broken CLA must not hold
		// back the initialization of every other service.
		c.sawEndpoints(r.Name)
		bes, err := translated[i].bes, translated[i].err
		if err != nil {
			// Answered, if badly: a held cluster waits no longer.
			rejected[r.Name] = errors.Join(err, c.writeHeldUsers(txn, r.Name))
			continue
		}
		c.clas[r.Name] = bes
		for _, name := range c.users[r.Name] {
			if c.clusters[name].held {
				// Written whole, with its backends, one transaction.
				if err := c.writeHeld(txn, name, bes); err != nil {
					rejected[r.Name] = errors.Join(rejected[r.Name], fmt.Errorf("cluster_load_assignment %q: %w", r.Name, err))
				}
				continue
			}
			sets = append(sets, loadbalancer.ServiceBackends{Name: c.clusters[name].svc.Name, Backends: bes})
			from = append(from, struct{ eds, cluster string }{r.Name, name})
		}
	}
	if len(sets) == 0 {
		return
	}
	for i, err := range many.SetBackendsOf(sets) {
		if _, seen := rejected[from[i].eds]; err != nil && !seen {
			rejected[from[i].eds] = fmt.Errorf("cluster_load_assignment %q: cluster %q: %w", from[i].eds, from[i].cluster, err)
		}
	}
}

// translateEndpoints checks and translates a ClusterLoadAssignment.
func (c *Controller) translateEndpoints(r xds.Resource) ([]loadbalancer.BackendParams, error) {
	cla, ok := r.Message.(*endpointv3.ClusterLoadAssignment)
	if !ok {
		return nil, fmt.Errorf("cluster_load_assignment %q: message is a %T, not a ClusterLoadAssignment", r.Name, r.Message)
	}
	if cla.GetClusterName() != r.Name {
		return nil, &Error{Kind: "cluster_load_assignment", Name: r.Name, Field: "cluster_name", Err: fmt.Errorf("%q differs from the resource name", cla.GetClusterName())}
	}
	return c.tr.Endpoints(cla)
}

// setBackends gives bes to every cluster of the EDS name, writing the held
// ones with them. refused says whether bes themselves were refused, not
// only a cluster's VIPs or name (taken by another source): then no cluster
// has them, those already set get back old.
func (c *Controller) setBackends(txn SinkTxn, edsName string, bes, old []loadbalancer.BackendParams) (refused bool, err error) {
	users := c.users[edsName]
	// displaced are the clusters whose service another source has: they
	// keep none.
	var displaced []string
	// undo gives old back to the written clusters among set.
	undo := func(set []string, errs []error) []error {
		for _, name := range set {
			if !c.clusters[name].held && !slices.Contains(displaced, name) {
				errs = append(errs, txn.SetBackends(c.clusters[name].svc.Name, old...))
			}
		}
		return errs
	}
	var errs []error
	for i, name := range users {
		if c.clusters[name].held {
			continue
		}
		svc := c.clusters[name].svc.Name
		if err := txn.SetBackends(svc, bes...); err != nil {
			errs = append(errs, fmt.Errorf("cluster_load_assignment %q: cluster %q: %w", edsName, name, err))
			if !takenByOther(err) {
				return true, errors.Join(undo(users[:i], errs)...)
			}
			// Another source took its service since it was written:
			// its backends are not at fault, and the other clusters
			// get them. Ours leave that service (they would serve
			// its frontends) and come back when it is ours again.
			if err := txn.SetBackends(svc); err != nil {
				errs = append(errs, fmt.Errorf("cluster_load_assignment %q: cluster %q: %w", edsName, name, err))
			}
			c.displaced[name] = struct{}{}
			displaced = append(displaced, name)
		}
	}
	for _, name := range users {
		if !c.clusters[name].held {
			continue
		}
		if err := c.writeHeld(txn, name, bes); err != nil {
			errs = append(errs, fmt.Errorf("cluster_load_assignment %q: %w", edsName, err))
			refused = refused || !takenByOther(err)
		}
	}
	if refused {
		errs = undo(users, errs)
	}
	return refused, errors.Join(errs...)
}

// takenByOther says whether err is a cluster's VIP or service name that
// another source has: its endpoints are not at fault. A held cluster is
// written once they are free (retryBlocked), a written one with its next
// change (displaced).
func takenByOther(err error) bool {
	return errors.Is(err, loadbalancer.ErrFrontendConflict) || errors.Is(err, loadbalancer.ErrServiceOwned)
}

// writeHeldUsers writes the held clusters of the EDS name with the backends
// known for it (none after a first rejected update).
func (c *Controller) writeHeldUsers(txn SinkTxn, edsName string) error {
	var errs []error
	for _, name := range c.users[edsName] {
		if c.clusters[name].held {
			if err := c.writeHeld(txn, name, c.clas[edsName]); err != nil {
				errs = append(errs, fmt.Errorf("cluster_load_assignment %q: %w", edsName, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Controller) sawEndpoints(name string) {
	if c.done == nil {
		return
	}
	if _, ok := c.sawEDS[name]; ok {
		return
	}
	c.sawEDS[name] = struct{}{}
	if _, ok := c.users[name]; ok {
		c.pending--
	}
}

// maybeInitialized marks the tables initialized once the first full state
// has arrived.
func (c *Controller) maybeInitialized(txn SinkTxn) {
	if c.done == nil || !c.sawCDS || c.pending > 0 {
		return
	}
	c.done(txn)
	c.done = nil
	c.sawEDS = nil
}
