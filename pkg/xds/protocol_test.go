// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// countRequests counts the requests of a type that match.
func countRequests(srv *testServer, typeURL string, match func(seenRequest) bool) int {
	n := 0
	for _, r := range srv.seen(typeURL) {
		if match(r) {
			n++
		}
	}
	return n
}

func isNack(r seenRequest) bool { return r.Error != "" }

// A resource the handler rejects because of another one (a VIP the other
// holds) is accepted once the other goes, although the server does not
// send it again: a Delta server never does, and a SotW server sends it
// unchanged.
func TestRejectedResourceOfferedAgain(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"))
		})
		tc := startClient(t, testConfig(srv.addr, certs, protocol), func(tc *testClient) {
			tc.clusters.conflicts = map[string]string{"b": "a", "c": "a"}
		})
		waitClusters(t, tc, map[string]string{"a": "1"})

		srv.setClusters(cluster("a", "1"), cluster("b", "1"), cluster("c", "1"))
		nack := srv.waitRequest(ClusterType, "NACK of b and c", isNack)
		want := `cluster "b": ` + vipConflictPrefix + `a; cluster "c": ` + vipConflictPrefix + "a"
		if nack.Error != want {
			t.Errorf("NACK error_detail = %q, want %q", nack.Error, want)
		}
		tc.waitState(t, ClusterType, "b", StateNacked)
		tc.waitState(t, ClusterType, "c", StateNacked)
		sentBefore := len(srv.sent(ClusterType))

		// a goes; b and c stay as they were on the server.
		srv.setClusters(cluster("b", "1"), cluster("c", "1"))
		waitClusters(t, tc, map[string]string{"b": "1", "c": "1"})
		for _, n := range []string{"b", "c"} {
			if r := tc.waitState(t, ClusterType, n, StateAcked); r.Version == "" || r.Error != "" {
				t.Errorf("%s = %+v, want acked with a version", n, r)
			}
		}
		waitFor(t, "ACK after a is removed", func() bool {
			reqs := srv.seen(ClusterType)
			last := reqs[len(reqs)-1]
			return last.Nonce != "" && last.Error == ""
		})
		if protocol == ProtocolDelta {
			for _, r := range srv.sent(ClusterType)[sentBefore:] {
				if len(r.Names) > 0 {
					t.Errorf("the server sent %q again; the test needs it not to", r.Names)
				}
			}
		}
		// Each resource is offered once per update.
		for _, u := range tc.clusters.all() {
			got := names(u.Upserted)
			if len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Errorf("update offers a resource twice: %q", got)
			}
		}
	})
}

// A server that answers every NACK with the same response at once
// (go-control-plane in SotW until a version was accepted) gets the
// repeated NACKs at a growing pace, and holding a NACK back stops
// nothing else: the other types and SetNames go on.
func TestRepeatedNackPacedWithoutBlocking(t *testing.T) {
	t.Run("not blocking", func(t *testing.T) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("x", "bad"))
			s.setEndpoints(endpoints("e1", 0))
		})
		tc := startClient(t, testConfig(srv.addr, certs, ProtocolSotW), func(tc *testClient) {
			tc.backoff = Backoff{Initial: time.Minute, Max: time.Minute, Multiplier: 2}
		})
		waitFor(t, "the bad response twice", func() bool { return len(srv.sent(ClusterType)) >= 2 })

		tc.SetNames(EndpointType, []string{"e1"})
		waitEndpoints(t, tc, map[string]string{"e1": "p0"})
		if n := countRequests(srv, ClusterType, isNack); n != 1 {
			t.Errorf("%d NACKs sent, want the first only: the repeat is held back", n)
		}
		tc.waitState(t, ClusterType, "x", StateNacked)
	})

	t.Run("paced", func(t *testing.T) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("x", "bad"))
		})
		startClient(t, testConfig(srv.addr, certs, ProtocolSotW))
		waitFor(t, "repeated NACKs", func() bool { return countRequests(srv, ClusterType, isNack) >= 3 })
		// The test backoff paces them at 20ms growing to 100ms: about
		// ten in a second, where a loop would make hundreds.
		before := countRequests(srv, ClusterType, isNack)
		time.Sleep(time.Second)
		if n := countRequests(srv, ClusterType, isNack) - before; n > 40 {
			t.Errorf("%d NACKs in a second", n)
		}
	})
}

// The does-not-exist timer is for names of which nothing was received: a
// resource the handler rejects exists. On a new stream the timer starts
// again for the names without an accepted resource.
func TestRejectedResourceExists(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setEndpoints(endpoints("e1", 9), endpoints("e2", 0))
		})
		cfg := testConfig(srv.addr, certs, protocol)
		cfg.XDSResourceDoesNotExistTimeout = 300 * time.Millisecond
		tc := startClient(t, cfg)
		tc.SetNames(EndpointType, []string{"e1", "e2"})
		waitEndpoints(t, tc, map[string]string{"e2": "p0"})
		e1 := tc.waitState(t, EndpointType, "e1", StateNacked)
		if e1.Error != badPriorityError {
			t.Errorf("e1 = %+v", e1)
		}

		// Well past the timeout, e1 still exists.
		time.Sleep(5 * cfg.XDSResourceDoesNotExistTimeout)
		if r := tc.resource(EndpointType, "e1"); r == nil || r.State != StateNacked {
			t.Errorf("e1 after the timeout = %+v, want nacked", r)
		}
		if got := tc.eps.removedNames(); len(got) != 0 {
			t.Errorf("removed endpoints = %q", got)
		}

		// A new server without endpoints: e1 had nothing accepted, so
		// its timer runs again and fires. e2 is kept (last-known-good) in
		// SotW; in Delta the server removes it (it was in the stream's
		// initial_resource_versions).
		srv.stop()
		startServer(t, srv.addr, certs, nil)
		tc.waitState(t, EndpointType, "e1", StateDoesNotExist)
		if protocol == ProtocolDelta {
			tc.waitState(t, EndpointType, "e2", StateDoesNotExist)
			if got := slices.Sorted(slices.Values(tc.eps.removedNames())); !slices.Equal(got, []string{"e1", "e2"}) {
				t.Errorf("removed endpoints = %q, want e1 (by the timer) and e2 (by the server)", got)
			}
			return
		}
		if got := tc.eps.removedNames(); !slices.Equal(got, []string{"e1"}) {
			t.Errorf("removed endpoints = %q", got)
		}
		if r := tc.resource(EndpointType, "e2"); r == nil || r.State != StateAcked {
			t.Errorf("e2 after reconnect = %+v", r)
		}
	})
}

// A new server with no cluster at all sends an empty first response
// (go-control-plane does, in SotW and in Delta, for a wildcard
// subscription), and the sweep empties the cache on it.
func TestResyncWithEmptyServer(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
			s.setEndpoints(endpoints("e1", 0))
		})
		tc := startClient(t, testConfig(srv.addr, certs, protocol))
		tc.SetNames(EndpointType, []string{"e1"})
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})
		waitEndpoints(t, tc, map[string]string{"e1": "p0"})
		n := tc.clusters.count()

		srv.stop()
		waitFor(t, "disconnected", func() bool { return tc.typeStatus(ClusterType).State != ConnConnected })
		empty := startServer(t, srv.addr, certs, nil)
		waitClusters(t, tc, map[string]string{})
		got := tc.clusters.all()[n:]
		if len(got) != 1 || !slices.Equal(got[0].Removed, []string{"a", "b"}) || len(got[0].Upserted) != 0 {
			t.Errorf("updates after the empty server = %+v, want one removing a and b", got)
		}
		if sent := empty.sent(ClusterType); len(sent) == 0 || len(sent[0].Names) != 0 {
			t.Errorf("responses of the empty server = %+v", sent)
		}
		if protocol == ProtocolDelta {
			// The server removes e1, listed in initial_resource_versions.
			tc.waitState(t, EndpointType, "e1", StateDoesNotExist)
			return
		}
		if r := tc.resource(EndpointType, "e1"); r == nil || r.State != StateAcked {
			t.Errorf("e1 after reconnect = %+v", r)
		}
		if got := tc.eps.removedNames(); len(got) != 0 {
			t.Errorf("removed endpoints = %q", got)
		}
	})
}

// A server that ends the stream after every response is reconnected to at
// the initial backoff, never in a loop.
func TestStreamClosedAfterEveryResponse(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"))
			s.closeOnAck = true
		})
		tc := startClient(t, testConfig(srv.addr, "", protocol), func(tc *testClient) {
			tc.backoff = Backoff{Initial: 200 * time.Millisecond, Max: time.Second, Multiplier: 1.6, Jitter: 0.2}
		})
		waitClusters(t, tc, map[string]string{"a": "1"})
		waitFor(t, "a reconnect", func() bool { return tc.Attempts() >= 2 })
		before := tc.Attempts()
		time.Sleep(time.Second)
		if n := tc.Attempts() - before; n > 15 {
			t.Errorf("%d attempts in a second", n)
		}
		if got := tc.clusters.count(); got != 1 {
			t.Errorf("%d cluster updates, want 1: each new stream brings the same state", got)
		}
		if st := tc.typeStatus(ClusterType); !strings.HasPrefix(st.Error, "xDS server ") && st.Error != "" {
			t.Errorf("status = %+v", st)
		}
	})
}

// SetNames may be called from any goroutine, handlers included, while the
// client runs; the last call wins.
func TestConcurrentSetNames(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"))
			s.setEndpoints(endpoints("e1", 0), endpoints("e2", 0), endpoints("e3", 0))
		})
		tc := startClient(t, testConfig(srv.addr, "", protocol), func(tc *testClient) {
			tc.clusters.onUpdate = func(Update) { tc.SetNames(EndpointType, []string{"e3"}) }
		})
		waitClusters(t, tc, map[string]string{"a": "1"})

		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 200 {
					tc.SetNames(EndpointType, []string{fmt.Sprintf("e%d", (g+i)%4)})
				}
			})
		}
		wg.Wait()
		tc.SetNames(EndpointType, []string{"e1", "e2"})
		waitFor(t, "rows of e1 and e2 only", func() bool {
			var got []string
			for r := range tc.resources.Prefix(tc.db.ReadTxn(), ResourcesByType(EndpointType)) {
				if r.State != StateAcked {
					return false
				}
				got = append(got, r.Name)
			}
			return slices.Equal(got, []string{"e1", "e2"})
		})
	})
}
