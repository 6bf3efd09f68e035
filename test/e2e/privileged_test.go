// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/test/netns"
)

// The topology alone, without the agent: the client reaches every backend
// by its own address through the LB (plain routing, TCP and UDP, IPv4 and
// IPv6), and a VIP is not reachable: whatever answers a VIP later is the
// datapath.
func TestPrivilegedTopologyRoutesWithoutTheAgent(t *testing.T) {
	bin := netns.AgentBinaries(t)
	topo := newTopology(t, 3)
	startServers(t, bin, topo)
	for i, b := range topo.Backends {
		name := backendName(i)
		for _, addr := range []netip.Addr{b.IPv4, b.IPv6} {
			for _, c := range []struct {
				proto string
				port  uint16
			}{{"tcp", 3306}, {"udp", 53}} {
				to := netip.AddrPortFrom(addr, c.port).String()
				r := probe(t, bin, topo.Client, to, c.proto, 5)
				if r.Answered != 5 || r.Backends[name] != 5 {
					t.Errorf("%s to %s: want 5 answers from %s; got %s", c.proto, to, name, r)
				}
			}
		}
	}
	r := probe(t, bin, topo.Client, "10.1.2.3:3306", "tcp", 1)
	t.Logf("without the agent: %s", r)
	if r.Answered != 0 {
		t.Errorf("without the agent a VIP answered: %s", r)
	}
}

// Backends by name: b<i> serves at 192.168.1.1<i> and fd01::1<i>.
func v4(i int, port uint16) endpoint { return endpoint{addr: netns.BackendIPv4(i), port: port} }
func v6(i int, port uint16) endpoint { return endpoint{addr: netns.BackendIPv6(i), port: port} }

func weighted(e endpoint, w int) endpoint      { e.weight = w; return e }
func health(e endpoint, h string) endpoint     { e.health = h; return e }
func tcp(vip string, port uint16) frontend     { return frontend{vip, port, "TCP"} }
func udp(vip string, port uint16) frontend     { return frontend{vip, port, "UDP"} }
func svc(name string, fes ...frontend) cluster { return cluster{name: name, frontends: fes} }
func (c cluster) with(eps ...endpoint) cluster { c.endpoints = eps; return c }

// The real agent with the BPF datapath between a client and three backend
// namespaces, the real control plane feeding it over mTLS. Scenarios share
// the topology; each one serves its own resources and waits until the
// agent reports them reconciled before sending traffic.
func TestPrivilegedLoadBalancer(t *testing.T) {
	e := newLBEnv(t, 3)

	t.Run("CFP example: TCP to 10.1.2.3:3306 reaches both backends", func(t *testing.T) {
		cfp, err := os.ReadFile("../../examples/cfp.yaml")
		if err != nil {
			t.Fatal(err)
		}
		e.apply(t, string(cfp))
		fe := tcp("10.1.2.3", 3306)
		e.waitFrontends(t, svc("my-database-service", fe).with(v4(0, 3306), v4(1, 3306)))
		r := e.probe(t, fe, 200)
		if r.Answered != 200 || r.Backends["b0"] == 0 || r.Backends["b1"] == 0 || r.Backends["b2"] != 0 {
			t.Errorf("want all 200 flows answered by b0 and b1, both; got %s", r)
		}
	})

	t.Run("DNS: 53/TCP and 53/UDP on one VIP both answered", func(t *testing.T) {
		fes := []frontend{udp("10.1.2.53", 53), tcp("10.1.2.53", 53)}
		e.serve(t, svc("dns", fes...).with(v4(0, 53), v4(1, 53), v4(2, 53)))
		for _, fe := range fes {
			r := e.probe(t, fe, 300)
			if r.Answered != 300 || len(r.Backends) != 3 {
				t.Errorf("%s: want all 300 flows answered, by all three backends; got %s", fe, r)
			}
		}
	})

	t.Run("weights 70/30: 2000 new UDP flows split 70/30 within 5 points", func(t *testing.T) {
		fe := udp("10.1.2.7", 7777)
		e.serve(t, svc("game", fe).with(weighted(v4(0, 7777), 70), weighted(v4(1, 7777), 30)))
		r := e.probe(t, fe, 2000, "--concurrency", "32")
		if r.Answered != 2000 {
			t.Errorf("want all 2000 flows answered; got %s", r)
		}
		for b, want := range map[string]float64{"b0": 70, "b1": 30, "b2": 0} {
			if got := r.share(b); got < want-5 || got > want+5 {
				t.Errorf("%s got %.1f%% of the flows, want %.0f%% ± 5: %s", b, got, want, r)
			}
		}
	})

	t.Run("IPv6 VIP: TCP and UDP", func(t *testing.T) {
		fes := []frontend{udp("fd00:10::53", 53), tcp("fd00:10::53", 53)}
		e.serve(t, svc("dns6", fes...).with(v6(0, 53), v6(1, 53), v6(2, 53)))
		for _, fe := range fes {
			r := e.probe(t, fe, 300)
			if r.Answered != 300 || len(r.Backends) != 3 {
				t.Errorf("%s: want all 300 flows answered, by all three backends; got %s", fe, r)
			}
		}
	})

	// 4000 bytes over links of MTU 1500: the client sends every request
	// in three fragments, only the first with the UDP header, and every
	// backend answers in three; all of them must be DNATed to the flow's
	// backend (answers from all three show the first fragments were
	// balanced) and reverse-NATed back, or the datagram is never reassembled.
	t.Run("fragments: 4000-byte UDP datagrams to IPv4 and IPv6 VIPs answered in full", func(t *testing.T) {
		fe4, fe6 := udp("10.1.2.40", 9000), udp("fd00:10::40", 9000)
		e.serve(t, svc("big4", fe4).with(v4(0, 9000), v4(1, 9000), v4(2, 9000)),
			svc("big6", fe6).with(v6(0, 9000), v6(1, 9000), v6(2, 9000)))
		for _, fe := range []frontend{fe4, fe6} {
			before := e.serviceStats(t, fe)
			r := e.probe(t, fe, 200, "--size", "4000", "--timeout", "2s")
			t.Logf("%s: %s", fe, statsDiff(before, e.serviceStats(t, fe)))
			if r.Answered != 200 || len(r.Backends) != 3 {
				t.Errorf("%s: want all 200 datagrams of 4000 bytes answered in full, by all three backends; got %s", fe, r)
			}
		}
	})

	// 64 KiB written at once leaves the client as TSO/GSO segments larger
	// than the MTU, and the backend's echo as well: the DNAT and reverse
	// NAT (checksums included) must hold for them.
	t.Run("TCP: 64 KiB sent and echoed through IPv4 and IPv6 VIPs", func(t *testing.T) {
		fe4, fe6 := tcp("10.1.2.41", 8080), tcp("fd00:10::41", 8080)
		e.serve(t, svc("bulk4", fe4).with(v4(0, 8080), v4(1, 8080), v4(2, 8080)),
			svc("bulk6", fe6).with(v6(0, 8080), v6(1, 8080), v6(2, 8080)))
		for _, fe := range []frontend{fe4, fe6} {
			r := e.probe(t, fe, 50, "--size", "65536", "--timeout", "5s")
			if r.Answered != 50 || len(r.Backends) != 3 {
				t.Errorf("%s: want all 50 flows of 64 KiB echoed in full, by all three backends; got %s", fe, r)
			}
		}
	})

	t.Run("DRAINING keeps a long-lived connection, new flows avoid it; removed backends get none", func(t *testing.T) {
		fe := tcp("10.1.2.8", 8080)
		all := []endpoint{v4(0, 8080), v4(1, 8080), v4(2, 8080)}
		e.serve(t, svc("drain", fe).with(all...))
		h := e.hold(t, fe)
		h.check(t, 3)
		drained := slices.Index([]string{backendName(0), backendName(1), backendName(2)}, h.backend)
		if drained < 0 {
			t.Fatalf("the long-lived connection was answered by %q", h.backend)
		}
		eps := append([]endpoint(nil), all...)
		eps[drained] = health(eps[drained], "DRAINING")
		e.serve(t, svc("drain", fe).with(eps...))
		h.check(t, 5)
		r := e.probe(t, fe, 300)
		if r.Answered != 300 || r.Backends[h.backend] != 0 || len(r.Backends) != 2 {
			t.Errorf("want all 300 new flows answered by the two active backends, none by the draining %s; got %s", h.backend, r)
		}
		h.check(t, 5)
		h.Stop()

		// The drained backend removed, then an active one: new flows go to
		// what is left.
		left := slices.Delete(slices.Clone(all), drained, drained+1)
		e.serve(t, svc("drain", fe).with(left...))
		r = e.probe(t, fe, 300)
		if r.Answered != 300 || r.Backends[h.backend] != 0 || len(r.Backends) != 2 {
			t.Errorf("want all 300 new flows answered by the two remaining backends; got %s", r)
		}
		removed := backendName(slices.Index(all, left[0]))
		e.serve(t, svc("drain", fe).with(left[1]))
		r = e.probe(t, fe, 300)
		if r.Answered != 300 || len(r.Backends) != 1 || r.Backends[removed] != 0 {
			t.Errorf("want all 300 new flows answered by the last backend, none by the removed %s; got %s", removed, r)
		}
	})

	t.Run("no backends: TCP refused, UDP ICMP unreachable, counted", func(t *testing.T) {
		fes := []frontend{tcp("10.1.2.9", 3306), udp("10.1.2.9", 53)}
		e.serve(t, svc("empty", fes...))
		want := map[string]string{"TCP": "connection refused", "UDP": "ICMP unreachable"}
		for _, fe := range fes {
			before := e.serviceStats(t, fe).Drops[datapath.DropNoBackend]
			r := e.probe(t, fe, 20, "--timeout", "3s")
			if r.Answered != 0 || r.Errors[want[fe.proto]] != 20 {
				t.Errorf("%s: want all 20 flows to fail with %q; got %s", fe, want[fe.proto], r)
			}
			if got := e.serviceStats(t, fe).Drops[datapath.DropNoBackend] - before; got < 20 {
				t.Errorf("%s: %d no-backend drops counted for 20 rejected flows", fe, got)
			}
		}
	})

	t.Run("a reject share: its new flows refused, the rest split by weight", func(t *testing.T) {
		// A weighted route's 30 % share of a backend that does not exist
		// (GEP-2645): refused, not sent to the others.
		for _, fe := range []frontend{tcp("10.1.2.12", 3306), udp("10.1.2.12", 53)} {
			c := svc("route-"+strings.ToLower(fe.proto), fe).with(weighted(v4(0, fe.port), 40), weighted(v4(1, fe.port), 30))
			c.rejectWeight = 30
			e.serve(t, c)
			const n = 1000
			r := e.probe(t, fe, n, "--timeout", "3s")
			refused := r.Errors[map[string]string{"TCP": "connection refused", "UDP": "ICMP unreachable"}[fe.proto]]
			pct := func(k int) float64 { return float64(k) * 100 / n }
			if r.Answered+refused != n || pct(refused) < 25 || pct(refused) > 35 ||
				pct(r.Backends["b0"]) < 35 || pct(r.Backends["b0"]) > 45 || pct(r.Backends["b1"]) < 25 || pct(r.Backends["b1"]) > 35 {
				t.Errorf("%s: want 30 ± 5 %% of %d flows refused, 40 and 30 ± 5 %% answered by b0 and b1; got %s", fe, n, r)
			}
			t.Logf("%s, reject_weight 30 beside weights 40 and 30: %s", fe, r)

			// The share back to the backends.
			c.rejectWeight = 0
			e.serve(t, c)
			if r := e.probe(t, fe, 200); r.Answered != 200 {
				t.Errorf("%s without reject_weight: want all 200 flows answered; got %s", fe, r)
			}
		}
	})

	t.Run("source ranges: an excluded client is dropped and counted, an included one served", func(t *testing.T) {
		excluded := cluster{name: "restricted", frontends: []frontend{tcp("10.1.2.10", 3306), udp("10.1.2.10", 53)},
			sourceRanges: []string{"192.0.2.0/24", "fd99::/64"}}
		included := cluster{name: "allowed", frontends: []frontend{tcp("10.1.2.11", 3306)},
			sourceRanges: []string{"192.0.2.0/24", "10.0.0.0/24"}}
		excluded.endpoints = []endpoint{v4(0, 3306), v4(1, 3306)}
		included.endpoints = excluded.endpoints
		e.serve(t, excluded, included)
		for _, fe := range excluded.frontends {
			before := e.serviceStats(t, fe).Drops[datapath.DropSourceRange]
			r := e.probe(t, fe, 10, "--timeout", "500ms")
			if r.Answered != 0 || r.Errors["timeout"] != 10 {
				t.Errorf("%s from outside the source ranges: want all 10 flows dropped (timeout); got %s", fe, r)
			}
			if got := e.serviceStats(t, fe).Drops[datapath.DropSourceRange] - before; got < 10 {
				t.Errorf("%s: %d source-range drops counted for 10 dropped flows", fe, got)
			}
		}
		r := e.probe(t, included.frontends[0], 50)
		if r.Answered != 50 {
			t.Errorf("a client inside the source ranges: want all 50 flows answered; got %s", r)
		}
	})

	t.Run("control plane killed: traffic unchanged; restarted: converges", func(t *testing.T) {
		fe := tcp("10.1.2.3", 3306)
		db := svc("db", fe).with(v4(0, 3306), v4(1, 3306))
		e.serve(t, db)
		e.cp.kill()
		r := e.probe(t, fe, 200)
		if r.Answered != 200 || r.Backends["b0"] == 0 || r.Backends["b1"] == 0 {
			t.Errorf("control plane down: want all 200 flows answered by b0 and b1; got %s", r)
		}
		e.waitFrontends(t, db) // the tables too are unchanged

		db = db.with(v4(0, 3306), v4(1, 3306), v4(2, 3306))
		e.apply(t, resourcesYAML(db))
		e.startControlPlane(t)
		e.waitFrontends(t, db)
		r = e.probe(t, fe, 300)
		if r.Answered != 300 || len(r.Backends) != 3 {
			t.Errorf("control plane back with a third backend: want all 300 flows answered by all three; got %s", r)
		}
	})

	t.Run("agent SIGKILLed and restarted: an open connection survives, no new flow fails", func(t *testing.T) {
		fe := tcp("10.1.2.3", 3306)
		db := svc("db", fe).with(v4(0, 3306), v4(1, 3306), v4(2, 3306))
		// UDP flows too: a datagram lost while the agent restarts is never
		// retransmitted, so a gap in the datapath shows as a failed flow.
		dnsFE := udp("10.1.2.53", 53)
		dns := svc("dns", dnsFE).with(v4(0, 53), v4(1, 53), v4(2, 53))
		e.serve(t, db, dns)
		h := e.hold(t, fe)
		h.check(t, 3)

		loops := flowLoops{e.newFlowLoop(t, fe), e.newFlowLoop(t, dnsFE)}
		loops.waitRounds(t, 2)
		e.agent.kill()
		loops.waitRounds(t, 3) // new flows while no agent runs
		h.check(t, 3)
		e.startAgent(t)
		e.waitFrontends(t, db, dns)
		loops.waitRounds(t, 3)
		h.check(t, 3)
		for _, l := range loops {
			flows, failed := l.stop()
			t.Logf("%s: %d new flows across the agent restart, %d rounds failed", l.fe, flows, len(failed))
			if len(failed) > 0 {
				t.Errorf("%s: new flows failed across the agent restart:\n%s", l.fe, strings.Join(failed, "\n"))
			}
		}
	})
}

// backendName is the name l4xds-traffic serve answers with in backend i.
func backendName(i int) string { return fmt.Sprintf("b%d", i) }
