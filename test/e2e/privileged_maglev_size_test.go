// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strings"
	"testing"
	"time"
)

// An operator changes --lb-maglev-table-size (the chart's maglevTableSize):
// the pinned Maglev map cannot take tables of the new size, so the new
// agent makes a new one. The program attached by the previous agent must
// keep forwarding with the old map until the new one holds every service,
// also when the control plane is down and cannot say what they are: not
// one new flow fails, and the established connection stays on its backend.
func TestPrivilegedMaglevTableSizeChange(t *testing.T) {
	e := newLBEnv(t, 3)
	widenEphemeralPorts(t, e.topo.Client)
	dbFE, gameFE := tcp("10.1.2.3", 3306), udp("10.1.2.7", 7777)
	db := svc("my-database-service", dbFE).with(v4(0, 3306), v4(1, 3306))
	game := svc("game", gameFE).with(v4(0, 7777), v4(1, 7777), v4(2, 7777))
	e.serve(t, db, game)

	h := e.hold(t, dbFE)
	loops := flowLoops{e.newFlowLoop(t, dbFE), e.newFlowLoop(t, gameFE)}
	var story phases
	story.enter("default table size", loops)
	loops.waitRounds(t, 2)

	restartWithSize := func(size string) {
		t.Helper()
		e.agent.Stop()
		e.agentArgs = []string{"--lb-maglev-table-size", size}
		e.startAgent(t)
		story.enter("agent restarted with --lb-maglev-table-size "+size, loops)
	}

	restartWithSize("2039")
	e.waitTableSize(t, dbFE, 2039)
	story.enter("tables of 2039 slots", loops)
	loops.waitRounds(t, 2)
	h.check(t, 3)

	// No control plane: the new agent cannot fill a new map, so the pinned
	// one, of the old size, keeps serving until the control plane returns.
	e.cp.kill()
	story.enter("control plane killed", loops)
	restartWithSize("4093")
	e.waitDisconnected(t, "restarted with a new table size and no control plane")
	loops.waitRounds(t, 3)
	if n := e.tableSize(t, dbFE); n != 2039 {
		t.Errorf("with no control plane the pinned table has %d slots, want the previous 2039", n)
	}
	h.check(t, 3)

	e.startControlPlane(t)
	story.enter("control plane back", loops)
	e.waitTableSize(t, dbFE, 4093)
	story.enter("tables of 4093 slots", loops)
	loops.waitRounds(t, 2)
	h.check(t, 3)

	for _, l := range loops {
		flows, failed := l.stop()
		t.Logf("%s: %d new flows across two table size changes, %d rounds failed", l.fe, flows, len(failed))
		if len(failed) > 0 {
			t.Errorf("%s: new flows failed:\n%s", l.fe, strings.Join(story.failures(l), "\n"))
		}
	}
	t.Logf("the long-lived connection to %s echoed %d times", h.backend, h.echoes())
}

// tableSize is the number of slots of the pinned Maglev table of f's
// service (0 when it has none).
func (e *lbEnv) tableSize(t *testing.T, f frontend) int {
	t.Helper()
	m := e.openMaps(t)
	defer m.Close()
	table, _, err := m.MaglevTable(serviceID(t, m, f))
	if err != nil {
		t.Fatalf("reading the Maglev table of %s: %v", f, err)
	}
	return len(table)
}

// waitTableSize waits until the pinned Maglev table of f's service has
// size slots: the new agent has filled its maps and pinned them.
func (e *lbEnv) waitTableSize(t *testing.T, f frontend, size int) {
	t.Helper()
	var n int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if n = e.tableSize(t, f); n == size {
			return
		}
		if e.agent.Exited() {
			t.Fatalf("the agent exited (%v):\n%s", e.agent.Cmd.ProcessState, tail(e.agent.Output(), 40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pinned Maglev table of %s has %d slots 30s after the restart, want %d:\n%s", f, n, size, tail(e.agent.Output(), 20))
		}
	}
}
