// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/l4xds/l4xds/pkg/datapath"
)

// lbList is what `l4xds-dbg bpf lb list -o json` prints.
type lbList struct {
	Services []struct {
		Frontend      string
		ID            uint32
		TakesNewFlows bool
		MaglevSlots   int
		Backends      []struct {
			Address string
			ID      uint32
			State   string
			Slots   int
			// Share of new flows: a service of one backend has no Maglev
			// table, its backend all of the share with no slot.
			Share float64
		}
		Problems []string
	}
	OrphanBackends []struct {
		Address   string
		ID        uint32
		ServiceID uint32
	}
	OrphanMaglevTables []uint32
}

func (e *env) lbList() (lbList, string, error) {
	var l lbList
	raw, out, err := e.dbgJSON("bpf", "lb", "list", "--bpf-root", e.bpfRoot)
	if err == nil && len(raw) != 1 {
		err = fmt.Errorf("l4xds-dbg bpf lb list printed %d values, want 1", len(raw))
	}
	if err == nil {
		err = json.Unmarshal(raw[0], &l)
	}
	return l, out, err
}

// mapsFigures are what the maps held when they matched the tables.
type mapsFigures struct {
	services, backends, maglevTables int
}

// mapsDiffer lists where the pinned maps and the frontends table disagree:
// every service, backend and Maglev table of the maps is the table's and
// the other way round, with nothing left over (no backend or Maglev table
// of a service that is gone, no VIP without services), every Maglev table
// filled with the service's backends that take new flows and no others.
func (e *env) mapsDiffer(table map[string][]string) (problems []string, fig mapsFigures, err error) {
	list, _, err := e.lbList()
	if err != nil {
		return nil, fig, err
	}
	inMaps := map[string][]string{}
	ids := map[uint32]string{}
	for _, s := range list.Services {
		if other, ok := ids[s.ID]; ok {
			problems = append(problems, fmt.Sprintf("service ID %d is both %s's and %s's", s.ID, other, s.Frontend))
		}
		ids[s.ID] = s.Frontend
		var bes []string
		slots := 0
		for _, b := range s.Backends {
			a := b.Address
			if b.State != "active" {
				a += " " + b.State
			}
			bes = append(bes, a)
			slots += b.Slots
			switch {
			case b.State == "active" && b.Share == 0:
				problems = append(problems, fmt.Sprintf("%s: active backend %s takes no new flows", s.Frontend, b.Address))
			case b.State != "active" && b.Share > 0:
				problems = append(problems, fmt.Sprintf("%s: %s backend %s takes %.0f%% of new flows", s.Frontend, b.State, b.Address, 100*b.Share))
			}
		}
		slices.Sort(bes)
		inMaps[s.Frontend] = bes
		for _, p := range s.Problems {
			problems = append(problems, s.Frontend+": "+p)
		}
		if s.MaglevSlots > 0 {
			fig.maglevTables++
			if slots != s.MaglevSlots {
				problems = append(problems, fmt.Sprintf("%s: %d of its %d Maglev slots name its backends", s.Frontend, slots, s.MaglevSlots))
			}
		}
		fig.services++
		fig.backends += len(s.Backends)
	}
	for _, b := range list.OrphanBackends {
		problems = append(problems, fmt.Sprintf("backend %s (id %d) of service %d, which is gone", b.Address, b.ID, b.ServiceID))
	}
	for _, id := range list.OrphanMaglevTables {
		problems = append(problems, fmt.Sprintf("a Maglev table of service %d, which is gone", id))
	}
	for _, fe := range slices.Sorted(maps.Keys(table)) {
		if got, ok := inMaps[fe]; !ok {
			problems = append(problems, fmt.Sprintf("%s is in the table, not in the maps", fe))
		} else if !slices.Equal(got, table[fe]) {
			problems = append(problems, fmt.Sprintf("%s: backends %v in the maps, %v in the table", fe, got, table[fe]))
		}
	}
	for _, fe := range slices.Sorted(maps.Keys(inMaps)) {
		if _, ok := table[fe]; !ok {
			problems = append(problems, fmt.Sprintf("%s is in the maps, not in the table", fe))
		}
	}

	// l4xds_vips counts the services of each VIP.
	m, err := datapath.OpenPinnedMaps(e.bpfRoot)
	if err != nil {
		return nil, fig, err
	}
	defer m.Close()
	vips, err := m.VIPs()
	if err != nil {
		return nil, fig, err
	}
	want := map[netip.Addr]uint32{}
	for fe := range table {
		ap, err := netip.ParseAddrPort(fe[:strings.LastIndex(fe, "/")])
		if err != nil {
			return nil, fig, fmt.Errorf("frontend %q of the table: %w", fe, err)
		}
		want[ap.Addr()]++
	}
	for _, vip := range slices.SortedFunc(maps.Keys(vips), netip.Addr.Compare) {
		if vips[vip] != want[vip] {
			problems = append(problems, fmt.Sprintf("l4xds_vips counts %d services of %s, the table %d", vips[vip], vip, want[vip]))
		}
	}
	for vip := range want {
		if _, ok := vips[vip]; !ok {
			problems = append(problems, fmt.Sprintf("VIP %s of the table is not in l4xds_vips", vip))
		}
	}
	return problems, fig, nil
}
