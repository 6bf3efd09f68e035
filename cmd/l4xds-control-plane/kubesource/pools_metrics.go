// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"math/big"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolUsage is how many addresses of one family a pool has, and how many of
// them Services and Gateways hold.
type PoolUsage struct {
	Pool   string
	Family string // "ipv4" or "ipv6"
	// Addresses is a float: an IPv6 pool has more than an integer counts.
	Addresses float64
	Allocated int
}

// usage counts the pools' addresses and those held, per pool and family,
// in the pools' order; a family a pool has no range of has no entry. An
// address shared by several objects counts once, one held outside every
// pool (KeepHeldAddresses) not at all.
func (al *allocator) usage() []PoolUsage {
	type key struct{ pool, family string }
	held := map[key]int{}
	for a, hs := range al.used {
		if len(hs) == 0 {
			continue
		}
		if p, ok := al.pools.find(a); ok {
			held[key{p, familyLabel(a)}]++
		}
	}
	var out []PoolUsage
	for _, p := range al.pools {
		for _, fam := range []string{"ipv4", "ipv6"} {
			n, any := new(big.Int), false
			for _, r := range p.Ranges {
				if familyLabel(r.First) == fam {
					n.Add(n, rangeSize(r))
					any = true
				}
			}
			if !any {
				continue
			}
			total, _ := n.Float64()
			out = append(out, PoolUsage{Pool: p.Name, Family: fam, Addresses: total, Allocated: held[key{p.Name, fam}]})
		}
	}
	return out
}

func familyLabel(a netip.Addr) string {
	if a.Is4() {
		return "ipv4"
	}
	return "ipv6"
}

// rangeSize is Last-First+1.
func rangeSize(r AddrRange) *big.Int {
	first, last := new(big.Int).SetBytes(r.First.AsSlice()), new(big.Int).SetBytes(r.Last.AsSlice())
	n := new(big.Int).Sub(last, first)
	return n.Add(n, big.NewInt(1))
}

// poolMetrics exports the usage of the last state built:
//
//	l4xds_control_plane_pool_addresses{pool,family}            gauge
//	l4xds_control_plane_pool_addresses_allocated{pool,family}  gauge
//
// A pool that goes (an edited pools ConfigMap) loses its series.
type poolMetrics struct {
	addresses, allocated *prometheus.Desc

	mu    sync.Mutex
	usage []PoolUsage
}

func newPoolMetrics() *poolMetrics {
	labels := []string{"pool", "family"}
	return &poolMetrics{
		addresses: prometheus.NewDesc("l4xds_control_plane_pool_addresses",
			"Addresses of each address pool, by family", labels, nil),
		allocated: prometheus.NewDesc("l4xds_control_plane_pool_addresses_allocated",
			"Addresses of each address pool held by Services and Gateways, by family", labels, nil),
	}
}

// set keeps u for the next scrape; a Source made without New has none.
func (m *poolMetrics) set(u []PoolUsage) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.usage = u
	m.mu.Unlock()
}

func (m *poolMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.addresses
	ch <- m.allocated
}

func (m *poolMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range m.usage {
		ch <- prometheus.MustNewConstMetric(m.addresses, prometheus.GaugeValue, u.Addresses, u.Pool, u.Family)
		ch <- prometheus.MustNewConstMetric(m.allocated, prometheus.GaugeValue, float64(u.Allocated), u.Pool, u.Family)
	}
}
