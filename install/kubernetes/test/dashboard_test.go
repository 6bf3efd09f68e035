// SPDX-License-Identifier: Apache-2.0

package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// dashboard is the part of a Grafana dashboard this test reads.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// grafanaVariables are what a panel query may contain besides PromQL, and
// the PromQL that stands for them when a query is run outside Grafana:
// $__rate_interval, and the Node variable, all of them.
var grafanaVariables = strings.NewReplacer(`$__rate_interval`, `5m`, `"$instance"`, `".*"`)

// dashboardQueries are the PromQL queries of the dashboard's panels, as
// runnable PromQL (grafanaVariables replaced), by panel title.
func dashboardQueries(t *testing.T, d dashboard) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q := grafanaVariables.Replace(tg.Expr)
			if strings.Contains(q, "$") {
				t.Errorf("panel %q, query %s: a variable the dashboard test does not know: %s", p.Title, tg.RefID, tg.Expr)
			}
			out[p.Title] = append(out[p.Title], q)
		}
	}
	return out
}

func readDashboard(t *testing.T, data []byte) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// The dashboard's ConfigMap carries the sidecar's label and the JSON of
// files/dashboards/l4xds.json; the JSON has the panels the operator needs,
// each on the data source variable, laid out on Grafana's 24 columns, and
// every panel's query is PromQL that parses (promtool check rules parses
// them with Prometheus' own parser, as recording rules).
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{"dashboards": map[string]any{"enabled": true, "label": "grafana_dashboard", "labelValue": "yes", "annotations": map[string]any{"grafana_folder": "Network"}}}
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	var cm *corev1.ConfigMap
	for _, c := range find[*corev1.ConfigMap](r) {
		if c.Name == "l4xds-dashboard" {
			cm = c
		}
	}
	if cm == nil {
		t.Fatalf("no ConfigMap l4xds-dashboard in %v", kindsOf(r))
	}
	if cm.Labels["grafana_dashboard"] != "yes" || cm.Annotations["grafana_folder"] != "Network" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.Labels, cm.Annotations)
	}
	if got := cm.Data["l4xds.json"]; strings.TrimSpace(got) != strings.TrimSpace(string(data)) {
		t.Errorf("the ConfigMap's l4xds.json is not %s", dashboardFile)
	}
	if off, err := render(t, nil); err != nil || slices.Contains(kindsOf(off), "ConfigMap/l4xds-dashboard") {
		t.Errorf("dashboards off by default: %v, %v", kindsOf(off), err)
	}

	d := readDashboard(t, data)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q", d.UID, d.Title)
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	if !slices.Equal(vars, []string{"datasource", "instance"}) {
		t.Errorf("variables %v, want datasource and instance (grafanaVariables knows those)", vars)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside 24 columns", p.Title, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
	queries := dashboardQueries(t, d)
	// What the dashboard exists for.
	for _, want := range []struct{ panel, metric string }{
		{"xDS connection per node", "l4xds_xds_client_connected"},
		{"NACKs", "l4xds_xds_client_resource_updates_invalid_total"},
		{"NACKs", "l4xds_control_plane_nacks_total"},
		{"Nodes per ACKed version", "l4xds_control_plane_acked_version"},
		{"Packets per frontend", "l4xds_datapath_service_packets_total"},
		{"Drops per frontend and reason", "l4xds_datapath_service_drops_total"},
		{"Map pressure (fullest node)", "l4xds_datapath_map_pressure"},
	} {
		if !slices.ContainsFunc(queries[want.panel], func(q string) bool { return strings.Contains(q, want.metric) }) {
			t.Errorf("no panel %q with a query of %s", want.panel, want.metric)
		}
	}

	promtool := needPromtool(t)
	group := ruleGroup{Name: "dashboard"}
	for _, p := range d.Panels {
		for i, q := range queries[p.Title] {
			group.Rules = append(group.Rules, rule{Record: fmt.Sprintf("dashboard:panel_%d:query_%d", p.ID, i), Expr: q})
		}
	}
	n := len(group.Rules)
	rules := ruleFile{Groups: []ruleGroup{group}}
	out, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	res := runPromtool(t, promtool, "check", "rules", file)
	t.Logf("%d panel queries: %s", n, strings.TrimSpace(res))
	if !regexp.MustCompile(fmt.Sprintf(`SUCCESS: %d rules found`, n)).MatchString(res) {
		t.Errorf("promtool did not check the %d queries", n)
	}
}
