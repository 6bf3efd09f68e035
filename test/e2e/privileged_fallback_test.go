// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/api"
)

// The secondary control plane listens beside the primary (controlPlaneAddr)
// in the LB namespace.
const secondaryControlPlaneAddr = "127.0.0.1:18001"

// xdsServerRow is a row of `l4xds-dbg statedb xds-servers -o json`.
type xdsServerRow struct {
	Priority int
	Address  string
	InUse    bool
	State    string
	Attempts uint64
	Failures uint64
	Error    string
}

// Two control planes over mTLS serve the same resources file, the agent
// lists both (each with its own certificate name), and real flows run
// throughout. The primary is killed: the secondary serves, and since it
// serves the same state nothing changes in the maps and no flow fails. The
// primary comes back: the agent returns to it, leaving the secondary without
// counting a failure. Both are killed: the agent keeps its last-known-good
// state and forwards on, and health names both servers.
func TestPrivilegedFallbackBetweenTwoControlPlanes(t *testing.T) {
	e := newLBEnv(t, 3)
	widenEphemeralPorts(t, e.topo.Client)
	secondary := startIn(t, e.top, e.topo.LB, filepath.Join(e.bin, "l4xds-control-plane"), "serve",
		"--resources", e.resources, "--listen", secondaryControlPlaneAddr,
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt"))
	// The development certificate is valid for localhost and 127.0.0.1:
	// one name per server.
	e.restartAgentWithServers(t, controlPlaneAddr+","+secondaryControlPlaneAddr, "localhost,127.0.0.1")
	client := nsHTTPClient(e.topo.LB)

	dbFE, gameFE := tcp("10.1.2.3", 3306), udp("10.1.2.7", 7777)
	db := svc("my-database-service", dbFE).with(v4(0, 3306), v4(1, 3306))
	game := svc("game", gameFE).with(v4(0, 7777), v4(1, 7777), v4(2, 7777))
	e.serve(t, db, game)
	inUse := func(addr string) func(metricFamilies) bool {
		return func(m metricFamilies) bool {
			return m.get("l4xds_xds_client_server_in_use", "xds_server", addr) == 1 &&
				m.get("l4xds_xds_client_connected", "xds_server", addr) == 1
		}
	}
	serverMetrics := []string{"l4xds_xds_client_server_in_use", "l4xds_xds_client_connected",
		"l4xds_xds_client_server_failure_total", "l4xds_xds_client_connection_attempts_total"}
	waitMetrics(t, client, metricsInLB, "the primary in use", inUse(controlPlaneAddr), serverMetrics...)
	e.waitServers(t, "the secondary untried", func(rows []xdsServerRow) bool {
		return rows[0].InUse && rows[1].State == "standby" && rows[1].Attempts == 0
	})
	pinned := e.pinnedMaps(t)

	h := e.hold(t, dbFE)
	h.check(t, 3)
	loops := flowLoops{e.newFlowLoop(t, dbFE), e.newFlowLoop(t, gameFE)}
	var story phases
	story.enter("primary serving", loops)
	loops.waitRounds(t, 2)

	// The primary dies mid-traffic.
	killed := time.Now()
	e.cp.kill()
	story.enter("primary killed", loops)
	m := waitMetrics(t, client, metricsInLB, "the secondary in use", inUse(secondaryControlPlaneAddr), serverMetrics...)
	t.Logf("BENCH fallback: the secondary in use %s after the primary was killed (backoff's first step: 1s ±20%%)",
		time.Since(killed).Round(time.Millisecond))
	t.Logf("scrape on the secondary:\n%s", m.format(serverMetrics...))
	if got := m.get("l4xds_xds_client_connected", "xds_server", controlPlaneAddr); got != 0 {
		t.Errorf("connected to the killed primary = %v, want 0", got)
	}
	e.waitSynced(t, secondaryControlPlaneAddr)
	rows := e.waitServers(t, "the primary tried again while the secondary serves", func(rows []xdsServerRow) bool {
		return rows[1].InUse && rows[0].State != "connected" && rows[0].Failures >= 2 && rows[0].Error != ""
	})
	t.Logf("servers on fallback: %+v", rows)
	// The same resources: the secondary's first full state changed nothing.
	if now := e.pinnedMaps(t); !now.equal(pinned) {
		t.Errorf("the pinned maps changed on fallback to a server with the same state:\n%s", mapsDiff(pinned, now))
	}
	if code, rep := healthz(t, e.socket); code != http.StatusOK || !xdsHealthNames(rep, "connected to "+secondaryControlPlaneAddr, controlPlaneAddr+": ") {
		t.Errorf("health on the secondary: %d %+v; want OK, naming why the primary is not used", code, rep)
	}
	loops.waitRounds(t, 2)
	h.check(t, 3)

	// The primary is back: the agent returns to it.
	e.startControlPlane(t)
	story.enter("primary restarted", loops)
	waitMetrics(t, client, metricsInLB, "the primary in use again", inUse(controlPlaneAddr), serverMetrics...)
	e.waitSynced(t, controlPlaneAddr)
	e.waitServers(t, "the secondary left without a failure", func(rows []xdsServerRow) bool {
		return rows[0].InUse && rows[0].State == "connected" && !rows[1].InUse && rows[1].State == "standby" && rows[1].Failures == 0
	})
	if now := e.pinnedMaps(t); !now.equal(pinned) {
		t.Errorf("the pinned maps changed on the return to the primary:\n%s", mapsDiff(pinned, now))
	}
	loops.waitRounds(t, 2)
	h.check(t, 3)

	// Both die: last-known-good, and health names both.
	e.cp.kill()
	secondary.kill()
	story.enter("both killed", loops)
	var rep api.HealthReport
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var code int
		code, rep = healthz(t, e.socket)
		if code == http.StatusServiceUnavailable &&
			xdsHealthNames(rep, "disconnected from "+controlPlaneAddr+": ", "; "+secondaryControlPlaneAddr+": ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health never named both servers as down; last /healthz: %d %+v", code, rep)
		}
	}
	t.Logf("health with both down: %+v", rep)
	loops.waitRounds(t, 2)
	h.check(t, 3)
	if now := e.pinnedMaps(t); !now.equal(pinned) {
		t.Errorf("the pinned maps changed with both servers down:\n%s", mapsDiff(pinned, now))
	}
	if rows, out, err := e.frontends(); err != nil || len(rows) != 2 {
		t.Errorf("frontends with both servers down (%v), want the last-known-good two:\n%s", err, out)
	}

	for _, l := range loops {
		flows, failed := l.stop()
		t.Logf("%s: %d new flows across fallback, return and both servers down, %d rounds failed", l.fe, flows, len(failed))
		if len(failed) > 0 {
			t.Errorf("%s: new flows failed:\n%s", l.fe, strings.Join(story.failures(l), "\n"))
		}
	}
	t.Logf("the long-lived connection to %s echoed %d times", h.backend, h.echoes())
}

// restartAgentWithServers replaces the agent by one with the same
// arguments but the servers and names given, and with metrics.
func (e *lbEnv) restartAgentWithServers(t *testing.T, addresses, names string) {
	t.Helper()
	agentBin := filepath.Join(e.bin, "l4xds-agent")
	i := slices.Index(e.agent.Cmd.Args, agentBin)
	if i < 0 {
		t.Fatalf("the agent's command line %q does not name %s", e.agent.Cmd.Args, agentBin)
	}
	args := slices.Clone(e.agent.Cmd.Args[i+1:])
	for k, v := range map[string]string{"--xds-server-address": addresses, "--xds-server-name": names} {
		j := slices.Index(args, k)
		if j < 0 || j+1 >= len(args) {
			t.Fatalf("the agent's arguments %q have no %s", args, k)
		}
		args[j+1] = v
	}
	args = append(args, "--prometheus-serve-addr", metricsInLB)
	e.agent.WaitOutput(t, "Started hive", 30*time.Second)
	e.agent.Stop()
	e.agent = startIn(t, e.top, e.topo.LB, agentBin, args...)
	e.agent.WaitOutput(t, "Serving Prometheus metrics", 30*time.Second)
}

// waitServers waits until the xds-servers rows, in order of priority,
// satisfy ok, and returns them.
func (e *lbEnv) waitServers(t *testing.T, what string, ok func([]xdsServerRow) bool) []xdsServerRow {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rows, out, err := statedbRows[xdsServerRow](e, "xds-servers")
		last = out
		if err == nil && len(rows) == 2 && ok(rows) {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s; last `l4xds-dbg statedb xds-servers -o json`:\n%s", what, last)
		}
	}
}

// waitSynced waits until every watched type is synced from server.
func (e *lbEnv) waitSynced(t *testing.T, server string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rows, out, err := e.xdsStatus()
		last = out
		if err == nil && len(rows) > 0 && !slices.ContainsFunc(rows, func(r xdsStatusRow) bool {
			return r.Server != server || r.State != "connected" || !r.Synced
		}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never synced from %s; last xds-status:\n%s", server, last)
		}
	}
}

// xdsHealthNames reports whether the xDS client's health message contains
// every part.
func xdsHealthNames(rep api.HealthReport, parts ...string) bool {
	for _, s := range rep.Statuses {
		if !strings.Contains(s.Scope, "xds-client") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(s.Message, p) {
				return false
			}
		}
		return true
	}
	return false
}
