// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"maps"
	"slices"
	"testing"
)

// gRFC A53: with ignore_resource_deletion, what the server deletes (a
// cluster left out of the full state, in SotW and in Delta; a server
// restarted empty) stays in use, shown as deletion-ignored; the mark goes
// when the server sends the resource again. Without the feature, the same
// deletion is applied.
func TestIgnoreResourceDeletion(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
		})
		cfg := testConfig(srv.addr, certs, protocol)
		cfg.XDSServerFeatures = FeatureIgnoreResourceDeletion
		tc := startClient(t, cfg)
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})

		srv.setClusters(cluster("a", "2"))
		waitClusters(t, tc, map[string]string{"a": "2", "b": "1"})
		tc.waitState(t, ClusterType, "b", StateDeletionIgnored)
		if got := tc.clusters.removedNames(); len(got) != 0 {
			t.Errorf("removed = %q, want nothing: the deletion is ignored", got)
		}

		srv.setClusters(cluster("a", "2"), cluster("b", "1"))
		tc.waitState(t, ClusterType, "b", StateAcked)

		// Restarted with nothing to serve: everything is kept.
		srv.stop()
		waitFor(t, "disconnected", func() bool { return tc.typeStatus(ClusterType).State != ConnConnected })
		empty := startServer(t, srv.addr, certs, nil)
		waitFor(t, "the empty state received", func() bool { return len(empty.sent(ClusterType)) > 0 })
		tc.waitState(t, ClusterType, "a", StateDeletionIgnored)
		tc.waitState(t, ClusterType, "b", StateDeletionIgnored)
		if got := tc.clusters.removedNames(); len(got) != 0 {
			t.Errorf("removed = %q, want nothing: the deletions are ignored", got)
		}
	})
}

// The feature is per server: a fallback server without it deletes.
func TestIgnoreResourceDeletionIsPerServer(t *testing.T) {
	certs := newCerts(t)
	primary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "1"), cluster("b", "1")) })
	secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "1")) })
	cfg := testConfig(primary.addr+","+secondary.addr, certs, ProtocolSotW)
	cfg.XDSServerFeatures = FeatureIgnoreResourceDeletion + ","
	tc := startClient(t, cfg)
	waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})
	primary.setClusters(cluster("a", "1"))
	tc.waitState(t, ClusterType, "b", StateDeletionIgnored)
	primary.stop()
	tc.waitInUse(t, secondary.addr)
	waitClusters(t, tc, map[string]string{"a": "1"})
}

// Delta: a server may send its state in several responses; the first of a
// new stream is not a full state, and nothing it lacks is swept. What the
// server no longer has, it removes (initial_resource_versions).
func TestDeltaInitialStateInSeveralResponses(t *testing.T) {
	rc := newRuleClient(t, ProtocolDelta)
	rc.respond(ClusterType, "1", nil, rc.cluster("a", "1"), rc.cluster("b", "1"), rc.cluster("c", "1"))
	rc.reconnect()
	n := rc.clusters.count()
	rc.respond(ClusterType, "2", nil, rc.cluster("a", "2"))
	rc.respond(ClusterType, "2", []string{"c"}, rc.cluster("b", "2"))
	if got := rc.clusters.state(); !maps.Equal(got, map[string]string{"a": "2", "b": "2"}) {
		t.Errorf("clusters = %v, want a and b at 2, c removed by the server", got)
	}
	var removed []string
	for _, u := range rc.clusters.all()[n:] {
		removed = append(removed, u.Removed...)
	}
	if !slices.Equal(removed, []string{"c"}) {
		t.Errorf("removed = %q, want c only", removed)
	}
}
