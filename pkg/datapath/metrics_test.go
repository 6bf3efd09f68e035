// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// startAgentWithRegistry is startAgentWith in a hive that has a metrics
// registry, as the agent's.
func startAgentWithRegistry(t *testing.T, cfg Config, hooks Hooks) (*agent, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	a := startAgentWith(t, cfg, hooks, cell.Provide(func() prometheus.Registerer { return reg }))
	return a, reg
}

// histogramCount is the number of observations of a histogram series.
func histogramCount(t *testing.T, reg *prometheus.Registry, name, label, value string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

const frontendsGauge = `
# HELP l4xds_datapath_frontends Frontends by reconciliation status: pending, done, error
# TYPE l4xds_datapath_frontends gauge
`

// The reconciler's metrics and the frontends' statuses, over the fake maps:
// no root needed.
func TestMetricsOfTheReconciler(t *testing.T) {
	a, reg := startAgentWithRegistry(t, DefaultConfig, Hooks{FakeMaps: NewFakeMaps()})
	a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, "10.5.5.5:80/TCP")
	a.setBackends(t, "web", "192.168.5.5:80")
	a.upsert(t, dbService, "10.1.2.3:3306/TCP", "[2001:db8::1]:3306/TCP")
	a.setBackends(t, "db", "192.168.1.10:3306")

	// Before the first full state every frontend waits.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(frontendsGauge+`
l4xds_datapath_frontends{status="done"} 0
l4xds_datapath_frontends{status="error"} 0
l4xds_datapath_frontends{status="pending"} 3
`), "l4xds_datapath_frontends"); err != nil {
		t.Error(err)
	}

	a.initialize(t)
	a.reconciled(t)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(frontendsGauge+`
l4xds_datapath_frontends{status="done"} 3
l4xds_datapath_frontends{status="error"} 0
l4xds_datapath_frontends{status="pending"} 0
`), "l4xds_datapath_frontends"); err != nil {
		t.Error(err)
	}
	// The reconciler writes a round of frontends as one batch: one
	// observation per round.
	if n := histogramCount(t, reg, "l4xds_datapath_reconcile_duration_seconds", "operation", "update"); n < 1 {
		t.Errorf("%d update durations observed, want one per round at least", n)
	}
	if n := histogramCount(t, reg, "l4xds_datapath_reconcile_duration_seconds", "operation", "delete"); n != 0 {
		t.Errorf("%d delete durations observed before any delete", n)
	}

	a.write(t, func(txn lb.WriteTxn) error { _, err := a.w.DeleteServiceAndFrontends(txn, "web"); return err })
	a.reconciled(t)
	if n := histogramCount(t, reg, "l4xds_datapath_reconcile_duration_seconds", "operation", "delete"); n != 1 {
		t.Errorf("%d delete durations observed, want 1", n)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP l4xds_datapath_reconcile_errors Frontends whose last reconciliation into the BPF maps failed
# TYPE l4xds_datapath_reconcile_errors gauge
l4xds_datapath_reconcile_errors 0
# HELP l4xds_datapath_reconcile_errors_total Frontends that failed to reconcile into the BPF maps (each is retried)
# TYPE l4xds_datapath_reconcile_errors_total counter
l4xds_datapath_reconcile_errors_total 0
`), "l4xds_datapath_reconcile_errors", "l4xds_datapath_reconcile_errors_total"); err != nil {
		t.Error(err)
	}
	// Fake maps have no counters to read.
	if n := testutil.CollectAndCount(reg, "l4xds_datapath_service_packets_total"); n != 0 {
		t.Errorf("%d service counters over fake maps", n)
	}
}

// The reconciler reports new and current errors each round; prunes report
// nil on success.
func TestMetricsCountErrors(t *testing.T) {
	m := newMetrics(nil, nil)
	var id cell.FullModuleID
	m.ReconciliationErrors(id, "", 2, 3)
	m.ReconciliationErrors(id, "", 0, 1)
	m.PruneError(id, "", errors.New("write l4xds_services: boom"))
	m.PruneError(id, "", nil)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"reconcile_errors_total", testutil.ToFloat64(m.reconcileErrorsTotal), 2},
		{"reconcile_errors", testutil.ToFloat64(m.reconcileErrors), 1},
		{"prune_errors_total", testutil.ToFloat64(m.pruneErrorsTotal), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// The service counters are read from the per-CPU stats map at scrape time,
// summed over the CPUs, named by frontend and service; what no service is
// charged with has an empty frontend.
func TestPrivilegedMetricsReadTheServiceCounters(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	a, reg := startAgentWithRegistry(t, testConfig(root), Hooks{})
	a.upsert(t, dbService, "10.1.2.3:3306/TCP")
	a.setBackends(t, "db", "192.168.1.10:3306")
	a.initialize(t)
	a.reconciled(t)
	id := readMaps(t, root).services[fe("10.1.2.3:3306/TCP")].ID

	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := func(f func(s *bpf.L4xdsLbStats, cpu int)) []bpf.L4xdsLbStats {
		v := make([]bpf.L4xdsLbStats, cpus)
		for i := range v {
			f(&v[i], i)
		}
		return v
	}
	// 3 packets of 100 bytes and 2 no-backend drops per CPU.
	writeEntry(t, root, bpf.L4xdsMapL4xdsStats, id, perCPU(func(s *bpf.L4xdsLbStats, _ int) {
		s.Packets, s.Bytes, s.Drops[DropNoBackend] = 3, 300, 2
	}))
	// One unknown-port drop on CPU 0.
	writeEntry(t, root, bpf.L4xdsMapL4xdsStats, uint32(0), perCPU(func(s *bpf.L4xdsLbStats, cpu int) {
		if cpu == 0 {
			s.Drops[DropUnknownPort] = 1
		}
	}))

	// Summed over the CPUs.
	n := func(v int) string { return strconv.Itoa(v * cpus) }
	want := `
# HELP l4xds_datapath_service_bytes_total Bytes forwarded to a backend, per frontend
# TYPE l4xds_datapath_service_bytes_total counter
l4xds_datapath_service_bytes_total{frontend="10.1.2.3:3306/TCP",service="db"} ` + n(300) + `
# HELP l4xds_datapath_service_drops_total Packets to a VIP dropped or rejected, per frontend and reason
# TYPE l4xds_datapath_service_drops_total counter
l4xds_datapath_service_drops_total{frontend="",reason="backend_family",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="fragment",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="icmp",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="ipv6_extension",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="malformed",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="no_backend",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="protocol",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="reject_limit",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="removed_vip",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="source_range",service=""} 0
l4xds_datapath_service_drops_total{frontend="",reason="unknown_port",service=""} 1
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="backend_family",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="fragment",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="icmp",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="ipv6_extension",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="malformed",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="no_backend",service="db"} ` + n(2) + `
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="protocol",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="reject_limit",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="removed_vip",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="source_range",service="db"} 0
l4xds_datapath_service_drops_total{frontend="10.1.2.3:3306/TCP",reason="unknown_port",service="db"} 0
# HELP l4xds_datapath_service_packets_total Packets forwarded to a backend, per frontend
# TYPE l4xds_datapath_service_packets_total counter
l4xds_datapath_service_packets_total{frontend="10.1.2.3:3306/TCP",service="db"} ` + n(3) + `
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"l4xds_datapath_service_packets_total", "l4xds_datapath_service_bytes_total", "l4xds_datapath_service_drops_total"); err != nil {
		t.Error(err)
	}

	// Stopped, the agent closes the maps: a scrape reads none.
	a.stop(t)
	if n := testutil.CollectAndCount(reg, "l4xds_datapath_service_packets_total"); n != 0 {
		t.Errorf("%d service counters after stop", n)
	}
}

// --datapath-service-metrics=false leaves out the counters of every
// frontend (13 series per frontend and node); the drops no frontend is
// charged with stay.
func TestPrivilegedMetricsWithoutServiceCounters(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.DatapathServiceMetrics = false
	a, reg := startAgentWithRegistry(t, cfg, Hooks{})
	a.upsert(t, dbService, "10.1.2.3:3306/TCP")
	a.setBackends(t, "db", "192.168.1.10:3306")
	a.initialize(t)
	a.reconciled(t)

	for _, name := range []string{"l4xds_datapath_service_packets_total", "l4xds_datapath_service_bytes_total"} {
		if n := testutil.CollectAndCount(reg, name); n != 0 {
			t.Errorf("%d series of %s", n, name)
		}
	}
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	drops := 0
	for _, mf := range got {
		if mf.GetName() != "l4xds_datapath_service_drops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			drops++
			for _, l := range m.GetLabel() {
				if (l.GetName() == "frontend" || l.GetName() == "service") && l.GetValue() != "" {
					t.Errorf("a drop series of a frontend: %v", m.GetLabel())
				}
			}
		}
	}
	if drops != int(NumDropReasons) {
		t.Errorf("%d drop series, want the %d of no frontend", drops, NumDropReasons)
	}
}
