// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"strings"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
)

// The client's metrics are gRFC A78's XdsClient metrics, prefixed l4xds_ and
// with Prometheus' conventions (_total on counters):
//
//	l4xds_xds_client_connected{xds_server}                              gauge
//	l4xds_xds_client_resource_updates_valid_total{xds_server,resource_type}   counter
//	l4xds_xds_client_resource_updates_invalid_total{xds_server,resource_type} counter
//	l4xds_xds_client_server_failure_total{xds_server}                   counter
//	l4xds_xds_client_resources{xds_server,type,cache_state}             gauge
//
// xds_server is --xds-server-address. resource_type and type are A78's
// resource type: the type URL without its "type.googleapis.com/" prefix,
// e.g. "envoy.config.cluster.v3.Cluster". cache_state is one of A78's
// requested, does_not_exist, acked, nacked, nacked_but_cached.
const metricsPrefix = "l4xds_xds_client_"

// cacheStates are the cache_state values, in the order of ResourceState.
var cacheStates = []ResourceState{StateRequested, StateDoesNotExist, StateAcked, StateNacked, StateNackedButCached}

// cacheStateLabel is A78's spelling of a state: "nacked_but_cached".
func cacheStateLabel(s ResourceState) string { return strings.ReplaceAll(string(s), "-", "_") }

// resourceTypeLabel is A78's resource type: "envoy.config.cluster.v3.Cluster".
func resourceTypeLabel(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '/')+1:]
}

// clientMetrics is the client's prometheus.Collector. The counters and the
// connected gauge are set by the run loop; the resources gauge is counted
// from the xds-resources table at scrape time.
type clientMetrics struct {
	db        *statedb.DB
	resources statedb.Table[*ResourceStatus]
	status    statedb.Table[*TypeStatus]

	connected     prometheus.Gauge
	valid         *prometheus.CounterVec
	invalid       *prometheus.CounterVec
	serverFailure prometheus.Counter
	resourcesDesc *prometheus.Desc
}

func newClientMetrics(server string, db *statedb.DB, resources statedb.Table[*ResourceStatus], status statedb.Table[*TypeStatus]) *clientMetrics {
	serverLabel := prometheus.Labels{"xds_server": server}
	return &clientMetrics{
		db:        db,
		resources: resources,
		status:    status,
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricsPrefix + "connected",
			Help: "Whether the client has a working ADS stream to the xDS server: 1 from the stream's creation, " +
				"0 after a connection failure or a stream that failed without a response (gRFC A57)",
			ConstLabels: serverLabel,
		}),
		valid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        metricsPrefix + "resource_updates_valid_total",
			Help:        "Resources received that were valid, changed or not",
			ConstLabels: serverLabel,
		}, []string{"resource_type"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        metricsPrefix + "resource_updates_invalid_total",
			Help:        "Resources received that were invalid (NACKed)",
			ConstLabels: serverLabel,
		}, []string{"resource_type"}),
		serverFailure: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        metricsPrefix + "server_failure_total",
			Help:        "Connection attempts and ADS streams that failed without receiving a response (gRFC A57)",
			ConstLabels: serverLabel,
		}),
		resourcesDesc: prometheus.NewDesc(metricsPrefix+"resources",
			"Resources in the client's cache, by type and cache state",
			[]string{"type", "cache_state"}, serverLabel),
	}
}

// Metrics is the client's collector, for a prometheus.Registerer.
func (c *Client) Metrics() prometheus.Collector { return c.metrics }

// watched makes the type's counters exist at 0, so that they are exported
// (and rate() works) before the first resource of the type.
func (m *clientMetrics) watched(typeURL string) {
	m.valid.WithLabelValues(resourceTypeLabel(typeURL))
	m.invalid.WithLabelValues(resourceTypeLabel(typeURL))
}

// streamOpened: A78's connected is 1 from the stream's creation.
func (m *clientMetrics) streamOpened() { m.connected.Set(1) }

// streamEnded counts an attempt that ended. One that had a response is no
// server failure (A57): the server closed a working stream, the client
// reconnects, and connected stays 1 unless that attempt fails.
func (m *clientMetrics) streamEnded(responded bool) {
	if responded {
		return
	}
	m.connected.Set(0)
	m.serverFailure.Inc()
}

// updates counts the resources of one response.
func (m *clientMetrics) updates(typeURL string, valid, invalid int) {
	if valid > 0 {
		m.valid.WithLabelValues(resourceTypeLabel(typeURL)).Add(float64(valid))
	}
	if invalid > 0 {
		m.invalid.WithLabelValues(resourceTypeLabel(typeURL)).Add(float64(invalid))
	}
}

func (m *clientMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.connected.Describe(ch)
	m.valid.Describe(ch)
	m.invalid.Describe(ch)
	m.serverFailure.Describe(ch)
	ch <- m.resourcesDesc
}

func (m *clientMetrics) Collect(ch chan<- prometheus.Metric) {
	m.connected.Collect(ch)
	m.valid.Collect(ch)
	m.invalid.Collect(ch)
	m.serverFailure.Collect(ch)

	// Every watched type has a row in xds-status: its states are all
	// exported, 0 included.
	txn := m.db.ReadTxn()
	for ts := range m.status.All(txn) {
		counts := make(map[ResourceState]int, len(cacheStates))
		for r := range m.resources.List(txn, ResourcesByType(ts.TypeURL)) {
			counts[r.State]++
		}
		for _, s := range cacheStates {
			ch <- prometheus.MustNewConstMetric(m.resourcesDesc, prometheus.GaugeValue, float64(counts[s]),
				resourceTypeLabel(ts.TypeURL), cacheStateLabel(s))
		}
	}
}
