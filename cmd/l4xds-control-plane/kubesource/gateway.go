// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// GatewayState is the Gateway API objects the source reads.
type GatewayState struct {
	Classes   []*gatewayv1.GatewayClass
	Gateways  []*gatewayv1.Gateway
	TCPRoutes []*gatewayv1.TCPRoute
	UDPRoutes []*gatewayv1.UDPRoute
}

// GatewayOutcome is the status of the Gateway API objects of this source.
// Routes keep the parents of other controllers; only the entries of this
// controller's parents are in RouteParents.
type GatewayOutcome struct {
	Classes      map[string]gatewayv1.GatewayClassStatus
	Gateways     map[types.NamespacedName]gatewayv1.GatewayStatus
	TCPRoutes    map[types.NamespacedName][]gatewayv1.RouteParentStatus
	UDPRoutes    map[types.NamespacedName][]gatewayv1.RouteParentStatus
	GatewayEvent map[types.NamespacedName][]Event
}

// gatewayRouteWeight is what the weights of one listener's backendRefs are
// scaled to before they are divided among each ref's endpoints (endpoint
// weights and reject_weight are 0..65535).
const gatewayRouteWeight = 60000

// ConditionBackendsAvailable is the condition this source adds to a
// route's parent status (the Gateway API allows domain-prefixed ones): False
// when the share of some backendRef is refused because it has no backend,
// with the refs and their shares in the message. ResolvedRefs only covers
// refs that do not resolve; a Service scaled to zero resolves.
const ConditionBackendsAvailable = "l4xds.io/BackendsAvailable"

// Reasons of ConditionBackendsAvailable.
const (
	ReasonBackendsAvailable = "BackendsAvailable"
	// ReasonNoReadyEndpoints: some ref's Service has no ready endpoint
	// (and maybe other refs do not resolve).
	ReasonNoReadyEndpoints = "NoReadyEndpoints"
	// ReasonRefsNotResolved: the refs refused do not resolve (ResolvedRefs
	// says why).
	ReasonRefsNotResolved = "RefsNotResolved"
)

func gatewayClusterName(g *gatewayv1.Gateway, l gatewayv1.SectionName) string {
	return "gateway/" + g.Namespace + "/" + g.Name + "/" + string(l)
}

// route is a TCPRoute or UDPRoute reduced to what this source uses.
type route struct {
	kind     string // TCPRoute or UDPRoute
	protocol gatewayv1.ProtocolType
	obj      metav1.Object
	parents  []gatewayv1.ParentReference
	refs     []gatewayv1.BackendRef
	status   []gatewayv1.RouteParentStatus
}

type listenerWork struct {
	gw      *gatewayv1.Gateway
	l       gatewayv1.Listener
	cluster *l4Cluster
	refs    []resolvedRef
	routes  int32
}

// resolvedRef is one weighted backendRef of a listener's routes. A ref
// without backends has its share refused; refused says why.
type resolvedRef struct {
	weight   int32
	backends []backend
	refused  string
	noReady  bool // refused because its Service has no ready endpoint
}

func cond(t string, ok bool, reason, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
}

// ourGateways are the Gateways of this controller's classes, oldest first.
func (c Config) ourGateways(st GatewayState) []*gatewayv1.Gateway {
	ours := map[string]bool{}
	for _, gc := range st.Classes {
		if string(gc.Spec.ControllerName) == c.ControllerName {
			ours[gc.Name] = true
		}
	}
	var gws []*gatewayv1.Gateway
	for _, g := range st.Gateways {
		if ours[string(g.Spec.GatewayClassName)] {
			gws = append(gws, g)
		}
	}
	slices.SortFunc(gws, func(a, b *gatewayv1.Gateway) int { return byAge(a, b) })
	return gws
}

// gatewayWork is a Gateway's addresses: those it asks for
// (spec.addresses), else those it holds (its status) or one new IPv4.
type gatewayWork struct {
	gw        *gatewayv1.Gateway
	h         *holder
	pool      string
	requested []netip.Addr
	addrs     []netip.Addr
	err       *addrError
}

func planGateways(gws []*gatewayv1.Gateway) []*gatewayWork {
	var work []*gatewayWork
	for _, g := range gws {
		w := &gatewayWork{gw: g, pool: g.Annotations[AnnotationPool], h: &holder{owner: "Gateway " + g.Namespace + "/" + g.Name, ports: map[portKey]bool{}}}
		for _, l := range g.Spec.Listeners {
			if p, ok := listenerProtocol(l.Protocol); ok {
				w.h.ports[portKey{int32(l.Port), p}] = true
			}
		}
		for _, a := range g.Spec.Addresses {
			if a.Type != nil && *a.Type != gatewayv1.IPAddressType {
				w.err = &addrError{string(gatewayv1.GatewayReasonUnsupportedAddress), fmt.Sprintf("address type %q is not supported: only IPAddress", *a.Type)}
				continue
			}
			ip, err := netip.ParseAddr(a.Value)
			if err != nil {
				w.err = &addrError{string(gatewayv1.GatewayReasonUnsupportedAddress), fmt.Sprintf("%q is not an IP address", a.Value)}
				continue
			}
			w.requested = append(w.requested, ip.Unmap())
		}
		work = append(work, w)
	}
	return work
}

// keepHeld is the first round: the addresses the Gateway holds (its
// status) and still wants.
func (w *gatewayWork) keepHeld(al *allocator) {
	if w.err != nil {
		return
	}
	for _, a := range w.gw.Status.Addresses {
		ip, err := netip.ParseAddr(a.Value)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if len(w.requested) > 0 && !slices.Contains(w.requested, ip) {
			continue
		}
		if !slices.Contains(w.addrs, ip) && al.hold(ip, w.h, w.pool) == nil {
			w.addrs = append(w.addrs, ip)
		}
	}
}

// takeRequested is the second round: the addresses asked for, in the
// order asked.
func (w *gatewayWork) takeRequested(al *allocator) {
	if w.err != nil || len(w.requested) == 0 {
		return
	}
	var addrs []netip.Addr
	for _, a := range w.requested {
		if slices.Contains(w.addrs, a) {
			addrs = append(addrs, a)
		} else if err := al.request(a, w.h, w.pool); err != nil {
			w.err = err
		} else {
			addrs = append(addrs, a)
		}
	}
	w.addrs = addrs
}

// takeNew is the last round: a new IPv4 address for a Gateway that asks
// for none and holds none.
func (w *gatewayWork) takeNew(al *allocator) {
	if w.err != nil || len(w.requested) > 0 || len(w.addrs) > 0 {
		return
	}
	a, err := al.allocate(true, w.h, w.pool)
	if err != nil {
		w.err = err
		return
	}
	w.addrs = append(w.addrs, a)
}

func (c Config) translateGateways(work []*gatewayWork, st GatewayState, svcs []*corev1.Service, idx endpointIndex) ([]*l4Cluster, GatewayOutcome) {
	out := GatewayOutcome{
		Classes:      map[string]gatewayv1.GatewayClassStatus{},
		Gateways:     map[types.NamespacedName]gatewayv1.GatewayStatus{},
		TCPRoutes:    map[types.NamespacedName][]gatewayv1.RouteParentStatus{},
		UDPRoutes:    map[types.NamespacedName][]gatewayv1.RouteParentStatus{},
		GatewayEvent: map[types.NamespacedName][]Event{},
	}
	for _, gc := range st.Classes {
		if string(gc.Spec.ControllerName) != c.ControllerName {
			continue
		}
		s := *gc.Status.DeepCopy()
		meta.SetStatusCondition(&s.Conditions, cond(string(gatewayv1.GatewayClassConditionStatusAccepted), true, string(gatewayv1.GatewayClassReasonAccepted), "handled by l4xds", gc.Generation))
		out.Classes[gc.Name] = s
	}

	svcByName := map[types.NamespacedName]*corev1.Service{}
	for _, s := range svcs {
		svcByName[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}

	// Listeners by Gateway, with their addresses.
	var gws []*gatewayv1.Gateway
	listeners := map[types.NamespacedName][]*listenerWork{}
	addrs := map[types.NamespacedName][]netip.Addr{}
	addrErr := map[types.NamespacedName]*addrError{}
	for _, w := range work {
		g := w.gw
		gws = append(gws, g)
		k := types.NamespacedName{Namespace: g.Namespace, Name: g.Name}
		addrs[k], addrErr[k] = w.addrs, w.err
		for _, l := range g.Spec.Listeners {
			listeners[k] = append(listeners[k], &listenerWork{gw: g, l: l})
		}
	}

	// Routes: attach to listeners, resolve backendRefs.
	var routes []*route
	for _, r := range st.TCPRoutes {
		var refs []gatewayv1.BackendRef
		for _, rule := range r.Spec.Rules {
			refs = append(refs, rule.BackendRefs...)
		}
		routes = append(routes, &route{"TCPRoute", gatewayv1.TCPProtocolType, r, r.Spec.ParentRefs, refs, r.Status.Parents})
	}
	for _, r := range st.UDPRoutes {
		var refs []gatewayv1.BackendRef
		for _, rule := range r.Spec.Rules {
			refs = append(refs, rule.BackendRefs...)
		}
		routes = append(routes, &route{"UDPRoute", gatewayv1.UDPProtocolType, r, r.Spec.ParentRefs, refs, r.Status.Parents})
	}
	slices.SortFunc(routes, func(a, b *route) int {
		return cmp.Or(byAge(a.obj, b.obj), cmp.Compare(a.kind, b.kind))
	})
	for _, r := range routes {
		rk := types.NamespacedName{Namespace: r.obj.GetNamespace(), Name: r.obj.GetName()}
		resolved, refsOK, refsReason, refsMsg := resolveRefs(r, svcByName, idx)
		var parents []gatewayv1.RouteParentStatus
		for _, pr := range r.parents {
			if (pr.Group != nil && *pr.Group != gatewayv1.GroupName) || (pr.Kind != nil && *pr.Kind != "Gateway") {
				continue
			}
			ns := rk.Namespace
			if pr.Namespace != nil {
				ns = string(*pr.Namespace)
			}
			gk := types.NamespacedName{Namespace: ns, Name: string(pr.Name)}
			ls, ok := listeners[gk]
			if !ok {
				continue // not a Gateway of ours: its controller writes this parent's status
			}
			attached := 0
			reason, msg := string(gatewayv1.RouteReasonNoMatchingParent), "no listener of the Gateway matches"
			for _, lw := range ls {
				if pr.SectionName != nil && *pr.SectionName != lw.l.Name {
					continue
				}
				if pr.Port != nil && *pr.Port != lw.l.Port {
					continue
				}
				if lw.l.Protocol != r.protocol {
					reason, msg = string(gatewayv1.RouteReasonNotAllowedByListeners), fmt.Sprintf("listener %q is %s, not %s", lw.l.Name, lw.l.Protocol, r.protocol)
					continue
				}
				if !allowedFrom(lw.l, lw.gw.Namespace, rk.Namespace) {
					reason, msg = string(gatewayv1.RouteReasonNotAllowedByListeners), fmt.Sprintf("listener %q does not allow routes from namespace %s", lw.l.Name, rk.Namespace)
					continue
				}
				if lw.routes > 0 {
					reason, msg = string(gatewayv1.RouteReasonNotAllowedByListeners), fmt.Sprintf("listener %q already has a %s: an L4 listener serves one route", lw.l.Name, r.kind)
					continue
				}
				lw.routes++
				lw.refs = resolved
				attached++
			}
			var conds []metav1.Condition
			for _, old := range r.status {
				if parentKey(old.ParentRef, rk.Namespace) == parentKey(pr, rk.Namespace) && string(old.ControllerName) == c.ControllerName {
					conds = slices.Clone(old.Conditions)
				}
			}
			if attached > 0 {
				meta.SetStatusCondition(&conds, cond(string(gatewayv1.RouteConditionAccepted), true, string(gatewayv1.RouteReasonAccepted), fmt.Sprintf("attached to %d listener(s)", attached), r.obj.GetGeneration()))
			} else {
				meta.SetStatusCondition(&conds, cond(string(gatewayv1.RouteConditionAccepted), false, reason, msg, r.obj.GetGeneration()))
			}
			meta.SetStatusCondition(&conds, cond(string(gatewayv1.RouteConditionResolvedRefs), refsOK, refsReason, refsMsg, r.obj.GetGeneration()))
			meta.SetStatusCondition(&conds, backendsAvailable(resolved, r.obj.GetGeneration()))
			parents = append(parents, gatewayv1.RouteParentStatus{ParentRef: pr, ControllerName: gatewayv1.GatewayController(c.ControllerName), Conditions: conds})
		}
		if r.kind == "TCPRoute" {
			out.TCPRoutes[rk] = parents
		} else {
			out.UDPRoutes[rk] = parents
		}
	}

	// Gateways: status and clusters.
	var clusters []*l4Cluster
	for _, g := range gws {
		k := types.NamespacedName{Namespace: g.Namespace, Name: g.Name}
		s := *g.Status.DeepCopy()
		s.Addresses = nil
		for _, a := range addrs[k] {
			s.Addresses = append(s.Addresses, gatewayv1.GatewayStatusAddress{Type: new(gatewayv1.IPAddressType), Value: a.String()})
		}
		meta.SetStatusCondition(&s.Conditions, cond(string(gatewayv1.GatewayConditionAccepted), true, string(gatewayv1.GatewayReasonAccepted), "handled by l4xds", g.Generation))
		if e := addrErr[k]; e != nil {
			old := meta.FindStatusCondition(g.Status.Conditions, string(gatewayv1.GatewayConditionProgrammed))
			if old == nil || old.Message != e.Message {
				out.GatewayEvent[k] = append(out.GatewayEvent[k], Event{corev1.EventTypeWarning, e.Reason, e.Message})
			}
			reason := e.Reason
			if reason == ReasonPoolExhausted || reason == ReasonAddressInUse || reason == ReasonAddressNotInPool {
				reason = string(gatewayv1.GatewayReasonAddressNotUsable)
			}
			meta.SetStatusCondition(&s.Conditions, cond(string(gatewayv1.GatewayConditionProgrammed), false, reason, e.Message, g.Generation))
		} else {
			meta.SetStatusCondition(&s.Conditions, cond(string(gatewayv1.GatewayConditionProgrammed), true, string(gatewayv1.GatewayReasonProgrammed), "serving on "+joinAddrs(addrs[k]), g.Generation))
		}
		var lstatus []gatewayv1.ListenerStatus
		for _, lw := range listeners[k] {
			ls := gatewayv1.ListenerStatus{Name: lw.l.Name, AttachedRoutes: lw.routes, SupportedKinds: []gatewayv1.RouteGroupKind{}}
			for _, old := range g.Status.Listeners {
				if old.Name == lw.l.Name {
					ls.Conditions = slices.Clone(old.Conditions)
				}
			}
			p, ok := listenerProtocol(lw.l.Protocol)
			if !ok {
				meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionAccepted), false, string(gatewayv1.ListenerReasonUnsupportedProtocol), fmt.Sprintf("l4xds serves TCP and UDP listeners, not %s", lw.l.Protocol), g.Generation))
				meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionProgrammed), false, string(gatewayv1.ListenerReasonInvalid), "not served", g.Generation))
				lstatus = append(lstatus, ls)
				continue
			}
			kind := gatewayv1.Kind("TCPRoute")
			if p == corev1.ProtocolUDP {
				kind = "UDPRoute"
			}
			ls.SupportedKinds = []gatewayv1.RouteGroupKind{{Group: new(gatewayv1.Group(gatewayv1.GroupName)), Kind: kind}}
			meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionAccepted), true, string(gatewayv1.ListenerReasonAccepted), "", g.Generation))
			meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionResolvedRefs), true, string(gatewayv1.ListenerReasonResolvedRefs), "", g.Generation))
			meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionProgrammed), len(addrs[k]) > 0, string(gatewayv1.ListenerReasonProgrammed), "", g.Generation))
			if len(addrs[k]) == 0 {
				meta.SetStatusCondition(&ls.Conditions, cond(string(gatewayv1.ListenerConditionProgrammed), false, string(gatewayv1.ListenerReasonInvalid), "the Gateway has no address", g.Generation))
			}
			lstatus = append(lstatus, ls)
			if len(addrs[k]) == 0 {
				continue
			}
			cl := &l4Cluster{Name: gatewayClusterName(g, lw.l.Name)}
			for _, a := range addrs[k] {
				cl.Frontends = append(cl.Frontends, frontend{VIP: a, Port: int32(lw.l.Port), Protocol: string(p)})
			}
			cl.Backends, cl.RejectWeight = weightedBackends(lw.refs)
			clusters = append(clusters, cl)
		}
		s.Listeners = lstatus
		out.Gateways[k] = s
	}
	return clusters, out
}

func listenerProtocol(p gatewayv1.ProtocolType) (corev1.Protocol, bool) {
	switch p {
	case gatewayv1.TCPProtocolType:
		return corev1.ProtocolTCP, true
	case gatewayv1.UDPProtocolType:
		return corev1.ProtocolUDP, true
	}
	return "", false
}

// allowedFrom applies a listener's allowedRoutes.namespaces (Same by
// default, All; a Selector is not supported and allows nothing).
func allowedFrom(l gatewayv1.Listener, gwNS, routeNS string) bool {
	from := gatewayv1.NamespacesFromSame
	if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil && l.AllowedRoutes.Namespaces.From != nil {
		from = *l.AllowedRoutes.Namespaces.From
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
		return true
	case gatewayv1.NamespacesFromSame:
		return gwNS == routeNS
	}
	return false
}

func parentKey(p gatewayv1.ParentReference, defNS string) string {
	ns := defNS
	if p.Namespace != nil {
		ns = string(*p.Namespace)
	}
	var sec string
	if p.SectionName != nil {
		sec = string(*p.SectionName)
	}
	var port int32
	if p.Port != nil {
		port = int32(*p.Port)
	}
	return fmt.Sprintf("%s/%s/%s/%d", ns, p.Name, sec, port)
}

// resolveRefs resolves a route's backendRefs to the ready endpoints of
// their Services. A ref that cannot be resolved, or has no ready endpoint,
// keeps its weight with no backends: its share is refused (GEP-2645), not
// given to the others.
func resolveRefs(r *route, svcs map[types.NamespacedName]*corev1.Service, idx endpointIndex) ([]resolvedRef, bool, string, string) {
	ok, reason, msg := true, string(gatewayv1.RouteReasonResolvedRefs), "every backendRef resolved"
	var out []resolvedRef
	fail := func(rs, m string) {
		out[len(out)-1].refused = m
		if ok {
			ok, reason, msg = false, rs, m
		} else {
			msg += "; " + m
		}
	}
	for _, ref := range r.refs {
		w := int32(1)
		if ref.Weight != nil {
			w = *ref.Weight
		}
		out = append(out, resolvedRef{weight: w})
		i := len(out) - 1
		if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Service") {
			fail(string(gatewayv1.RouteReasonInvalidKind), fmt.Sprintf("backendRef %s: only core Services are supported", ref.Name))
			continue
		}
		ns := r.obj.GetNamespace()
		if ref.Namespace != nil && string(*ref.Namespace) != ns {
			fail(string(gatewayv1.RouteReasonRefNotPermitted), fmt.Sprintf("backendRef %s/%s: Services of other namespaces are not supported (no ReferenceGrant support)", *ref.Namespace, ref.Name))
			continue
		}
		sk := types.NamespacedName{Namespace: ns, Name: string(ref.Name)}
		svc, found := svcs[sk]
		if !found {
			fail(string(gatewayv1.RouteReasonBackendNotFound), fmt.Sprintf("Service %s not found", sk))
			continue
		}
		if ref.Port == nil {
			fail(string(gatewayv1.RouteReasonUnsupportedValue), fmt.Sprintf("backendRef %s: port is required", sk))
			continue
		}
		var sp *corev1.ServicePort
		for j := range svc.Spec.Ports {
			if svc.Spec.Ports[j].Port == int32(*ref.Port) {
				sp = &svc.Spec.Ports[j]
			}
		}
		if sp == nil {
			fail(string(gatewayv1.RouteReasonBackendNotFound), fmt.Sprintf("Service %s has no port %d", sk, *ref.Port))
			continue
		}
		es := idx[sk]
		var ready []backend
		if port := slicePort(es, sp.Name, sp.Protocol); port != 0 {
			for _, b := range podBackends(es, port) {
				if b.Health == corev3.HealthStatus_HEALTHY {
					ready = append(ready, b)
				}
			}
		}
		out[i].backends = ready
		if len(ready) == 0 {
			out[i].refused, out[i].noReady = fmt.Sprintf("Service %s has no ready endpoint", sk), true
		}
	}
	return out, ok, reason, msg
}

// backendsAvailable is ConditionBackendsAvailable for a route's refs.
func backendsAvailable(refs []resolvedRef, gen int64) metav1.Condition {
	var sum int64
	for _, r := range refs {
		sum += int64(r.weight)
	}
	var refused int64
	var why []string
	reason := ReasonRefsNotResolved
	for _, r := range refs {
		if r.refused == "" || r.weight == 0 {
			continue
		}
		refused += int64(r.weight)
		why = append(why, fmt.Sprintf("%s (%s)", r.refused, percent(int64(r.weight), sum)))
		if r.noReady {
			reason = ReasonNoReadyEndpoints
		}
	}
	if refused == 0 {
		return cond(ConditionBackendsAvailable, true, ReasonBackendsAvailable, "every backendRef has ready endpoints", gen)
	}
	msg := fmt.Sprintf("%s of new flows are refused: %s", percent(refused, sum), strings.Join(why, "; "))
	return cond(ConditionBackendsAvailable, false, reason, msg, gen)
}

// percent is part/whole in percent, to a tenth at most ("30%", "33.3%").
func percent(part, whole int64) string {
	return strconv.FormatFloat(math.Round(1000*float64(part)/float64(whole))/10, 'f', -1, 64) + "%"
}

// weightedBackends divides gatewayRouteWeight among the refs by their
// weights, and each ref's share among its endpoints. The shares of the refs
// without a backend are the reject weight. The parts add up to
// gatewayRouteWeight exactly, so the share refused is exactly the one the
// route gives those refs; an endpoint whose part rounds to 0 gets 1, taken
// from the largest part.
func weightedBackends(refs []resolvedRef) ([]backend, uint32) {
	weights := make([]int64, len(refs))
	for i, r := range refs {
		weights[i] = int64(r.weight)
	}
	// parts[0] is the reject weight, parts[i+1] that of bs[i].
	parts := []int64{0}
	var bs []backend
	for i, share := range split(gatewayRouteWeight, weights) {
		r := refs[i]
		if r.weight == 0 {
			continue
		}
		if len(r.backends) == 0 {
			parts[0] += share
			continue
		}
		for j, p := range split(share, slices.Repeat([]int64{1}, len(r.backends))) {
			bs = append(bs, r.backends[j])
			parts = append(parts, p)
		}
	}
	for i := 1; i < len(parts); i++ {
		if parts[i] == 0 {
			parts[i]++
			parts[slices.Index(parts, slices.Max(parts))]--
		}
	}

	byAddr := map[netip.AddrPort]backend{}
	for i, b := range bs {
		key := netip.AddrPortFrom(b.Addr, uint16(b.Port))
		w := parts[i+1]
		if old, ok := byAddr[key]; ok { // one Service in two refs
			w += int64(old.Weight)
		}
		b.Weight = uint32(w) // at most gatewayRouteWeight
		byAddr[key] = b
	}
	out := make([]backend, 0, len(byAddr))
	for _, b := range byAddr {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b backend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out, uint32(parts[0])
}

// split divides total in proportion to weights, exactly: the running sums
// are rounded down, so the parts add up to total (none when every weight
// is 0).
func split(total int64, weights []int64) []int64 {
	var sum int64
	for _, w := range weights {
		sum += w
	}
	out := make([]int64, len(weights))
	if sum == 0 {
		return out
	}
	var cum, prev int64
	for i, w := range weights {
		cum += w
		next := total * cum / sum
		out[i], prev = next-prev, next
	}
	return out
}
