// SPDX-License-Identifier: Apache-2.0

package test

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// ciliumPorts are the ports Cilium 1.20 opens on a node by default or with
// its chart's usual options ("Port Range / Protocol" in Cilium's
// Documentation/operations/system_requirements.rst, and the port values of
// its chart): Cilium and l4xds run side by side on a node (cilium.md), and
// the agent's metrics take a hostPort.
var ciliumPorts = []int32{
	4240, 4244, 4245, 4250, 4251, // health, Hubble, Hubble Relay, mutual auth, SPIRE
	6060, 6061, 6062, // pprof
	9878, 9879, // cilium-envoy and agent health
	9890, 9891, 9893, // gops
	9901,                         // cilium-envoy admin
	9962, 9963, 9964, 9965, 9966, // metrics: agent, operator, envoy, Hubble, Hubble Relay
}

// The agent's default metrics port collides with none of Cilium's on the
// same node.
func TestMetricsPortBesideCilium(t *testing.T) {
	r, err := render(t, map[string]any{"prometheus": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	ds := only[*appsv1.DaemonSet](t, r)
	ports := ds.Spec.Template.Spec.Containers[0].Ports
	if len(ports) != 1 {
		t.Fatalf("agent ports %+v, want the metrics port", ports)
	}
	if p := ports[0]; slices.Contains(ciliumPorts, p.HostPort) || slices.Contains(ciliumPorts, p.ContainerPort) {
		t.Errorf("metrics port %d (hostPort %d) is one of Cilium's %v", p.ContainerPort, p.HostPort, ciliumPorts)
	}
}
