// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverRow is the xds-servers row of addr.
func (tc *testClient) serverRow(addr string) *ServerStatus {
	for s := range tc.serverRows.All(tc.db.ReadTxn()) {
		if s.Address == addr {
			return s
		}
	}
	return nil
}

// waitInUse waits until the client uses addr with a working stream.
func (tc *testClient) waitInUse(t *testing.T, addr string) {
	t.Helper()
	waitFor(t, addr+" in use and connected", func() bool {
		s := tc.serverRow(addr)
		st := tc.typeStatus(ClusterType)
		return s != nil && s.InUse && s.State == ConnConnected && st.Server == addr && st.State == ConnConnected
	})
}

// gRFC A71 with two real servers over mTLS: the primary goes, the
// secondary serves; the primary comes back, the client returns to it; both
// go, the last state is kept and health names both.
func TestFallbackAndReturn(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		primary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "primary"))
		})
		secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "secondary"), cluster("c", "1"))
		})
		health := &healthLog{}
		tc := startClient(t, testConfig(primary.addr+","+secondary.addr, certs, protocol), func(tc *testClient) {
			tc.health = health
		})
		waitClusters(t, tc, map[string]string{"a": "1", "b": "primary"})
		tc.waitInUse(t, primary.addr)
		if s := tc.serverRow(secondary.addr); s.State != ConnStandby || s.Attempts != 0 {
			t.Errorf("secondary while the primary serves = %+v, want standby, never tried", s)
		}
		if got := secondary.seen(ClusterType); len(got) != 0 {
			t.Errorf("the secondary received requests while the primary served: %+v", got)
		}

		// The primary goes: the secondary serves; its state replaces the
		// primary's in one update, a unchanged (not delivered again).
		n := tc.clusters.count()
		primary.stop()
		waitClusters(t, tc, map[string]string{"a": "1", "b": "secondary", "c": "1"})
		tc.waitInUse(t, secondary.addr)
		if u := tc.clusters.all()[n:]; len(u) != 1 || !slices.Equal(names(u[0].Upserted), []string{"b", "c"}) || len(u[0].Removed) != 0 {
			t.Errorf("updates on fallback = %+v, want one: b and c upserted", u)
		}
		if tc.clusters.removedNames() != nil {
			t.Errorf("removed on fallback: %q", tc.clusters.removedNames())
		}
		if tc.inUse(secondary.addr) != 1 || tc.inUse(primary.addr) != 0 || tc.connectedTo(secondary.addr) != 1 || tc.connectedTo(primary.addr) != 0 {
			t.Errorf("server_in_use %v/%v, connected %v/%v; want the secondary's 1, the primary's 0",
				tc.inUse(primary.addr), tc.inUse(secondary.addr), tc.connectedTo(primary.addr), tc.connectedTo(secondary.addr))
		}
		// The primary is tried again while the secondary serves.
		failures := tc.serverFailuresOf(primary.addr)
		waitFor(t, "the primary tried again", func() bool { return tc.serverFailuresOf(primary.addr) >= failures+2 })
		if s := tc.serverRow(primary.addr); s.InUse || s.Error == "" || s.Attempts < s.Failures+1 {
			t.Errorf("primary while down = %+v, want not in use, with its error, every failure an attempt", s)
		}
		// Every attempt counts, the first successful one included.
		if got := tc.attemptsOn(primary.addr); got < failures+3 {
			t.Errorf("attempts on the primary = %v, want at least %v", got, failures+3)
		}
		waitFor(t, "health OK on the secondary", func() bool {
			return strings.HasPrefix(health.last(), "OK: connected to "+secondary.addr+", 1 types synced ("+primary.addr+": ")
		})

		// The primary comes back, with another state: the client returns,
		// and leaving the secondary is no failure of it.
		n = tc.clusters.count()
		primary = startServer(t, primary.addr, certs, func(s *testServer) {
			s.setClusters(cluster("a", "1"), cluster("b", "primary-2"))
		})
		waitClusters(t, tc, map[string]string{"a": "1", "b": "primary-2"})
		tc.waitInUse(t, primary.addr)
		if u := tc.clusters.all()[n:]; len(u) != 1 || !slices.Equal(u[0].Removed, []string{"c"}) || !slices.Equal(names(u[0].Upserted), []string{"b"}) {
			t.Errorf("updates on return = %+v, want one: b upserted, c removed", u)
		}
		if s := tc.serverRow(secondary.addr); s.InUse || s.State != ConnStandby || s.Failures != 0 {
			t.Errorf("secondary after the return = %+v, want standby, no failure", s)
		}
		if tc.serverFailuresOf(secondary.addr) != 0 || tc.connectedTo(secondary.addr) != 0 || tc.inUse(primary.addr) != 1 {
			t.Errorf("secondary failures %v, connected %v, primary in use %v; want 0, 0, 1",
				tc.serverFailuresOf(secondary.addr), tc.connectedTo(secondary.addr), tc.inUse(primary.addr))
		}
		waitFor(t, "health OK on the primary", func() bool {
			return health.last() == "OK: connected to "+primary.addr+", 1 types synced"
		})

		// Both go: last-known-good, and health names both.
		n = tc.clusters.count()
		for _, s := range []*testServer{primary, secondary} {
			s.stop()
		}
		prefix := "Degraded: disconnected from " + primary.addr + ": "
		waitFor(t, "degraded naming both servers", func() bool {
			h := health.last()
			return strings.HasPrefix(h, prefix) && strings.Contains(h, "; "+secondary.addr+": ")
		})
		if tc.clusters.count() != n {
			t.Errorf("updates with every server down: %+v", tc.clusters.all()[n:])
		}
		for _, name := range []string{"a", "b"} {
			if r := tc.resource(ClusterType, name); r.State != StateAcked {
				t.Errorf("cluster %s with every server down = %+v, want acked", name, r)
			}
		}
	})
}

// Each server has its own certificate name: a primary whose certificate
// does not carry the name given for it fails the handshake, and the
// secondary, named right, serves.
func TestFallbackServerNames(t *testing.T) {
	certs := newCerts(t)
	primary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "primary")) })
	secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "secondary")) })
	cfg := testConfig(primary.addr+","+secondary.addr, certs, ProtocolSotW)
	cfg.XDSServerName = "xds.example.org,localhost"
	tc := startClient(t, cfg)
	waitClusters(t, tc, map[string]string{"a": "secondary"})
	tc.waitInUse(t, secondary.addr)
	p, s := tc.serverRow(primary.addr), tc.serverRow(secondary.addr)
	if p.Name != "xds.example.org" || s.Name != "localhost" {
		t.Errorf("names %q and %q, want xds.example.org and localhost", p.Name, s.Name)
	}
	if want := "tls: certificate is valid for localhost, not xds.example.org"; !strings.Contains(p.Error, want) || p.InUse {
		t.Errorf("primary = %+v, want not in use, with %q", p, want)
	}
	if got := primary.seen(ClusterType); len(got) != 0 {
		t.Errorf("the primary received requests over a refused handshake: %+v", got)
	}
}

// The secondary in use goes while the primary is still down: the session
// on it must end (not wait for the prober of the primary for ever), and the
// client goes on. Both come back in turn and are used, and status and
// health never claim a connection that is gone.
func TestFallbackSecondaryRestartsWhilePrimaryDown(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, protocol string) {
		certs := newCerts(t)
		primary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "primary")) })
		secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "secondary-1")) })
		health := &healthLog{}
		tc := startClient(t, testConfig(primary.addr+","+secondary.addr, certs, protocol), func(tc *testClient) {
			tc.health = health
		})
		waitClusters(t, tc, map[string]string{"a": "primary"})
		primary.stop()
		waitClusters(t, tc, map[string]string{"a": "secondary-1"})
		tc.waitInUse(t, secondary.addr)

		// The secondary restarts with another state; the primary stays down.
		secondary.stop()
		waitFor(t, "status to say the secondary is gone", func() bool {
			return tc.typeStatus(ClusterType).State != ConnConnected && !strings.HasPrefix(health.last(), "OK")
		})
		secondary = startServer(t, secondary.addr, certs, func(s *testServer) { s.setClusters(cluster("a", "secondary-2")) })
		waitClusters(t, tc, map[string]string{"a": "secondary-2"})
		tc.waitInUse(t, secondary.addr)

		// And the primary, back, is returned to.
		startServer(t, primary.addr, certs, func(s *testServer) { s.setClusters(cluster("a", "primary-2")) })
		waitClusters(t, tc, map[string]string{"a": "primary-2"})
		tc.waitInUse(t, primary.addr)
	})
}

// A primary that accepts connections and never answers must not keep the
// client from returning to it for ever, nor from leaving the secondary when
// that fails: every probe of a higher server is bounded.
func TestFallbackProbeOfAHungServerIsBounded(t *testing.T) {
	certs := newCerts(t)
	// A "server" that accepts TCP and never says a word (no TLS handshake).
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		hung.Close()
		heldMu.Lock()
		for _, c := range held {
			c.Close()
		}
		heldMu.Unlock()
	})
	secondary := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "secondary")) })
	cfg := testConfig(hung.Addr().String()+","+secondary.addr, certs, ProtocolSotW)
	cfg.XDSConnectTimeout = 200 * time.Millisecond
	tc := startClient(t, cfg)
	waitClusters(t, tc, map[string]string{"a": "secondary"})
	tc.waitInUse(t, secondary.addr)
	// The prober keeps trying the hung primary: each try ends.
	waitFor(t, "several bounded probes of the hung primary", func() bool {
		s := tc.serverRow(hung.Addr().String())
		return s != nil && s.Failures >= 3 && strings.Contains(s.Error, "no response within")
	})
}

// A run loop that hangs is reported by the watchdog, not hidden behind the
// last status the loop wrote; the report goes once the loop moves on.
func TestStuckRunLoopIsReported(t *testing.T) {
	certs := newCerts(t)
	srv := startServer(t, "127.0.0.1:0", certs, func(s *testServer) { s.setClusters(cluster("a", "1")) })
	health := &healthLog{}
	release := make(chan struct{})
	var once sync.Once
	tc := startClient(t, testConfig(srv.addr, certs, ProtocolSotW), func(tc *testClient) {
		tc.health = health
		tc.stallAfter = 200 * time.Millisecond
		tc.clusters.onUpdate = func(u Update) {
			for _, r := range u.Upserted {
				if r.Name == "b" {
					<-release // a consumer that does not return
				}
			}
		}
	})
	// Registered after startClient's: runs before it, so that the client
	// can stop even when the test fails.
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	waitClusters(t, tc, map[string]string{"a": "1"})
	waitFor(t, "health OK", func() bool { return strings.HasPrefix(health.last(), "OK: ") })

	srv.setClusters(cluster("a", "1"), cluster("b", "1"))
	const stuck = "xDS client stuck for "
	waitFor(t, "the hang reported in health and status", func() bool {
		return strings.HasPrefix(health.last(), "Degraded: "+stuck) &&
			strings.Contains(health.last(), "handling a Cluster response of "+srv.addr) &&
			strings.HasPrefix(tc.typeStatus(ClusterType).Error, stuck)
	})
	once.Do(func() { close(release) })
	waitFor(t, "health and status back to the loop's", func() bool {
		return strings.HasPrefix(health.last(), "OK: ") && tc.typeStatus(ClusterType).Error == ""
	})
}
