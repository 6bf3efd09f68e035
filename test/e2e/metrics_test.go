// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/l4xds/l4xds/pkg/api"
)

// The xDS client's metrics, as every agent with a control plane exports
// them (gRFC A78).
var xdsMetrics = []string{
	"l4xds_xds_client_connected",
	"l4xds_xds_client_resource_updates_valid_total",
	"l4xds_xds_client_resource_updates_invalid_total",
	"l4xds_xds_client_server_failure_total",
	"l4xds_xds_client_resources",
	"l4xds_xds_client_server_in_use",
	"l4xds_xds_client_connection_attempts_total",
}

// A78's resource types.
const (
	clusterType  = "envoy.config.cluster.v3.Cluster"
	endpointType = "envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// metricFamilies is one scrape of /metrics, by family name.
type metricFamilies map[string]*dto.MetricFamily

// scrapeMetrics gets and parses http://addr/metrics.
func scrapeMetrics(client *http.Client, addr string) (metricFamilies, error) {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// series returns the series of a family whose labels include the given
// name, value pairs.
func (m metricFamilies) series(name string, labels ...string) []*dto.Metric {
	var out []*dto.Metric
	for _, s := range m[name].GetMetric() {
		if hasLabels(s, labels) {
			out = append(out, s)
		}
	}
	return out
}

func hasLabels(s *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !slices.ContainsFunc(s.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == pairs[i] && l.GetValue() == pairs[i+1]
		}) {
			return false
		}
	}
	return true
}

// value is the sum of the matching series: a counter's or gauge's value, a
// histogram's count of observations. ok is false without any series.
func (m metricFamilies) value(name string, labels ...string) (v float64, ok bool) {
	for _, s := range m.series(name, labels...) {
		ok = true
		switch {
		case s.Counter != nil:
			v += s.GetCounter().GetValue()
		case s.Gauge != nil:
			v += s.GetGauge().GetValue()
		case s.Histogram != nil:
			v += float64(s.GetHistogram().GetSampleCount())
		case s.Untyped != nil:
			v += s.GetUntyped().GetValue()
		}
	}
	return v, ok
}

// get is value for a series that must be there.
func (m metricFamilies) get(name string, labels ...string) float64 {
	v, _ := m.value(name, labels...)
	return v
}

// missing lists the names that have no series.
func (m metricFamilies) missing(names ...string) []string {
	var out []string
	for _, n := range names {
		if len(m[n].GetMetric()) == 0 {
			out = append(out, n)
		}
	}
	return out
}

// waitMetrics scrapes until ok holds; it fails the test after a generous
// deadline, showing the last scrape of the families named in show.
func waitMetrics(t *testing.T, client *http.Client, addr, what string, ok func(metricFamilies) bool, show ...string) metricFamilies {
	t.Helper()
	var (
		m   metricFamilies
		err error
	)
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if m, err = scrapeMetrics(client, addr); err == nil && ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("metrics at %s never showed %s: %v", addr, what, err)
	}
	t.Fatalf("metrics at %s never showed %s; last scrape:\n%s", addr, what, m.format(show...))
	return nil
}

// format prints the named families as the exposition format does.
func (m metricFamilies) format(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		if f, ok := m[n]; ok {
			expfmt.MetricFamilyToText(&b, f)
		}
	}
	return b.String()
}

// healthz gets /healthz from the agent's API socket.
func healthz(t *testing.T, socket string) (int, api.HealthReport) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := client.Get("http://agent/healthz")
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	defer resp.Body.Close()
	var rep api.HealthReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	return resp.StatusCode, rep
}

// tcpListeners lists the local addresses the process listens on over TCP,
// from its file descriptors and the socket tables of its namespace.
func tcpListeners(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ... uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && f[3] == "0A" && inodes[f[9]] {
				out = append(out, table+" "+f[1])
			}
		}
	}
	return out
}

// pidOf finds the process whose command line has arg (unique to the test).
func pidOf(t *testing.T, arg string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return pid
		}
	}
	t.Fatalf("no process with %q in its command line", arg)
	return 0
}

// stoppable is a process the test stops before it ends.
type stoppable struct {
	cmd  *exec.Cmd
	out  syncBuffer
	done chan struct{}
}

func startStoppable(t *testing.T, bin string, args ...string) *stoppable {
	t.Helper()
	p := &stoppable{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.out.String())
		}
	})
	return p
}

// waitListening waits until addr accepts TCP connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the process at once, as a crash would.
func (p *stoppable) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// The agent serves no metrics unless asked: it listens on no TCP port.
func TestBinariesMetricsAreOffByDefault(t *testing.T) {
	bin := binDir(t)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	agent := start(t, filepath.Join(bin, "l4xds-agent"), "--api-socket", socket, "--datapath", "none")
	shows(t, filepath.Join(bin, "l4xds-dbg"), socket, []string{"xds", "status"}, "xDS control plane disabled")
	if l := tcpListeners(t, pidOf(t, socket)); len(l) != 0 {
		t.Errorf("the agent listens on TCP without --prometheus-serve-addr: %v", l)
	}
	if strings.Contains(agent.out.String(), "Serving Prometheus metrics") {
		t.Errorf("the agent says it serves metrics without --prometheus-serve-addr:\n%s", agent.out.String())
	}
}

// The xDS client's metrics of a running agent, scraped: connected, every
// resource counted, a malformed cluster counted invalid and NACKed, and the
// control plane killed: disconnected, a server failure, /healthz degraded.
func TestBinariesMetricsOfTheXDSClient(t *testing.T) {
	bin := binDir(t)
	dir := t.TempDir()
	example := writeCFP(t, bin, dir)
	cpAddr := freePort(t)
	server := startStoppable(t, filepath.Join(bin, "l4xds-control-plane"), example.serveArgs(cpAddr)...)
	// The agent's first attempt must find the server listening: a refused
	// one would count as a server failure.
	waitListening(t, cpAddr)

	metricsAddr := freePort(t)
	socket := filepath.Join(dir, "agent.sock")
	agent := start(t, filepath.Join(bin, "l4xds-agent"), append([]string{"--api-socket", socket, "--datapath", "none",
		"--prometheus-serve-addr", metricsAddr}, example.xdsArgs(cpAddr)...)...)
	client := &http.Client{Timeout: 10 * time.Second}

	synced := waitMetrics(t, client, metricsAddr, "the CFP example acked", func(m metricFamilies) bool {
		return m.get("l4xds_xds_client_connected") == 1 &&
			m.get("l4xds_xds_client_resources", "resource_type", clusterType, "cache_state", "acked") == 1 &&
			m.get("l4xds_xds_client_resources", "resource_type", endpointType, "cache_state", "acked") == 1
	}, xdsMetrics...)
	t.Logf("scrape of the synced agent:\n%s", synced.format(xdsMetrics...))
	if miss := synced.missing(append(xdsMetrics, "go_goroutines", "process_cpu_seconds_total")...); len(miss) > 0 {
		t.Errorf("metrics missing: %v", miss)
	}
	for _, typ := range []string{clusterType, endpointType} {
		if v := synced.get("l4xds_xds_client_resource_updates_valid_total", "resource_type", typ, "xds_server", cpAddr); v < 1 {
			t.Errorf("valid %s updates = %v, want the one received", typ, v)
		}
		if v, ok := synced.value("l4xds_xds_client_resource_updates_invalid_total", "resource_type", typ); !ok || v != 0 {
			t.Errorf("invalid %s updates = %v (exported: %v), want 0", typ, v, ok)
		}
	}
	if v := synced.get("l4xds_xds_client_server_failure_total", "xds_server", cpAddr); v != 0 {
		t.Errorf("server failures = %v with the server up from the start", v)
	}
	if n := len(synced.series("l4xds_xds_client_resources", "xds_server", cpAddr)); n != 10 {
		t.Errorf("%d resources series, want 5 cache states of 2 types", n)
	}
	// --datapath=none exports no datapath metrics.
	for name := range synced {
		if strings.HasPrefix(name, "l4xds_datapath_") {
			t.Errorf("%s exported with --datapath=none", name)
		}
	}
	if code, rep := healthz(t, socket); code != http.StatusOK || !rep.OK {
		t.Errorf("/healthz %d %+v while synced, want 200 OK", code, rep)
	}
	if !strings.Contains(agent.out.String(), "Serving Prometheus metrics") || !strings.Contains(agent.out.String(), metricsAddr) {
		t.Errorf("the agent's log does not name the metrics address %s", metricsAddr)
	}

	// A malformed l4lb cluster is counted invalid and NACKed alone.
	bad := string(example.cfp) + `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: broken
  metadata:
    filter_metadata:
      io.cilium.l4lb: { vip: "10.1.2.4", port: 70000, protocol: TCP }
  type: EDS
`
	if err := os.WriteFile(example.resources, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	nacked := waitMetrics(t, client, metricsAddr, "the malformed cluster counted invalid", func(m metricFamilies) bool {
		return m.get("l4xds_xds_client_resource_updates_invalid_total", "resource_type", clusterType) >= 1 &&
			m.get("l4xds_xds_client_resources", "resource_type", clusterType, "cache_state", "nacked") == 1
	}, xdsMetrics...)
	if v := nacked.get("l4xds_xds_client_resources", "resource_type", clusterType, "cache_state", "acked"); v != 1 {
		t.Errorf("acked clusters = %v after the NACK, want the good one kept", v)
	}

	// The control plane dies: the stream had responses, the reconnect
	// attempts fail.
	server.kill()
	down := waitMetrics(t, client, metricsAddr, "the control plane gone", func(m metricFamilies) bool {
		return m.get("l4xds_xds_client_connected") == 0 && m.get("l4xds_xds_client_server_failure_total") >= 1
	}, xdsMetrics...)
	t.Logf("scrape with the control plane killed:\n%s", down.format("l4xds_xds_client_connected", "l4xds_xds_client_server_failure_total"))
	// Last-known-good: the cache is kept.
	if v := down.get("l4xds_xds_client_resources", "cache_state", "acked"); v != 2 {
		t.Errorf("acked resources = %v with the control plane gone, want the 2 kept", v)
	}
	code, rep := healthz(t, socket)
	var reason string
	for _, s := range rep.Statuses {
		if s.Level == "Degraded" {
			reason = s.Message
		}
	}
	if code != http.StatusServiceUnavailable || rep.OK || !strings.Contains(reason, "disconnected from "+cpAddr) {
		t.Errorf("/healthz %d %+v with the control plane gone, want 503 and the xDS client degraded, naming %s", code, rep, cpAddr)
	}
}

// A metrics address that cannot be listened on stops the agent with an
// error naming it.
func TestBinariesMetricsAddressInUse(t *testing.T) {
	bin := binDir(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "l4xds-agent"), "--api-socket", filepath.Join(t.TempDir(), "s"),
		"--datapath", "none", "--prometheus-serve-addr", l.Addr().String()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--prometheus-serve-addr "+l.Addr().String()) {
		t.Errorf("agent with its metrics address in use: %v\n%s\nwant a failure naming --prometheus-serve-addr %s", err, out, l.Addr())
	}
}
