// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestParsePool(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "lan=10.0.0.0/30", want: "lan [10.0.0.0-10.0.0.3]"},
		{in: "lan=10.0.0.5/30", want: "lan [10.0.0.4-10.0.0.7]"},
		{in: "mixed=10.0.0.1-10.0.0.9, 2001:db8::/127", want: "mixed [10.0.0.1-10.0.0.9 2001:db8::-2001:db8::1]"},
		{in: "lan", err: `pool "lan": want NAME=CIDR|FIRST-LAST[,...]`},
		{in: "=10.0.0.0/8", err: `pool "=10.0.0.0/8": want NAME=CIDR|FIRST-LAST[,...]`},
		{in: "lan=10.0.0.9-10.0.0.1", err: `pool "lan": range "10.0.0.9-10.0.0.1": the first address must not be after the last, both of one family`},
		{in: "lan=10.0.0.1-2001:db8::1", err: `pool "lan": range "10.0.0.1-2001:db8::1": the first address must not be after the last, both of one family`},
		{in: "lan=10.0.0.0/33", err: `pool "lan": range "10.0.0.0/33": want a CIDR or FIRST-LAST`},
	}
	for _, tt := range tests {
		p, err := ParsePool(tt.in)
		if tt.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.in, err)
			continue
		}
		got := p.Name + " ["
		for i, r := range p.Ranges {
			if i > 0 {
				got += " "
			}
			got += r.First.String() + "-" + r.Last.String()
		}
		if got += "]"; got != tt.want {
			t.Errorf("%s: %s, want %s", tt.in, got, tt.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) <= len(s) && (s[:len(sub)] == sub || contains(s[1:], sub))
}

func TestEndpointHealth(t *testing.T) {
	yes, no := new(true), new(false)
	tests := []struct {
		name                        string
		ready, serving, terminating *bool
		want                        string
	}{
		{"conditions unset", nil, nil, nil, "HEALTHY"},
		{"ready", yes, yes, no, "HEALTHY"},
		{"terminating, still serving", no, yes, yes, "DRAINING"},
		{"terminating, not serving", no, no, yes, "none"},
		{"not ready", no, no, no, "none"},
	}
	for _, tt := range tests {
		h, ok := endpointHealth(discoveryv1.EndpointConditions{Ready: tt.ready, Serving: tt.serving, Terminating: tt.terminating})
		got := "none"
		if ok {
			got = h.String()
		}
		if got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestWeightedBackends(t *testing.T) {
	b := func(a string) backend {
		return backend{Addr: netip.MustParseAddr(a), Port: 7777, Health: corev3.HealthStatus_HEALTHY}
	}
	ref := func(w int32, bs ...backend) resolvedRef { return resolvedRef{weight: w, backends: bs} }
	tests := []struct {
		name string
		refs []resolvedRef
		want string
	}{
		{"70/30 over 2 and 1", []resolvedRef{ref(70, b("10.0.0.1"), b("10.0.0.2")), ref(30, b("10.0.0.3"))}, "10.0.0.1:21000 10.0.0.2:21000 10.0.0.3:18000"},
		{"a ref without endpoints is refused", []resolvedRef{ref(80), ref(20, b("10.0.0.3"))}, "10.0.0.3:12000 reject 48000"},
		{"weight 0", []resolvedRef{ref(0, b("10.0.0.1")), ref(1, b("10.0.0.2"))}, "10.0.0.2:60000"},
		{"weight 0 without endpoints is not refused", []resolvedRef{ref(0), ref(1, b("10.0.0.2"))}, "10.0.0.2:60000"},
		{"one Service in two refs adds up", []resolvedRef{ref(1, b("10.0.0.1")), ref(1, b("10.0.0.1"))}, "10.0.0.1:60000"},
		{"thirds add up exactly", []resolvedRef{ref(1, b("10.0.0.1"), b("10.0.0.2")), ref(1, b("10.0.0.3")), ref(1)}, "10.0.0.1:10000 10.0.0.2:10000 10.0.0.3:20000 reject 20000"},
		{"sevenths add up exactly", []resolvedRef{ref(1, b("10.0.0.1"), b("10.0.0.2"), b("10.0.0.3")), ref(6)}, "10.0.0.1:2857 10.0.0.2:2857 10.0.0.3:2857 reject 51429"},
		{"tiny shares stay at least 1", []resolvedRef{ref(1, b("10.0.0.1")), ref(1000000, b("10.0.0.2"))}, "10.0.0.1:1 10.0.0.2:59999"},
		{"every ref refused", []resolvedRef{ref(3), ref(1)}, "reject 60000"},
	}
	for _, tt := range tests {
		bs, reject := weightedBackends(tt.refs)
		var parts []string
		sum := int64(reject)
		for _, be := range bs {
			parts = append(parts, fmt.Sprintf("%s:%d", be.Addr, be.Weight))
			sum += int64(be.Weight)
		}
		if reject > 0 {
			parts = append(parts, fmt.Sprintf("reject %d", reject))
		}
		if got := strings.Join(parts, " "); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
		if sum != gatewayRouteWeight {
			t.Errorf("%s: the parts add up to %d, not %d", tt.name, sum, gatewayRouteWeight)
		}
	}
}

func TestPercent(t *testing.T) {
	for _, tt := range []struct {
		part, whole int64
		want        string
	}{{30, 100, "30%"}, {1, 3, "33.3%"}, {2, 3, "66.7%"}, {1, 1000, "0.1%"}} {
		if got := percent(tt.part, tt.whole); got != tt.want {
			t.Errorf("percent(%d, %d) = %s, want %s", tt.part, tt.whole, got, tt.want)
		}
	}
}

// An address held stays with its holder: a newer Service asking for it
// explicitly gets AddressInUse, even when it sorts first.
func TestAddressHeldIsNotTakenAway(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name string, ip string, held string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: at, Annotations: map[string]string{}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}},
		}
		if ip != "" {
			s.Annotations[AnnotationAddresses] = ip
		}
		if held != "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: held}}
		}
		return s
	}
	pool, _ := ParsePool("lan=10.0.0.1-10.0.0.2")
	out := Build(Config{Pools: Pools{pool}}, State{Services: []*corev1.Service{
		svc("b-holder", "", "10.0.0.1"),
		svc("a-newcomer", "10.0.0.1", ""), // same second, sorts first
	}})
	for name, want := range map[string]string{"b-holder": "AddressAssigned", "a-newcomer": "AddressInUse"} {
		so := out.Services[nn(name)]
		var got string
		for _, c := range so.Status.Conditions {
			if c.Type == ConditionAddress {
				got = c.Reason
			}
		}
		if got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}

func nn(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

// The addresses Services and Gateways hold are all kept before any is
// given out: a new or requesting object, Service or Gateway, never takes
// an address another holds, whatever the order they are handled in.
func TestHeldAddressesAreKeptBeforeAnyAllocation(t *testing.T) {
	old, young := metav1.NewTime(time.Unix(1000, 0)), metav1.NewTime(time.Unix(2000, 0))
	svc := func(name string, created metav1.Time, requested, held string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: created, Annotations: map[string]string{}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}},
		}
		if requested != "" {
			s.Annotations[AnnotationAddresses] = requested
		}
		if held != "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: held}}
		}
		return s
	}
	gw := func(name string, created metav1.Time, requested, held string) *gatewayv1.Gateway {
		g := &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: created},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: "l4xds", Listeners: []gatewayv1.Listener{
				{Name: "dns", Port: 53, Protocol: gatewayv1.UDPProtocolType},
			}},
		}
		if requested != "" {
			g.Spec.Addresses = []gatewayv1.GatewaySpecAddress{{Type: new(gatewayv1.IPAddressType), Value: requested}}
		}
		if held != "" {
			g.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: new(gatewayv1.IPAddressType), Value: held}}
		}
		return g
	}
	class := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "l4xds"}, Spec: gatewayv1.GatewayClassSpec{ControllerName: DefaultControllerName}}
	pool, _ := ParsePool("lan=10.0.0.1-10.0.0.4")
	tests := []struct {
		name string
		st   State
		want map[string]string // object: its address, or its condition's reason
	}{{
		name: "a new Service, a Gateway holding the first address",
		st: State{Services: []*corev1.Service{svc("new", young, "", "")},
			Gateway: GatewayState{Gateways: []*gatewayv1.Gateway{gw("holder", old, "", "10.0.0.1")}}},
		want: map[string]string{"Service new": "10.0.0.2", "Gateway holder": "10.0.0.1"},
	}, {
		name: "a Service asking for the address a Gateway holds",
		st: State{Services: []*corev1.Service{svc("asks", old, "10.0.0.1", "")},
			Gateway: GatewayState{Gateways: []*gatewayv1.Gateway{gw("holder", young, "", "10.0.0.1")}}},
		want: map[string]string{"Service asks": ReasonAddressInUse, "Gateway holder": "10.0.0.1"},
	}, {
		name: "an older new Gateway, a younger one holding the first address",
		st:   State{Gateway: GatewayState{Gateways: []*gatewayv1.Gateway{gw("new", old, "", ""), gw("holder", young, "", "10.0.0.1")}}},
		want: map[string]string{"Gateway new": "10.0.0.2", "Gateway holder": "10.0.0.1"},
	}, {
		name: "an older Gateway asking for the address a younger one holds",
		st:   State{Gateway: GatewayState{Gateways: []*gatewayv1.Gateway{gw("asks", old, "10.0.0.1", ""), gw("holder", young, "", "10.0.0.1")}}},
		want: map[string]string{"Gateway asks": string(gatewayv1.GatewayReasonAddressNotUsable), "Gateway holder": "10.0.0.1"},
	}, {
		name: "a new Gateway, a Service holding the first address",
		st: State{Services: []*corev1.Service{svc("holder", young, "", "10.0.0.1")},
			Gateway: GatewayState{Gateways: []*gatewayv1.Gateway{gw("new", old, "", "")}}},
		want: map[string]string{"Gateway new": "10.0.0.2", "Service holder": "10.0.0.1"},
	}}
	for _, tt := range tests {
		tt.st.Gateway.Classes = []*gatewayv1.GatewayClass{class}
		out := Build(Config{Pools: Pools{pool}}, tt.st)
		for obj, want := range tt.want {
			kind, name, _ := strings.Cut(obj, " ")
			var got string
			switch kind {
			case "Service":
				so := out.Services[nn(name)]
				if ing := so.Status.LoadBalancer.Ingress; len(ing) > 0 {
					got = ing[0].IP
				} else if c := meta.FindStatusCondition(so.Status.Conditions, ConditionAddress); c != nil {
					got = c.Reason
				}
			case "Gateway":
				gs := out.Gateway.Gateways[nn(name)]
				if len(gs.Addresses) > 0 {
					got = gs.Addresses[0].Value
				} else if c := meta.FindStatusCondition(gs.Conditions, string(gatewayv1.GatewayConditionProgrammed)); c != nil {
					got = c.Reason
				}
			}
			if got != want {
				t.Errorf("%s: %s has %s, want %s", tt.name, obj, got, want)
			}
		}
	}
}

// A sharing key is found by an index, not by walking the pools: the first
// Service of a key in an IPv6 /64 pool would walk 2^64 addresses.
func TestSharingKeyInAHugePool(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name string, proto corev1.Protocol) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: at, Annotations: map[string]string{AnnotationSharingKey: "dns"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol},
				Ports:      []corev1.ServicePort{{Port: 53, Protocol: proto}}},
		}
	}
	other := svc("other", corev1.ProtocolUDP)
	other.Annotations[AnnotationSharingKey] = "other"
	pool, _ := ParsePool("v6=2001:db8::/64")
	built := make(chan Outcome, 1)
	go func() {
		built <- Build(Config{Pools: Pools{pool}}, State{Services: []*corev1.Service{
			svc("dns-udp", corev1.ProtocolUDP), svc("dns-tcp", corev1.ProtocolTCP), other,
		}})
	}()
	var out Outcome
	select {
	case out = <-built:
	case <-time.After(30 * time.Second): // it either returns at once or walks the pool for ages
		t.Fatal("Build did not return: it walks the pool for the sharing key")
	}
	for name, want := range map[string]string{"dns-udp": "2001:db8::", "dns-tcp": "2001:db8::", "other": "2001:db8::1"} {
		if ing := out.Services[nn(name)].Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != want {
			t.Errorf("%s: %v, want %s", name, ing, want)
		}
	}
}
