// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	"github.com/l4xds/l4xds/test/netns"
)

// backends is the number of backend namespaces: enough for a service to
// gain and lose some, few enough for two cores.
const backends = 4

// frontend is a VIP, port and protocol as the frontends table prints it.
type frontend struct {
	vip   string
	port  uint16
	proto string // TCP or UDP
}

func (f frontend) String() string { return f.dial() + "/" + f.proto }

func (f frontend) dial() string {
	return netip.AddrPortFrom(netip.MustParseAddr(f.vip), f.port).String()
}

// endpoint is one backend of a service, on the service's backend port.
type endpoint struct {
	backend  int // b<backend>, 192.168.1.1<backend>
	weight   int
	draining bool
}

// kind says what the churn may do to a service.
type kind int

const (
	// steady services keep their frontends and their backends; weights
	// and DRAINING flip. Flows to them never fail.
	steady kind = iota
	// members services also gain and lose backends (never the last one).
	members
	// mover is a service whose VIP moves between two addresses.
	mover
	// ephemeral services come and go.
	ephemeral
)

// service is one l4lb cluster of the resources. Every service has a
// backend port of its own, served by every backend: two VIPs never share a
// backend address and port, so no two live flows are ambiguous to a NAT
// that keeps client ports.
type service struct {
	name      string
	kind      kind
	frontends []frontend
	port      uint16 // the backends' port
	endpoints []endpoint
	// vips are the addresses a mover moves between.
	vips []string
}

// The services of the soak: two steady, two whose backends change, a VIP
// that moves, three that come and go. TCP and UDP on each kind; the
// mover is UDP, whose connected sockets never share a client port, so
// that a flow to the old VIP and one to the new never look the same to
// the backend.
func initialServices() []*service {
	all := func() []endpoint {
		var eps []endpoint
		for i := range backends {
			eps = append(eps, endpoint{backend: i, weight: 1})
		}
		return eps
	}
	return []*service{
		{name: "web", kind: steady, port: 8080, frontends: []frontend{{"10.1.2.3", 8080, "TCP"}}, endpoints: all()},
		{name: "dns", kind: steady, port: 53, frontends: []frontend{{"10.1.2.5", 53, "UDP"}, {"10.1.2.5", 53, "TCP"}}, endpoints: all()},
		{name: "db", kind: members, port: 3306, frontends: []frontend{{"10.1.2.4", 3306, "TCP"}}, endpoints: all()[:2]},
		{name: "game", kind: members, port: 7777, frontends: []frontend{{"10.1.2.6", 7777, "UDP"}}, endpoints: all()[1:3]},
		{name: "mover", kind: mover, port: 9100, frontends: []frontend{{"10.1.4.1", 9100, "UDP"}}, endpoints: all(), vips: []string{"10.1.4.1", "10.1.4.2"}},
		{name: "tmp-0", kind: ephemeral, port: 9200, frontends: []frontend{{"10.1.3.10", 9200, "TCP"}}, endpoints: all()[:3]},
		{name: "tmp-1", kind: ephemeral, port: 9201, frontends: []frontend{{"10.1.3.11", 9201, "UDP"}}, endpoints: all()[1:]},
		{name: "tmp-2", kind: ephemeral, port: 9202, frontends: []frontend{{"10.1.3.12", 9202, "TCP"}, {"10.1.3.12", 9202, "UDP"}}, endpoints: all()[:2]},
	}
}

// servedPorts are what every backend listens on: the services' ports.
func servedPorts(services []*service) (tcp, udp []uint16) {
	for _, s := range services {
		for _, f := range s.frontends {
			if f.proto == "TCP" && !slices.Contains(tcp, s.port) {
				tcp = append(tcp, s.port)
			}
			if f.proto == "UDP" && !slices.Contains(udp, s.port) {
				udp = append(udp, s.port)
			}
		}
	}
	return tcp, udp
}

func (s *service) address(backend int) string {
	return netip.AddrPortFrom(netns.BackendIPv4(backend), s.port).String()
}

// has tells whether backend is one of the service's endpoints.
func (s *service) has(backend int) bool {
	return slices.ContainsFunc(s.endpoints, func(e endpoint) bool { return e.backend == backend })
}

func (s *service) active() int {
	n := 0
	for _, e := range s.endpoints {
		if !e.draining {
			n++
		}
	}
	return n
}

// change is one rewrite of the resources, as the churn made it.
type change struct {
	what    string // "weight", "draining", "backend added", ...
	service string
	// backend is the endpoint changed, -1 for a change of the service.
	backend int
	// gone are the frontends that left the resources, added those that
	// entered them.
	gone, added []frontend
}

func (c change) String() string {
	s := c.what + " " + c.service
	if c.backend >= 0 {
		s += fmt.Sprintf(" b%d", c.backend)
	}
	for _, f := range c.gone {
		s += " -" + f.String()
	}
	for _, f := range c.added {
		s += " +" + f.String()
	}
	return s
}

// world is the desired state: every service, served or not.
type world struct {
	services []*service
	served   map[string]bool
}

func newWorld() *world {
	w := &world{services: initialServices(), served: map[string]bool{}}
	for _, s := range w.services {
		w.served[s.name] = s.kind != ephemeral || s.name == "tmp-0"
	}
	return w
}

// mutate makes one random change. Every change leaves each served service
// with a backend that takes new flows (one that is not DRAINING).
func (w *world) mutate(rnd *rand.Rand) change {
	for {
		s := w.services[rnd.IntN(len(w.services))]
		if !w.served[s.name] && s.kind != ephemeral {
			continue
		}
		switch p := rnd.IntN(100); {
		case s.kind == ephemeral && p < 25:
			w.served[s.name] = !w.served[s.name]
			if w.served[s.name] {
				return change{what: "service added", service: s.name, backend: -1, added: s.frontends}
			}
			return change{what: "service removed", service: s.name, backend: -1, gone: s.frontends}
		case !w.served[s.name]:
			continue
		case s.kind == mover && p < 40:
			old := s.frontends[0]
			next := old
			next.vip = s.vips[(slices.Index(s.vips, old.vip)+1)%len(s.vips)]
			s.frontends = []frontend{next}
			return change{what: "VIP moved", service: s.name, backend: -1, gone: []frontend{old}, added: []frontend{next}}
		case s.kind == members && p < 30:
			var missing []int
			for i := range backends {
				if !s.has(i) {
					missing = append(missing, i)
				}
			}
			if len(missing) == 0 {
				continue
			}
			b := missing[rnd.IntN(len(missing))]
			s.endpoints = append(s.endpoints, endpoint{backend: b, weight: 1 + rnd.IntN(10)})
			slices.SortFunc(s.endpoints, func(a, b endpoint) int { return a.backend - b.backend })
			return change{what: "backend added", service: s.name, backend: b}
		case s.kind == members && p < 60:
			i := rnd.IntN(len(s.endpoints))
			e := s.endpoints[i]
			if len(s.endpoints) == 1 || (!e.draining && s.active() == 1) {
				continue
			}
			s.endpoints = slices.Delete(s.endpoints, i, i+1)
			return change{what: "backend removed", service: s.name, backend: e.backend}
		case p < 75:
			i := rnd.IntN(len(s.endpoints))
			e := &s.endpoints[i]
			if !e.draining && s.active() == 1 {
				continue
			}
			e.draining = !e.draining
			return change{what: "draining", service: s.name, backend: e.backend}
		default:
			e := &s.endpoints[rnd.IntN(len(s.endpoints))]
			e.weight = 1 + rnd.IntN(10)
			return change{what: "weight", service: s.name, backend: e.backend}
		}
	}
}

// served lists the served services.
func (w *world) servedServices() []*service {
	var out []*service
	for _, s := range w.services {
		if w.served[s.name] {
			out = append(out, s)
		}
	}
	return out
}

// yaml renders the served services as a control-plane resources file.
func (w *world) yaml() string {
	var b strings.Builder
	b.WriteString("# Written by the soak test.\n")
	for _, s := range w.servedServices() {
		fmt.Fprintf(&b, `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: %s
  metadata:
    filter_metadata:
      io.cilium.l4lb:
        frontends:
`, s.name)
		for _, f := range s.frontends {
			fmt.Fprintf(&b, "        - { vip: %q, port: %d, protocol: %s }\n", f.vip, f.port, f.proto)
		}
		fmt.Fprintf(&b, `  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: %s
  endpoints:
  - lb_endpoints:
`, s.name)
		for _, e := range s.endpoints {
			fmt.Fprintf(&b, "    - endpoint: { address: { socket_address: { address: %q, port_value: %d } } }\n", netns.BackendIPv4(e.backend), s.port)
			fmt.Fprintf(&b, "      load_balancing_weight: %d\n", e.weight)
			if e.draining {
				b.WriteString("      health_status: DRAINING\n")
			}
		}
	}
	return b.String()
}

// frontends is what the frontends table must hold for the served
// services: each frontend's backends as the table prints them, sorted.
func (w *world) frontends() map[string][]string {
	out := map[string][]string{}
	for _, s := range w.servedServices() {
		var bes []string
		for _, e := range s.endpoints {
			a := s.address(e.backend)
			if e.draining {
				a += " terminating"
			}
			bes = append(bes, a)
		}
		slices.Sort(bes)
		for _, f := range s.frontends {
			out[f.String()] = bes
		}
	}
	return out
}
