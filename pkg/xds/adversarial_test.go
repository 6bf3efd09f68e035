// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// gRFC A53 over Delta: a resource whose deletion was ignored and that the
// server has again when the client reconnects (restarted with its old state)
// must lose its mark, as it does in SotW, where the full state carries it.
// The reconnect's initial_resource_versions must not claim the version of a
// resource the server deleted: a server that has the same version sends
// nothing, and the row says deletion-ignored for ever.
func TestIgnoreResourceDeletionMarkClearedOnReconnect(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
		})
		cfg := testConfig(srv.addr, certs, protocol)
		cfg.XDSServerFeatures = FeatureIgnoreResourceDeletion
		tc := startClient(t, cfg)
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})

		srv.setClusters(cluster("a", "1"))
		tc.waitState(t, ClusterType, "b", StateDeletionIgnored)

		// The server restarts with b back, unchanged.
		srv.stop()
		waitFor(t, "disconnected", func() bool { return tc.typeStatus(ClusterType).State != ConnConnected })
		back := startServer(t, srv.addr, certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
		})
		waitFor(t, "the restarted server's state received", func() bool { return len(back.sent(ClusterType)) > 0 })
		tc.waitInUse(t, srv.addr)
		waitFor(t, "status synced", func() bool { return tc.typeStatus(ClusterType).Synced })
		if r := tc.resource(ClusterType, "b"); r.State != StateAcked {
			t.Errorf("b after the server has it again = %+v, want acked", r)
		}
	})
}

// gRFC A53: a resource whose newer version the handler rejected (nacked but
// cached, offered again with later updates) and which the server then
// deletes keeps its accepted version in use. The rejected version, which the
// server withdrew, must not be offered again: the consumer would apply a
// version of a resource the server no longer has, and the mark would go.
func TestIgnoreResourceDeletionDoesNotResurrectARejectedVersion(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		rc := newRuleClient(t, protocol)
		rc.current.ignoreResourceDeletion = true
		// b's VIP is held by a: b is rejected while a is held.
		rc.clusters.conflicts = map[string]string{"b": "a"}
		rc.respondFull(ClusterType, "1", rc.cluster("b", "1"))
		rc.respondFull(ClusterType, "2", rc.cluster("a", "1"), rc.cluster("b", "2"))
		if r := rc.resource(ClusterType, "b"); r.State != StateNackedButCached {
			t.Fatalf("b = %+v, want nacked-but-cached", r)
		}
		// The server deletes b; the deletion is ignored.
		if rc.delta {
			rc.respond(ClusterType, "3", []string{"b"})
		} else {
			rc.respondFull(ClusterType, "3", rc.cluster("a", "1"))
		}
		if r := rc.resource(ClusterType, "b"); r.State != StateDeletionIgnored {
			t.Fatalf("b after its deletion = %+v, want deletion-ignored", r)
		}
		// Another update, after which b-2 would be valid.
		rc.clusters.mu.Lock()
		rc.clusters.conflicts = nil
		rc.clusters.mu.Unlock()
		rc.respondFull(ClusterType, "4", rc.cluster("a", "2"))
		if got := rc.clusters.state()["b"]; got != "1" {
			t.Errorf("the consumer holds b at %q, want 1: the version accepted before the deletion", got)
		}
		want := "1"
		if rc.delta {
			want = rc.cluster("b", "1").version
		}
		if r := rc.resource(ClusterType, "b"); r.State != StateDeletionIgnored || r.Version != want {
			t.Errorf("b = %+v, want deletion-ignored at its accepted version", r)
		}
	})
}

// hungListener accepts TCP connections and never says a word; Close
// closes it and every connection it accepted.
type hungListener struct {
	net.Listener
	mu   sync.Mutex
	held []net.Conn
}

func listenHung(t *testing.T) *hungListener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hungListener{Listener: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.held = append(h.held, c)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.close)
	return h
}

func (h *hungListener) close() {
	h.Listener.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.held {
		c.Close()
	}
	h.held = nil
}

// Faults in sequence: the secondary in use dies while a probe of the hung
// primary is in flight; the client goes on to the secondary restarted; Run
// ends while the next probe hangs. Nothing the client started outlives Run.
func TestFallbackSecondaryDiesDuringAProbeAndNothingOutlivesRun(t *testing.T) {
	base := runtime.NumGoroutine()
	certs := newCerts(t)
	hung := listenHung(t)
	secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "1")) })
	cfg := testConfig(hung.Addr().String()+","+secondary.addr, certs, ProtocolSotW)
	cfg.XDSConnectTimeout = 2 * time.Second
	db := statedb.New()
	c, err := NewClient(cfg, hivetest.Logger(t), db, WithBackoff(testBackoff))
	if err != nil {
		t.Fatal(err)
	}
	tc := &testClient{Client: c, db: db, clusters: &recorder{}, eps: &recorder{}}
	c.Watch(ClusterType, true, tc.clusters)
	c.Watch(EndpointType, false, tc.eps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)

	probing := func() bool {
		s := tc.serverRow(hung.Addr().String())
		return s != nil && !s.InUse && s.State == ConnConnecting
	}
	waitClusters(t, tc, map[string]string{"a": "1"})
	tc.waitInUse(t, secondary.addr)
	waitFor(t, "a probe of the hung primary in flight", probing)
	secondary.stop()
	secondary = startServer(t, secondary.addr, certs, func(s *testServer) { s.setClusters(cluster("a", "2")) })
	waitClusters(t, tc, map[string]string{"a": "2"})
	tc.waitInUse(t, secondary.addr)
	waitFor(t, "the next probe of the hung primary in flight", probing)

	stop()
	secondary.stop()
	hung.close()
	waitFor(t, "the goroutines of the client gone", func() bool { return runtime.NumGoroutine() <= base+2 })
}

// Delta, a client of names only: on a reconnect to the same server, every
// resource goes with the server's version, and a server with nothing new
// sends nothing (the type is presumed current). Nothing is owed, so the
// connect timeout must not end the stream as a server that never answers.
func TestDeltaPresumedStreamIsNotTimedOut(t *testing.T) {
	certs := newCerts(t)
	setup := func(s *testServer) { s.setEndpoints(endpoints("x", 1)) }
	srv := startServer(t, "127.0.0.1:0", certs, setup)
	cfg := testConfig(srv.addr, certs, ProtocolDelta)
	cfg.XDSConnectTimeout = 300 * time.Millisecond
	db := statedb.New()
	c, err := NewClient(cfg, hivetest.Logger(t), db, WithBackoff(testBackoff))
	if err != nil {
		t.Fatal(err)
	}
	tc := &testClient{Client: c, db: db, clusters: &recorder{}, eps: &recorder{}}
	c.Watch(EndpointType, false, tc.eps)
	c.SetNames(EndpointType, []string{"x"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitEndpoints(t, tc, map[string]string{"x": "p1"})

	srv.stop()
	waitFor(t, "disconnected", func() bool { return tc.typeStatus(EndpointType).State != ConnConnected })
	back := startServer(t, srv.addr, certs, setup)
	back.waitRequest(EndpointType, "the reconnect's first request", func(seenRequest) bool { return true })
	// A bounded look: the stream of a server that owes nothing must stay.
	for end := time.Now().Add(10 * cfg.XDSConnectTimeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s := tc.serverRow(srv.addr); strings.Contains(s.Error, "no response within") {
			t.Fatalf("the server that owed nothing counted as failed: %+v", s)
		}
	}
}

// silentADS accepts ADS streams, reads the requests and never answers, as
// a server waiting for its own state does.
type silentADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (silentADS) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

func (silentADS) DeltaAggregatedResources(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// A server that opens the stream and never answers is a failed server:
// every attempt ends at --xds-connect-timeout, and the client tries again.
// No attempt may hang on the dead stream the timer cancelled.
func TestAttemptOnASilentServerAlwaysEnds(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		addr := serveADS(t, silentADS{})
		cfg := testConfig(addr, "", protocol)
		cfg.XDSConnectTimeout = 100 * time.Millisecond
		tc := startClient(t, cfg)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("attempts %d; server %+v; status %+v", tc.Attempts(), tc.serverRow(addr), tc.typeStatus(ClusterType))
			}
		})
		// Each attempt that hangs on the stream the timer cancelled has
		// one chance in two: eight attempts in a row end only if none does.
		waitFor(t, "eight attempts on the silent server, each ended by the timeout", func() bool {
			return tc.Attempts() >= 8
		})
		// Every attempt but the one under way failed.
		if s := tc.serverRow(addr); s.Failures+1 < s.Attempts {
			t.Errorf("the silent server's row = %+v, want every attempt but the last failed", s)
		}
	})
}

// Delta after a fallback: the first stream to the other server lists no
// endpoints (versions mean nothing to it), and what it lacks stays cached,
// as in SotW. A mere reconnect to that same server must keep it so: the
// type's versionsOf is now that server, but x still holds the first
// server's version, and listing it makes the server remove it.
func TestDeltaReconnectToTheFallbackKeepsWhatItLacks(t *testing.T) {
	rc := newRuleClient(t, ProtocolDelta)
	rc.setNames("x", "y")
	rc.respond(EndpointType, "a1", nil, rc.cla("x", 1), rc.cla("y", 1))

	// To B, which has y only: x stays.
	rc.end(errors.New("A is gone"))
	rc.connectTo(1)
	if iv := rc.lastRequest(EndpointType).initialVersions; len(iv) != 0 {
		t.Fatalf("initial versions to another server = %v, want none", iv)
	}
	rc.respondFull(EndpointType, "b1", rc.cla("y", 2))
	if r := rc.resource(EndpointType, "x"); r.State != StateAcked {
		t.Fatalf("x on the first stream to B = %+v, want acked (kept, as in SotW)", r)
	}

	// The stream to B breaks and comes back.
	rc.reconnect()
	iv := rc.lastRequest(EndpointType).initialVersions
	if v, ok := iv["x"]; ok {
		t.Errorf("initial versions to B list x at %q, a version B never gave", v)
	}
	rc.respondFull(EndpointType, "b2")
	if r := rc.resource(EndpointType, "x"); r.State != StateAcked || rc.eps.state()["x"] != "p1" {
		t.Errorf("x after a reconnect to B = %+v, consumer %q; want still acked and held, as on the first stream to B", r, rc.eps.state()["x"])
	}
}

// deafADS answers the first request of a stream, then pushes a new version
// of cluster "a" as fast as the stream takes them and reads nothing more.
type deafADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (deafADS) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return deaf(func() error { _, err := s.Recv(); return err }, func(v string, a *anypb.Any) error {
		return s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: ClusterType, VersionInfo: v, Nonce: v, Resources: []*anypb.Any{a}})
	})
}

func (deafADS) DeltaAggregatedResources(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return deaf(func() error { _, err := s.Recv(); return err }, func(v string, a *anypb.Any) error {
		return s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: ClusterType, Nonce: v,
			Resources: []*discoveryv3.Resource{{Name: "a", Version: v, Resource: a}}})
	})
}

// deaf receives one request, then sends version after version of cluster
// "a" until a send fails.
func deaf(recv func() error, send func(version string, a *anypb.Any) error) error {
	if err := recv(); err != nil {
		return err
	}
	for v := 1; ; v++ {
		a, err := anypb.New(cluster("a", fmt.Sprint(v)))
		if err != nil {
			return err
		}
		if err := send(fmt.Sprint(v), a); err != nil {
			return err
		}
	}
}

// A server that stops reading requests while it sends: once the client's
// ACKs fill the stream's window its send waits, and so does all else the
// run loop does. The watchdog says so, naming the send and the server, and
// the rows say what the handler applied: a response's rows are written
// before its ACK, the send that waits.
func TestServerThatReadsNoRequestsIsReported(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		addr := serveADS(t, deafADS{})
		health := &healthLog{}
		tc := startClient(t, testConfig(addr, "", protocol), func(tc *testClient) {
			tc.health = health
			tc.stallAfter = 200 * time.Millisecond
		})
		want := "sending a Cluster request to " + addr
		waitFor(t, "the blocked send reported in health", func() bool {
			return strings.HasPrefix(health.last(), "Degraded: xDS client stuck for ") && strings.Contains(health.last(), want)
		})
		if applied, row := tc.clusters.state()["a"], tc.resource(ClusterType, "a"); row == nil || row.Version != applied {
			t.Errorf("while the ACK waits, the row of cluster a is %+v; the handler applied version %s", row, applied)
		}
	})
}

// serveADS serves srv, without TLS, until the test ends; it returns the
// address.
func serveADS(t *testing.T, srv discoveryv3.AggregatedDiscoveryServiceServer) string {
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, srv)
	lis := listen(t, "127.0.0.1:0")
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}
