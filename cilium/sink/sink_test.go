// SPDX-License-Identifier: Apache-2.0

package sink

import (
	"testing"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// TestServiceName: our service names become Cilium's in Cilium's parts,
// from the parts the translation gives, never by splitting at slashes (an
// xDS cluster's name may hold some).
func TestServiceName(t *testing.T) {
	for _, tc := range []struct {
		svc                      lb.Service
		cluster, namespace, name string
	}{
		{lb.Service{Name: "db"}, "", "xds", "db"},
		{lb.Service{Name: "xds/db", Namespace: "xds"}, "", "xds", "db"},
		{lb.Service{Name: "xds/outbound|80||web/v1", Namespace: "xds"}, "", "xds", "outbound|80||web/v1"},
		{lb.Service{Name: "platform/cassandra", Namespace: "platform"}, "", "platform", "cassandra"},
		{lb.Service{Name: "prod/platform/cassandra", Namespace: "platform", Cluster: "prod"}, "prod", "platform", "cassandra"},
	} {
		n := serviceName(&tc.svc)
		if n.Cluster() != tc.cluster || n.Namespace() != tc.namespace || n.Name() != tc.name {
			t.Errorf("%q: cluster %q namespace %q name %q, want %q %q %q", tc.svc.Name, n.Cluster(), n.Namespace(), n.Name(), tc.cluster, tc.namespace, tc.name)
		}
	}
}
