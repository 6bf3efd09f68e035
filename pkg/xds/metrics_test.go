// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/tlsmetrics"
)

const (
	clusterTypeLabel  = "envoy.config.cluster.v3.Cluster"
	endpointTypeLabel = "envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// The metrics of the client's first server.

func (tc *testClient) valid(typeLabel string) float64 {
	return testutil.ToFloat64(tc.metrics.valid.WithLabelValues(tc.servers[0].address, typeLabel))
}

func (tc *testClient) invalid(typeLabel string) float64 {
	return testutil.ToFloat64(tc.metrics.invalid.WithLabelValues(tc.servers[0].address, typeLabel))
}

func (tc *testClient) connected() float64 { return tc.connectedTo(tc.servers[0].address) }

func (tc *testClient) serverFailures() float64 { return tc.serverFailuresOf(tc.servers[0].address) }

// The metrics of one server.

func (tc *testClient) connectedTo(addr string) float64 {
	return testutil.ToFloat64(tc.metrics.connected.WithLabelValues(addr))
}

func (tc *testClient) serverFailuresOf(addr string) float64 {
	return testutil.ToFloat64(tc.metrics.serverFailure.WithLabelValues(addr))
}

func (tc *testClient) inUse(addr string) float64 {
	return testutil.ToFloat64(tc.metrics.inUse.WithLabelValues(addr))
}

func (tc *testClient) attemptsOn(addr string) float64 {
	return testutil.ToFloat64(tc.metrics.attempts.WithLabelValues(addr))
}

// resourcesGauge is the l4xds_xds_client_resources exposition expected for
// a client of server addr with, per type, the count of each cache state
// given (the others 0).
func resourcesGauge(addr string, counts map[string]map[string]int) string {
	var b strings.Builder
	b.WriteString("# HELP l4xds_xds_client_resources Resources in the client's cache, by type and cache state\n")
	b.WriteString("# TYPE l4xds_xds_client_resources gauge\n")
	for _, typ := range []string{clusterTypeLabel, endpointTypeLabel} {
		for _, state := range []string{"acked", "does_not_exist", "nacked", "nacked_but_cached", "requested"} {
			fmt.Fprintf(&b, "l4xds_xds_client_resources{cache_state=%q,resource_type=%q,xds_server=%q} %d\n",
				state, typ, addr, counts[typ][state])
		}
	}
	return b.String()
}

func TestMetricsCountResourcesAndNacks(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
			s.setEndpoints(endpoints("a", 0))
		})
		tc := startClient(t, testConfig(srv.addr, "", protocol), func(tc *testClient) {
			tc.clusters.onUpdate = func(Update) { tc.SetNames(EndpointType, []string{"a", "missing"}) }
			tc.cfg.XDSResourceDoesNotExistTimeout = time.Hour
		})
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})
		waitEndpoints(t, tc, map[string]string{"a": "p0"})
		waitFor(t, "connected 1", func() bool { return tc.connected() == 1 })

		// Every resource received counts, one by one.
		if got := tc.valid(clusterTypeLabel); got != 2 {
			t.Errorf("valid clusters = %v, want 2", got)
		}
		if got := tc.valid(endpointTypeLabel); got != 1 {
			t.Errorf("valid endpoints = %v, want 1", got)
		}
		if got := tc.invalid(clusterTypeLabel); got != 0 {
			t.Errorf("invalid clusters = %v before any NACK", got)
		}
		if err := testutil.CollectAndCompare(tc.Metrics(), strings.NewReader(resourcesGauge(srv.addr, map[string]map[string]int{
			clusterTypeLabel:  {"acked": 2},
			endpointTypeLabel: {"acked": 1, "requested": 1},
		})), "l4xds_xds_client_resources"); err != nil {
			t.Error(err)
		}

		// b turns bad: one invalid, and the good a counts again in SotW,
		// which resends every cluster.
		srv.setClusters(cluster("a", "1"), cluster("b", "bad"))
		tc.waitState(t, ClusterType, "b", StateNackedButCached)
		if got := tc.invalid(clusterTypeLabel); got != 1 {
			t.Errorf("invalid clusters = %v after one NACK, want 1", got)
		}
		wantValid := 2.0 // Delta sends only b
		if protocol == ProtocolSotW {
			wantValid = 3
		}
		if got := tc.valid(clusterTypeLabel); got != wantValid {
			t.Errorf("valid clusters = %v after the NACK, want %v", got, wantValid)
		}
		if err := testutil.CollectAndCompare(tc.Metrics(), strings.NewReader(resourcesGauge(srv.addr, map[string]map[string]int{
			clusterTypeLabel:  {"acked": 1, "nacked_but_cached": 1},
			endpointTypeLabel: {"acked": 1, "requested": 1},
		})), "l4xds_xds_client_resources"); err != nil {
			t.Error(err)
		}
		if got := tc.serverFailures(); got != 0 {
			t.Errorf("server failures = %v while the server is up", got)
		}

		// The server goes away: the stream had responses, so its end is
		// no failure, but the next attempt's is.
		srv.stop()
		waitFor(t, "connected 0", func() bool { return tc.connected() == 0 })
		waitFor(t, "a server failure", func() bool { return tc.serverFailures() >= 1 })
		// The cache is kept: last-known-good.
		if err := testutil.CollectAndCompare(tc.Metrics(), strings.NewReader(resourcesGauge(srv.addr, map[string]map[string]int{
			clusterTypeLabel:  {"acked": 1, "nacked_but_cached": 1},
			endpointTypeLabel: {"acked": 1, "requested": 1},
		})), "l4xds_xds_client_resources"); err != nil {
			t.Error(err)
		}
	})
}

func TestMetricsNoServer(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", "", nil)
	srv.stop() // an address where nothing listens
	tc := startClient(t, testConfig(srv.addr, "", ProtocolSotW))
	waitFor(t, "three server failures", func() bool { return tc.serverFailures() >= 3 })
	if got := tc.connected(); got != 0 {
		t.Errorf("connected = %v with no server", got)
	}
	// The counters of the watched types exist before any resource.
	if n := testutil.CollectAndCount(tc.Metrics(), "l4xds_xds_client_resource_updates_valid_total"); n != 2 {
		t.Errorf("%d valid counters, want one per watched type", n)
	}
}

// A server that ends every stream after a response (e.g. a maximum
// connection age) is no failing server (gRFC A57): connected stays 1.
func TestMetricsStreamEndedAfterResponse(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
		s.setClusters(cluster("a", "1"))
		s.closeOnAck = true
	})
	tc := startClient(t, testConfig(srv.addr, "", ProtocolSotW))
	// Each stream brings cluster a once.
	waitFor(t, "three streams with a response", func() bool { return tc.valid(clusterTypeLabel) >= 3 })
	if got := tc.serverFailures(); got != 0 {
		t.Errorf("server failures = %v, want 0: every stream had a response", got)
	}
	if got := tc.connected(); got != 1 {
		t.Errorf("connected = %v, want 1", got)
	}
}

// healthLog records every report, as "Level: message", skipping repeats.
type healthLog struct {
	mu    sync.Mutex
	lines []string
}

func (h *healthLog) add(line string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.lines); n == 0 || h.lines[n-1] != line {
		h.lines = append(h.lines, line)
	}
}

func (h *healthLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

func (h *healthLog) last() string {
	all := h.all()
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

func (h *healthLog) OK(status string)                { h.add("OK: " + status) }
func (h *healthLog) Degraded(reason string, _ error) { h.add("Degraded: " + reason) }
func (h *healthLog) Stopped(reason string)           { h.add("Stopped: " + reason) }
func (h *healthLog) NewScope(string) cell.Health     { return h }
func (h *healthLog) Close()                          {}

// Health is OK only once every watched type that asks for something had its
// first response on the stream; degraded, with the reason, before that and
// while disconnected. It never turns OK in between.
func TestHealthWaitsForEveryType(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"))
			s.setEndpoints(endpoints("a", 0))
		})
		health := &healthLog{}
		startClient(t, testConfig(srv.addr, "", protocol), func(tc *testClient) {
			tc.health = health
			tc.clusters.onUpdate = func(Update) { tc.SetNames(EndpointType, []string{"a"}) }
		})
		synced := "OK: connected to " + srv.addr + ", 2 types synced"
		waitFor(t, "health OK", func() bool { return health.last() == synced })
		want := []string{
			"Degraded: connecting to " + srv.addr,
			"Degraded: connected to " + srv.addr + ", waiting for the first Cluster response",
			"Degraded: connected to " + srv.addr + ", waiting for the first ClusterLoadAssignment response",
			synced,
		}
		if got := health.all(); !slices.Equal(got, want) {
			t.Errorf("health reports:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}

		srv.stop()
		waitFor(t, "degraded", func() bool {
			return strings.HasPrefix(health.last(), "Degraded: disconnected from "+srv.addr+": ")
		})
	})
}

// A Delta server does not answer for names it does not have: the type is
// owed a response until the does-not-exist timer settles its names.
func TestHealthAfterDoesNotExist(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
		s.setClusters(cluster("a", "1"))
	})
	health := &healthLog{}
	tc := startClient(t, testConfig(srv.addr, "", ProtocolDelta), func(tc *testClient) {
		tc.health = health
		tc.clusters.onUpdate = func(Update) { tc.SetNames(EndpointType, []string{"a"}) }
		tc.cfg.XDSResourceDoesNotExistTimeout = 300 * time.Millisecond
	})
	tc.waitState(t, EndpointType, "a", StateDoesNotExist)
	waitFor(t, "health OK", func() bool { return health.last() == "OK: connected to "+srv.addr+", 1 types synced" })
	if got := health.all(); !slices.Contains(got, "Degraded: connected to "+srv.addr+", waiting for the first ClusterLoadAssignment response") {
		t.Errorf("health reports %q: never waited for the endpoints", got)
	}
}

// With TLS, the client exports when its certificate and its CA expire, as
// the files say; in plaintext it has no certificates to report.
func TestMetricsCertificateExpiry(t *testing.T) {
	dir := t.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{Validity: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("127.0.0.1:1", dir, "sotw")
	c, err := NewClient(cfg, hivetest.Logger(t), statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	want.WriteString("# HELP l4xds_tls_certificate_expiry_timestamp_seconds When the certificate file expires (Unix time): the first expiry of a chain, the last of a CA bundle; the last good value while the file cannot be read\n")
	want.WriteString("# TYPE l4xds_tls_certificate_expiry_timestamp_seconds gauge\n")
	for _, f := range []struct{ role, path string }{{"xds-ca", cfg.XDSCACertPath}, {"xds-client", cfg.XDSClientCertPath}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		at, err := tlsmetrics.Expiry(data, false)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(at); d < 47*time.Hour || d > 49*time.Hour {
			t.Fatalf("%s expires in %s, want the 48h it was made for", f.path, d)
		}
		fmt.Fprintf(&want, "l4xds_tls_certificate_expiry_timestamp_seconds{file=%q,role=%q} %d\n", f.path, f.role, at.Unix())
	}
	if err := testutil.CollectAndCompare(c.Metrics(), strings.NewReader(want.String()), "l4xds_tls_certificate_expiry_timestamp_seconds"); err != nil {
		t.Error(err)
	}

	c, err = NewClient(testConfig("127.0.0.1:1", "", "sotw"), hivetest.Logger(t), statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c.Metrics(), "l4xds_tls_certificate_expiry_timestamp_seconds"); n != 0 {
		t.Errorf("a plaintext client exports %d certificate expiries", n)
	}
}
