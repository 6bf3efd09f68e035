// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"maps"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Replicas behind one address are one server to an agent: on a reconnect
// it lists in initial_resource_versions the versions another replica gave
// it, and the replica it reaches sends only what differs. That is safe
// only if a Delta version names the contents, whoever serves it: two
// servers (started apart, with their own version prefixes and update
// counts) give the same resource the same version (a hash of its bytes).
func TestDeltaVersionsAreTheSameOnEveryReplica(t *testing.T) {
	a, b := startServer(t), startServer(t)
	cfp := cfpResources(t)
	if err := a.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	// b gets there through other states: its update counts differ.
	if err := b.srv.Set(Resources{}); err != nil {
		t.Fatal(err)
	}
	if err := b.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	first := func(e *testEnv) map[string]string {
		c := e.delta(t, map[string][]string{resource.ClusterType: {"*"}})
		var resp *discovery.DeltaDiscoveryResponse
		for resp == nil || resp.GetTypeUrl() != resource.ClusterType {
			resp = c.recv()
		}
		return versions(resp)
	}
	va, vb := first(a), first(b)
	if len(va) == 0 || !maps.Equal(va, vb) {
		t.Fatalf("versions of the same clusters: %v on one replica, %v on another", va, vb)
	}
}
