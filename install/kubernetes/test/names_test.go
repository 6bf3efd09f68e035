// SPDX-License-Identifier: Apache-2.0

package test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// withControlPlane are values that render every object of the agent and of
// the control plane with TLS.
func withControlPlane() map[string]any {
	return map[string]any{
		"xdsControlPlane": map[string]any{"enabled": true, "tlsSecretName": "agent-tls"},
		"controlPlane":    map[string]any{"enabled": true, "tlsSecretName": "cp-tls"},
	}
}

// For any release name, and with nameOverride or fullnameOverride, the
// objects are named <fullname>... as Documentation/kubernetes.md says, and
// what the agents dial and the certificate must carry (NOTES.txt) is the
// control plane Service's real name.
func TestReleaseNames(t *testing.T) {
	for _, c := range []struct {
		release      string
		overrides    map[string]any
		fullname     string
		appNameLabel string
	}{
		{"l4xds", nil, "l4xds", "l4xds"},
		{"lb", nil, "lb-l4xds", "l4xds"},
		{"edge-l4xds", nil, "edge-l4xds", "l4xds"},
		{"lb", map[string]any{"fullnameOverride": "edge"}, "edge", "l4xds"},
		{"lb", map[string]any{"nameOverride": "xlb"}, "lb-xlb", "xlb"},
		{"xlb-prod", map[string]any{"nameOverride": "xlb"}, "xlb-prod", "xlb"},
	} {
		t.Run(c.release+"/"+c.fullname, func(t *testing.T) {
			vals := withControlPlane()
			for k, v := range c.overrides {
				vals[k] = v
			}
			r, err := renderRelease(t, c.release, vals)
			if err != nil {
				t.Fatal(err)
			}
			cp := c.fullname + "-control-plane"
			want := []string{
				"ConfigMap/" + c.fullname + "-config", "ConfigMap/" + cp + "-resources",
				"DaemonSet/" + c.fullname, "Deployment/" + cp, "Service/" + cp,
				"ServiceAccount/" + c.fullname,
			}
			if got := kindsOf(r); !slices.Equal(got, want) {
				t.Errorf("objects %v, want %v", got, want)
			}
			checkNames(t, r)

			svc := only[*corev1.Service](t, r)
			dns := svc.Name + "." + namespace + ".svc"
			cm := checkAgent(t, r)
			if got, want := cm.Data["xds-server-address"], dns+":9000"; got != want {
				t.Errorf("xds-server-address %q, want the Service %q", got, want)
			}
			if want := "--server-name " + dns + "\n"; !strings.Contains(r.Notes, want) {
				t.Errorf("NOTES.txt does not tell to make the certificate for %q:\n%s", dns, r.Notes)
			}
			for _, o := range r.Objects {
				if got := o.Obj.(metav1.Object).GetLabels()["app.kubernetes.io/name"]; got != c.appNameLabel {
					t.Errorf("%s/%s: app.kubernetes.io/name %q, want %q", o.Kind, o.Name, got, c.appNameLabel)
				}
			}
			ds := only[*appsv1.DaemonSet](t, r)
			if got := ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"]; got != c.appNameLabel {
				t.Errorf("DaemonSet selector app.kubernetes.io/name %q, want %q", got, c.appNameLabel)
			}
		})
	}
}

// The names the documents give as <fullname>-... are the names the chart
// renders, for a release whose name is not its full name; none names an
// object <release>-..., right only for a release named l4xds.
func TestDocumentedNames(t *testing.T) {
	vals := withControlPlane()
	cp := vals["controlPlane"].(map[string]any)
	cp["kubernetes"] = map[string]any{"enabled": true, "addressPoolsConfigMap": "pools"}
	cp["xdsResources"] = "resource: {}\n"
	vals["prometheus"] = map[string]any{"enabled": true, "serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}}
	vals["dashboards"] = map[string]any{"enabled": true}
	r, err := renderRelease(t, "lb", vals)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range r.Objects {
		names = append(names, o.Name)
	}
	// And what tls.auto makes, by either method.
	for _, method := range []string{"helm", "certmanager"} {
		ra, err := renderRelease(t, "lb", autoTLS(method))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ra.Objects {
			names = append(names, o.Name)
		}
	}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "Documentation", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no Documentation/*.md: %v", err)
	}
	var documented []string
	for _, file := range docs {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		doc, name := string(data), filepath.Base(file)
		for _, m := range regexp.MustCompile("<release>-[a-z0-9-]*").FindAllString(doc, -1) {
			if m != "<release>-l4xds" {
				t.Errorf("%s names an object %q: the prefix is <fullname>, the release name only when it contains l4xds", name, m)
			}
		}
		for _, d := range regexp.MustCompile("<fullname>(-[a-z]+)*").FindAllString(doc, -1) {
			documented = append(documented, d)
			if n := strings.Replace(d, "<fullname>", "lb-l4xds", 1); !slices.Contains(names, n) {
				t.Errorf("%s names %s, but release lb renders no %s (only %v)", name, d, n, names)
			}
		}
	}
	if len(documented) < 3 {
		t.Fatalf("the documents name only %q with <fullname>", documented)
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, docsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`<fullname>`") {
		t.Errorf("%s does not define `<fullname>`", docsFile)
	}
}
