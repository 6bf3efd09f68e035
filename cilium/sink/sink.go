// SPDX-License-Identifier: Apache-2.0

// Package sink writes the l4lb translation into Cilium's load-balancing
// tables (github.com/cilium/cilium/pkg/loadbalancer), through Cilium's own
// Writer, so that Cilium's BPF reconciler and datapath serve the xDS
// services. It is the Cilium twin of l4lb.NewTablesSink: the rules of the
// translation stay in pkg/l4lb; what is here is only how each of our rows is
// said in Cilium's vocabulary.
package sink

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/cilium/pkg/annotation"
	cmtypes "github.com/cilium/cilium/pkg/clustermesh/types"
	"github.com/cilium/cilium/pkg/datapath/tables"
	"github.com/cilium/cilium/pkg/labels"
	clb "github.com/cilium/cilium/pkg/loadbalancer"
	"github.com/cilium/cilium/pkg/loadbalancer/writer"
	"github.com/cilium/cilium/pkg/source"
	"github.com/cilium/statedb"

	"github.com/l4xds/l4xds/pkg/l4lb"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

const (
	// Source owns every row the sink writes; Cilium's other sources
	// (Kubernetes, the file reflector) are never touched.
	Source = source.Source("xds")
	// Namespace is the namespace of an xDS service whose name has none
	// (the cell gives every service one): cluster "db" is service "xds/db".
	Namespace = "xds"
)

// ServiceName is the name of an xDS service in Cilium's tables: a name
// without a namespace in Namespace.
func ServiceName(name lb.ServiceName) clb.ServiceName {
	return clb.NewServiceName(Namespace, string(name))
}

// serviceName is svc's name in Cilium's tables, in Cilium's parts: the
// translation names it "[cluster/]namespace/service" when it has a
// namespace, and says where the prefix ends.
func serviceName(svc *lb.Service) clb.ServiceName {
	if svc.Namespace == "" {
		return ServiceName(svc.Name)
	}
	prefix := svc.Namespace + "/"
	if svc.Cluster != "" {
		prefix = svc.Cluster + "/" + prefix
	}
	return clb.NewServiceNameInCluster(svc.Cluster, svc.Namespace, strings.TrimPrefix(string(svc.Name), prefix))
}

// maglev is every service's annotations, one map for all: Cilium's rows
// are immutable (a reference field is cloned before it is changed).
var maglev = map[string]string{annotation.ServiceLoadBalancingAlgorithm: clb.SVCLoadBalancingAlgorithmMaglev.String()}

// New returns the sink that writes through Cilium's Writer. cfg and
// nodeAddrs say which frontends Cilium's Writer would skip (NodePort's).
func New(w *writer.Writer, cfg clb.Config, nodeAddrs statedb.Table[tables.NodeAddress], log *slog.Logger) l4lb.Sink {
	return &Sink{w: w, cfg: cfg, nodeAddrs: nodeAddrs, log: log, services: map[lb.ServiceName]*service{}}
}

// Sink is an l4lb.Sink over Cilium's Writer.
//
// Two things our rows say that Cilium's cannot say directly are mapped:
//   - A frontend's target port (ServicePort) replaces the port of every
//     backend. Cilium selects a frontend's backends by protocol and port
//     name, so each (protocol, target port) of a service becomes a port
//     name, and each backend is written once per port name with that port.
//   - Locality priority (failover): only the lowest priority that has an
//     active backend takes new flows. Cilium has no priorities, so the
//     backends of the other priorities are written in Maintenance (kept,
//     no new flows) and rewritten when the active priority changes. So is
//     a backend of weight 0.
//
// One it cannot say at all: a reject share (RejectWeight). Cilium's Maglev
// tables name only backends, so the share goes to the backends instead,
// and the sink says so in a warning each time a service gets one.
type Sink struct {
	w         *writer.Writer
	cfg       clb.Config
	nodeAddrs statedb.Table[tables.NodeAddress]
	log       *slog.Logger
	// services remembers what each service's rows were made from, so that a
	// change of its frontends' target ports rewrites its backends. Guarded
	// by the tables' write lock: only a WriteTxn touches it.
	services map[lb.ServiceName]*service
}

type service struct {
	// name is the service's name in Cilium's tables, known once it has
	// been upserted.
	name  clb.ServiceName
	ports []portName // one per (protocol, target port) of the frontends
	// backends are the controller's, not a copy: it never changes a
	// slice it has passed.
	backends []lb.BackendParams
	reject   uint16 // the RejectWeight last written
}

// portName is one (protocol, target port) of a service: the backends its
// frontends use. Target 0 means the backend's own port.
type portName struct {
	proto  clb.L4Type
	target uint16
}

// String is the port name in Cilium's tables: "tcp", or "tcp-5353" for a
// target port.
func (p portName) String() string {
	s := strings.ToLower(p.proto)
	if p.target != 0 {
		s += "-" + strconv.Itoa(int(p.target))
	}
	return s
}

func (s *Sink) WriteTxn() l4lb.SinkTxn { return &txn{s: s, txn: s.w.WriteTxn()} }

func (s *Sink) RegisterInitializer(name string) func(l4lb.SinkTxn) {
	done := s.w.RegisterInitializer(name)
	return func(t l4lb.SinkTxn) { done(t.(*txn).txn) }
}

type txn struct {
	s   *Sink
	txn writer.WriteTxn
}

func (t *txn) Commit() { t.txn.Commit() }

// frontends are svc's frontends in Cilium's terms, and their port names.
func frontends(svc *lb.Service, name clb.ServiceName, fes []lb.FrontendParams) ([]clb.FrontendParams, []portName, error) {
	var ports []portName
	cfes := make([]clb.FrontendParams, 0, len(fes))
	for _, fe := range fes {
		proto, err := l4Type(fe.Address.Protocol)
		if err != nil {
			return nil, nil, fmt.Errorf("service %q: frontend %s: %w", svc.Name, fe.Address, err)
		}
		p := portName{proto, fe.ServicePort}
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
		cfes = append(cfes, clb.FrontendParams{
			Address:     clb.NewL3n4Addr(proto, cmtypes.AddrClusterFrom(fe.Address.Addr, 0), fe.Address.Port, clb.ScopeExternal),
			Type:        clb.SVCTypeLoadBalancer,
			ServiceName: name,
			PortName:    clb.FEPortName(p.String()),
		})
	}
	return cfes, ports, nil
}

// checkFrontends finds the service's name owned by another source (a
// Kubernetes Service, say: Cilium's writer would replace it, its frontends
// with it) or a frontend owned by another service. The errors are the
// standalone writer's, word for word.
func (t *txn) checkFrontends(name clb.ServiceName, cfes []clb.FrontendParams, fes []lb.FrontendParams) error {
	if err := t.checkOwner(name); err != nil {
		return err
	}
	for i, fe := range cfes {
		if old, _, found := t.s.w.Frontends().Get(t.txn, clb.FrontendByAddress(fe.Address)); found && !old.ServiceName.Equal(name) {
			return fmt.Errorf("frontend %s is owned by service %q: %w", fes[i].Address, owner(old.ServiceName), lb.ErrFrontendConflict)
		}
		if t.nodePort(fe.Address) {
			return fmt.Errorf("frontend %s: a node's NodePort address with a port in Cilium's NodePort range %d-%d, which Cilium's writer skips (it keeps them for NodePort services)",
				fes[i].Address, t.s.cfg.NodePortMin, t.s.cfg.NodePortMax)
		}
	}
	return nil
}

// nodePort says whether Cilium's writer would skip a LoadBalancer frontend
// at addr, silently but for a log line: a port of its NodePort range on an
// address its NodePort services listen on.
func (t *txn) nodePort(addr clb.L3n4Addr) bool {
	if addr.Port() < t.s.cfg.NodePortMin || addr.Port() > t.s.cfg.NodePortMax {
		return false
	}
	for na := range t.s.nodeAddrs.List(t.txn, tables.NodeAddressNodePortIndex.Query(true)) {
		if na.Addr == addr.AddrCluster().Addr() {
			return true
		}
	}
	return false
}

// checkOwner refuses a service name that another source's service has.
func (t *txn) checkOwner(name clb.ServiceName) error {
	if old, _, found := t.s.w.Services().Get(t.txn, clb.ServiceByName(name)); found && old.Source != Source {
		return fmt.Errorf("service %q is source %q's: %w", owner(name), old.Source, lb.ErrServiceOwned)
	}
	return nil
}

// checked is svc's name, frontends and port names in Cilium's terms, or
// why Cilium's writer must not be given them: Cilium's writer upserts the
// service before it finds a conflict in the frontends, so they are checked
// first, and a refused update changes nothing.
func (t *txn) checked(svc *lb.Service, fes []lb.FrontendParams) (clb.ServiceName, []clb.FrontendParams, []portName, error) {
	name := serviceName(svc)
	cfes, ports, err := frontends(svc, name, fes)
	if err == nil {
		err = t.checkFrontends(name, cfes, fes)
	}
	return name, cfes, ports, err
}

func (t *txn) CheckFrontends(svc *lb.Service, fes ...lb.FrontendParams) error {
	_, _, _, err := t.checked(svc, fes)
	return err
}

func (t *txn) UpsertServiceAndFrontends(svc *lb.Service, fes ...lb.FrontendParams) error {
	name, cfes, ports, err := t.checked(svc, fes)
	if err != nil {
		return err
	}
	return t.upsert(svc, name, cfes, ports)
}

// upsert writes a checked service and its frontends.
func (t *txn) upsert(svc *lb.Service, name clb.ServiceName, cfes []clb.FrontendParams, ports []portName) error {
	csvc := &clb.Service{
		Name:   name,
		Source: Source,
		// Weights take effect only with Maglev: ask for it per service
		// (honoured with --bpf-lb-algorithm-annotation).
		Annotations:            maglev,
		ExtTrafficPolicy:       clb.SVCTrafficPolicyCluster,
		IntTrafficPolicy:       clb.SVCTrafficPolicyCluster,
		SessionAffinity:        svc.SessionAffinity,
		SessionAffinityTimeout: svc.SessionAffinityTimeout,
		SourceRanges:           svc.SourceRanges,
		PortNames:              svc.PortNames,
	}
	if len(svc.Labels) > 0 {
		// With the source of Kubernetes' labels: Cilium's BGP advertisements
		// and L2 announcement policies select services by their labels'
		// K8sStringMap, which prefixes any other source to the key.
		csvc.Labels = labels.Map2Labels(svc.Labels, labels.LabelSourceK8s)
	}
	// A change of target ports rewrites the backends: make their rows
	// first as well, so that a refused update writes nothing.
	var cur service
	if st := t.s.services[svc.Name]; st != nil {
		cur = *st
	}
	rewrite := !slices.Equal(cur.ports, ports)
	var cbes []clb.Backend
	if rewrite {
		var err error
		if cbes, err = backendRows(svc.Name, cur.backends, ports); err != nil {
			return err
		}
	}
	if err := t.s.w.UpsertServiceAndFrontends(t.txn, csvc, cfes...); err != nil {
		if errors.Is(err, clb.ErrFrontendConflict) {
			err = fmt.Errorf("%w: %w", lb.ErrFrontendConflict, err)
		}
		return fmt.Errorf("service %q: %w", svc.Name, err)
	}
	st := t.s.state(svc.Name)
	st.name = name
	if svc.RejectWeight != st.reject && svc.RejectWeight > 0 {
		t.s.log.Warn("xDS service asks for a reject share that Cilium cannot serve: those new flows go to its backends instead of being refused",
			"service", svc.Name, "reject_weight", svc.RejectWeight)
	}
	st.reject = svc.RejectWeight
	if !rewrite {
		return nil
	}
	st.ports = ports
	if len(cur.backends) == 0 {
		// No rows of ours to rewrite (a new service): the writer's
		// SetBackends would only compute the frontends' backends again.
		return nil
	}
	return t.setBackends(svc.Name, cbes)
}

// UpsertNewService writes a service with its backends, the backends
// first: Cilium's writer computes a frontend's backends as it inserts it,
// and SetBackends after the frontends would write every frontend again
// (RefreshFrontends), half of what the transaction costs. Cilium's
// reconciler waits for that transaction to commit its own. A service the
// sink already has goes the usual way. A refusal (a frontend or the name
// another service or source holds, a backend Cilium cannot say) writes
// nothing; if Cilium's writer failed after the checks, the backends would
// be released and what it wrote of the service stay, as with
// l4lb.UpsertThenSetBackends.
func (t *txn) UpsertNewService(svc *lb.Service, fes []lb.FrontendParams, bes []lb.BackendParams) error {
	if st := t.s.services[svc.Name]; st != nil || len(bes) == 0 {
		return l4lb.UpsertThenSetBackends(t, svc, fes, bes)
	}
	// Refused before anything is written: backends under another
	// source's name would refresh its frontends.
	name, cfes, ports, err := t.checked(svc, fes)
	if err != nil {
		return err
	}
	cbes, err := backendRows(svc.Name, bes, ports)
	if err != nil {
		return err
	}
	if err := t.s.w.SetBackends(t.txn, name, Source, cbes...); err != nil {
		return errors.Join(fmt.Errorf("service %q: %w", svc.Name, err), t.releaseBackends(name))
	}
	if err := t.upsert(svc, name, cfes, ports); err != nil {
		return errors.Join(err, t.releaseBackends(name))
	}
	t.s.state(svc.Name).backends = bes
	return nil
}

// releaseBackends deletes the backends of ours that UpsertNewService set.
func (t *txn) releaseBackends(name clb.ServiceName) error {
	return t.s.w.SetBackends(t.txn, name, Source)
}

// owner names the service of a frontend as the standalone agent would: a
// cluster's service without a namespace by its name, any other service
// (qualified, or Kubernetes') in full.
func owner(n clb.ServiceName) string {
	if n.Namespace() == Namespace && n.Cluster() == "" {
		return n.Name()
	}
	return n.String()
}

func (t *txn) DeleteServiceAndFrontends(name lb.ServiceName) error {
	// A service of ours that another source has replaced since (a
	// Kubernetes Service of its name) is that source's to delete.
	if t.checkOwner(t.s.name(name)) == nil {
		if _, err := t.s.w.DeleteServiceAndFrontends(t.txn, t.s.name(name)); err != nil && !errors.Is(err, statedb.ErrObjectNotFound) {
			return fmt.Errorf("service %q: %w", name, err)
		}
	}
	if st := t.s.services[name]; st != nil {
		st.ports, st.reject = nil, 0
		t.s.forget(name, st)
	}
	return nil
}

func (t *txn) SetBackends(name lb.ServiceName, bes ...lb.BackendParams) error {
	if len(bes) > 0 {
		// Not into another source's service: its frontends would
		// serve them.
		if err := t.checkOwner(t.s.name(name)); err != nil {
			return err
		}
	}
	st := t.s.state(name)
	cbes, err := backendRows(name, bes, st.ports)
	if err != nil {
		t.s.forget(name, st)
		return err
	}
	st.backends = bes
	err = t.setBackends(name, cbes)
	t.s.forget(name, st)
	return err
}

// name is the Cilium name of the service: as last upserted, else as a name
// without a namespace.
func (s *Sink) name(name lb.ServiceName) clb.ServiceName {
	if st := s.services[name]; st != nil && st.name.String() != "" {
		return st.name
	}
	return ServiceName(name)
}

func (s *Sink) state(name lb.ServiceName) *service {
	st := s.services[name]
	if st == nil {
		st = &service{}
		s.services[name] = st
	}
	return st
}

func (s *Sink) forget(name lb.ServiceName, st *service) {
	if st.ports == nil && st.backends == nil && st.reject == 0 {
		delete(s.services, name)
	}
}

// backendRows are the service's backends in Cilium's rows, once per port
// name: none while it has no frontends. Made before anything is written, so
// that what Cilium cannot say refuses the update whole.
func backendRows(name lb.ServiceName, backends []lb.BackendParams, ports []portName) ([]clb.Backend, error) {
	active4, active6 := activePriority(backends, true), activePriority(backends, false)
	cbes := make([]clb.Backend, 0, len(ports)*len(backends))
	// rowOf is where each address's row is, once there are more rows than
	// linearRows: searching them all for every backend costs the square of
	// a large service's backends.
	var rowOf map[clb.L3n4Addr]int
	for _, p := range ports {
		first := len(cbes) // this port name's rows start here
		// One slice for the port's backends: rows are immutable, and an
		// append to it (below) copies, its capacity being its length.
		names := []string{p.String()}
		for _, be := range backends {
			port := be.Address.Port
			if p.target != 0 {
				port = p.target
			}
			state, err := backendState(be.State)
			if err != nil {
				return nil, fmt.Errorf("service %q: backend %s: %w", name, be.Address, err)
			}
			// No new flows without a weight, or outside the active
			// priority: kept for its flows, as Cilium's Kubernetes source
			// keeps a backend of weight 0.
			active := active6
			if be.Address.Addr.Unmap().Is4() {
				active = active4
			}
			if state == clb.BackendStateActive && (be.Weight == 0 || be.Priority != active) {
				state = clb.BackendStateMaintenance
			}
			cbe := clb.Backend{
				Address:   clb.NewL3n4Addr(p.proto, cmtypes.AddrClusterFrom(be.Address.Addr, 0), port, clb.ScopeExternal),
				PortNames: names,
				Weight:    be.Weight,
				State:     state,
				NodeName:  be.NodeName,
			}
			if be.Zone != "" {
				cbe.Zone = &clb.BackendZone{Zone: be.Zone}
			}
			// Cilium has one row, with one weight, per backend address.
			i, found := rowOf[cbe.Address]
			if rowOf == nil {
				i = slices.IndexFunc(cbes, func(o clb.Backend) bool { return o.Address == cbe.Address })
				found = i >= 0
			}
			switch {
			case !found:
				cbes = append(cbes, cbe)
				switch {
				case rowOf != nil:
					rowOf[cbe.Address] = len(cbes) - 1
				case len(cbes) > linearRows:
					rowOf = make(map[clb.L3n4Addr]int, cap(cbes))
					for j, o := range cbes {
						rowOf[o.Address] = j
					}
				}
			case i >= first:
				// The target port made two endpoints one address: one
				// backend with both shares, as the standalone datapath
				// gives it both endpoints' slots.
				mergeBackend(&cbes[i], cbe)
			case !slices.Contains(cbes[i].PortNames, names[0]):
				// Another port name has this address (the same endpoint,
				// or one whose port is this target port): one row with
				// both names.
				cbes[i].PortNames = append(cbes[i].PortNames, names[0])
			default:
				// Both, and the sum would change the weight the other
				// port name gives the backend.
				return nil, fmt.Errorf("service %q: endpoint %s becomes %s for port name %s, a backend that port names %s already have: Cilium gives a backend one weight for all its port names",
					name, be.Address, cbe.Address.StringWithProtocol(), names[0], strings.Join(cbes[i].PortNames, " and "))
			}
		}
	}
	return cbes, nil
}

// linearRows is how many rows backendRows searches one by one.
var linearRows = 16

// setBackends replaces the service's backends by rows.
func (t *txn) setBackends(name lb.ServiceName, rows []clb.Backend) error {
	if err := t.s.w.SetBackends(t.txn, t.s.name(name), Source, rows...); err != nil {
		return fmt.Errorf("service %q: %w", name, err)
	}
	return nil
}

// mergeBackend adds o's share to b, both rows of one address: the weights
// of active rows add up; a row that takes no new flows adds nothing.
func mergeBackend(b *clb.Backend, o clb.Backend) {
	switch {
	case o.State != clb.BackendStateActive:
	case b.State != clb.BackendStateActive:
		b.State, b.Weight = o.State, o.Weight
	default:
		b.Weight = uint16(min(uint32(b.Weight)+uint32(o.Weight), math.MaxUint16))
	}
}

// activePriority is the lowest priority that has an active backend with a
// weight, among the backends of one IP family (a frontend's backends are of
// its family, as in the standalone datapath); 0 when none has.
func activePriority(bes []lb.BackendParams, is4 bool) uint32 {
	best, found := uint32(0), false
	for _, be := range bes {
		if be.Address.Addr.Unmap().Is4() != is4 {
			continue
		}
		if be.State == lb.BackendStateActive && be.Weight > 0 && (!found || be.Priority < best) {
			best, found = be.Priority, true
		}
	}
	return best
}

func l4Type(t lb.L4Type) (clb.L4Type, error) {
	switch t {
	case lb.TCP:
		return clb.TCP, nil
	case lb.UDP:
		return clb.UDP, nil
	}
	return "", fmt.Errorf("protocol %q is not served", t)
}

// backendState maps our states to Cilium's. A draining backend keeps its
// flows and takes no new ones even when no backend is active: Cilium's
// TerminatingNotServing, not Terminating (which Cilium uses as a fallback).
func backendState(s lb.BackendState) (clb.BackendState, error) {
	switch s {
	case lb.BackendStateActive:
		return clb.BackendStateActive, nil
	case lb.BackendStateTerminating:
		return clb.BackendStateTerminatingNotServing, nil
	case lb.BackendStateQuarantined:
		return clb.BackendStateQuarantined, nil
	case lb.BackendStateMaintenance:
		return clb.BackendStateMaintenance, nil
	}
	return 0, fmt.Errorf("state %s has no Cilium equivalent", s)
}
