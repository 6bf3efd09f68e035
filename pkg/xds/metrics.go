// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"strings"
	"sync/atomic"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/l4xds/l4xds/pkg/tlsmetrics"
)

// The client's metrics are gRFC A78's XdsClient metrics, prefixed l4xds_ and
// with Prometheus' conventions (_total on counters), and two of l4xds's own
// for fallback (gRFC A71):
//
//	l4xds_xds_client_connected{xds_server}                              gauge
//	l4xds_xds_client_resource_updates_valid_total{xds_server,resource_type}   counter
//	l4xds_xds_client_resource_updates_invalid_total{xds_server,resource_type} counter
//	l4xds_xds_client_server_failure_total{xds_server}                   counter
//	l4xds_xds_client_resources{xds_server,resource_type,cache_state}    gauge
//	l4xds_xds_client_server_in_use{xds_server}                          gauge
//	l4xds_xds_client_connection_attempts_total{xds_server}              counter
//	l4xds_tls_certificate_expiry_timestamp_seconds{role,file}           gauge, with TLS
//
// xds_server is one server of --xds-server-address; every server has its
// series from the start. The updates are counted for the server that sent
// them; the cache (resources) is one, shown under the server in use.
// resource_type is A78's resource type, one label name on every metric: the
// type URL without its "type.googleapis.com/" prefix, e.g.
// "envoy.config.cluster.v3.Cluster".
// cache_state is one of A78's requested, does_not_exist, acked, nacked,
// nacked_but_cached. The certificate expiries (package tlsmetrics) are those
// of --xds-client-cert-path (role xds-client) and --xds-ca-cert-path
// (xds-ca), read at scrape time as the handshakes read them.
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
// gauges of servers are set by the run loop (and by returnToHigher); the
// resources gauge is counted from the xds-resources table at scrape time.
type clientMetrics struct {
	db        *statedb.DB
	resources statedb.Table[*ResourceStatus]
	status    statedb.Table[*TypeStatus]

	// servers are the xds_server values; inUse is the one in use.
	servers []string
	inUseAt atomic.Pointer[string]

	connected     *prometheus.GaugeVec
	valid         *prometheus.CounterVec
	invalid       *prometheus.CounterVec
	serverFailure *prometheus.CounterVec
	inUse         *prometheus.GaugeVec
	attempts      *prometheus.CounterVec
	resourcesDesc *prometheus.Desc
	// certs is nil in plaintext (--xds-insecure).
	certs *tlsmetrics.Collector
}

func newClientMetrics(db *statedb.DB, resources statedb.Table[*ResourceStatus], status statedb.Table[*TypeStatus]) *clientMetrics {
	server := []string{"xds_server"}
	return &clientMetrics{
		db:        db,
		resources: resources,
		status:    status,
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricsPrefix + "connected",
			Help: "Whether the client has a working ADS stream to the xDS server: 1 from the stream's creation, " +
				"0 after a connection failure or a stream that failed without a response (gRFC A57), or once the client left the server",
		}, server),
		valid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricsPrefix + "resource_updates_valid_total",
			Help: "Resources received that were valid, changed or not",
		}, []string{"xds_server", "resource_type"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricsPrefix + "resource_updates_invalid_total",
			Help: "Resources received that were invalid (NACKed)",
		}, []string{"xds_server", "resource_type"}),
		serverFailure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricsPrefix + "server_failure_total",
			Help: "Connection attempts and ADS streams that failed without receiving a response (gRFC A57)",
		}, server),
		inUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricsPrefix + "server_in_use",
			Help: "1 for the xDS server of the list whose stream the client uses or is trying (gRFC A71), 0 for the others",
		}, server),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricsPrefix + "connection_attempts_total",
			Help: "Connection attempts to the xDS server, including those that check whether a server of higher priority delivers again",
		}, server),
		resourcesDesc: prometheus.NewDesc(metricsPrefix+"resources",
			"Resources in the client's cache, by type and cache state",
			[]string{"xds_server", "resource_type", "cache_state"}, nil),
	}
}

// setServers makes every server's series exist, at 0.
func (m *clientMetrics) setServers(servers []string) {
	m.servers = servers
	for _, s := range servers {
		m.connected.WithLabelValues(s)
		m.serverFailure.WithLabelValues(s)
		m.inUse.WithLabelValues(s)
		m.attempts.WithLabelValues(s)
	}
	m.use(servers[0])
}

// Metrics is the client's collector, for a prometheus.Registerer.
func (c *Client) Metrics() prometheus.Collector { return c.metrics }

// watched makes the type's counters exist at 0, so that they are exported
// (and rate() works) before the first resource of the type.
func (m *clientMetrics) watched(typeURL string) {
	for _, s := range m.servers {
		m.valid.WithLabelValues(s, resourceTypeLabel(typeURL))
		m.invalid.WithLabelValues(s, resourceTypeLabel(typeURL))
	}
}

// use marks the server in use. The others have no stream.
func (m *clientMetrics) use(server string) {
	m.inUseAt.Store(&server)
	for _, s := range m.servers {
		v := 0.0
		if s == server {
			v = 1
		} else {
			m.connected.WithLabelValues(s).Set(0)
		}
		m.inUse.WithLabelValues(s).Set(v)
	}
}

// attempt counts a connection attempt to server.
func (m *clientMetrics) attempt(server string) { m.attempts.WithLabelValues(server).Inc() }

// streamOpened: A78's connected is 1 from the stream's creation.
func (m *clientMetrics) streamOpened(server string) { m.connected.WithLabelValues(server).Set(1) }

// streamEnded counts an attempt that ended. One that had a response is no
// server failure (A57): the server closed a working stream, the client
// reconnects, and connected stays 1 unless that attempt fails (or the
// client moves to another server: use).
func (m *clientMetrics) streamEnded(server string, responded bool) {
	if !responded {
		m.serverFailed(server)
	}
}

// serverFailed counts a failure of server.
func (m *clientMetrics) serverFailed(server string) {
	m.connected.WithLabelValues(server).Set(0)
	m.serverFailure.WithLabelValues(server).Inc()
}

// updates counts the resources of one response.
func (m *clientMetrics) updates(typeURL string, valid, invalid int) {
	server := m.current()
	if valid > 0 {
		m.valid.WithLabelValues(server, resourceTypeLabel(typeURL)).Add(float64(valid))
	}
	if invalid > 0 {
		m.invalid.WithLabelValues(server, resourceTypeLabel(typeURL)).Add(float64(invalid))
	}
}

func (m *clientMetrics) current() string {
	if p := m.inUseAt.Load(); p != nil {
		return *p
	}
	return ""
}

func (m *clientMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.connected.Describe(ch)
	m.valid.Describe(ch)
	m.invalid.Describe(ch)
	m.serverFailure.Describe(ch)
	m.inUse.Describe(ch)
	m.attempts.Describe(ch)
	ch <- m.resourcesDesc
	if m.certs != nil {
		m.certs.Describe(ch)
	}
}

func (m *clientMetrics) Collect(ch chan<- prometheus.Metric) {
	m.connected.Collect(ch)
	m.valid.Collect(ch)
	m.invalid.Collect(ch)
	m.serverFailure.Collect(ch)
	m.inUse.Collect(ch)
	m.attempts.Collect(ch)
	if m.certs != nil {
		m.certs.Collect(ch)
	}

	// Every watched type has a row in xds-status: its states are all
	// exported, 0 included.
	server := m.current()
	txn := m.db.ReadTxn()
	for ts := range m.status.All(txn) {
		counts := make(map[ResourceState]int, len(cacheStates))
		for r := range m.resources.Prefix(txn, ResourcesByType(ts.TypeURL)) {
			counts[r.State]++
		}
		for _, s := range cacheStates {
			ch <- prometheus.MustNewConstMetric(m.resourcesDesc, prometheus.GaugeValue, float64(counts[s]),
				server, resourceTypeLabel(ts.TypeURL), cacheStateLabel(s))
		}
	}
}
