// SPDX-License-Identifier: Apache-2.0

package test

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
)

// `helm upgrade --reuse-values` from a chart version before the control
// plane's high availability, with replicas: 1 given at install and the
// cluster served: one replica stays (as given), no PodDisruptionBudget, and
// the new flags are rendered from the templates' defaults.
func TestUpgradeReuseValuesHA(t *testing.T) {
	cfg := helmConfig(t)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "lb", namespace
	old := map[string]any{"datapath": "none", "controlPlane": map[string]any{
		"enabled": true, "insecure": true, "replicas": 1, "kubernetes": map[string]any{"enabled": true},
	}, "xdsControlPlane": map[string]any{"enabled": true, "insecure": true}}
	chrt := olderChart(t, "controlPlane.podDisruptionBudget", "controlPlane.maxConnectionAge", "controlPlane.priorityClassName")
	if _, err := install.Run(chrt, old); err != nil {
		t.Fatalf("install of the older chart: %v", err)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace, upgrade.ReuseValues = namespace, true
	rel, err := upgrade.Run("lb", loadChart(t), nil)
	if err != nil {
		t.Fatalf("helm upgrade --reuse-values: %v", err)
	}
	if rel.Info.Status != release.StatusDeployed {
		t.Fatalf("release %s", rel.Info.Status)
	}
	names := manifestNames(t, rel)
	if slices.Contains(names, "PodDisruptionBudget/lb-l4xds-control-plane") {
		t.Errorf("objects %v: a PodDisruptionBudget with one replica", names)
	}
	for _, want := range []string{"replicas: 1\n", "--max-connection-age=30m", "--leader-elect"} {
		if !strings.Contains(rel.Manifest, want) {
			t.Errorf("manifest lacks %q", want)
		}
	}
}
