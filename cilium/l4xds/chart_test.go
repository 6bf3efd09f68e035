// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/xds"
)

const ciliumDocs = "../../Documentation/cilium.md"

// TestUpstreamChart renders Cilium's own Helm chart, of the Cilium version
// this module builds, with the values Documentation/cilium.md gives, and
// checks what an operator relies on: cilium-config carries the block, the
// Maglev annotation switch and socket-LB for the host namespace only, the
// agent container runs our image and mounts the TLS Secret where the block
// points, and the rendered cilium-config loads into this module's agent
// (every key that is an agent setting parses as that setting, and the block
// decodes).
func TestUpstreamChart(t *testing.T) {
	values := docsValues(t)
	chrt, err := loader.Load(path.Join(ciliumModuleDir(t), "install/kubernetes/cilium"))
	if err != nil {
		t.Fatalf("load Cilium's chart: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.34.0", Major: "1", Minor: "34"}
	opts := chartutil.ReleaseOptions{Name: "cilium", Namespace: "kube-system", Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chrt, values, opts, caps)
	if err != nil {
		t.Fatalf("the values of %s: %v", ciliumDocs, err)
	}
	files, err := engine.Engine{}.Render(chrt, top)
	if err != nil {
		t.Fatalf("render Cilium's chart: %v", err)
	}

	var config *corev1.ConfigMap
	var agent *appsv1.DaemonSet
	for name, manifest := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, helpers
		}
		for _, doc := range releaseutil.SplitManifests(manifest) {
			var tm struct {
				metav1.TypeMeta
				Metadata metav1.ObjectMeta `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			switch {
			case tm.Kind == "ConfigMap" && tm.Metadata.Name == "cilium-config":
				config = new(corev1.ConfigMap)
				decodeStrict(t, doc, config)
			case tm.Kind == "DaemonSet" && tm.Metadata.Name == "cilium":
				agent = new(appsv1.DaemonSet)
				decodeStrict(t, doc, agent)
			}
		}
	}
	if config == nil || agent == nil {
		t.Fatalf("rendered no cilium-config ConfigMap or no cilium DaemonSet")
	}

	// cilium-config, as the agent reads it.
	if got := config.Data["bpf-lb-algorithm-annotation"]; got != "true" {
		t.Errorf("cilium-config bpf-lb-algorithm-annotation is %q, want \"true\" (weights need Maglev)", got)
	}
	if got := config.Data["bpf-lb-sock-hostns-only"]; got != "true" {
		t.Errorf("cilium-config bpf-lb-sock-hostns-only is %q, want \"true\" (socket-LB ignores the weights: pods' flows per packet)", got)
	}
	flags := pflag.NewFlagSet("cilium-agent", pflag.ContinueOnError)
	hive.New(cmd.Agent, Cell).RegisterFlags(flags)
	for key, value := range config.Data {
		if f := flags.Lookup(key); f != nil {
			if err := f.Value.Set(value); err != nil {
				t.Errorf("cilium-config %s=%q does not parse as the agent's --%s: %v", key, value, key, err)
			}
		}
	}
	if flags.Lookup("xds-control-plane") == nil {
		t.Fatal("the agent has no --xds-control-plane")
	}
	cfg, _, err := applyBlock(xds.DefaultConfig, l4lb.DefaultConfig, block{XDSControlPlane: config.Data["xds-control-plane"]})
	if err != nil {
		t.Fatalf("cilium-config xds-control-plane: %v", err)
	}
	if !cfg.EnableXDSControlPlane || cfg.XDSServerAddress == "" {
		t.Errorf("cilium-config xds-control-plane does not enable a server: %+v", cfg)
	}

	// The agent container: our image, the Secret where the block points.
	var container *corev1.Container
	for i, c := range agent.Spec.Template.Spec.Containers {
		if c.Name == "cilium-agent" {
			container = &agent.Spec.Template.Spec.Containers[i]
		}
	}
	if container == nil {
		t.Fatal("the cilium DaemonSet has no cilium-agent container")
	}
	if want := values["image"].(map[string]any)["override"]; container.Image != want {
		t.Errorf("cilium-agent image %q, want %q", container.Image, want)
	}
	for _, file := range []string{cfg.XDSClientCertPath, cfg.XDSClientKeyPath, cfg.XDSCACertPath} {
		mount := mountOf(container, file)
		if mount == nil {
			t.Errorf("%s is on no volume mount of cilium-agent", file)
			continue
		}
		secret := secretOf(agent.Spec.Template.Spec, mount.Name)
		if secret == "" {
			t.Errorf("%s is on volume %q, which is no Secret", file, mount.Name)
			continue
		}
		if key := path.Base(file); !strings.Contains("tls.crt tls.key ca.crt", key) {
			t.Errorf("%s: the Secret %q has no key %q (a cert-manager Secret has tls.crt, tls.key, ca.crt)", file, secret, key)
		}
	}
}

// docsValues is the YAML block of the section "Cilium's Helm chart" of
// Documentation/cilium.md: the test checks what the docs tell operators.
func docsValues(t *testing.T) map[string]any {
	t.Helper()
	doc, err := os.ReadFile(ciliumDocs)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Cilium's Helm chart\n.*?```yaml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatalf("%s: no yaml block under \"### Cilium's Helm chart\"", ciliumDocs)
	}
	var values map[string]any
	if err := yaml.Unmarshal(m[1], &values); err != nil {
		t.Fatalf("%s: the chart values: %v", ciliumDocs, err)
	}
	return values
}

// ciliumModuleDir is where the Go module cache holds this module's version
// of github.com/cilium/cilium (its chart is part of the module).
func ciliumModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-json", "github.com/cilium/cilium").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/cilium/cilium: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go list -m github.com/cilium/cilium: no module directory in %s", out)
	}
	return m.Dir
}

func decodeStrict(t *testing.T, doc string, obj any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		t.Fatalf("%T does not decode strictly: %v", obj, err)
	}
}

// mountOf is the volume mount of c that file is under.
func mountOf(c *corev1.Container, file string) *corev1.VolumeMount {
	for i, m := range c.VolumeMounts {
		if strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// secretOf is the Secret behind the pod's volume, "" when it is none.
func secretOf(pod corev1.PodSpec, volume string) string {
	for _, v := range pod.Volumes {
		if v.Name == volume && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}
