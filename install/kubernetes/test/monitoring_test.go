// SPDX-License-Identifier: Apache-2.0

package test

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The fields of prometheus-operator's monitoring.coreos.com/v1 objects that
// the chart sets. decode is strict: a field the chart renders and these do
// not have (a typo, a field of another kind) fails the test.
type (
	relabeling struct {
		SourceLabels []string `json:"sourceLabels,omitempty"`
		TargetLabel  string   `json:"targetLabel,omitempty"`
		Action       string   `json:"action,omitempty"`
	}
	scrapeEndpoint struct {
		Port        string       `json:"port"`
		Path        string       `json:"path"`
		Interval    string       `json:"interval,omitempty"`
		Relabelings []relabeling `json:"relabelings,omitempty"`
	}
	namespaceSelector struct {
		MatchNames []string `json:"matchNames"`
	}
	serviceMonitor struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Selector          metav1.LabelSelector `json:"selector"`
			NamespaceSelector namespaceSelector    `json:"namespaceSelector"`
			Endpoints         []scrapeEndpoint     `json:"endpoints"`
		} `json:"spec"`
	}
	podMonitor struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Selector            metav1.LabelSelector `json:"selector"`
			NamespaceSelector   namespaceSelector    `json:"namespaceSelector"`
			PodMetricsEndpoints []scrapeEndpoint     `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	// ruleFile is a Prometheus rule file, and a PrometheusRule's spec.
	ruleFile struct {
		Groups []ruleGroup `json:"groups"`
	}
	ruleGroup struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	}
	rule struct {
		Alert       string            `json:"alert,omitempty"`
		Record      string            `json:"record,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	prometheusRule struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              ruleFile `json:"spec"`
	}
)

const (
	alertsFile     = chartDir + "/files/alerts.yaml"
	alertsTestFile = "testdata/alerts-test.yaml"
	dashboardFile  = chartDir + "/files/dashboards/l4xds.json"
	alertsDoc      = "Documentation/alerts.md"
	defaultRunbook = "https://github.com/l4xds/l4xds/blob/main/" + alertsDoc
)

// monitoringValues turn on the agents' metrics, the control plane and every
// monitoring object (monitor: serviceMonitor or podMonitor).
func monitoringValues(monitor string) map[string]any {
	vals := withControlPlane()
	vals["prometheus"] = map[string]any{
		"enabled":        true,
		monitor:          map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}, "interval": "30s"},
		"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
	}
	vals["dashboards"] = map[string]any{"enabled": true, "annotations": map[string]any{"grafana_folder": "Network"}}
	return vals
}

// podOf is the pod template of the workload of a component.
func podOf(t *testing.T, r *rendered, component string) corev1.PodTemplateSpec {
	t.Helper()
	switch component {
	case "agent":
		return only[*appsv1.DaemonSet](t, r).Spec.Template
	case "control-plane":
		return only[*appsv1.Deployment](t, r).Spec.Template
	}
	t.Fatalf("no component %q", component)
	return corev1.PodTemplateSpec{}
}

// checkScrape checks that a monitor of a component selects its pods
// (directly, or through a Service that selects them), in the release's
// namespace, on a named container port; and carries the extra labels.
func checkScrape(t *testing.T, r *rendered, kind string, meta metav1.ObjectMeta, sel metav1.LabelSelector, ns namespaceSelector, eps []scrapeEndpoint) {
	t.Helper()
	component := meta.Labels["app.kubernetes.io/component"]
	pod := podOf(t, r, component)
	if meta.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("%s %s: labels %v lack the extra ones", kind, meta.Name, meta.Labels)
	}
	if !slices.Equal(ns.MatchNames, []string{namespace}) {
		t.Errorf("%s %s: namespaceSelector %v, want the release's %q", kind, meta.Name, ns.MatchNames, namespace)
	}
	selector, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil || selector.Empty() {
		t.Fatalf("%s %s: selector %v: %v", kind, meta.Name, sel, err)
	}
	if len(eps) != 1 {
		t.Fatalf("%s %s: endpoints %+v, want one", kind, meta.Name, eps)
	}
	ep := eps[0]
	if ep.Path != "/metrics" || ep.Interval != "30s" {
		t.Errorf("%s %s: endpoint %+v", kind, meta.Name, ep)
	}
	containerPort := func(name string) bool {
		for _, c := range pod.Spec.Containers {
			if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name }) {
				return true
			}
		}
		return false
	}
	if component == "agent" {
		want := []relabeling{{SourceLabels: []string{"__meta_kubernetes_pod_node_name"}, TargetLabel: "node", Action: "replace"}}
		if !reflect.DeepEqual(ep.Relabelings, want) {
			t.Errorf("%s %s: relabelings %+v, want the node label %+v", kind, meta.Name, ep.Relabelings, want)
		}
	}
	if kind == "PodMonitor" {
		if !selector.Matches(labels.Set(pod.Labels)) {
			t.Errorf("PodMonitor %s: selector %s does not select the %s pods %v", meta.Name, selector, component, pod.Labels)
		}
		if !containerPort(ep.Port) {
			t.Errorf("PodMonitor %s: no container port %q in the %s pod", meta.Name, ep.Port, component)
		}
		return
	}
	// A ServiceMonitor scrapes the Services it selects that have the port.
	var scraped []string
	for _, svc := range find[*corev1.Service](r) {
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
		if !selector.Matches(labels.Set(svc.Labels)) || i < 0 {
			continue
		}
		scraped = append(scraped, svc.Name)
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service %s: clusterIP %q, want a headless Service", svc.Name, svc.Spec.ClusterIP)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			t.Errorf("Service %s: selector %v does not select the %s pods", svc.Name, svc.Spec.Selector, component)
		}
		if tp := svc.Spec.Ports[i].TargetPort.String(); !containerPort(tp) {
			t.Errorf("Service %s: targetPort %q is no container port of the %s pod", svc.Name, tp, component)
		}
	}
	if len(scraped) != 1 {
		t.Errorf("ServiceMonitor %s scrapes the Services %v, want one", meta.Name, scraped)
	}
}

func TestServiceMonitors(t *testing.T) {
	r, err := render(t, monitoringValues("serviceMonitor"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Service/l4xds-agent-metrics", "Service/l4xds-cp-metrics",
		"ServiceMonitor/l4xds-agent", "ServiceMonitor/l4xds-control-plane",
		"PrometheusRule/l4xds", "ConfigMap/l4xds-dashboard",
	} {
		if !slices.Contains(kindsOf(r), want) {
			t.Errorf("no %s in %v", want, kindsOf(r))
		}
	}
	checkNames(t, r)
	sms := find[*serviceMonitor](r)
	if len(sms) != 2 {
		t.Fatalf("%d ServiceMonitors, want the agents' and the control plane's", len(sms))
	}
	for _, sm := range sms {
		checkScrape(t, r, "ServiceMonitor", sm.ObjectMeta, sm.Spec.Selector, sm.Spec.NamespaceSelector, sm.Spec.Endpoints)
	}
	if n := len(find[*podMonitor](r)); n != 0 {
		t.Errorf("%d PodMonitors with podMonitor.enabled false", n)
	}
}

func TestPodMonitors(t *testing.T) {
	r, err := render(t, monitoringValues("podMonitor"))
	if err != nil {
		t.Fatal(err)
	}
	pms := find[*podMonitor](r)
	if len(pms) != 2 {
		t.Fatalf("%d PodMonitors, want the agents' and the control plane's", len(pms))
	}
	for _, pm := range pms {
		checkScrape(t, r, "PodMonitor", pm.ObjectMeta, pm.Spec.Selector, pm.Spec.NamespaceSelector, pm.Spec.PodMetricsEndpoints)
	}
	if n := len(find[*serviceMonitor](r)); n != 0 {
		t.Errorf("%d ServiceMonitors with serviceMonitor.enabled false", n)
	}
	// No Service only for a ServiceMonitor.
	for _, svc := range find[*corev1.Service](r) {
		if strings.HasSuffix(svc.Name, "-metrics") {
			t.Errorf("Service %s without serviceMonitor.enabled", svc.Name)
		}
	}
}

// A monitor for a component the release does not run is left out; one with
// nothing at all to scrape is an error that says what to set.
func TestMonitorsFollowComponents(t *testing.T) {
	for _, monitor := range []string{"serviceMonitor", "podMonitor"} {
		vals := map[string]any{"prometheus": map[string]any{"enabled": true, monitor: map[string]any{"enabled": true}}}
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range r.Objects {
			if o.Kind == "ServiceMonitor" || o.Kind == "PodMonitor" {
				names = append(names, o.Kind+"/"+o.Name)
			}
		}
		if len(names) != 1 || !strings.HasSuffix(names[0], "/l4xds-agent") {
			t.Errorf("%s without the control plane: %v, want the agents' alone", monitor, names)
		}

		vals = map[string]any{"prometheus": map[string]any{monitor: map[string]any{"enabled": true}}}
		_, err = render(t, vals)
		if err == nil || !strings.Contains(err.Error(), "prometheus."+monitor+".enabled: nothing to scrape") {
			t.Errorf("%s with neither the agents' metrics nor the control plane: error %v", monitor, err)
		}
	}
}

func readRuleFile(t *testing.T, data []byte) ruleFile {
	t.Helper()
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("rule file: %v", err)
	}
	return f
}

// The PrometheusRule serves files/alerts.yaml, with the runbooks where
// prometheus.prometheusRule.runbookURL says.
func TestPrometheusRule(t *testing.T) {
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	const mirror = "https://docs.example.com/l4xds/alerts.html"
	vals := monitoringValues("serviceMonitor")
	vals["prometheus"].(map[string]any)["prometheusRule"].(map[string]any)["runbookURL"] = mirror
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	pr := only[*prometheusRule](t, r)
	if pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v lack the extra ones", pr.Labels)
	}
	want := readRuleFile(t, []byte(strings.ReplaceAll(string(data), defaultRunbook+"#", mirror+"#")))
	if !reflect.DeepEqual(pr.Spec, want) {
		t.Errorf("PrometheusRule spec is not %s with the runbooks at %s:\n got %+v\nwant %+v", alertsFile, mirror, pr.Spec, want)
	}
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			n++
			if u := rule.Annotations["runbook_url"]; !strings.HasPrefix(u, mirror+"#") {
				t.Errorf("alert %s: runbook_url %q is not under %s", rule.Alert, u, mirror)
			}
		}
	}
	if n == 0 {
		t.Fatal("the PrometheusRule has no rules")
	}

	// What Prometheus loads from the PrometheusRule must pass promtool.
	promtool := needPromtool(t)
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(file, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, promtool, "check", "rules", file)
}

// needPromtool returns the path of promtool, or skips the test when it is
// not installed (Debian's prometheus package has it); with
// L4XDS_PROMTOOL_REQUIRED=1, as in CI, it fails instead.
func needPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("L4XDS_PROMTOOL_REQUIRED") == "1" {
			t.Fatalf("promtool not found (L4XDS_PROMTOOL_REQUIRED=1): apt-get install prometheus")
		}
		t.Skip("promtool not found: apt-get install prometheus to check the rules and the dashboard's queries")
	}
	return p
}

func runPromtool(t *testing.T, promtool string, args ...string) string {
	t.Helper()
	out, err := exec.Command(promtool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The rules' unit tests (testdata/alerts-test.yaml) pass, and every alert
// has a case where it fires and one where it does not; every alert has a
// severity, a summary, a description and a runbook that
// Documentation/alerts.md has.
func TestAlerts(t *testing.T) {
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	rules := readRuleFile(t, data)
	doc, err := os.ReadFile(filepath.Join(repoRoot, alertsDoc))
	if err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(string(doc))
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule %q that is no alert", g.Name, r.Expr)
				continue
			}
			alerts[r.Alert] = true
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, a)
				}
			}
			u := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(u, defaultRunbook+"#")
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is no section of %s (its anchors: %v)", r.Alert, u, alertsDoc, slices.Sorted(maps.Keys(anchors)))
			}
		}
	}

	var tests struct {
		Tests []struct {
			AlertRuleTests []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	data, err = os.ReadFile(alertsTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatalf("%s: %v", alertsTestFile, err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for _, a := range slices.Sorted(maps.Keys(alerts)) {
		if !fires[a] || !silent[a] {
			t.Errorf("alert %s: %s has a case where it fires: %v, where it does not: %v", a, alertsTestFile, fires[a], silent[a])
		}
	}

	promtool := needPromtool(t)
	runPromtool(t, promtool, "check", "rules", alertsFile)
	out := runPromtool(t, promtool, "test", "rules", alertsTestFile)
	t.Logf("promtool test rules:\n%s", out)
}

// markdownAnchors are the anchors GitHub makes of a document's headings:
// lower case, spaces as dashes, punctuation dropped.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		out[b.String()] = true
	}
	return out
}
