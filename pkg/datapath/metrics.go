// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// The datapath's metrics, exported with --datapath=bpf only:
//
//	l4xds_datapath_reconcile_duration_seconds{operation}   histogram, operation update or delete
//	l4xds_datapath_reconcile_errors_total                  counter: failed reconciliations
//	l4xds_datapath_reconcile_errors                        gauge: frontends failing now
//	l4xds_datapath_prune_duration_seconds                  histogram
//	l4xds_datapath_prune_errors_total                      counter
//	l4xds_datapath_frontends{status}                       gauge: pending, done, error
//	l4xds_datapath_service_packets_total{frontend,service} counter
//	l4xds_datapath_service_bytes_total{frontend,service}   counter
//	l4xds_datapath_service_drops_total{frontend,service,reason} counter
//
// The service counters are read at scrape time from the per-CPU stats map,
// summed over the CPUs: one series per frontend in the services map
// (frontend "10.1.2.3:3306/TCP", service its name in the frontends table).
// Drops no service can be charged with (a VIP on a port no service has:
// unknown_port) have frontend="" and service="". reason is the DropReason
// in snake case: no_backend, source_range, unknown_port, fragment,
// malformed, backend_family, protocol, icmp, ipv6_extension, removed_vip,
// reject_limit. With --datapath-service-metrics=false only the latter are
// exported: the others are 13 series per frontend on every node.
const metricsPrefix = "l4xds_datapath_"

// Frontend statuses as exported; a refreshing frontend (a periodic rewrite
// of a done one) counts as done.
var frontendStatuses = map[reconciler.StatusKind]string{
	reconciler.StatusKindPending:    "pending",
	reconciler.StatusKindRefreshing: "done",
	reconciler.StatusKindDone:       "done",
	reconciler.StatusKindError:      "error",
}

func dropReasonLabel(r DropReason) string { return strings.ReplaceAll(r.String(), " ", "_") }

// metrics implements the reconciler's Metrics with Prometheus, and is the
// collector of the datapath's metrics.
type metrics struct {
	reconcileDuration    *prometheus.HistogramVec
	reconcileErrorsTotal prometheus.Counter
	reconcileErrors      prometheus.Gauge
	pruneDuration        prometheus.Histogram
	pruneErrorsTotal     prometheus.Counter

	db        *statedb.DB
	frontends statedb.Table[*lb.Frontend]
	// perFrontend is --datapath-service-metrics.
	perFrontend bool

	frontendsDesc, packetsDesc, bytesDesc, dropsDesc *prometheus.Desc

	// mu keeps the maps open while a scrape reads them.
	mu   sync.RWMutex
	maps *Maps // nil before start, after stop, and with fake maps
}

var _ reconciler.Metrics = (*metrics)(nil)

func newMetrics(db *statedb.DB, frontends statedb.Table[*lb.Frontend]) *metrics {
	m := &metrics{
		reconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricsPrefix + "reconcile_duration_seconds",
			Help: "Time to write one frontend into the BPF maps (update) or remove it (delete)",
			// From a few microseconds (a backend weight) to a large
			// Maglev table rebuilt.
			Buckets: prometheus.ExponentialBuckets(5e-6, 4, 10),
		}, []string{"operation"}),
		reconcileErrorsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricsPrefix + "reconcile_errors_total",
			Help: "Frontends that failed to reconcile into the BPF maps (each is retried)",
		}),
		reconcileErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricsPrefix + "reconcile_errors",
			Help: "Frontends whose last reconciliation into the BPF maps failed",
		}),
		pruneDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricsPrefix + "prune_duration_seconds",
			Help:    "Time to prune the BPF maps of what the frontends table no longer has",
			Buckets: prometheus.ExponentialBuckets(1e-4, 4, 10),
		}),
		pruneErrorsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricsPrefix + "prune_errors_total",
			Help: "Prunes of the BPF maps that failed",
		}),
		db:        db,
		frontends: frontends,
		frontendsDesc: prometheus.NewDesc(metricsPrefix+"frontends",
			"Frontends by reconciliation status: pending, done, error", []string{"status"}, nil),
		packetsDesc: prometheus.NewDesc(metricsPrefix+"service_packets_total",
			"Packets forwarded to a backend, per frontend", []string{"frontend", "service"}, nil),
		bytesDesc: prometheus.NewDesc(metricsPrefix+"service_bytes_total",
			"Bytes forwarded to a backend, per frontend", []string{"frontend", "service"}, nil),
		dropsDesc: prometheus.NewDesc(metricsPrefix+"service_drops_total",
			"Packets to a VIP dropped or rejected, per frontend and reason", []string{"frontend", "service", "reason"}, nil),
	}
	// Both series exist before the first reconciliation.
	m.reconcileDuration.WithLabelValues(reconciler.OpUpdate)
	m.reconcileDuration.WithLabelValues(reconciler.OpDelete)
	return m
}

// registerMetrics makes the datapath's metrics and registers them in the
// agent's registry, if it has one. Its hook comes after the loader's: the
// maps are read from its start until its stop, before they are closed.
func registerMetrics(p params, o *ops) (*metrics, error) {
	m := newMetrics(p.DB, p.Frontends)
	m.perFrontend = p.Config.DatapathServiceMetrics
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error { m.setMaps(o.pinned); return nil },
		OnStop:  func(cell.HookContext) error { m.setMaps(nil); return nil },
	})
	if p.Metrics == nil {
		return m, nil
	}
	return m, p.Metrics.Register(m)
}

func (m *metrics) setMaps(maps *Maps) {
	m.mu.Lock()
	m.maps = maps
	m.mu.Unlock()
}

func (m *metrics) ReconciliationDuration(_ cell.FullModuleID, _, operation string, d time.Duration) {
	m.reconcileDuration.WithLabelValues(operation).Observe(d.Seconds())
}

func (m *metrics) ReconciliationErrors(_ cell.FullModuleID, _ string, new, current int) {
	m.reconcileErrorsTotal.Add(float64(new))
	m.reconcileErrors.Set(float64(current))
}

func (m *metrics) PruneDuration(_ cell.FullModuleID, _ string, d time.Duration) {
	m.pruneDuration.Observe(d.Seconds())
}

func (m *metrics) PruneError(_ cell.FullModuleID, _ string, err error) {
	if err != nil {
		m.pruneErrorsTotal.Inc()
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.reconcileDuration.Describe(ch)
	m.reconcileErrorsTotal.Describe(ch)
	m.reconcileErrors.Describe(ch)
	m.pruneDuration.Describe(ch)
	m.pruneErrorsTotal.Describe(ch)
	ch <- m.frontendsDesc
	ch <- m.packetsDesc
	ch <- m.bytesDesc
	ch <- m.dropsDesc
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.reconcileDuration.Collect(ch)
	m.reconcileErrorsTotal.Collect(ch)
	m.reconcileErrors.Collect(ch)
	m.pruneDuration.Collect(ch)
	m.pruneErrorsTotal.Collect(ch)

	txn := m.db.ReadTxn()
	counts := map[string]int{"pending": 0, "done": 0, "error": 0}
	for fe := range m.frontends.All(txn) {
		if s, ok := frontendStatuses[fe.Status.Kind]; ok {
			counts[s]++
		}
	}
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.frontendsDesc, prometheus.GaugeValue, float64(n), s)
	}

	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.maps != nil {
		m.collectServices(ch, txn)
	}
}

// collectServices reads the counters of every service in the services map,
// and those no service is charged with.
func (m *metrics) collectServices(ch chan<- prometheus.Metric, txn statedb.ReadTxn) {
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	drops := func(s Stats, frontend, service string) {
		for r := range NumDropReasons {
			counter(m.dropsDesc, s.Drops[r], frontend, service, dropReasonLabel(r))
		}
	}
	if m.perFrontend {
		m.collectFrontends(ch, txn, counter, drops)
	}
	s, err := m.maps.ServiceStats(0)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.dropsDesc, err)
		return
	}
	drops(s, "", "")
}

// collectFrontends reads the counters of every service in the services map.
func (m *metrics) collectFrontends(ch chan<- prometheus.Metric, txn statedb.ReadTxn,
	counter func(*prometheus.Desc, uint64, ...string), drops func(Stats, string, string)) {
	for svc, err := range m.maps.Services() {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(m.packetsDesc, err)
			return
		}
		s, err := m.maps.ServiceStats(svc.ID)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(m.packetsDesc, err)
			continue
		}
		var name string
		if fe, _, ok := m.frontends.Get(txn, lb.FrontendByAddress.Query(svc.Frontend)); ok {
			name = fe.ServiceName.String()
		}
		frontend := svc.Frontend.String()
		counter(m.packetsDesc, s.Packets, frontend, name)
		counter(m.bytesDesc, s.Bytes, frontend, name)
		drops(s, frontend, name)
	}
}
