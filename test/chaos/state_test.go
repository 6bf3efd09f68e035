// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/test/netns"
)

// service is one l4lb cluster that a state may serve. A name always has
// the same frontend, in every state of every server: a frontend that
// leaves the tables left because its service did.
type service struct {
	name  string
	vip   string
	port  uint16
	proto string // TCP or UDP
	// core services are in every state, with backend 0 among their
	// endpoints: what the agent must never lose, whichever server it uses.
	core bool
	// steady services are in every state with the same endpoints (backends
	// 0 and 1): whatever the servers do, nothing of them changes, and no
	// flow through them may fail (the privileged variant's traffic).
	steady bool
}

func (s service) frontend() string { return s.dial() + "/" + s.proto }

func (s service) dial() string {
	return netip.AddrPortFrom(netip.MustParseAddr(s.vip), s.port).String()
}

// universe is every service a state may serve.
var universe = []service{
	{name: "web", vip: "10.1.2.3", port: 8080, proto: "TCP", core: true},
	{name: "dns", vip: "10.1.2.5", port: 53, proto: "UDP", core: true},
	{name: "db", vip: "10.1.2.4", port: 3306, proto: "TCP"},
	{name: "game", vip: "10.1.2.6", port: 7777, proto: "UDP"},
	{name: "cache", vip: "10.1.2.7", port: 6379, proto: "TCP"},
	{name: "metrics", vip: "10.1.2.8", port: 9090, proto: "TCP"},
	{name: "api", vip: "10.1.3.1", port: 443, proto: "TCP", steady: true},
	{name: "ntp", vip: "10.1.3.2", port: 123, proto: "UDP", steady: true},
}

// backends is the number of backend addresses endpoints draw from
// (192.168.1.10 and up; nothing listens there: the agent runs without a
// datapath).
const backends = 5

// endpoint is one backend of a service, on the service's port.
type endpoint struct {
	backend  int
	weight   int
	draining bool
}

// state is what one control plane serves: some services of the universe,
// each with its endpoints, sorted by backend.
type state struct {
	// id numbers the states in the order the schedule made them, for its
	// lines: s0, s1, ...
	id       int
	services map[string][]endpoint
}

func (s *state) String() string { return fmt.Sprintf("s%d", s.id) }

// describe is the state in one line: each service and its endpoints, but
// the steady ones, which every state has alike.
func (s *state) describe() string {
	var parts []string
	for _, svc := range universe {
		eps, ok := s.services[svc.name]
		if !ok || svc.steady {
			continue
		}
		var b []string
		for _, e := range eps {
			d := fmt.Sprintf("b%d", e.backend)
			if e.weight != 1 {
				d += fmt.Sprintf("w%d", e.weight)
			}
			if e.draining {
				d += "(draining)"
			}
			b = append(b, d)
		}
		parts = append(parts, svc.name+"["+strings.Join(b, " ")+"]")
	}
	return fmt.Sprintf("%s{%s}", s, strings.Join(parts, " "))
}

// randomState makes a state: the core services with backend 0 and maybe
// others, each other service with some chance; weights and DRAINING at
// random. Every served service keeps a backend that is not DRAINING.
func randomState(rnd *rand.Rand, id int) *state {
	s := &state{id: id, services: map[string][]endpoint{}}
	for _, svc := range universe {
		if svc.steady {
			s.services[svc.name] = []endpoint{{backend: 0, weight: 1}, {backend: 1, weight: 1}}
			continue
		}
		if !svc.core && rnd.IntN(100) < 40 {
			continue
		}
		var eps []endpoint
		for b := range backends {
			if (svc.core && b == 0) || rnd.IntN(100) < 40 {
				e := endpoint{backend: b, weight: 1}
				if rnd.IntN(100) < 30 {
					e.weight = 1 + rnd.IntN(9)
				}
				e.draining = rnd.IntN(100) < 15
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			eps = []endpoint{{backend: rnd.IntN(backends), weight: 1}}
		}
		if !slices.ContainsFunc(eps, func(e endpoint) bool { return !e.draining }) {
			eps[0].draining = false
		}
		s.services[svc.name] = eps
	}
	return s
}

// yaml renders the state as a control-plane resources file.
func (s *state) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# State %s of the chaos test.\n", s)
	for _, svc := range universe {
		eps, ok := s.services[svc.name]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: %s
  metadata:
    filter_metadata:
      io.cilium.l4lb:
        frontends:
        - { vip: %q, port: %d, protocol: %s }
  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: %s
  endpoints:
  - lb_endpoints:
`, svc.name, svc.vip, svc.port, svc.proto, svc.name)
		for _, e := range eps {
			fmt.Fprintf(&b, "    - endpoint: { address: { socket_address: { address: %q, port_value: %d } } }\n", netns.BackendIPv4(e.backend), svc.port)
			fmt.Fprintf(&b, "      load_balancing_weight: %d\n", e.weight)
			if e.draining {
				b.WriteString("      health_status: DRAINING\n")
			}
		}
	}
	return b.String()
}

// view is the agent's tables as the checks compare them: each frontend
// ("10.1.2.3:8080/TCP web") and its backends ("192.168.1.10:8080 w1
// active"), sorted, from the frontends table; and the backends table's
// rows ("web 192.168.1.10:8080 w1 active"), sorted.
type view struct {
	frontends map[string][]string
	backends  []string
}

func frontendKey(address, service string) string { return address + " " + service }

func backendLine(addr netip.AddrPort, weight int, state string) string {
	return fmt.Sprintf("%s w%d %s", addr, weight, state)
}

// view is what the agent's tables hold once they hold s.
func (s *state) view() view { return s.viewAs(func(name string) string { return name }, true) }

// viewAs is the view of s served under other cluster names (name), without
// the endpoints' weights unless weighted.
func (s *state) viewAs(name func(string) string, weighted bool) view {
	v := view{frontends: map[string][]string{}}
	for _, svc := range universe {
		eps, ok := s.services[svc.name]
		if !ok {
			continue
		}
		var bes []string
		for _, e := range eps {
			st := lb.BackendStateActive
			if e.draining {
				st = lb.BackendStateTerminating
			}
			weight := e.weight
			if !weighted {
				weight = 1
			}
			line := backendLine(netip.AddrPortFrom(netns.BackendIPv4(e.backend), svc.port), weight, st.String())
			bes = append(bes, line)
			v.backends = append(v.backends, name(svc.name)+" "+line)
		}
		slices.Sort(bes)
		v.frontends[frontendKey(svc.frontend(), name(svc.name))] = bes
	}
	slices.Sort(v.backends)
	return v
}

// tablesView is the view of the agent's frontends and backends rows.
func tablesView(fes []*lb.Frontend, bes []*lb.Backend) view {
	v := view{frontends: map[string][]string{}}
	for _, fe := range fes {
		var lines []string
		for _, b := range fe.Backends {
			lines = append(lines, backendLine(netip.AddrPortFrom(b.Address.Addr, b.Address.Port), int(b.Weight), b.State.String()))
		}
		slices.Sort(lines)
		v.frontends[frontendKey(fe.Address.String(), string(fe.ServiceName))] = lines
	}
	for _, b := range bes {
		v.backends = append(v.backends, string(b.ServiceName)+" "+
			backendLine(netip.AddrPortFrom(b.Address.Addr, b.Address.Port), int(b.Weight), b.State.String()))
	}
	slices.Sort(v.backends)
	return v
}

func (v view) equal(w view) bool {
	return maps.EqualFunc(v.frontends, w.frontends, slices.Equal) && slices.Equal(v.backends, w.backends)
}

// diff lists how v differs from want, one line each.
func (v view) diff(want view) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want.frontends)) {
		got, ok := v.frontends[k]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("frontend %s missing (want backends %v)", k, want.frontends[k]))
		case !slices.Equal(got, want.frontends[k]):
			out = append(out, fmt.Sprintf("frontend %s has backends %v, want %v", k, got, want.frontends[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(v.frontends)) {
		if _, ok := want.frontends[k]; !ok {
			out = append(out, fmt.Sprintf("frontend %s (backends %v) should not be there", k, v.frontends[k]))
		}
	}
	if !slices.Equal(v.backends, want.backends) {
		out = append(out, fmt.Sprintf("backends table %v, want %v", v.backends, want.backends))
	}
	return out
}

func (v view) String() string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(v.frontends)) {
		lines = append(lines, fmt.Sprintf("%s -> %s", k, strings.Join(v.frontends[k], ", ")))
	}
	return strings.Join(lines, "\n")
}

// members are the frontends of v and each frontend's backend addresses
// ("10.1.2.3:8080/TCP web @ 192.168.1.10:8080"): what "never removed"
// counts, whatever a backend's weight or state.
func (v view) members() map[string]bool {
	m := map[string]bool{}
	for fe, bes := range v.frontends {
		m[fe] = true
		for _, b := range bes {
			addr, _, _ := strings.Cut(b, " ")
			m[fe+" @ "+addr] = true
		}
	}
	return m
}
