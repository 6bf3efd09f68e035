// SPDX-License-Identifier: Apache-2.0

package test

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
)

// Two releases in one namespace that both serve the cluster (two
// load-balancer classes, say) elect their writers on different Leases:
// sharing one, a release would write no status while the other leads.
func TestLeasePerRelease(t *testing.T) {
	const values = `
xdsControlPlane: {enabled: true, insecure: true}
controlPlane: {enabled: true, insecure: true, kubernetes: {enabled: true}}`
	lease := map[string]string{}
	for _, release := range []string{"lb-a", "lb-b"} {
		vals, err := chartutil.ReadValues([]byte(values))
		if err != nil {
			t.Fatal(err)
		}
		r, err := renderRelease(t, release, vals)
		if err != nil {
			t.Fatal(err)
		}
		// Without --leader-elect-lease the Lease is
		// $POD_NAMESPACE/l4xds-control-plane.
		name := namespace + "/l4xds-control-plane"
		for _, a := range only[*appsv1.Deployment](t, r).Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--leader-elect-lease="); ok {
				name = v
			}
		}
		if other, ok := lease[name]; ok {
			t.Errorf("releases %s and %s share the Lease %s", other, release, name)
		}
		lease[name] = release
	}
}
