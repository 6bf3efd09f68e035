// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	"github.com/l4xds/l4xds/test/netns"
)

// The SRE story: the control plane is down for a long time, and meanwhile
// the agent is restarted twice, gracefully then by SIGKILL. Each restarted
// agent finds no control plane: it keeps forwarding with what it restored
// from the pinned maps, shows an empty frontends table, and changes
// nothing in the maps. The resources change while the control plane is
// down; when it returns, the agent converges: the removed service's VIP
// stops answering, the added one answers, and the untouched services
// never failed a flow, nor the connection held open throughout.
func TestPrivilegedLongControlPlaneOutageAcrossAgentRestarts(t *testing.T) {
	e := newLBEnv(t, 3)
	// The loops below open over a thousand TCP connections a second, each
	// leaving its port in TIME_WAIT for a minute: the client's default
	// ephemeral range (28232 ports) would run out on a fast machine.
	widenEphemeralPorts(t, e.topo.Client)

	dbFE, gameFE := tcp("10.1.2.3", 3306), udp("10.1.2.7", 7777)
	db := svc("my-database-service", dbFE).with(v4(0, 3306), v4(1, 3306))
	game := svc("game", gameFE).with(v4(0, 7777), v4(1, 7777), v4(2, 7777))
	// During the outage a resolver moves to another VIP: the old one is
	// removed, the new one added. Their backends listen on another port
	// than game's: two live flows from one client port to two VIPs on one
	// backend address and port are ambiguous to a NAT that keeps ports
	// (the backend's answers to both look the same), and this story is
	// not about that.
	oldResolver := svc("old-resolver", tcp("10.1.2.60", 53), udp("10.1.2.60", 53)).with(v4(1, 53), v4(2, 53))
	newResolver := svc("new-resolver", tcp("10.1.2.61", 53), udp("10.1.2.61", 53)).with(v4(0, 53), v4(2, 53))
	// Never served: what the client gets from an address the datapath does
	// not know, which is what the removed VIP must become.
	unknown := map[string]frontend{"TCP": tcp("10.1.2.99", 53), "UDP": udp("10.1.2.99", 53)}

	before := []cluster{db, game, oldResolver}
	e.serve(t, before...)
	served := map[frontend][]string{} // frontend -> the backends that answered
	for _, c := range before {
		for _, fe := range c.frontends {
			r := e.probe(t, fe, 100)
			if r.Answered != 100 || len(r.Backends) != len(c.endpoints) {
				t.Fatalf("%s before the outage: want all 100 flows answered by its %d backends; got %s", fe, len(c.endpoints), r)
			}
			served[fe] = slices.Sorted(maps.Keys(r.Backends))
		}
	}
	pinned := e.pinnedMaps(t)
	m := e.openMaps(t)
	ids := map[frontend]uint32{dbFE: serviceID(t, m, dbFE), gameFE: serviceID(t, m, gameFE)}
	m.Close()

	h := e.hold(t, dbFE)
	h.check(t, 3)
	loops := flowLoops{e.newFlowLoop(t, dbFE), e.newFlowLoop(t, gameFE)}
	var story phases
	story.enter("control plane up", loops)
	loops.waitRounds(t, 2)

	e.cp.kill()
	story.enter("control plane killed", loops)
	loops.waitRounds(t, 2)
	h.check(t, 3)

	// An agent restarted with no control plane: no state to act on, the
	// maps as the previous agent left them, and the same backends answer.
	restartedAlone := func(how string) {
		t.Helper()
		e.waitDisconnected(t, how)
		if now := e.pinnedMaps(t); !now.equal(pinned) {
			t.Errorf("%s: the pinned maps changed before the control plane's first full state:\n%s", how, mapsDiff(pinned, now))
		}
		for _, c := range before {
			for _, fe := range c.frontends {
				r := e.probe(t, fe, 100)
				if got := slices.Sorted(maps.Keys(r.Backends)); r.Answered != 100 || !slices.Equal(got, served[fe]) {
					t.Errorf("%s: %s: want all 100 flows answered by %v, as before the outage; got %s", how, fe, served[fe], r)
				}
			}
		}
		loops.waitRounds(t, 2)
		h.check(t, 3)
	}

	e.agent.Stop()
	story.enter("agent stopped (SIGTERM)", loops)
	if !e.agent.Cmd.ProcessState.Success() || e.agent.killed {
		t.Errorf("the agent did not exit cleanly on SIGTERM: %v\n%s", e.agent.Cmd.ProcessState, tail(e.agent.Output(), 20))
	}
	loops.waitRounds(t, 2) // new flows while no agent runs
	e.startAgent(t)
	story.enter("agent restarted", loops)
	restartedAlone("after a graceful restart")

	e.agent.kill()
	story.enter("agent SIGKILLed", loops)
	loops.waitRounds(t, 2)
	e.startAgent(t)
	story.enter("agent restarted again", loops)
	restartedAlone("after a SIGKILL and restart")

	// The resources change while nobody serves them: the agent cannot know.
	after := []cluster{db, game, newResolver}
	e.apply(t, resourcesYAML(after...))
	for _, fe := range newResolver.frontends {
		if r := e.probe(t, fe, 5, "--timeout", "500ms"); r.Answered != 0 {
			t.Errorf("%s answered before the control plane served it: %s", fe, r)
		}
	}
	if rows, out, err := e.frontends(); err != nil || len(rows) != 0 {
		t.Errorf("the frontends table filled with no control plane (%v):\n%s", err, out)
	}

	e.startControlPlane(t)
	story.enter("control plane back", loops)
	e.waitFrontends(t, after...)
	// Done rows say the added services are written; the removed ones go
	// by Prune, after them: wait until the maps no longer know them.
	e.waitPruned(t, oldResolver.frontends)
	story.enter("converged", loops)

	for _, fe := range newResolver.frontends {
		r := e.probe(t, fe, 100)
		if r.Answered != 100 || len(r.Backends) != len(newResolver.endpoints) {
			t.Errorf("%s added during the outage: want all 100 flows answered by its %d backends; got %s", fe, len(newResolver.endpoints), r)
		}
	}
	// A VIP no longer in l4xds_vips is dropped for --lb-removed-vip-grace
	// (its flows time out); after that its packets go to the LB's stack,
	// which has no route for it and answers, at the rate ICMP errors are
	// limited to, "network unreachable". The datapath's own answers for a
	// VIP it still knows (RST, ICMP port unreachable) must not appear.
	for _, fe := range oldResolver.frontends {
		never := e.probe(t, unknown[fe.proto], 10, "--timeout", "500ms")
		r := e.probe(t, fe, 10, "--timeout", "500ms")
		if r.Answered != 0 || r.Errors["timeout"]+r.Errors["network unreachable"] != 10 {
			t.Errorf("%s removed during the outage: want its flows to fail as to an address never served (%s); got %s", fe, never, r)
		}
	}
	m = e.openMaps(t)
	for fe, id := range ids {
		if now := serviceID(t, m, fe); now != id {
			t.Errorf("%s: service ID %d after converging, %d before the outage: its counters started over", fe, now, id)
		}
	}
	m.Close()

	loops.waitRounds(t, 2)
	h.check(t, 3)
	for _, l := range loops {
		flows, failed := l.stop()
		t.Logf("%s: %d new flows across the outage and both agent restarts, %d rounds failed", l.fe, flows, len(failed))
		if len(failed) > 0 {
			t.Errorf("%s: new flows failed during the outage:\n%s", l.fe, strings.Join(story.failures(l), "\n"))
		}
	}
	t.Logf("the long-lived connection to %s echoed %d times", h.backend, h.echoes())
}

// widenEphemeralPorts gives the connections from namespace ns every port
// above 1023.
func widenEphemeralPorts(t *testing.T, ns string) {
	t.Helper()
	cmd := netns.Command(context.Background(), ns, "sh", "-c", "echo 1024 65535 > /proc/sys/net/ipv4/ip_local_port_range")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("widening the ephemeral ports of %s: %v\n%s", ns, err, out)
	}
}

// phases marks where the story was when each round of new flows ended,
// so that a failed round says what it overlapped.
type phases struct {
	names []string
	at    []map[*flowLoop]int // rounds each loop had made when the phase began
}

func (p *phases) enter(name string, loops []*flowLoop) {
	at := map[*flowLoop]int{}
	for _, l := range loops {
		at[l] = l.roundsSoFar()
	}
	p.names, p.at = append(p.names, name), append(p.at, at)
}

// failures are the failed rounds of a stopped loop, each with the phase
// in which it ended.
func (p *phases) failures(l *flowLoop) []string {
	var out []string
	for i, r := range l.rounds {
		if r.Answered == r.Flows {
			continue
		}
		phase := "before the story"
		for k := range p.names {
			if p.at[k][l] <= i {
				phase = p.names[k]
			}
		}
		out = append(out, fmt.Sprintf("round %d, ended during %q: %s", i, phase, r))
	}
	return out
}

// xdsStatusRow is a row of `l4xds-dbg statedb xds-status -o json`.
type xdsStatusRow struct {
	Server   string
	State    string
	Attempts uint64
	Synced   bool
	Error    string
}

// waitDisconnected waits until the agent answers on its socket and has
// failed to reach the control plane twice (a retry after its backoff: the
// outage outlasts its first attempt), then checks that its frontends table
// is empty: the agent has nothing to act on.
func (e *lbEnv) waitDisconnected(t *testing.T, how string) {
	t.Helper()
	var rows []xdsStatusRow
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var last string
		var err error
		rows, last, err = e.xdsStatus()
		if err == nil && len(rows) > 0 && !slices.ContainsFunc(rows, func(r xdsStatusRow) bool {
			return r.State == "connected" || r.Synced || r.Attempts < 2
		}) {
			break
		}
		if e.agent.Exited() {
			t.Fatalf("%s: the agent exited (%v):\n%s", how, e.agent.Cmd.ProcessState, tail(e.agent.Output(), 40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the agent never showed two failed attempts to reach the control plane; last xds-status:\n%s", how, last)
		}
	}
	t.Logf("%s: xDS %s after %d attempts (%s)", how, rows[0].State, rows[0].Attempts, rows[0].Error)
	if rows, out, err := e.frontends(); err != nil || len(rows) != 0 {
		t.Errorf("%s: want an empty frontends table with no control plane; got (%v):\n%s", how, err, out)
	}
}

func (e *lbEnv) xdsStatus() ([]xdsStatusRow, string, error) {
	return statedbRows[xdsStatusRow](e, "xds-status")
}

// pinnedState is the content of the maps that say what is served, read
// from the pins: map name -> hex key -> hex value. The maglev values are
// the IDs of the per-service tables, so a rebuilt table shows as a change.
type pinnedState map[string]map[string]string

// statefulMaps are the maps the agent writes; conntrack and the counters
// change with traffic.
var statefulMaps = []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsBackends, bpf.L4xdsMapL4xdsMaglev,
	bpf.L4xdsMapL4xdsVips, bpf.L4xdsMapL4xdsSrcrange}

func (e *lbEnv) pinnedMaps(t *testing.T) pinnedState {
	t.Helper()
	s := pinnedState{}
	for _, name := range statefulMaps {
		m := e.openPinned(t, name)
		entries := map[string]string{}
		var k, v []byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			entries[hex.EncodeToString(k)] = hex.EncodeToString(v)
		}
		m.Close()
		if err := it.Err(); err != nil {
			t.Fatalf("reading the pinned map %s: %v", name, err)
		}
		s[name] = entries
	}
	return s
}

func (e *lbEnv) openPinned(t *testing.T, name string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpfRoot, "l4xds", name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("opening the pinned map %s: %v", name, err)
	}
	return m
}

func (s pinnedState) equal(o pinnedState) bool {
	return maps.EqualFunc(s, o, func(a, b map[string]string) bool { return maps.Equal(a, b) })
}

// waitPruned waits until the pinned maps no longer hold the frontends, nor
// their VIPs: the datapath passes what is sent to them to the LB's stack.
func (e *lbEnv) waitPruned(t *testing.T, fes []frontend) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = pinnedFrontends(t, e.openMaps(t), fes)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pinned maps still hold %s, 30s after the frontends converged", strings.Join(left, ", "))
		}
	}
}

// pinnedFrontends names the frontends, and their VIPs, that the maps still
// hold; it closes the maps.
func pinnedFrontends(t *testing.T, m *datapath.Maps, fes []frontend) []string {
	t.Helper()
	defer m.Close()
	services := map[string]bool{}
	for s, err := range m.Services() {
		if err != nil {
			t.Fatalf("reading the pinned services map: %v", err)
		}
		services[s.Frontend.String()] = true
	}
	vips, err := m.VIPs()
	if err != nil {
		t.Fatalf("reading the pinned VIPs map: %v", err)
	}
	var left []string
	for _, fe := range fes {
		if services[fe.String()] {
			left = append(left, "service "+fe.String())
		}
		if _, ok := vips[netip.MustParseAddr(fe.vip)]; ok && !slices.Contains(left, "VIP "+fe.vip) {
			left = append(left, "VIP "+fe.vip)
		}
	}
	return left
}

// mapsDiff names the entries that differ between two states, the first
// few of each map.
func mapsDiff(was, now pinnedState) string {
	const shown = 5
	var b strings.Builder
	for _, name := range statefulMaps {
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(was[name])) {
			if nv, ok := now[name][k]; !ok {
				lines = append(lines, fmt.Sprintf("key %s removed", k))
			} else if nv != was[name][k] {
				lines = append(lines, fmt.Sprintf("key %s: %s -> %s", k, was[name][k], nv))
			}
		}
		for _, k := range slices.Sorted(maps.Keys(now[name])) {
			if _, ok := was[name][k]; !ok {
				lines = append(lines, fmt.Sprintf("key %s added", k))
			}
		}
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s: %d entries before, %d now, %d differ:\n", name, len(was[name]), len(now[name]), len(lines))
		for _, l := range lines[:min(len(lines), shown)] {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	return b.String()
}
