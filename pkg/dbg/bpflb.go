// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/datapath"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

func lbListCommand(bpfRoot *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Services, their backends and weights, source ranges and counters, as the maps hold them",
		Long: "List every service of the pinned maps by frontend: its backends with the state the map holds " +
			"and the share of the service's Maglev table each one has (how the weights are realised: new flows " +
			"split in these proportions), its source ranges and affinity, and its packet, byte and drop counters. " +
			"Reads the maps directly: works while the agent is down.",
		Example: "  l4xds-dbg bpf lb list\n  l4xds-dbg bpf lb list --bpf-root /mnt/bpf -o json",
		Args:    cobra.NoArgs,
	}
	showOutput(cmd, func(*cobra.Command) (lbList, error) {
		m, err := openMaps(*bpfRoot)
		if err != nil {
			return lbList{}, err
		}
		defer m.Close()
		in, err := readLB(m)
		if err != nil {
			return lbList{}, err
		}
		return newLBList(in), nil
	}, printLBList)
	return cmd
}

// lbMaps is what the maps hold, read once.
type lbMaps struct {
	services []datapath.ServiceEntry
	backends []datapath.BackendEntry
	ranges   []datapath.SourceRangeEntry
	// maglev holds the table of each service that has one; maglevIDs
	// are the services the Maglev map has a table of, with or without a
	// service.
	maglev    map[uint32][]uint32
	maglevIDs []uint32
	// stats by service ID; 0 holds the drops charged to no service.
	stats map[uint32]datapath.Stats
}

func readLB(m *datapath.Maps) (lbMaps, error) {
	in := lbMaps{maglev: map[uint32][]uint32{}, stats: map[uint32]datapath.Stats{}}
	for s, err := range m.Services() {
		if err != nil {
			return in, err
		}
		in.services = append(in.services, s)
	}
	for b, err := range m.Backends() {
		if err != nil {
			return in, err
		}
		in.backends = append(in.backends, b)
	}
	for r, err := range m.SourceRanges() {
		if err != nil {
			return in, err
		}
		in.ranges = append(in.ranges, r)
	}
	var err error
	if in.maglevIDs, err = m.MaglevServiceIDs(); err != nil {
		return in, err
	}
	ids := []uint32{0}
	for _, s := range in.services {
		ids = append(ids, s.ID)
	}
	for _, id := range ids {
		if id != 0 {
			table, ok, err := m.MaglevTable(id)
			if err != nil {
				return in, err
			}
			if ok {
				in.maglev[id] = table
			}
		}
		st, err := m.ServiceStats(id)
		if err != nil {
			return in, err
		}
		in.stats[id] = st
	}
	return in, nil
}

// lbList is what `bpf lb list` prints.
type lbList struct {
	Services []lbService `json:"services"`
	// UnchargedDrops are drops of packets to a VIP that no service can be
	// charged with (a port or protocol the VIP does not serve, headers too
	// short to find the service), by reason.
	UnchargedDrops map[string]uint64 `json:"unchargedDrops,omitempty"`
	// OrphanBackends belong to no service of the map.
	OrphanBackends []lbBackend `json:"orphanBackends,omitempty"`
	// OrphanMaglevTables are the IDs of services that are not in the map
	// but still have a Maglev table: each one holds a kernel map.
	OrphanMaglevTables []uint32 `json:"orphanMaglevTables,omitempty"`
}

type lbService struct {
	Frontend string `json:"frontend"`
	ID       uint32 `json:"id"`
	// SourceRanges are the only clients allowed, when the service enforces
	// them; null when it does not (every client is allowed).
	SourceRanges []string `json:"sourceRanges"`
	// AffinityTimeout is the client-IP session affinity ("" when off).
	AffinityTimeout string `json:"affinityTimeout,omitempty"`
	// TakesNewFlows: a backend is in the Maglev table, or is the
	// service's one backend. Without one, new flows are rejected (TCP RST,
	// ICMP port unreachable).
	TakesNewFlows bool `json:"takesNewFlows"`
	// MaglevSlots is the size of the Maglev table; 0 for a service of one
	// backend, which needs none.
	MaglevSlots int `json:"maglevSlots"`
	// RejectSlots of the Maglev table refuse new flows (reject_weight),
	// RejectShare percent of them.
	RejectSlots int         `json:"rejectSlots,omitempty"`
	RejectShare float64     `json:"rejectShare,omitempty"`
	Backends    []lbBackend `json:"backends"`
	Packets     uint64      `json:"packets"`
	Bytes       uint64      `json:"bytes"`
	// Drops by reason, only those that happened.
	Drops map[string]uint64 `json:"drops,omitempty"`
	// Problems are what a reader should look at: no backend for new flows,
	// maps that disagree with each other.
	Problems []string `json:"problems,omitempty"`

	frontend lb.L3n4Addr
}

type lbBackend struct {
	Address string `json:"address"`
	ID      uint32 `json:"id"`
	State   string `json:"state"`
	// Slots of the service's Maglev table that are this backend's, and
	// their share of the table in percent: the weight as realised. The one
	// backend of a service without a table has no slot and all the share.
	Slots int     `json:"slots"`
	Share float64 `json:"share"`
	// ServiceID, for an orphan backend.
	ServiceID uint32 `json:"serviceID,omitempty"`
}

// newLBList joins the maps' entries by service, sorted by frontend, each
// service's backends by address.
func newLBList(in lbMaps) lbList {
	var list lbList
	bySvc := map[uint32][]datapath.BackendEntry{}
	for _, b := range in.backends {
		bySvc[b.ServiceID] = append(bySvc[b.ServiceID], b)
	}
	rangesOf := map[uint32][]string{}
	for _, r := range in.ranges {
		rangesOf[r.ServiceID] = append(rangesOf[r.ServiceID], r.Prefix.String())
	}
	known := map[uint32]bool{}
	for _, s := range in.services {
		known[s.ID] = true
		list.Services = append(list.Services, newLBService(s, bySvc[s.ID], rangesOf[s.ID], in.maglev[s.ID], in.stats[s.ID]))
	}
	slices.SortFunc(list.Services, func(a, b lbService) int {
		return cmp.Or(a.frontend.Compare(b.frontend), cmp.Compare(a.ID, b.ID))
	})
	for _, id := range slices.Sorted(maps.Keys(bySvc)) {
		if known[id] {
			continue
		}
		for _, b := range sortedBackends(bySvc[id]) {
			list.OrphanBackends = append(list.OrphanBackends,
				lbBackend{Address: b.Address.String(), ID: b.ID, State: b.State.String(), ServiceID: id})
		}
	}
	for _, id := range slices.Sorted(slices.Values(in.maglevIDs)) {
		if !known[id] {
			list.OrphanMaglevTables = append(list.OrphanMaglevTables, id)
		}
	}
	list.UnchargedDrops = drops(in.stats[0])
	return list
}

func newLBService(s datapath.ServiceEntry, backends []datapath.BackendEntry, ranges []string, table []uint32, st datapath.Stats) lbService {
	out := lbService{
		Frontend:      s.Frontend.String(),
		ID:            s.ID,
		TakesNewFlows: s.Count > 0 && (len(table) > 0 || s.Backend != 0),
		MaglevSlots:   len(table),
		Backends:      []lbBackend{},
		Packets:       st.Packets,
		Bytes:         st.Bytes,
		Drops:         drops(st),
		frontend:      s.Frontend,
	}
	if s.Affinity {
		out.AffinityTimeout = s.AffinityTimeout.String()
	}
	slices.Sort(ranges)
	switch {
	case s.SourceRanges && len(ranges) == 0:
		out.SourceRanges = []string{}
		out.Problems = append(out.Problems, "source ranges enforced but none allowed: every client is dropped")
	case s.SourceRanges:
		out.SourceRanges = ranges
	case len(ranges) > 0:
		out.Problems = append(out.Problems, fmt.Sprintf("source ranges %s in the map but not enforced", strings.Join(ranges, ", ")))
	}

	if s.Backend != 0 {
		// The datapath reads no table: a leftover one is not shown.
		table = nil
		out.MaglevSlots = 0
	}
	slots := map[uint32]int{}
	for _, id := range table {
		slots[id]++
	}
	// Backend 0 is never a backend: its slots are the reject share.
	out.RejectSlots, out.RejectShare = slots[0], share(slots[0], len(table))
	delete(slots, 0)
	single := false
	for _, b := range sortedBackends(backends) {
		n := slots[b.ID]
		delete(slots, b.ID)
		be := lbBackend{
			Address: b.Address.String(), ID: b.ID, State: b.State.String(),
			Slots: n, Share: share(n, len(table)),
		}
		if s.Backend != 0 && b.ID == s.Backend {
			be.Share, single = 100, true
		}
		out.Backends = append(out.Backends, be)
	}
	for _, id := range slices.Sorted(maps.Keys(slots)) {
		out.Problems = append(out.Problems, fmt.Sprintf("%d Maglev slots name backend id %d, which is not one of this service's: its new flows are rejected", slots[id], id))
	}
	switch {
	case s.Count == 0:
		out.Problems = append([]string{"no backend takes new flows: new connections are rejected (TCP RST, ICMP port unreachable)"}, out.Problems...)
	case s.Backend != 0 && !single:
		out.Problems = append([]string{fmt.Sprintf("the service's one backend id %d is not one of its backends: its new flows are dropped", s.Backend)}, out.Problems...)
	case s.Backend != 0 && s.Count != 1:
		out.Problems = append(out.Problems, fmt.Sprintf("the service counts %d backends for new flows but names one, id %d", s.Count, s.Backend))
	case s.Backend != 0:
	case len(table) == 0:
		out.Problems = append([]string{fmt.Sprintf("%d backends take new flows but the Maglev table is missing: new connections are rejected", s.Count)}, out.Problems...)
	case int(s.Count) != distinctBackends(table):
		out.Problems = append(out.Problems, fmt.Sprintf("the service counts %d backends for new flows, its Maglev table holds %d", s.Count, distinctBackends(table)))
	}
	return out
}

func sortedBackends(bs []datapath.BackendEntry) []datapath.BackendEntry {
	return slices.SortedFunc(slices.Values(bs), func(a, b datapath.BackendEntry) int {
		return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.ID, b.ID))
	})
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) * 100 / float64(of)
}

// distinctBackends counts the backends a table names (not the reject
// share's 0).
func distinctBackends(table []uint32) int {
	seen := map[uint32]bool{}
	for _, id := range table {
		if id != 0 {
			seen[id] = true
		}
	}
	return len(seen)
}

// drops names the non-zero drop counters by reason.
func drops(st datapath.Stats) map[string]uint64 {
	var out map[string]uint64
	for r, n := range st.Drops {
		if n > 0 {
			if out == nil {
				out = map[string]uint64{}
			}
			out[datapath.DropReason(r).String()] = n
		}
	}
	return out
}

// formatDrops is "3 source range, 1 no backend" in the order of the
// reasons, or "none".
func formatDrops(d map[string]uint64) string {
	var parts []string
	for r := range datapath.NumDropReasons {
		if n := d[r.String()]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, r))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// printLBList prints a line per backend under its frontend, then the
// service's settings, counters and problems (marked "!").
func printLBList(w io.Writer, list lbList) error {
	t := newTable(w)
	t.row("Frontend", "Service", "Backend", "State", "Slots", "Share")
	for _, s := range list.Services {
		first := []string{s.Frontend, fmt.Sprint(s.ID)}
		line := func(cells ...string) {
			t.row(append(first, cells...)...)
			first = []string{"", ""}
		}
		for _, p := range s.Problems {
			line("! " + p)
		}
		for _, b := range s.Backends {
			line(fmt.Sprintf("%s (id %d)", b.Address, b.ID), b.State, fmt.Sprint(b.Slots), fmt.Sprintf("%.1f%%", b.Share))
		}
		if s.RejectSlots > 0 {
			line("reject (new flows refused)", "", fmt.Sprint(s.RejectSlots), fmt.Sprintf("%.1f%%", s.RejectShare))
		}
		if s.SourceRanges != nil {
			line("source ranges: " + strings.Join(s.SourceRanges, ", "))
		}
		if s.AffinityTimeout != "" {
			line("session affinity: " + s.AffinityTimeout)
		}
		line(fmt.Sprintf("%d packets, %d bytes, drops: %s", s.Packets, s.Bytes, formatDrops(s.Drops)))
	}
	if err := t.flush(); err != nil {
		return err
	}
	backends := 0
	for _, s := range list.Services {
		backends += len(s.Backends)
	}
	fmt.Fprintf(w, "%s, %s", plural(len(list.Services), "service", "services"), plural(backends, "backend", "backends"))
	if len(list.UnchargedDrops) > 0 {
		fmt.Fprintf(w, "; drops to a VIP charged to no service: %s", formatDrops(list.UnchargedDrops))
	}
	fmt.Fprintln(w)
	for _, b := range list.OrphanBackends {
		fmt.Fprintf(w, "! backend %s (id %d, %s) belongs to service %d, which is not in the map\n", b.Address, b.ID, b.State, b.ServiceID)
	}
	for _, id := range list.OrphanMaglevTables {
		fmt.Fprintf(w, "! a Maglev table of service %d, which is not in the map\n", id)
	}
	return nil
}
