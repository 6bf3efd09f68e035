// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/l4xds/l4xds/pkg/devcerts"
)

func forEachProtocol(t *testing.T, f func(t *testing.T, protocol string)) {
	for _, p := range []string{ProtocolSotW, ProtocolDelta} {
		t.Run(p, func(t *testing.T) { f(t, p) })
	}
}

func names(rs []Resource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return out
}

func waitClusters(t *testing.T, tc *testClient, want map[string]string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("clusters %v", want), func() bool { return maps.Equal(tc.clusters.state(), want) })
}

func waitEndpoints(t *testing.T, tc *testClient, want map[string]string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("endpoints %v", want), func() bool { return maps.Equal(tc.eps.state(), want) })
}

func TestUpsertsAndAcks(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
		})
		tc := startClient(t, testConfig(srv.addr, certs, protocol))
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})

		first := srv.seen(ClusterType)[0]
		if n := first.Node; n.GetId() != "node-1" || n.GetCluster() != "l4xds" || n.GetUserAgentName() != "l4xds" || n.GetLocality().GetZone() != "zone-a" {
			t.Errorf("first request's node = %v", n)
		}
		// SotW: the legacy wildcard (no names); Delta: an explicit "*".
		if protocol == ProtocolSotW && len(first.Names) != 0 {
			t.Errorf("first request names %q, want none (the legacy wildcard)", first.Names)
		}
		if protocol == ProtocolDelta && !slices.Equal(first.Subscribe, []string{"*"}) {
			t.Errorf("first request subscribes to %q, want an explicit wildcard", first.Subscribe)
		}

		ack := srv.waitRequest(ClusterType, "ACK", func(r seenRequest) bool { return r.Nonce != "" })
		if ack.Error != "" {
			t.Errorf("ACK has error_detail %q", ack.Error)
		}
		if protocol == ProtocolSotW && (ack.Version == "" || ack.Version != tc.typeStatus(ClusterType).Version) {
			t.Errorf("ACK version %q, status version %q", ack.Version, tc.typeStatus(ClusterType).Version)
		}
		for _, n := range []string{"a", "b"} {
			tc.waitState(t, ClusterType, n, StateAcked)
		}
		select {
		case <-tc.Synced(ClusterType):
		default:
			t.Error("Synced(ClusterType) not closed after the first response")
		}

		// The server resends every cluster (SotW) or the changed one
		// (Delta): either way the handler sees only what changed.
		before := tc.clusters.count()
		srv.setClusters(cluster("a", "2"), cluster("b", "1"))
		waitClusters(t, tc, map[string]string{"a": "2", "b": "1"})
		got := tc.clusters.all()[before:]
		if len(got) != 1 || !slices.Equal(names(got[0].Upserted), []string{"a"}) || len(got[0].Removed) != 0 {
			t.Errorf("updates after changing a: %+v, want one with a upserted", got)
		}
		st := tc.typeStatus(ClusterType)
		if st.State != ConnConnected || !st.Synced || st.Protocol != protocol || st.Error != "" {
			t.Errorf("status = %+v", st)
		}
	})
}

func TestNackKeepsGoodResources(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"), cluster("c", "1"))
		})
		tc := startClient(t, testConfig(srv.addr, certs, protocol))
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1", "c": "1"})
		accepted := tc.typeStatus(ClusterType).Version
		bVersion := tc.waitState(t, ClusterType, "b", StateAcked).Version

		// b turns bad, c changes, d arrives bad.
		srv.setClusters(cluster("a", "1"), cluster("b", "bad"), cluster("c", "2"), cluster("d", "bad"))
		nack := srv.waitRequest(ClusterType, "NACK", func(r seenRequest) bool { return r.Error != "" })
		want := `cluster "b": ` + badPortError + `; cluster "d": ` + badPortError
		if nack.Error != want {
			t.Errorf("NACK error_detail = %q, want %q", nack.Error, want)
		}
		if protocol == ProtocolSotW && nack.Version != accepted {
			t.Errorf("NACK version = %q, want the last accepted %q", nack.Version, accepted)
		}
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1", "c": "2"})
		b := tc.waitState(t, ClusterType, "b", StateNackedButCached)
		if b.Version != bVersion || b.Error != badPortError {
			t.Errorf("b = %+v, want version %q kept and the error", b, bVersion)
		}
		if d := tc.waitState(t, ClusterType, "d", StateNacked); d.Version != "" {
			t.Errorf("d = %+v, want no version", d)
		}
		tc.waitState(t, ClusterType, "c", StateAcked)

		// Fixing b (and dropping d) is ACKed.
		srv.setClusters(cluster("a", "1"), cluster("b", "2"), cluster("c", "2"))
		waitClusters(t, tc, map[string]string{"a": "1", "b": "2", "c": "2"})
		tc.waitState(t, ClusterType, "b", StateAcked)
		waitFor(t, "ACK after the fix", func() bool {
			reqs := srv.seen(ClusterType)
			last := reqs[len(reqs)-1]
			return last.Nonce != "" && last.Error == ""
		})
		if d := tc.resource(ClusterType, "d"); d != nil {
			t.Errorf("d is still in the table: %+v", d)
		}
		if slices.Contains(tc.clusters.removedNames(), "d") {
			t.Error("Removed delivered for d, which was never accepted")
		}
	})
}

func TestRemovals(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
			s.setEndpoints(endpoints("e1", 0), endpoints("e2", 0))
		})
		tc := startClient(t, testConfig(srv.addr, certs, protocol))
		tc.SetNames(EndpointType, []string{"e2", "e1", "e1"})
		waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})
		waitEndpoints(t, tc, map[string]string{"e1": "p0", "e2": "p0"})
		srv.waitRequest(EndpointType, "request for e1 and e2", func(r seenRequest) bool {
			return slices.Equal(r.Names, []string{"e1", "e2"}) || slices.Equal(r.Subscribe, []string{"e1", "e2"})
		})

		// Wildcard: gone from the server is Removed.
		srv.setClusters(cluster("a", "1"))
		waitClusters(t, tc, map[string]string{"a": "1"})
		if got := tc.clusters.removedNames(); !slices.Equal(got, []string{"b"}) {
			t.Errorf("removed clusters = %q", got)
		}
		if r := tc.resource(ClusterType, "b"); r != nil {
			t.Errorf("b still in the table: %+v", r)
		}

		// Endpoints: e2 deleted while e1 changes.
		srv.setEndpoints(endpoints("e1", 1))
		if protocol == ProtocolSotW {
			// Absent from a SotW response of a non-wildcard type is not
			// deleted.
			waitEndpoints(t, tc, map[string]string{"e1": "p1", "e2": "p0"})
			if got := tc.eps.removedNames(); len(got) != 0 {
				t.Errorf("removed endpoints = %q", got)
			}
			tc.waitState(t, EndpointType, "e2", StateAcked)
		} else {
			waitEndpoints(t, tc, map[string]string{"e1": "p1"})
			if got := tc.eps.removedNames(); !slices.Equal(got, []string{"e2"}) {
				t.Errorf("removed endpoints = %q", got)
			}
			tc.waitState(t, EndpointType, "e2", StateDoesNotExist)
		}
	})
}

func TestSetNamesAndDoesNotExist(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("e1", "1"))
			s.setEndpoints(endpoints("e1", 0))
		})
		cfg := testConfig(srv.addr, certs, protocol)
		cfg.XDSResourceDoesNotExistTimeout = 300 * time.Millisecond
		tc := startClient(t, cfg)
		// The cluster handler asks for endpoints from inside the handler,
		// as the load balancer does.
		tc.clusters.onUpdate = func(u Update) {
			tc.SetNames(EndpointType, append(names(u.Upserted), "ghost"))
		}
		waitEndpoints(t, tc, map[string]string{"e1": "p0"})
		waitFor(t, "ghost removed", func() bool { return slices.Equal(tc.eps.removedNames(), []string{"ghost"}) })
		tc.waitState(t, EndpointType, "ghost", StateDoesNotExist)
		tc.waitState(t, EndpointType, "e1", StateAcked)

		// Dropping a name forgets it, without a Removed.
		tc.SetNames(EndpointType, []string{"e1"})
		srv.waitRequest(EndpointType, "request without ghost", func(r seenRequest) bool {
			return slices.Equal(r.Names, []string{"e1"}) || slices.Equal(r.Unsubscribe, []string{"ghost"})
		})
		waitFor(t, "ghost forgotten", func() bool { return tc.resource(EndpointType, "ghost") == nil })
		if got := tc.eps.removedNames(); !slices.Equal(got, []string{"ghost"}) {
			t.Errorf("removed endpoints = %q", got)
		}
	})
}

func TestLastKnownGoodAndResync(t *testing.T) {
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

		nClusters, nEndpoints := tc.clusters.count(), tc.eps.count()
		attempts := tc.Attempts()
		srv.stop()
		waitFor(t, "disconnected", func() bool { return tc.typeStatus(ClusterType).State != ConnConnected })
		waitFor(t, "reconnect attempts", func() bool { return tc.Attempts() >= attempts+3 })
		time.Sleep(2 * time.Second)
		if tc.clusters.count() != nClusters || tc.eps.count() != nEndpoints {
			t.Fatalf("handlers called while the server was down: %+v %+v", tc.clusters.all()[nClusters:], tc.eps.all()[nEndpoints:])
		}
		for _, r := range []struct{ typ, name string }{{ClusterType, "a"}, {ClusterType, "b"}, {EndpointType, "e1"}} {
			if got := tc.resource(r.typ, r.name); got == nil || got.State != StateAcked {
				t.Errorf("%s while disconnected: %+v", r.name, got)
			}
		}
		st := tc.typeStatus(ClusterType)
		if !strings.HasPrefix(st.Error, "xDS server "+srv.addr+": ") || st.Synced {
			t.Errorf("status while disconnected: %+v", st)
		}

		// Another state on the same address: a is swept, with the full
		// state, in one update. e1 (asked by name) stays in SotW, where
		// the server cannot say it is gone; in Delta the server removes
		// it (the stream's initial_resource_versions listed it).
		startServer(t, srv.addr, certs, func(s *testServer) {
			s.setClusters(cluster("b", "2"), cluster("c", "1"))
		})
		waitClusters(t, tc, map[string]string{"b": "2", "c": "1"})
		got := tc.clusters.all()[nClusters:]
		if len(got) != 1 || !slices.Equal(got[0].Removed, []string{"a"}) || !slices.Equal(names(got[0].Upserted), []string{"b", "c"}) {
			t.Errorf("updates after the new server = %+v, want one: b and c upserted, a removed", got)
		}
		waitFor(t, "connected", func() bool { return tc.typeStatus(ClusterType).State == ConnConnected })
		if protocol == ProtocolDelta {
			tc.waitState(t, EndpointType, "e1", StateDoesNotExist)
			if got := tc.eps.removedNames(); !slices.Equal(got, []string{"e1"}) {
				t.Errorf("removed endpoints = %q, want e1", got)
			}
			return
		}
		if tc.eps.count() != nEndpoints {
			t.Errorf("endpoint updates after reconnect: %+v", tc.eps.all()[nEndpoints:])
		}
		if r := tc.resource(EndpointType, "e1"); r == nil || r.State != StateAcked {
			t.Errorf("e1 after reconnect: %+v", r)
		}
	})
}

func TestTLSFailures(t *testing.T) {
	certs := newCerts(t)
	other := newCerts(t)
	srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "1")) })

	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"wrong CA", func(c *Config) { c.XDSCACertPath = filepath.Join(other, devcerts.CACert) },
			"tls: certificate signed by unknown authority"},
		{"wrong server name", func(c *Config) { c.XDSServerName = "xds.example.org" },
			"tls: certificate is valid for localhost, not xds.example.org"},
		{"client certificate of another CA", func(c *Config) {
			c.XDSClientCertPath = filepath.Join(other, devcerts.ClientCert)
			c.XDSClientKeyPath = filepath.Join(other, devcerts.ClientKey)
		}, "remote error: tls: "},
		{"no client certificate", func(c *Config) { c.XDSClientCertPath = filepath.Join(t.TempDir(), "missing.crt") },
			"tls: client certificate: open "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(srv.addr, certs, ProtocolSotW)
			tt.modify(&cfg)
			tc := startClient(t, cfg)
			prefix := "xDS server " + srv.addr + ": "
			var st *TypeStatus
			waitFor(t, "a connection error", func() bool {
				st = tc.typeStatus(ClusterType)
				return st != nil && st.Error != ""
			})
			if !strings.HasPrefix(st.Error, prefix) || !strings.Contains(st.Error, tt.want) {
				t.Errorf("error = %q, want %q then %q", st.Error, prefix, tt.want)
			}
			if strings.ContainsAny(st.Error, "\n") || strings.Contains(st.Error, "rpc error") || strings.Contains(st.Error, "desc =") {
				t.Errorf("error is not one clean line: %q", st.Error)
			}

			// With 20ms..100ms backoff, a second holds about ten attempts;
			// a hot loop would make hundreds.
			before := tc.Attempts()
			time.Sleep(time.Second)
			n := tc.Attempts() - before
			if n < 2 || n > 60 {
				t.Errorf("%d attempts in a second", n)
			}
			if tc.clusters.count() != 0 {
				t.Errorf("updates without a connection: %+v", tc.clusters.all())
			}
		})
	}
	if got := srv.seen(ClusterType); len(got) != 0 {
		t.Errorf("server received requests: %+v", got)
	}
}

func TestCertificateRotation(t *testing.T) {
	dir := newCerts(t)
	srv := startServer(t, "127.0.0.1:0", dir, func(s *testServer) { s.setClusters(cluster("a", "1")) })
	tc := startClient(t, testConfig(srv.addr, dir, ProtocolSotW))
	waitClusters(t, tc, map[string]string{"a": "1"})

	// New CA and certificates at the same paths; the old server goes and
	// a server with the new ones comes. Connecting proves the client read
	// both the new CA and its new certificate.
	oldCA, _ := os.ReadFile(filepath.Join(dir, devcerts.CACert))
	srv.stop()
	if err := devcerts.Write(dir, devcerts.Options{}); err != nil {
		t.Fatal(err)
	}
	if newCA, _ := os.ReadFile(filepath.Join(dir, devcerts.CACert)); string(newCA) == string(oldCA) {
		t.Fatal("devcerts wrote the same CA")
	}
	startServer(t, srv.addr, dir, func(s *testServer) { s.setClusters(cluster("a", "1"), cluster("b", "1")) })
	waitClusters(t, tc, map[string]string{"a": "1", "b": "1"})
	if st := tc.typeStatus(ClusterType); st.State != ConnConnected {
		t.Errorf("status after rotation: %+v", st)
	}
}

func TestBackoffSequence(t *testing.T) {
	tests := []struct {
		name   string
		rand   float64
		want   []time.Duration
		resets int // Reset after this many
	}{
		{"no jitter", 0.5, []time.Duration{
			time.Second, 1600 * time.Millisecond, 2560 * time.Millisecond, 4096 * time.Millisecond,
		}, 0},
		{"lowest jitter", 0, []time.Duration{800 * time.Millisecond, 1280 * time.Millisecond}, 0},
		{"highest jitter", 1, []time.Duration{1200 * time.Millisecond, 1920 * time.Millisecond}, 0},
		{"reset", 0.5, []time.Duration{time.Second, 1600 * time.Millisecond, time.Second, 1600 * time.Millisecond}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := DefaultBackoff
			b.Rand = func() float64 { return tt.rand }
			var got []time.Duration
			for i := range tt.want {
				if tt.resets > 0 && i == tt.resets {
					b.Reset()
				}
				got = append(got, b.Next())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("waits = %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("capped at Max", func(t *testing.T) {
		b := DefaultBackoff
		b.Rand = func() float64 { return 1 }
		var last time.Duration
		for range 30 {
			last = b.Next()
			if last > b.Max {
				t.Fatalf("wait %s above max %s", last, b.Max)
			}
		}
		if last != b.Max {
			t.Errorf("wait after 30 attempts = %s, want %s", last, b.Max)
		}
	})
}

// The names a handler asks for are requested before their rows are
// written: on a large update the request is what the tables wait for, the
// rows only what an operator reads. Each EDS request is checked as it is
// sent, on the run loop, so the order is the client's.
func TestRequestsGoBeforeTheirRows(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "1"))
		})
		db := statedb.New()
		c, err := NewClient(testConfig(srv.addr, "", protocol), hivetest.Logger(t), db, WithBackoff(testBackoff))
		if err != nil {
			t.Fatal(err)
		}
		var rowAtRequest atomic.Pointer[ResourceStatus]
		asked := make(chan struct{})
		c.dialExtra = append(c.dialExtra, grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc,
			cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			return sendHook{cs, func(m any) {
				names := []string{}
				switch r := m.(type) {
				case *discoveryv3.DiscoveryRequest:
					if r.GetTypeUrl() == EndpointType {
						names = r.GetResourceNames()
					}
				case *discoveryv3.DeltaDiscoveryRequest:
					if r.GetTypeUrl() == EndpointType {
						names = r.GetResourceNamesSubscribe()
					}
				}
				if slices.Contains(names, "a") && rowAtRequest.Load() == nil {
					row, _, _ := c.resources.Get(db.ReadTxn(), ResourceByName(EndpointType, "a"))
					rowAtRequest.Store(cmp.Or(row, &ResourceStatus{State: "no row"}))
					close(asked)
				}
			}}, err
		}))
		c.Watch(ClusterType, true, HandlerFunc(func(_ context.Context, u Update) map[string]error {
			c.SetNames(EndpointType, names(u.Upserted))
			return nil
		}))
		c.Watch(EndpointType, false, &recorder{})
		runClient(t, c)
		select {
		case <-asked:
		case <-time.After(time.Minute):
			t.Fatal("no EDS request for the clusters")
		}
		if row := rowAtRequest.Load(); row.State != "no row" {
			t.Fatalf("the row of endpoints a when they were asked for: %+v, want none yet", row)
		}
		waitFor(t, "the row of endpoints a", func() bool {
			row, _, _ := c.resources.Get(db.ReadTxn(), ResourceByName(EndpointType, "a"))
			return row != nil && row.State == StateRequested
		})
	})
}

// What health calls synced has its rows: a response's rows are written
// before the type is marked synced and before its ACK.
func TestSyncedTypesHaveTheirRows(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		srv := startServer(t, "127.0.0.1:0", "", func(s *testServer) {
			s.setClusters(cluster("a", "1"))
		})
		health := &rowsAtSync{}
		startClient(t, testConfig(srv.addr, "", protocol), func(tc *testClient) {
			health.tc, tc.health = tc, health
		})
		waitFor(t, "health OK with the clusters synced", func() bool { return health.seen.Load() != nil })
		if row := health.seen.Load(); row.State != StateAcked {
			t.Fatalf("the row of cluster a when health said synced: %+v, want acked", row)
		}
	})
}

// rowsAtSync records cluster a's row when health first says a type is
// synced.
type rowsAtSync struct {
	healthLog
	tc   *testClient
	seen atomic.Pointer[ResourceStatus]
}

func (h *rowsAtSync) OK(status string) {
	if strings.Contains(status, "types synced") && h.seen.Load() == nil {
		h.seen.Store(cmp.Or(h.tc.resource(ClusterType, "a"), &ResourceStatus{State: "no row"}))
	}
	h.healthLog.OK(status)
}

func (h *rowsAtSync) NewScope(string) cell.Health { return h }

// Names set before the client runs have their rows at once, even while the
// first attempt waits for a server that never answers.
func TestNamesHaveRowsBeforeAServerAnswers(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		addr := listenHung(t).Addr().String()
		cfg := testConfig(addr, "", protocol)
		cfg.XDSConnectTimeout = time.Hour
		tc := startClient(t, cfg, func(tc *testClient) { tc.SetNames(EndpointType, []string{"x"}) })
		tc.waitState(t, EndpointType, "x", StateRequested)
		if s := tc.serverRow(addr); s.Attempts != 1 || s.Failures != 0 {
			t.Fatalf("the row came after the first attempt ended: server %+v", s)
		}
	})
}

// sendHook calls sent with each message a stream sends, before sending it.
type sendHook struct {
	grpc.ClientStream
	sent func(any)
}

func (h sendHook) SendMsg(m any) error {
	h.sent(m)
	return h.ClientStream.SendMsg(m)
}
