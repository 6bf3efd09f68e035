// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// The datapath's metrics (with --datapath=bpf).
var datapathMetrics = []string{
	"l4xds_datapath_reconcile_duration_seconds",
	"l4xds_datapath_reconcile_errors_total",
	"l4xds_datapath_reconcile_errors",
	"l4xds_datapath_prune_duration_seconds",
	"l4xds_datapath_prune_errors_total",
	"l4xds_datapath_frontends",
	"l4xds_datapath_service_packets_total",
	"l4xds_datapath_service_bytes_total",
	"l4xds_datapath_service_drops_total",
}

// metricsInLB is where the agent of the privileged tests serves metrics:
// inside the LB namespace, new for every topology.
const metricsInLB = "127.0.0.1:9970"

// nsHTTPClient is an HTTP client whose connections are made inside network
// namespace ns.
func nsHTTPClient(ns string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.Dial(ctx, ns, network, addr)
		},
	}}
}

// restartAgentWithMetrics replaces the environment's agent by one with the
// same arguments and --prometheus-serve-addr metricsInLB; the new agent
// takes the pinned maps over, as any restart.
func (e *lbEnv) restartAgentWithMetrics(t *testing.T) {
	t.Helper()
	agentBin := filepath.Join(e.bin, "l4xds-agent")
	i := slices.Index(e.agent.Cmd.Args, agentBin)
	if i < 0 {
		t.Fatalf("the agent's command line %q does not name %s", e.agent.Cmd.Args, agentBin)
	}
	args := append(slices.Clone(e.agent.Cmd.Args[i+1:]), "--prometheus-serve-addr", metricsInLB)
	e.agent.WaitOutput(t, "Started hive", 30*time.Second)
	e.agent.Stop()
	e.agent = startIn(t, e.top, e.topo.LB, agentBin, args...)
	e.agent.WaitOutput(t, "Serving Prometheus metrics", 30*time.Second)
}

// Real traffic through the BPF datapath, then a scrape of the agent: the
// packets and bytes of a served frontend, the drops of a service without
// backends (no_backend) and of a VIP's unserved port (unknown_port, charged
// to no frontend), the reconciler's durations and the frontends' statuses;
// every metric of the agent is there.
func TestPrivilegedMetricsOfTheDatapath(t *testing.T) {
	e := newLBEnv(t, 2)
	e.restartAgentWithMetrics(t)
	client := nsHTTPClient(e.topo.LB)

	web, empty := tcp("10.1.2.60", 8080), tcp("10.1.2.61", 3306)
	e.serve(t, svc("web", web).with(v4(0, 8080), v4(1, 8080)), svc("empty", empty))

	if r := e.probe(t, web, 50); r.Answered != 50 {
		t.Fatalf("%s: want all 50 flows answered; got %s", web, r)
	}
	if r := e.probe(t, empty, 10, "--timeout", "3s"); r.Errors["connection refused"] != 10 {
		t.Fatalf("%s: want all 10 flows refused; got %s", empty, r)
	}
	unserved := tcp("10.1.2.60", 9999)
	if r := e.probe(t, unserved, 5, "--timeout", "500ms"); r.Answered != 0 {
		t.Fatalf("%s: want no answer from a port no service has; got %s", unserved, r)
	}

	before := e.serviceStats(t, web)
	m := waitMetrics(t, client, metricsInLB, "the traffic counted", func(m metricFamilies) bool {
		return m.get("l4xds_datapath_service_packets_total", "frontend", web.String()) > 0 &&
			m.get("l4xds_datapath_service_drops_total", "frontend", "", "reason", "unknown_port") >= 5
	}, datapathMetrics...)
	after := e.serviceStats(t, web)
	t.Logf("scrape after the traffic:\n%s", m.format(datapathMetrics...))

	if miss := m.missing(append(slices.Clone(xdsMetrics), datapathMetrics...)...); len(miss) > 0 {
		t.Errorf("metrics missing: %v", miss)
	}
	// The counters are the pinned map's, summed over the CPUs.
	packets := m.get("l4xds_datapath_service_packets_total", "frontend", web.String(), "service", "web")
	bytes := m.get("l4xds_datapath_service_bytes_total", "frontend", web.String(), "service", "web")
	if packets < float64(before.Packets) || packets > float64(after.Packets) || packets < 50 {
		t.Errorf("%s: %v packets exported, the map counted %d then %d (50 flows sent)", web, packets, before.Packets, after.Packets)
	}
	if bytes < float64(before.Bytes) || bytes > float64(after.Bytes) || bytes <= packets {
		t.Errorf("%s: %v bytes exported, the map counted %d then %d", web, bytes, before.Bytes, after.Bytes)
	}
	for _, c := range []struct {
		frontend, service, reason string
		atLeast                   float64
	}{
		{empty.String(), "empty", "no_backend", 10},
		{"", "", "unknown_port", 5}, // charged to no frontend
	} {
		label := []string{"frontend", c.frontend, "service", c.service, "reason", c.reason}
		if v, ok := m.value("l4xds_datapath_service_drops_total", label...); !ok || v < c.atLeast {
			t.Errorf("drops %v = %v (exported: %v), want at least %v", label, v, ok, c.atLeast)
		}
	}
	if v := m.get("l4xds_datapath_service_drops_total", "frontend", web.String()); v != 0 {
		t.Errorf("%s: %v drops, want none", web, v)
	}
	// One observation per round of the reconciler, which may carry both
	// frontends (the datapath writes them as a batch).
	if v := m.get("l4xds_datapath_reconcile_duration_seconds", "operation", "update"); v < 1 {
		t.Errorf("%v updates observed, want at least one round", v)
	}
	for status, want := range map[string]float64{"done": 2, "pending": 0, "error": 0} {
		if v, ok := m.value("l4xds_datapath_frontends", "status", status); !ok || v != want {
			t.Errorf("frontends{status=%q} = %v (exported: %v), want %v", status, v, ok, want)
		}
	}
	if v := m.get("l4xds_datapath_reconcile_errors"); v != 0 {
		t.Errorf("%v frontends failing to reconcile", v)
	}
	if v := m.get("l4xds_xds_client_connected", "xds_server", controlPlaneAddr); v != 1 {
		t.Errorf("xDS client connected = %v, want 1", v)
	}
}
