// SPDX-License-Identifier: Apache-2.0

package test

import (
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"encoding/json"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
)

// olderChart is the chart as a version before the keys were added: without
// them in values.yaml and values.schema.json, and an older version number.
func olderChart(t *testing.T, keys ...string) *chart.Chart {
	t.Helper()
	chrt := loadChart(t)
	var schema map[string]any
	if err := json.Unmarshal(chrt.Schema, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	for _, key := range keys {
		vals, node := chrt.Values, schema
		path := strings.Split(key, ".")
		for _, k := range path[:len(path)-1] {
			vals = vals[k].(map[string]any)
			node = node["properties"].(map[string]any)[k].(map[string]any)
		}
		last := path[len(path)-1]
		props := node["properties"].(map[string]any)
		if _, ok := vals[last]; !ok {
			t.Fatalf("values.yaml has no %s", key)
		}
		if _, ok := props[last]; !ok {
			t.Fatalf("values.schema.json has no %s", key)
		}
		delete(vals, last)
		delete(props, last)
		if req, ok := node["required"].([]any); ok {
			node["required"] = slices.DeleteFunc(req, func(k any) bool { return k == last })
		}
	}
	var err error
	if chrt.Schema, err = json.Marshal(schema); err != nil {
		t.Fatal(err)
	}
	chrt.Metadata.Version = "0.0.1"
	return chrt
}

// helmConfig is Helm's action configuration with its releases in memory and
// a Kubernetes client that applies nothing: install and upgrade run as
// `helm` runs them, up to the API calls.
func helmConfig(t *testing.T) *action.Configuration {
	return &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: capabilities(),
		Log:          t.Logf,
	}
}

// manifestNames are "Kind/name" of the objects of a release.
func manifestNames(t *testing.T, rel *release.Release) []string {
	t.Helper()
	var names []string
	for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
		obj, err := decode("release "+rel.Name, doc)
		if err != nil {
			t.Fatal(err)
		}
		if obj != nil {
			names = append(names, obj.Kind+"/"+obj.Name)
		}
	}
	slices.Sort(names)
	return names
}

// `helm upgrade --reuse-values` from a chart version without a key to the
// version that adds it: Helm then validates and renders the new chart with
// the old release's values, which lack the key (Documentation/kubernetes.md
// recommends --reuse-values). Each case is a key a chart version added.
func TestUpgradeReuseValues(t *testing.T) {
	for _, c := range []struct {
		added   []string       // by the newer chart version
		install map[string]any // values given at install, besides datapath
		set     map[string]any
		want    []string // the objects after the upgrade
	}{
		{
			added: []string{"legacyCapabilities"},
			set:   nil,
			want:  []string{"ConfigMap/lb-l4xds-config", "DaemonSet/lb-l4xds", "ServiceAccount/lb-l4xds"},
		},
		{
			added: []string{"legacyCapabilities"},
			set:   map[string]any{"legacyCapabilities": true},
			want:  []string{"ConfigMap/lb-l4xds-config", "DaemonSet/lb-l4xds", "ServiceAccount/lb-l4xds"},
		},
		{
			added: []string{"controlPlane.kubernetes"},
			install: map[string]any{"controlPlane": map[string]any{
				"enabled": true, "tlsSecretName": "cp-tls", "xdsResources": "resource: {}\n",
			}},
			want: []string{
				"ConfigMap/lb-l4xds-config", "ConfigMap/lb-l4xds-control-plane-resources", "DaemonSet/lb-l4xds",
				"Deployment/lb-l4xds-control-plane", "Service/lb-l4xds-control-plane", "ServiceAccount/lb-l4xds",
			},
		},
		{
			// The monitoring values of a chart version before them: the
			// objects they add stay off, the per-frontend counters on.
			added: []string{"prometheus.serviceMetrics", "prometheus.serviceMonitor", "prometheus.podMonitor", "prometheus.prometheusRule", "dashboards"},
			install: map[string]any{"prometheus": map[string]any{"enabled": true},
				"controlPlane": map[string]any{"enabled": true, "tlsSecretName": "cp-tls", "xdsResources": "resource: {}\n"}},
			want: []string{
				"ConfigMap/lb-l4xds-config", "ConfigMap/lb-l4xds-control-plane-resources", "DaemonSet/lb-l4xds",
				"Deployment/lb-l4xds-control-plane", "Service/lb-l4xds-control-plane", "ServiceAccount/lb-l4xds",
			},
		},
		{
			added:   []string{"prometheus.serviceMonitor", "prometheus.prometheusRule", "dashboards"},
			install: map[string]any{"prometheus": map[string]any{"enabled": true}},
			set: map[string]any{"prometheus": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
				"dashboards": map[string]any{"enabled": true}},
			want: []string{
				"ConfigMap/lb-l4xds-config", "ConfigMap/lb-l4xds-dashboard", "DaemonSet/lb-l4xds", "PrometheusRule/lb-l4xds",
				"Service/lb-l4xds-agent-metrics", "ServiceAccount/lb-l4xds", "ServiceMonitor/lb-l4xds-agent",
			},
		},
		{
			added: []string{"nameOverride", "fullnameOverride"},
			set:   nil,
			want:  []string{"ConfigMap/lb-l4xds-config", "DaemonSet/lb-l4xds", "ServiceAccount/lb-l4xds"},
		},
		{
			added: []string{"nameOverride", "fullnameOverride"},
			set:   map[string]any{"fullnameOverride": "edge"},
			want:  []string{"ConfigMap/edge-config", "DaemonSet/edge", "ServiceAccount/edge"},
		},
	} {
		t.Run(strings.Join(c.added, ",")+"/"+strings.Join(slices.Sorted(maps.Keys(c.set)), ","), func(t *testing.T) {
			cfg := helmConfig(t)
			install := action.NewInstall(cfg)
			install.ReleaseName, install.Namespace = "lb", namespace
			old := map[string]any{"datapath": "none"} // a value the operator set at install
			maps.Copy(old, c.install)
			if _, err := install.Run(olderChart(t, c.added...), old); err != nil {
				t.Fatalf("install of the older chart: %v", err)
			}

			upgrade := action.NewUpgrade(cfg)
			upgrade.Namespace, upgrade.ReuseValues = namespace, true
			rel, err := upgrade.Run("lb", loadChart(t), c.set)
			if err != nil {
				t.Fatalf("helm upgrade --reuse-values: %v", err)
			}
			if rel.Info.Status != release.StatusDeployed || rel.Version != 2 {
				t.Errorf("release %s version %d, want deployed version 2", rel.Info.Status, rel.Version)
			}
			if got := manifestNames(t, rel); !slices.Equal(got, c.want) {
				t.Errorf("objects %v, want %v", got, c.want)
			}
			if !strings.Contains(rel.Manifest, `datapath: "none"`) {
				t.Errorf("the value set at install (datapath: none) was not reused:\n%s", rel.Manifest)
			}
		})
	}
}

// Values that lack any key of values.yaml still validate: what
// --reuse-values gives a chart version that added that key. The schema
// still checks the type of each key given.
func TestSchemaRequiresNoKey(t *testing.T) {
	chrt := loadChart(t)
	var paths [][]string
	var walk func(prefix []string, vals map[string]any)
	walk = func(prefix []string, vals map[string]any) {
		for k, v := range vals {
			p := append(slices.Clone(prefix), k)
			paths = append(paths, p)
			if m, ok := v.(map[string]any); ok {
				walk(p, m)
			}
		}
	}
	walk(nil, chrt.Values)
	if len(paths) < 50 {
		t.Fatalf("only %d keys in values.yaml", len(paths))
	}
	for _, p := range paths {
		vals, err := chartutil.ReadValues([]byte(mustYAML(t, chrt.Values)))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any(vals)
		for _, k := range p[:len(p)-1] {
			m = m[k].(map[string]any)
		}
		delete(m, p[len(p)-1])
		if err := chartutil.ValidateAgainstSchema(chrt, vals); err != nil {
			t.Errorf("values without %s: %v", strings.Join(p, "."), err)
		}
	}
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	out, err := chartutil.Values(v.(map[string]any)).YAML()
	if err != nil {
		t.Fatal(err)
	}
	return out
}
