// SPDX-License-Identifier: Apache-2.0

package test

import (
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The control plane's PodDisruptionBudget and replicas as the values say:
// maxUnavailable as given (0 forbids voluntary evictions, a percentage
// stays one), none when disabled or with one replica.
func TestControlPlanePodDisruptionBudget(t *testing.T) {
	const base = `
xdsControlPlane: {enabled: true, insecure: true}
controlPlane:
  enabled: true
  insecure: true
`
	for _, c := range []struct {
		name     string
		values   string
		replicas int32
		pdb      *intstr.IntOrString // nil: no PodDisruptionBudget
	}{
		{"file only, replicas unset", base + "  xdsResources: 'resources: []'\n", 1, nil},
		{"cluster, replicas unset", base + "  kubernetes: {enabled: true}\n", 2, new(intstr.FromInt32(1))},
		{"cluster, one replica", base + "  replicas: 1\n  kubernetes: {enabled: true}\n", 1, nil},
		{"cluster, disabled", base + "  kubernetes: {enabled: true}\n  podDisruptionBudget: {enabled: false}\n", 2, nil},
		{"cluster, a percentage", base + "  kubernetes: {enabled: true}\n  podDisruptionBudget: {maxUnavailable: '50%'}\n", 2, new(intstr.FromString("50%"))},
		{"cluster, no eviction", base + "  kubernetes: {enabled: true}\n  podDisruptionBudget: {maxUnavailable: 0}\n", 2, new(intstr.FromInt32(0))},
	} {
		t.Run(c.name, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			r, err := render(t, vals)
			if err != nil {
				t.Fatal(err)
			}
			d := only[*appsv1.Deployment](t, r)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != c.replicas {
				t.Errorf("replicas %v, want %d", d.Spec.Replicas, c.replicas)
			}
			pdbs := find[*policyv1.PodDisruptionBudget](r)
			switch {
			case c.pdb == nil && len(pdbs) != 0:
				t.Errorf("a PodDisruptionBudget, maxUnavailable %v: want none", pdbs[0].Spec.MaxUnavailable)
			case c.pdb != nil && len(pdbs) != 1:
				t.Errorf("%d PodDisruptionBudgets, want one", len(pdbs))
			case c.pdb != nil && (pdbs[0].Spec.MaxUnavailable == nil || *pdbs[0].Spec.MaxUnavailable != *c.pdb):
				t.Errorf("PodDisruptionBudget maxUnavailable %v, want %v", pdbs[0].Spec.MaxUnavailable, c.pdb.String())
			}
		})
	}
}
