// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the Prometheus metrics of the clients of a Server. A
// node's series go when its last stream closes.
type serverMetrics struct {
	acks, nacks *prometheus.CounterVec
	version     *prometheus.GaugeVec
}

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
	}
	reg.MustRegister(m.acks, m.nacks, m.version,
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
