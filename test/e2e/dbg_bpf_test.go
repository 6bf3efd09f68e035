// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// lbListJSON is what `l4xds-dbg bpf lb list -o json` prints.
type lbListJSON struct {
	Services []struct {
		Frontend      string
		ID            uint32
		SourceRanges  []string
		TakesNewFlows bool
		Backends      []struct {
			Address string
			ID      uint32
			State   string
			Slots   int
			Share   float64
		}
		Packets, Bytes uint64
	}
}

// ctListJSON is what `l4xds-dbg bpf ct list -o json` prints.
type ctListJSON struct {
	Entries []struct {
		Direction, Protocol, Client, Frontend, Backend string
		Flags                                          []string
		Expired                                        bool
	}
}

func dbgJSON(t *testing.T, dbg string, v any, args ...string) {
	t.Helper()
	r := runDbg(t, dbg, append(args, "-o", "json")...)
	if r.code != 0 {
		t.Fatalf("l4xds-dbg %s: exit %d: %s", strings.Join(args, " "), r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("l4xds-dbg %s -o json: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

// After real traffic, l4xds-dbg shows what the datapath holds: the
// weights as Maglev shares, the states, the source ranges, the counters,
// and the flows' conntrack entries from the client through the VIP to the
// backend; and the pinned maps are still readable with the agent stopped.
func TestPrivilegedDbgShowsTheDatapathAfterTraffic(t *testing.T) {
	e := newLBEnv(t, 3)
	dbg := filepath.Join(e.bin, "l4xds-dbg")
	db, game := tcp("10.1.2.3", 3306), udp("10.1.2.7", 7777)
	dbCluster := svc("db", db).with(weighted(v4(0, 3306), 70), weighted(v4(1, 3306), 30), health(v4(2, 3306), "DRAINING"))
	dbCluster.sourceRanges = []string{"10.0.0.0/24"}
	e.serve(t, dbCluster, svc("game", game).with(v4(0, 7777), v4(1, 7777)))

	h := e.hold(t, db) // one TCP flow stays open
	h.check(t, 3)
	// Each UDP flow from a port of its own: ports the kernel picks may
	// repeat once a flow's socket is closed, and two flows of one 5-tuple
	// share their conntrack entries.
	const udpFlows, firstPort = 50, 20000
	if r := e.probe(t, game, udpFlows, "--source-port", fmt.Sprint(firstPort)); r.Answered != udpFlows {
		t.Fatalf("UDP probe: %s", r)
	}
	bpfRoot := []string{"--bpf-root", e.bpfRoot}

	lbList := runDbg(t, dbg, append([]string{"bpf", "lb", "list"}, bpfRoot...)...)
	t.Logf("l4xds-dbg bpf lb list:\n%s%s", lbList.stdout, lbList.stderr)
	if lbList.code != 0 || !containsAll(lbList.squeezed(), []string{
		"10.1.2.3:3306/TCP", "10.1.2.7:7777/UDP", "source ranges: 10.0.0.0/24", "2 services, 5 backends",
	}) {
		t.Errorf("bpf lb list (exit %d) lacks a frontend, the source ranges or the totals", lbList.code)
	}
	var list lbListJSON
	dbgJSON(t, dbg, &list, append([]string{"bpf", "lb", "list"}, bpfRoot...)...)
	byFrontend := map[string]int{}
	for i, s := range list.Services {
		byFrontend[s.Frontend] = i
	}
	dbSvc := list.Services[byFrontend[db.String()]]
	shares := map[string]string{}
	for _, b := range dbSvc.Backends {
		shares[b.Address] = fmt.Sprintf("%s %.0f%%", b.State, b.Share)
	}
	for addr, want := range map[string]string{
		"192.168.1.10:3306": "active 70%", "192.168.1.11:3306": "active 30%", "192.168.1.12:3306": "terminating 0%",
	} {
		if shares[addr] != want {
			t.Errorf("%s backend %s: %q, want %q (all: %v)", db, addr, shares[addr], want, shares)
		}
	}
	if gameSvc := list.Services[byFrontend[game.String()]]; gameSvc.Packets < 2*udpFlows || gameSvc.Bytes == 0 {
		t.Errorf("%s: %d packets, %d bytes after %d UDP flows, want at least %d packets", game, gameSvc.Packets, gameSvc.Bytes, udpFlows, 2*udpFlows)
	}

	ctList := runDbg(t, dbg, append([]string{"bpf", "ct", "list"}, bpfRoot...)...)
	t.Logf("l4xds-dbg bpf ct list (%d lines):\n%s", strings.Count(ctList.stdout, "\n"), tail(ctList.stdout, 12))
	var ct ctListJSON
	dbgJSON(t, dbg, &ct, append([]string{"bpf", "ct", "list"}, bpfRoot...)...)
	// The held flow: a forward and a reply entry from the client through
	// the VIP to the backend that answers it, alive.
	i, err := strconv.Atoi(strings.TrimPrefix(h.backend, "b"))
	if err != nil {
		t.Fatalf("held connection answered by %q", h.backend)
	}
	heldBackend := netip.AddrPortFrom(netns.BackendIPv4(i), 3306).String()
	var held []string
	udpEntries := map[uint16][]string{} // by client port
	for _, c := range ct.Entries {
		client, _ := netip.ParseAddrPort(c.Client)
		if client.Addr() != e.topo.ClientIPv4 {
			continue
		}
		switch {
		case c.Frontend == db.dial() && c.Backend == heldBackend && !c.Expired && len(c.Flags) == 0:
			held = append(held, c.Direction)
		case c.Frontend == game.dial() && c.Protocol == "UDP":
			udpEntries[client.Port()] = append(udpEntries[client.Port()], c.Direction)
		}
	}
	if strings.Join(held, " ") != "forward reply" {
		t.Errorf("entries of the held flow %s -> %s -> %s: %v, want a live forward and reply entry", e.topo.ClientIPv4, db.dial(), heldBackend, held)
	}
	for p := uint16(firstPort); p < firstPort+udpFlows; p++ {
		if dirs := udpEntries[p]; len(dirs) != 2 || !slices.Contains(dirs, "forward") || !slices.Contains(dirs, "reply") {
			t.Errorf("conntrack entries of the UDP flow %s:%d -> %s: %v, want a forward and a reply entry", e.topo.ClientIPv4, p, game, dirs)
		}
	}
	if len(udpEntries) != udpFlows {
		t.Errorf("UDP flows of %s in conntrack from %d client ports, want the %d of the probe: %v", game, len(udpEntries), udpFlows, udpEntries)
	}
	if !strings.Contains(ctList.squeezed(), fmt.Sprintf("TCP %s:", e.topo.ClientIPv4)) {
		t.Errorf("bpf ct list does not show the client's TCP flow")
	}

	st := runDbg(t, dbg, "--socket", e.socket, "status")
	t.Logf("l4xds-dbg status (exit %d):\n%s%s", st.code, st.stdout, st.stderr)
	if st.code != 0 || !containsAll(st.squeezed(), []string{
		"Health: OK", "Frontends: 2 (2 Done)", "Backends: 5 (4 active, 1 terminating)",
		fmt.Sprintf("Datapath: bpf on %s, %s; maps at %s: 2 services, 5 backends", netns.ClientDevice, netns.BridgeDevice, filepath.Join(e.bpfRoot, "l4xds")),
	}) {
		t.Errorf("status of the agent with the BPF datapath")
	}

	// The agent stops: the maps, and what l4xds-dbg reads from them, stay.
	e.agent.Stop()
	again := runDbg(t, dbg, append([]string{"bpf", "lb", "list"}, bpfRoot...)...)
	if again.code != 0 || !containsAll(again.squeezed(), []string{"10.1.2.3:3306/TCP", "10.1.2.7:7777/UDP", "2 services, 5 backends"}) {
		t.Errorf("bpf lb list with the agent stopped: exit %d\n%s%s", again.code, again.stdout, again.stderr)
	}
	if st := runDbg(t, dbg, "--socket", e.socket, "status"); st.code == 0 {
		t.Errorf("status with the agent stopped exited 0:\n%s", st.stdout)
	}
}
