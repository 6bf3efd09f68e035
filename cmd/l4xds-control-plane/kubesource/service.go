// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Conditions this source sets on Services.
const (
	// ConditionPortsError is KEP-1435's: True when some port of the
	// Service is not served (its status port carries the error).
	ConditionPortsError = "LoadBalancerPortsError"
	// ConditionAddress says whether the Service got its addresses.
	ConditionAddress = "l4xds.io/AddressAssigned"
)

// Port errors (status.loadBalancer.ingress[].ports[].error).
const (
	PortErrorProtocol   = "l4xds.io/ProtocolNotSupported"
	PortErrorNoNodePort = "l4xds.io/NoNodePort"
)

// Reasons of ConditionPortsError.
const (
	ReasonPortsServed   = "AllPortsServed"
	ReasonPortsNotAll   = "PortsNotServed"
	defaultAffinityTime = 10800 * time.Second // Kubernetes' default ClientIP timeout
)

// Event is an Event to record on an object when its status is written.
type Event struct {
	Type    string // corev1.EventTypeNormal or EventTypeWarning
	Reason  string
	Message string
}

// ServiceOutcome is what the source wants for one Service of its class.
type ServiceOutcome struct {
	Status corev1.ServiceStatus
	Events []Event
}

func serviceClusterName(s *corev1.Service) string {
	return "service/" + s.Namespace + "/" + s.Name
}

// ours reports whether the source serves s.
func (c Config) ours(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass != nil && *s.Spec.LoadBalancerClass == c.LoadBalancerClass
}

// byAge orders objects oldest first, then by namespace and name: the order in
// which they get addresses.
func byAge(a, b metav1.Object) int {
	if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
}

type serviceWork struct {
	svc   *corev1.Service
	h     *holder
	pool  string
	wants []*addrWant
	addrs []netip.Addr
	errs  []addrError
}

// addrWant is one address a Service wants: of a family, maybe a specific
// one (asked for or held).
type addrWant struct {
	fam      corev1.IPFamily
	addr     netip.Addr // the address asked for or held; invalid: any
	explicit bool
	done     bool
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// planServices reads what addresses each Service wants, oldest first.
func planServices(svcs []*corev1.Service) []*serviceWork {
	var work []*serviceWork
	for _, s := range svcs {
		w := &serviceWork{svc: s, pool: s.Annotations[AnnotationPool], h: &holder{
			owner:      "Service " + s.Namespace + "/" + s.Name,
			sharingKey: s.Annotations[AnnotationSharingKey],
			ports:      map[portKey]bool{},
		}}
		for _, p := range s.Spec.Ports {
			w.h.ports[portKey{p.Port, p.Protocol}] = true
		}
		work = append(work, w)
		families := s.Spec.IPFamilies
		if len(families) == 0 {
			families = []corev1.IPFamily{corev1.IPv4Protocol}
		}
		req, aerr := requestedAddrs(s.Annotations[AnnotationAddresses], s.Spec.LoadBalancerIP)
		if aerr != nil {
			w.errs = append(w.errs, *aerr)
			continue
		}
		for _, a := range req {
			if !slices.Contains(families, familyOf(a)) {
				w.errs = append(w.errs, addrError{ReasonInvalidRequest, fmt.Sprintf("%s is %s; the Service's ipFamilies are %v", a, familyOf(a), families)})
			}
		}
		if len(w.errs) > 0 {
			continue
		}
		current := map[corev1.IPFamily]netip.Addr{}
		for _, in := range s.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				current[familyOf(a.Unmap())] = a.Unmap()
			}
		}
		for i, fam := range families {
			wt := &addrWant{fam: fam, addr: current[fam]}
			for _, a := range req {
				if familyOf(a) == fam {
					wt.addr, wt.explicit = a, true
				}
			}
			if !wt.explicit && len(req) > 0 && i > 0 {
				continue // specific addresses asked for, none of this optional family
			}
			w.wants = append(w.wants, wt)
		}
	}
	return work
}

// keepHeld is the first round: the addresses the Service holds (its
// status) and still wants.
func (w *serviceWork) keepHeld(al *allocator) {
	for _, wt := range w.wants {
		cur := false
		for _, in := range w.svc.Status.LoadBalancer.Ingress {
			cur = cur || in.IP == wt.addr.String()
		}
		if wt.addr.IsValid() && cur && al.hold(wt.addr, w.h, w.pool) == nil {
			w.addrs = append(w.addrs, wt.addr)
			wt.done = true
		}
	}
}

// takeRequested is the second round: the addresses asked for.
func (w *serviceWork) takeRequested(al *allocator) {
	for _, wt := range w.wants {
		if wt.done || !wt.explicit {
			continue
		}
		wt.done = true
		if aerr := al.request(wt.addr, w.h, w.pool); aerr != nil {
			w.errs = append(w.errs, *aerr)
			continue
		}
		w.addrs = append(w.addrs, wt.addr)
	}
}

// takeNew is the last round: new addresses for what is still wanted.
func (w *serviceWork) takeNew(al *allocator) {
	for i, wt := range w.wants {
		if wt.done {
			continue
		}
		a, aerr := al.allocate(wt.fam == corev1.IPv4Protocol, w.h, w.pool)
		if aerr != nil {
			optional := i > 0 || len(w.addrs) > 0
			prefer := w.svc.Spec.IPFamilyPolicy == nil || *w.svc.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyRequireDualStack
			if optional && prefer && aerr.Reason == ReasonPoolExhausted && !al.hasFamily(wt.fam == corev1.IPv4Protocol) {
				continue // PreferDualStack without a pool of that family
			}
			w.errs = append(w.errs, *aerr)
			continue
		}
		w.addrs = append(w.addrs, a)
	}
	slices.SortFunc(w.addrs, func(a, b netip.Addr) int { return a.Compare(b) })
}

func (al *allocator) hasFamily(v4 bool) bool {
	found := false
	al.pools.each(v4, func(netip.Addr) bool { found = true; return false })
	return found
}

// endpointIndex holds the EndpointSlices by Service.
type endpointIndex map[types.NamespacedName][]*discoveryv1.EndpointSlice

func indexSlices(slices_ []*discoveryv1.EndpointSlice) endpointIndex {
	idx := endpointIndex{}
	for _, es := range slices_ {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		k := types.NamespacedName{Namespace: es.Namespace, Name: name}
		idx[k] = append(idx[k], es)
	}
	for _, l := range idx {
		slices.SortFunc(l, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	}
	return idx
}

// endpointHealth maps EndpointSlice conditions onto an xDS health status:
// ready is HEALTHY, serving and terminating DRAINING, anything else is not
// a backend (false).
func endpointHealth(c discoveryv1.EndpointConditions) (corev3.HealthStatus, bool) {
	if c.Ready == nil || *c.Ready {
		return corev3.HealthStatus_HEALTHY, true
	}
	if c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating {
		return corev3.HealthStatus_DRAINING, true
	}
	return 0, false
}

// slicePort is the endpoints' port of the Service port named name.
func slicePort(es []*discoveryv1.EndpointSlice, name string, proto corev1.Protocol) int32 {
	for _, s := range es {
		for _, p := range s.Ports {
			pn := ""
			if p.Name != nil {
				pn = *p.Name
			}
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if pn == name && pp == proto && p.Port != nil {
				return *p.Port
			}
		}
	}
	return 0
}

// podBackends are the endpoints of the slices, one per address (the
// healthiest when an address is in several slices, as while a slice is
// being replaced).
func podBackends(es []*discoveryv1.EndpointSlice, port int32) []backend {
	best := map[netip.Addr]backend{}
	for _, s := range es {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN
		}
		for _, ep := range s.Endpoints {
			health, ok := endpointHealth(ep.Conditions)
			if !ok || len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil {
				continue
			}
			a = a.Unmap()
			if old, ok := best[a]; ok && old.Health == corev3.HealthStatus_HEALTHY {
				continue
			}
			best[a] = backend{Addr: a, Port: port, Health: health}
		}
	}
	return sortedBackends(best)
}

func sortedBackends(m map[netip.Addr]backend) []backend {
	out := make([]backend, 0, len(m))
	for _, b := range m {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b backend) int { return a.Addr.Compare(b.Addr) })
	return out
}

// nodeBackends are the nodes' InternalIPs: Ready nodes HEALTHY, the others
// UNHEALTHY, and with externalTrafficPolicy Local also those without a
// ready endpoint of the Service.
func nodeBackends(nodes []*corev1.Node, local map[string]bool, port int32) []backend {
	out := map[netip.Addr]backend{}
	for _, n := range nodes {
		health := corev3.HealthStatus_UNHEALTHY
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				health = corev3.HealthStatus_HEALTHY
			}
		}
		if local != nil && !local[n.Name] {
			health = corev3.HealthStatus_UNHEALTHY
		}
		seen := map[bool]bool{}
		for _, na := range n.Status.Addresses {
			if na.Type != corev1.NodeInternalIP {
				continue
			}
			a, err := netip.ParseAddr(na.Address)
			if err != nil || seen[a.Unmap().Is4()] {
				continue
			}
			a = a.Unmap()
			seen[a.Is4()] = true
			out[a] = backend{Addr: a, Port: port, Health: health}
		}
	}
	return sortedBackends(out)
}

// readyNodes are the nodes with a ready endpoint in es.
func readyNodes(es []*discoveryv1.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, s := range es {
		for _, ep := range s.Endpoints {
			if (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && ep.NodeName != nil {
				out[*ep.NodeName] = true
			}
		}
	}
	return out
}

// translateService makes the cluster (nil when nothing is served) and the
// status of one Service.
func (c Config) translateService(w *serviceWork, idx endpointIndex, nodes []*corev1.Node) (*l4Cluster, ServiceOutcome) {
	s := w.svc
	mode := c.BackendMode
	var modeErr string
	if v, ok := s.Annotations[AnnotationBackendMode]; ok {
		m, err := parseBackendMode(v)
		if err != nil {
			modeErr = fmt.Sprintf("%s: %v", AnnotationBackendMode, err)
		} else {
			mode = m
		}
	}
	es := idx[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}]

	cl := &l4Cluster{Name: serviceClusterName(s), SourceRanges: slices.Clone(s.Spec.LoadBalancerSourceRanges)}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		cl.AffinityTimeout = defaultAffinityTime
		if cfg := s.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			cl.AffinityTimeout = time.Duration(*cfg.ClientIP.TimeoutSeconds) * time.Second
		}
	}

	portErr := map[portKey]string{}
	var served []corev1.ServicePort
	targets := map[portKey]int32{}
	for _, p := range s.Spec.Ports {
		k := portKey{p.Port, p.Protocol}
		switch {
		case p.Protocol != corev1.ProtocolTCP && p.Protocol != corev1.ProtocolUDP:
			portErr[k] = PortErrorProtocol
		case mode == NodePortBackends && p.NodePort == 0:
			portErr[k] = PortErrorNoNodePort
		default:
			served = append(served, p)
			if mode == NodePortBackends {
				targets[k] = p.NodePort
			} else if t := slicePort(es, p.Name, p.Protocol); t != 0 {
				targets[k] = t
			} else if p.TargetPort.IntVal != 0 {
				targets[k] = p.TargetPort.IntVal
			} else {
				targets[k] = p.Port
			}
		}
	}
	for _, a := range w.addrs {
		for _, p := range served {
			cl.Frontends = append(cl.Frontends, frontend{VIP: a, Port: p.Port, Protocol: string(p.Protocol), TargetPort: targets[portKey{p.Port, p.Protocol}]})
		}
	}
	if len(served) > 0 {
		port := targets[portKey{served[0].Port, served[0].Protocol}]
		if mode == NodePortBackends {
			var local map[string]bool
			if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
				local = readyNodes(es)
			}
			cl.Backends = nodeBackends(nodes, local, port)
		} else {
			cl.Backends = podBackends(es, port)
		}
	}

	// Status.
	out := ServiceOutcome{Status: *s.Status.DeepCopy()}
	out.Status.LoadBalancer.Ingress = nil
	for _, a := range w.addrs {
		in := corev1.LoadBalancerIngress{IP: a.String(), IPMode: new(corev1.LoadBalancerIPModeVIP)}
		for _, p := range s.Spec.Ports {
			ps := corev1.PortStatus{Port: p.Port, Protocol: p.Protocol}
			if e := portErr[portKey{p.Port, p.Protocol}]; e != "" {
				ps.Error = new(e)
			}
			in.Ports = append(in.Ports, ps)
		}
		out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, in)
	}

	conds := &out.Status.Conditions
	oldAddr := meta.FindStatusCondition(*conds, ConditionAddress)
	addrCond := metav1.Condition{Type: ConditionAddress, ObservedGeneration: s.Generation}
	errs := w.errs
	if modeErr != "" {
		errs = append(errs, addrError{ReasonInvalidRequest, modeErr})
	}
	if len(errs) == 0 {
		addrCond.Status, addrCond.Reason = metav1.ConditionTrue, ReasonAddressAssigned
		addrCond.Message = "serving on " + joinAddrs(w.addrs)
	} else {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Message
		}
		addrCond.Status, addrCond.Reason = metav1.ConditionFalse, errs[0].Reason
		addrCond.Message = strings.Join(msgs, "; ")
	}
	if oldAddr == nil || oldAddr.Status != addrCond.Status || oldAddr.Reason != addrCond.Reason || oldAddr.Message != addrCond.Message {
		if addrCond.Status == metav1.ConditionTrue {
			out.Events = append(out.Events, Event{corev1.EventTypeNormal, addrCond.Reason, addrCond.Message})
		} else {
			out.Events = append(out.Events, Event{corev1.EventTypeWarning, addrCond.Reason, addrCond.Message})
		}
	}
	meta.SetStatusCondition(conds, addrCond)

	portsCond := metav1.Condition{Type: ConditionPortsError, ObservedGeneration: s.Generation, Status: metav1.ConditionFalse, Reason: ReasonPortsServed, Message: "every port is served"}
	if len(portErr) > 0 {
		var bad []string
		for _, p := range s.Spec.Ports {
			if e := portErr[portKey{p.Port, p.Protocol}]; e != "" {
				bad = append(bad, fmt.Sprintf("%d/%s: %s", p.Port, p.Protocol, e))
			}
		}
		portsCond.Status, portsCond.Reason = metav1.ConditionTrue, ReasonPortsNotAll
		portsCond.Message = "not served: " + strings.Join(bad, ", ")
	}
	if old := meta.FindStatusCondition(*conds, ConditionPortsError); portsCond.Status == metav1.ConditionTrue && (old == nil || old.Message != portsCond.Message) {
		out.Events = append(out.Events, Event{corev1.EventTypeWarning, portsCond.Reason, portsCond.Message})
	}
	meta.SetStatusCondition(conds, portsCond)

	if len(cl.Frontends) == 0 {
		return nil, out
	}
	return cl, out
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
