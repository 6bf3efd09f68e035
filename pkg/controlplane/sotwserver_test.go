// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// A client that rejects the first response of a stream NACKs with the
// version it accepted before: none, or one of another server process. The
// server must not answer that with the same response again (the client
// would reject it again, in a loop), but wait for a change.
func TestSotwServerDoesNotResendARejectedFirstResponse(t *testing.T) {
	for _, tc := range []struct{ name, accepted string }{
		{"no version accepted", ""},
		{"a version of another process", "otherprocess-7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startServer(t)
			cfp := cfpResources(t)
			if err := env.srv.Set(cfp); err != nil {
				t.Fatal(err)
			}
			c := env.sotw(t, nil)
			c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: tc.accepted})
			first, err := c.stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			c.send(&discovery.DiscoveryRequest{
				TypeUrl: resource.ClusterType, VersionInfo: tc.accepted, ResponseNonce: first.GetNonce(),
				ErrorDetail: &status.Status{Code: 3, Message: "rejected"},
			})
			env.waitForLogs(t, "NACK", 1)
			if err := env.srv.Set(withVIP(t, cfp, "10.1.2.4")); err != nil {
				t.Fatal(err)
			}
			next, err := c.stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if next.GetVersionInfo() == first.GetVersionInfo() {
				t.Fatalf("the rejected version %s was sent again before any change", first.GetVersionInfo())
			}
		})
	}
}

// sotwGoroutines counts the goroutines of SotW streams: handlers and
// senders.
func sotwGoroutines() (handlers, senders int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case strings.Contains(g, "controlplane.(*sotwStream).flush"):
			senders++
		case strings.Contains(g, "controlplane.(*sotwServer).serve"):
			handlers++
		}
	}
	return handlers, senders
}

// A client that stops reading holds its own stream only: other streams get
// every change, Set does not wait for it, and once it goes (or the server
// stops) none of its goroutines stays.
func TestSotwServerStuckClient(t *testing.T) {
	env := startServer(t)
	// Enough clusters that one CDS response does not fit the stuck
	// client's flow-control window.
	const clusters = 3000
	if err := env.srv.Set(fleetResources(t, clusters, 0)); err != nil {
		t.Fatal(err)
	}
	small := grpc.WithInitialWindowSize(64 << 10)
	conn, err := grpc.NewClient(env.addr, grpc.WithTransportCredentials(credentials.NewTLS(env.clientTLS(t, true))),
		small, grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	stuck, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, typeURL := range []string{resource.ClusterType, resource.EndpointType} {
		if err := stuck.Send(&discovery.DiscoveryRequest{Node: testNode, TypeUrl: typeURL}); err != nil {
			t.Fatal(err)
		}
	}
	// The stuck stream's sender blocks in its first response.
	waitFor(t, "the stuck stream's sender", func() bool { _, s := sotwGoroutines(); return s == 1 })

	c := env.sotw(t, map[string][]string{resource.EndpointType: nil})
	c.recv()
	for r := 1; r <= 6; r++ {
		if err := env.srv.Set(fleetResources(t, clusters, r)); err != nil {
			t.Fatal(err)
		}
		resp, _ := c.recv()
		if resp.GetTypeUrl() != resource.EndpointType {
			t.Fatalf("got %s, want EDS", resp.GetTypeUrl())
		}
	}

	cancel()
	waitFor(t, "the stuck stream's goroutines to end", func() bool { h, s := sotwGoroutines(); return h == 1 && s == 0 })
	env.srv.Stop()
	waitFor(t, "every stream's goroutines to end after Stop", func() bool { h, s := sotwGoroutines(); return h == 0 && s == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testContext(t)
	for !cond() {
		select {
		case <-ctx.Done():
			h, s := sotwGoroutines()
			t.Fatalf("waiting for %s: %d SotW handlers, %d senders", what, h, s)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A node's SotW and Delta streams are two streams to the callbacks, which
// count a node's streams to forget its metrics when its last one closes.
// The two servers number their streams apart; their IDs must not meet.
func TestSotwAndDeltaStreamsOfANodeCountTwice(t *testing.T) {
	env := startServer(t)
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	s := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	s.recv()
	d := env.delta(t, map[string][]string{resource.ClusterType: {"*"}})
	d.recv()
	env.srv.cb.mu.Lock()
	n := env.srv.cb.streams[testNode.GetId()]
	env.srv.cb.mu.Unlock()
	if n != 2 {
		t.Fatalf("node %s has %d streams, want 2 (one SotW, one Delta)", testNode.GetId(), n)
	}
}

// Envoy names on a new stream the version it last accepted. A new stream
// of a full-state type (CDS, LDS) is answered even if the state is now
// empty: the client may hold resources that went while it was away, and a
// full-state response is what removes them.
func TestSotwServerAnswersAReconnectToAnEmptyFullState(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	a := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	held, _ := a.recv()
	if err := env.srv.Set(Resources{resource.EndpointType: cfp[resource.EndpointType]}); err != nil {
		t.Fatal(err)
	}
	// The client was away when the clusters went, and comes back.
	b := env.sotw(t, nil)
	b.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: held.GetVersionInfo()})
	resp, msgs := b.recv()
	if resp.GetTypeUrl() != resource.ClusterType || len(msgs) != 0 || resp.GetVersionInfo() == held.GetVersionInfo() {
		t.Fatalf("got %s %s with %d resources, want CDS with none at a version after %s",
			resp.GetTypeUrl(), resp.GetVersionInfo(), len(msgs), held.GetVersionInfo())
	}
}

// A node that restarts in a storm opens streams faster than its old ones
// close: once the old ones are gone, it counts as the one stream it has,
// and nothing of the others stays.
func TestSotwServerRestartStorm(t *testing.T) {
	env := startServer(t)
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	conn := env.dial(t, credentials.NewTLS(env.clientTLS(t, true)))
	const storm = 30
	cancels := make([]context.CancelFunc, storm)
	for i := range cancels {
		ctx, cancel := context.WithCancel(testContext(t))
		cancels[i] = cancel
		st, err := conn.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := &sotwClient{t: t, stream: st}
		c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType})
		c.recv()
	}
	last := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	last.recv()
	for _, cancel := range cancels {
		go cancel()
	}
	waitFor(t, "the old streams to end", func() bool {
		h, s := sotwGoroutines()
		env.srv.cb.mu.Lock()
		defer env.srv.cb.mu.Unlock()
		return h == 1 && s == 0 && len(env.srv.cb.nodes) == 1 && env.srv.cb.streams[testNode.GetId()] == 1
	})
	if err := env.srv.Set(withVIP(t, cfpResources(t), "10.1.2.9")); err != nil {
		t.Fatal(err)
	}
	if _, msgs := last.recv(); vipOf(msgs["my-database-service"]) != "10.1.2.9" {
		t.Fatalf("the stream that stayed got %v", msgs)
	}
}

// A type the server cannot serve (no such message is linked in) is not
// answered, and the stream goes on serving the others: failing it would
// fail the client's reconnects alike, and leave it without any type.
func TestSotwServerIgnoresATypeItCannotServe(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	c := env.sotw(t, nil)
	c.send(&discovery.DiscoveryRequest{TypeUrl: "type.googleapis.com/example.NoSuchResource"})
	c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType})
	resp, _ := c.recv()
	if resp.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("got a %s response, want CDS", resp.GetTypeUrl())
	}
	if err := env.srv.Set(withVIP(t, cfp, "10.1.2.9")); err != nil {
		t.Fatal(err)
	}
	if resp, msgs := c.recv(); resp.GetTypeUrl() != resource.ClusterType || vipOf(msgs["my-database-service"]) != "10.1.2.9" {
		t.Fatalf("got %s %v, want the changed cluster", resp.GetTypeUrl(), msgs)
	}
}
