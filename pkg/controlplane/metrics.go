// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the Prometheus metrics of the clients of a Server. A
// node's series go when its last stream closes.
type serverMetrics struct {
	acks, nacks *prometheus.CounterVec
	version     *prometheus.GaugeVec
	// ackLatency is by type URL only: a node label would make one
	// histogram per node, thousands of series of a dozen buckets each. A
	// node that lags shows in l4xds_control_plane_acked_version.
	ackLatency *prometheus.HistogramVec
}

// ackLatencyBuckets span a fast local ACK to a fleet that takes minutes.
var ackLatencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func newServerMetrics(reg prometheus.Registerer, c *callbacks) *serverMetrics {
	m := &serverMetrics{
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4xds_control_plane_acks_total",
			Help: "Responses a node accepted (ACK), by type URL",
		}, []string{"node", "type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4xds_control_plane_nacks_total",
			Help: "Responses a node rejected (NACK), by type URL; the log has the node's error",
		}, []string{"node", "type"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "l4xds_control_plane_acked_version",
			Help: "The version a node last accepted, by type URL (1, the version a label)",
		}, []string{"node", "type", "version"}),
		ackLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "l4xds_control_plane_ack_latency_seconds",
			Help: "From a new version of a type published to each node's ACK of it, by type URL; " +
				"nodes that connected after the version was published are not counted (their first response is a sync, not a change)",
			Buckets: ackLatencyBuckets,
		}, []string{"type"}),
	}
	reg.MustRegister(m.acks, m.nacks, m.version, m.ackLatency,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "l4xds_control_plane_connected_clients",
			Help: "Nodes with an xDS stream open",
		}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return float64(len(c.streams))
		}))
	return m
}

// Register adds l4xds_control_plane_ready (1 when ready, see Ready) to reg.
func (h *Health) Register(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "l4xds_control_plane_ready",
		Help: "1 once the first complete state is served and no source reports a problem (/readyz)",
	}, func() float64 {
		if h.Ready() != nil {
			return 0
		}
		return 1
	}))
}

// publishedVersions remembers when the last versions of each type were
// published, for the ACK latency: a node ACKs a version some time after it
// was published, and may skip versions when changes come faster than it
// ACKs.
type publishedVersions struct {
	mu     sync.Mutex
	byType map[string][]publishedVersion // oldest first, at most keepVersions
}

type publishedVersion struct {
	version string
	at      time.Time
}

// keepVersions bounds the versions remembered per type: a node that ACKs a
// version older than that is not measured.
const keepVersions = 64

func (p *publishedVersions) publish(typeURL, version string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byType == nil {
		p.byType = map[string][]publishedVersion{}
	}
	vs := append(p.byType[typeURL], publishedVersion{version, at})
	if len(vs) > keepVersions {
		vs = vs[len(vs)-keepVersions:]
	}
	p.byType[typeURL] = vs
}

// at is when version of typeURL was published.
func (p *publishedVersions) at(typeURL, version string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.byType[typeURL] {
		if v.version == version {
			return v.at, true
		}
	}
	return time.Time{}, false
}
