// SPDX-License-Identifier: Apache-2.0

// Package test renders the l4xds Helm chart with Helm's own engine and
// checks every object it produces against the Kubernetes API types and
// against the agent's real flags.
package test

import (
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../l4xds"
	releaseName = "l4xds"
	namespace   = "kube-system"
	// kubeVersion is the cluster the chart is rendered for: its
	// kubeVersion constraint must accept it.
	kubeVersion = "v1.34.0"
)

// object is one rendered Kubernetes object, decoded into its API type.
type object struct {
	Template string // templates/... it came from
	Kind     string
	Name     string
	Obj      any // *appsv1.DaemonSet, *corev1.ConfigMap, ...
}

// kinds are the only objects the chart may render, with their apiVersion.
// Anything else (a typo in a kind, RBAC nobody reviewed) fails the test.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"DaemonSet":      {"apps/v1", func() any { return new(appsv1.DaemonSet) }},
	"Deployment":     {"apps/v1", func() any { return new(appsv1.Deployment) }},
	"ConfigMap":      {"v1", func() any { return new(corev1.ConfigMap) }},
	"Service":        {"v1", func() any { return new(corev1.Service) }},
	"ServiceAccount": {"v1", func() any { return new(corev1.ServiceAccount) }},
	// The control plane serving the cluster (controlPlane.kubernetes).
	"ClusterRole":        {"rbac.authorization.k8s.io/v1", func() any { return new(rbacv1.ClusterRole) }},
	"ClusterRoleBinding": {"rbac.authorization.k8s.io/v1", func() any { return new(rbacv1.ClusterRoleBinding) }},
	"Role":               {"rbac.authorization.k8s.io/v1", func() any { return new(rbacv1.Role) }},
	"RoleBinding":        {"rbac.authorization.k8s.io/v1", func() any { return new(rbacv1.RoleBinding) }},
	// More than one replica.
	"PodDisruptionBudget": {"policy/v1", func() any { return new(policyv1.PodDisruptionBudget) }},
	// tls.auto: Helm's certificates, or cert-manager's (their schema is
	// the CRDs', which the kind tier applies to a real API server).
	"Secret":      {"v1", func() any { return new(corev1.Secret) }},
	"Issuer":      {"cert-manager.io/v1", func() any { return new(unstructured.Unstructured) }},
	"Certificate": {"cert-manager.io/v1", func() any { return new(unstructured.Unstructured) }},
	// prometheus.serviceMonitor, podMonitor and prometheusRule
	// (prometheus-operator's CRDs; the fields the chart sets, in
	// monitoring_test.go).
	"ServiceMonitor": {"monitoring.coreos.com/v1", func() any { return new(serviceMonitor) }},
	"PodMonitor":     {"monitoring.coreos.com/v1", func() any { return new(podMonitor) }},
	"PrometheusRule": {"monitoring.coreos.com/v1", func() any { return new(prometheusRule) }},
}

// clusterScoped are the kinds of kinds that have no namespace; every other
// object is in the release's.
var clusterScoped = map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return chrt
}

// rendered is the output of one helm install, as objects.
type rendered struct {
	Objects []object
	Notes   string
}

// render renders the chart as `helm install` does: the values are merged
// over values.yaml, checked against values.schema.json, and the templates
// executed with missing keys as errors (Helm's strict mode, as in
// `helm lint --strict`).
func render(t *testing.T, values map[string]any) (*rendered, error) {
	t.Helper()
	return renderRelease(t, releaseName, values)
}

// capabilities are those of the cluster the chart is rendered for.
func capabilities() *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "34"}
	return caps
}

// renderRelease is render for a release of another name.
func renderRelease(t *testing.T, name string, values map[string]any) (*rendered, error) {
	t.Helper()
	return renderChart(t, loadChart(t), name, values)
}

// renderChart is renderRelease for a chart loaded otherwise (a package).
func renderChart(t *testing.T, chrt *chart.Chart, name string, values map[string]any) (*rendered, error) {
	t.Helper()
	caps := capabilities()
	opts := chartutil.ReleaseOptions{Name: name, Namespace: namespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chrt, values, opts, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true}.Render(chrt, top)
	if err != nil {
		return nil, err
	}
	r := &rendered{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if path.Base(name) == "NOTES.txt" {
			r.Notes = files[name]
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := slices.Collect(maps.Keys(docs))
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, key := range keys {
			obj, err := decode(name, docs[key])
			if err != nil {
				return nil, err
			}
			if obj != nil {
				r.Objects = append(r.Objects, *obj)
			}
		}
	}
	return r, nil
}

// decode decodes one YAML document strictly into the API type of its kind:
// an unknown or misspelt field, a duplicate key or a wrong type is an error.
func decode(template, doc string) (*object, error) {
	if strings.TrimSpace(stripComments(doc)) == "" {
		return nil, nil
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", template, err, doc)
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return nil, fmt.Errorf("%s: kind %q is not one the chart may render", template, tm.Kind)
	}
	if tm.APIVersion != k.apiVersion {
		return nil, fmt.Errorf("%s: %s has apiVersion %q, want %q", template, tm.Kind, tm.APIVersion, k.apiVersion)
	}
	obj := k.new()
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return nil, fmt.Errorf("%s: %s does not decode strictly: %w\n%s", template, tm.Kind, err, doc)
	}
	meta := obj.(metav1.Object)
	wantNS := namespace
	if clusterScoped[tm.Kind] {
		wantNS = ""
	}
	if meta.GetName() == "" || meta.GetNamespace() != wantNS {
		return nil, fmt.Errorf("%s: %s %q in namespace %q, want a name in %q", template, tm.Kind, meta.GetName(), meta.GetNamespace(), wantNS)
	}
	return &object{Template: template, Kind: tm.Kind, Name: meta.GetName(), Obj: obj}, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// find returns the objects of one kind.
func find[T any](r *rendered) []T {
	var out []T
	for _, o := range r.Objects {
		if v, ok := o.Obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// only returns the one object of its kind, failing if there are more or none.
func only[T any](t *testing.T, r *rendered) T {
	t.Helper()
	all := find[T](r)
	if len(all) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d", zero, len(all))
	}
	return all[0]
}

// readValues reads a values file as `helm install -f` does.
func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return vals
}
