// SPDX-License-Identifier: Apache-2.0

package test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/internal/makecmd"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
)

// `make release-chart` (part of `make release`) packages the chart with the
// version and appVersion of VERSION, the tag's leading v dropped, so that
// the chart's default image is the image `make release` tags; the package
// holds the whole chart. A VERSION that is not a release version fails.
func TestReleaseChartPackage(t *testing.T) {
	dist := t.TempDir()
	out, err := makecmd.Command("-C", repoRoot, "release-chart", "VERSION=v9.8.7-rc.1", "DIST="+dist).CombinedOutput()
	if err != nil {
		t.Fatalf("make release-chart: %v\n%s", err, out)
	}
	pkg := filepath.Join(dist, "l4xds-9.8.7-rc.1.tgz")
	chrt, err := loader.Load(pkg)
	if err != nil {
		t.Fatalf("the packaged chart %s: %v\n%s", pkg, err, out)
	}
	if chrt.Metadata.Version != "9.8.7-rc.1" || chrt.Metadata.AppVersion != "9.8.7-rc.1" {
		t.Errorf("packaged chart version %q, appVersion %q, want both 9.8.7-rc.1 (VERSION=v9.8.7-rc.1)", chrt.Metadata.Version, chrt.Metadata.AppVersion)
	}
	src := loadChart(t)
	if len(chrt.Templates) != len(src.Templates) || string(chrt.Schema) != string(src.Schema) {
		t.Errorf("the package has %d templates and a schema of %d bytes, the chart %d and %d", len(chrt.Templates), len(chrt.Schema), len(src.Templates), len(src.Schema))
	}
	// The packaged chart's default image is the release's.
	r, err := renderChart(t, chrt, releaseName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img := only[*appsv1.DaemonSet](t, r).Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/l4xds/l4xds:9.8.7-rc.1" {
		t.Errorf("the packaged chart's agent image %q, want the release's tag 9.8.7-rc.1", img)
	}

	out, err = makecmd.Command("-C", repoRoot, "release-chart", "VERSION=4ff647d-dirty", "DIST="+dist).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "VERSION=4ff647d-dirty is not a release version") {
		t.Errorf("make release-chart with VERSION=4ff647d-dirty: %v\n%s", err, out)
	}
}
