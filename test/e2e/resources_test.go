// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net/netip"
	"strings"
)

// cluster is one l4lb service as the privileged tests serve it: a Cluster
// with io.cilium.l4lb metadata and its ClusterLoadAssignment, written in the
// form of the CFP example.
type cluster struct {
	name         string
	frontends    []frontend
	sourceRanges []string
	rejectWeight int // 0: not set
	endpoints    []endpoint
}

type frontend struct {
	vip   string
	port  uint16
	proto string // TCP or UDP
}

type endpoint struct {
	addr   netip.Addr
	port   uint16
	weight int    // 0: not set (weight 1)
	health string // "": not set (healthy)
}

// String is the frontend as the frontends table prints it.
func (f frontend) String() string { return f.dial() + "/" + f.proto }

// dial is the frontend as l4xds-traffic --to takes it.
func (f frontend) dial() string {
	return netip.AddrPortFrom(netip.MustParseAddr(f.vip), f.port).String()
}

// String is the backend as the frontends table prints it, with its state
// when it is not active.
func (e endpoint) String() string {
	s := netip.AddrPortFrom(e.addr, e.port).String()
	switch e.health {
	case "DRAINING":
		s += " terminating"
	case "UNHEALTHY", "TIMEOUT":
		s += " quarantined"
	}
	return s
}

// resourcesYAML renders clusters as a control-plane resources file.
func resourcesYAML(clusters ...cluster) string {
	var b strings.Builder
	b.WriteString("# Written by the privileged end-to-end tests.\n")
	for _, c := range clusters {
		fmt.Fprintf(&b, `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: %s
  metadata:
    filter_metadata:
      io.cilium.l4lb:
        frontends:
`, c.name)
		for _, f := range c.frontends {
			fmt.Fprintf(&b, "        - { vip: %q, port: %d, protocol: %s }\n", f.vip, f.port, f.proto)
		}
		if c.rejectWeight > 0 {
			fmt.Fprintf(&b, "        reject_weight: %d\n", c.rejectWeight)
		}
		if len(c.sourceRanges) > 0 {
			fmt.Fprintf(&b, "        source_ranges: [%s]\n", quoteAll(c.sourceRanges))
		}
		fmt.Fprintf(&b, `  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: %s
`, c.name)
		if len(c.endpoints) == 0 {
			b.WriteString("  endpoints: []\n")
			continue
		}
		b.WriteString("  endpoints:\n  - lb_endpoints:\n")
		for _, e := range c.endpoints {
			fmt.Fprintf(&b, "    - endpoint: { address: { socket_address: { address: %q, port_value: %d } } }\n", e.addr, e.port)
			if e.weight != 0 {
				fmt.Fprintf(&b, "      load_balancing_weight: %d\n", e.weight)
			}
			if e.health != "" {
				fmt.Fprintf(&b, "      health_status: %s\n", e.health)
			}
		}
	}
	return b.String()
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
