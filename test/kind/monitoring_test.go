// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The prometheus-operator release whose CRDs the chart's ServiceMonitors,
// PodMonitors and PrometheusRule are applied against: its Go module holds
// them (example/prometheus-operator-crd), read from Go's module cache.
const promOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

// The control plane's alert: no agent reaches an xDS server.
const controlPlaneAlert = "L4xdsAgentXdsDisconnected"

// The rules' for: durations in this Prometheus. The chart's are minutes
// (promtool test rules checks them, install/kubernetes/test); here the
// expressions are what is tested, on real targets, without the wait.
const ruleFor = "10s"

// monitoring installs the Prometheus Operator's CRDs and turns on the
// chart's metrics, ServiceMonitors, PrometheusRule and dashboard: the API
// server accepts them. A Prometheus server on the host (Debian's
// prometheus) scrapes the agents (the host network's port 9970 on each
// node's address) and the control plane (a NodePort Service in front of its
// health port: pod addresses are not routable from the host), with the rules of the PrometheusRule
// as the API server holds it. Every query of the dashboard returns data,
// and the control plane's alert fires while the control plane is scaled
// to zero and clears when it is back.
func (c *cluster) monitoring(t *testing.T, docs string) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is missing: apt-get install prometheus (.ci/run installs it): %v", err)
	}
	dir := filepath.Join(moduleDir(t, promOperatorModule), "example", "prometheus-operator-crd")
	var files, crds []string
	for _, kind := range []string{"servicemonitors", "podmonitors", "prometheusrules"} {
		files = append(files, filepath.Join(dir, "monitoring.coreos.com_"+kind+".yaml"))
		crds = append(crds, "crd/"+kind+".monitoring.coreos.com")
	}
	c.applyCRDs(t, files, crds)
	t.Logf("Prometheus Operator CRDs from %s", dir)

	// The agents serve metrics since the install (prometheus.enabled), so
	// this upgrade does not roll them.
	upgrade := forRelease("helm upgrade l4xds install/kubernetes/l4xds -n kube-system --reuse-values " +
		"--set prometheus.serviceMonitor.enabled=true --set prometheus.prometheusRule.enabled=true " +
		"--set dashboards.enabled=true --wait")
	c.sh(t, docs, upgrade)
	t.Logf("accepted: %s", c.kubectl(t, "-n", ns, "get", "servicemonitors,prometheusrules", "-o", "name"))
	// The PodMonitors, the other way to scrape the same targets: a
	// server-side dry run (both at once would scrape every target twice).
	manifest := c.sh(t, docs, fmt.Sprintf("helm get values %s -n %s -o yaml >values.yaml && helm template %s install/kubernetes/l4xds -n %s -f values.yaml --kube-version 1.34.4 --set prometheus.serviceMonitor.enabled=false --set prometheus.podMonitor.enabled=true --show-only templates/podmonitor.yaml", release, ns, release, ns))
	if n := strings.Count(c.dryRun(t, manifest), "(server dry run)"); n != 2 {
		t.Errorf("%d PodMonitors accepted, want 2 (the agents', the control plane's)", n)
	}

	// The control plane's metrics, per node.
	c.apply(t, fmt.Sprintf(cpMetricsNodePortYAML, cpName+"-metrics-np", ns, release))
	nodePort := strings.TrimSpace(c.kubectl(t, "-n", ns, "get", "service", cpName+"-metrics-np", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	defer c.run("kubectl", "-n", ns, "delete", "service", cpName+"-metrics-np")

	// The rules of the PrometheusRule, as the API server holds them.
	var rule struct {
		Spec struct {
			Groups []struct {
				Name  string           `json:"name"`
				Rules []map[string]any `json:"rules"`
			} `json:"groups"`
		}
	}
	c.kubectlJSON(t, &rule, "-n", ns, "get", "prometheusrule", fullname, "-o", "json")
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if _, ok := r["alert"]; ok {
				alerts++
			}
			if _, ok := r["for"]; ok {
				r["for"] = ruleFor
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("PrometheusRule %s has no alert", fullname)
	}
	work := t.TempDir()
	rules, err := json.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "rules.json"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	var agents []string
	for _, n := range c.nodes {
		agents = append(agents, fmt.Sprintf("%q", n.ip+":9970"))
	}
	// One target: the replicas may all be on one node.
	cps := []string{fmt.Sprintf("%q", c.nodes[0].ip+":"+nodePort)}
	cfg := fmt.Sprintf(`global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [rules.json]
scrape_configs:
  - job_name: %s-agent-metrics
    static_configs: [{targets: [%s], labels: {namespace: %s}}]
  - job_name: %s-cp-metrics
    static_configs: [{targets: [%s], labels: {namespace: %s}}]
`, fullname, strings.Join(agents, ", "), ns, fullname, strings.Join(cps, ", "), ns)
	if err := os.WriteFile(filepath.Join(work, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPrometheus(t, prom, work)

	// Every target up: the agents, the control plane.
	c.eventually(t, "every target up", func() string {
		var targets struct {
			ActiveTargets []struct {
				ScrapeURL, Health, LastError string
			}
		}
		p.get(t, "/api/v1/targets?state=active", &targets)
		var bad []string
		for _, tg := range targets.ActiveTargets {
			if tg.Health != "up" {
				bad = append(bad, tg.ScrapeURL+" "+tg.Health+" "+tg.LastError)
			}
		}
		if len(targets.ActiveTargets) != len(c.nodes)+1 || len(bad) > 0 {
			return fmt.Sprintf("%d targets, not up: %v", len(targets.ActiveTargets), bad)
		}
		return ""
	})

	var loaded struct {
		Groups []struct {
			Rules []struct{ Name, Health string }
		}
	}
	p.get(t, "/api/v1/rules?type=alert", &loaded)
	n := 0
	for _, g := range loaded.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("rule %s does not evaluate", r.Name)
			}
		}
	}
	if n != alerts {
		t.Errorf("prometheus loaded %d alerts, the PrometheusRule has %d", n, alerts)
	}

	t.Run("control plane alert", func(t *testing.T) { c.controlPlaneAlert(t, p) })
	t.Run("dashboard queries return data", func(t *testing.T) { c.dashboardQueries(t, p) })
}

const cpMetricsNodePortYAML = `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  type: NodePort
  selector:
    app.kubernetes.io/name: l4xds
    app.kubernetes.io/instance: %[3]s
    app.kubernetes.io/component: control-plane
  ports: [{name: health, port: 9001, targetPort: health}]
`

// prometheus is the server this test started.
type prometheus struct{ base string }

// startPrometheus runs prometheus with the config of dir, its storage in
// dir, on a port the kernel picks (its log says which); it is stopped by
// its PID when the test ends, and dir is removed.
func startPrometheus(t *testing.T, bin, dir string) *prometheus {
	t.Helper()
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0")
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log []string
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		listening := regexp.MustCompile(`msg="Listening on" address=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log = append(log, sc.Text())
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", lastLines(strings.Join(log, "\n"), 20))
		}
	})
	select {
	case a := <-addr:
		t.Logf("prometheus (pid %d) on %s", cmd.Process.Pid, a)
		// It listens before its storage is open, answering 503 until then.
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err := http.Get("http://" + a + "/-/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return &prometheus{base: "http://" + a}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("prometheus not ready after a minute: %v", err)
			}
			time.Sleep(time.Second)
		}
	case <-done:
		t.Fatalf("prometheus exited: %s", lastLines(strings.Join(log, "\n"), 10))
	case <-time.After(time.Minute):
		t.Fatal("prometheus does not listen after a minute")
	}
	return nil
}

// get decodes the data of a Prometheus API answer.
func (p *prometheus) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(p.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Error  string
		Data   json.RawMessage
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("GET %s: %s %v %s", path, resp.Status, err, body)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// query returns the number of series (or 1 for a scalar) of an instant
// query.
func (p *prometheus) query(t *testing.T, q string) int {
	t.Helper()
	var d struct {
		ResultType string
		Result     json.RawMessage
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(q), &d)
	if d.ResultType == "scalar" {
		return 1
	}
	var series []json.RawMessage
	if err := json.Unmarshal(d.Result, &series); err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	return len(series)
}

// dashboardQueries runs the query of every panel of the chart's dashboard
// ConfigMap, its variables set to everything, against the Prometheus: each
// returns data. Traffic through each node first, so that the rates move.
func (c *cluster) dashboardQueries(t *testing.T, p *prometheus) {
	var cm struct{ Data map[string]string }
	c.kubectlJSON(t, &cm, "-n", ns, "get", "configmap", fullname+"-dashboard", "-o", "json")
	var exprs []string
	for name, board := range cm.Data {
		var d any
		if err := json.Unmarshal([]byte(board), &d); err != nil {
			t.Fatalf("dashboard %s: %v", name, err)
		}
		exprs = append(exprs, panelExprs(d)...)
	}
	if len(exprs) < 5 {
		t.Fatalf("only %d queries in the dashboard ConfigMap", len(exprs))
	}
	// What the panels show must happen: a resource the agents reject (the
	// NACKs panel; the server follows its file once the kubelet updated it),
	// traffic through each node, and packets to a port of a VIP that no
	// frontend has (the drops panel).
	resourcesCM := cpName + "-resources"
	var res struct{ Data map[string]string }
	c.kubectlJSON(t, &res, "-n", ns, "get", "configmap", resourcesCM, "-o", "json")
	patch := func(data string) {
		b, err := json.Marshal(map[string]any{"data": map[string]string{"resources.yaml": data}})
		if err != nil {
			t.Fatal(err)
		}
		c.kubectl(t, "-n", ns, "patch", "configmap", resourcesCM, "--type", "merge", "-p", string(b))
	}
	patch(strings.TrimRight(res.Data["resources.yaml"], "\n") + "\n" + badCluster)
	defer patch(res.Data["resources.yaml"])
	traffic := func() {
		for _, n := range c.nodes {
			c.route(t, n)
			for _, p := range []struct{ vip, proto string }{{tcpVIP, "tcp"}, {udpVIP, "udp"}} {
				if _, err := c.probe(p.vip, p.proto, 100); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := exec.Command("docker", "exec", c.client, "l4xds-traffic", "probe", "--to", host(tcpVIP)+":3307",
				"--proto", "tcp", "--flows", "3", "--timeout", "200ms", "-o", "json").Output(); err != nil {
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
					t.Fatalf("probe of an unknown port: %v", err)
				}
			}
		}
	}
	vars := regexp.MustCompile(`\$\{?(\w+)\}?`)
	pending := map[string]bool{}
	for _, e := range exprs {
		q := vars.ReplaceAllStringFunc(e, func(v string) string {
			switch strings.Trim(v, "${}") {
			case "__rate_interval", "__interval", "__range":
				return "1m"
			}
			return ".*"
		})
		pending[q] = true
	}
	deadline := time.Now().Add(3 * time.Minute)
	for len(pending) > 0 {
		traffic()
		for q := range pending {
			if n := p.query(t, q); n > 0 {
				t.Logf("%d series: %s", n, q)
				delete(pending, q)
			}
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Second)
	}
	for _, q := range slices.Sorted(maps.Keys(pending)) {
		t.Errorf("no data: %s", q)
	}
}

// badCluster is an l4lb cluster the agents reject (NACK).
const badCluster = `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: monitoring-bad-port
  metadata:
    filter_metadata:
      io.cilium.l4lb: {vip: "10.1.2.9", port: 70000, protocol: TCP}
  type: EDS
  eds_cluster_config: {service_name: monitoring-bad-port}
`

// panelExprs returns every "expr" of a dashboard's panels, rows included.
func panelExprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "expr" && strings.TrimSpace(s) != "" {
				out = append(out, s)
				continue
			}
			if k == "templating" {
				continue // the variables' queries are label_values(), not PromQL
			}
			out = append(out, panelExprs(e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, panelExprs(e)...)
		}
	}
	return out
}

// controlPlaneAlert scales the control plane to zero: its alert fires; scaled
// back (to one replica), it clears and the agents are Ready again.
func (c *cluster) controlPlaneAlert(t *testing.T, p *prometheus) {
	replicas := strings.TrimSpace(c.kubectl(t, "-n", ns, "get", "deploy/"+cpName, "-o", "jsonpath={.spec.replicas}"))
	state := func() string {
		var d struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
		p.get(t, "/api/v1/alerts", &d)
		for _, a := range d.Alerts {
			if a.Labels["alertname"] == controlPlaneAlert {
				return a.State
			}
		}
		return "inactive"
	}
	if s := state(); s != "inactive" {
		t.Fatalf("%s is %s before the control plane was scaled down", controlPlaneAlert, s)
	}
	c.kubectl(t, "-n", ns, "scale", "deploy/"+cpName, "--replicas=0")
	scaled := time.Now()
	c.eventually(t, controlPlaneAlert+" firing", func() string {
		if s := state(); s != "firing" {
			return s
		}
		return ""
	})
	t.Logf("%s firing %v after the control plane was scaled to 0", controlPlaneAlert, time.Since(scaled).Round(time.Second))
	// Back with one replica: Prometheus reaches the control plane through
	// one NodePort, which picks a replica per connection, and the series
	// of the agents' ACKs and NACKs are on the replica they use only: with
	// two, the dashboard's panels of them would see their series come and
	// go with each scrape.
	c.kubectl(t, "-n", ns, "scale", "deploy/"+cpName, "--replicas=1")
	back := time.Now()
	c.kubectl(t, "-n", ns, "rollout", "status", "deploy/"+cpName, "--timeout", "3m")
	c.eventually(t, controlPlaneAlert+" cleared", func() string {
		if s := state(); s != "inactive" {
			return s
		}
		return ""
	})
	t.Logf("%s cleared %v after the control plane (%s replicas) was scaled back to 1", controlPlaneAlert, time.Since(back).Round(time.Second), replicas)
	c.waitAgentsReady(t, 3*time.Minute)
}
