// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"testing"

	"github.com/l4xds/l4xds/pkg/datapath"
)

// openMaps opens the agent's pinned maps for reading, whether an agent runs
// or not.
func (e *lbEnv) openMaps(t *testing.T) *datapath.Maps {
	t.Helper()
	m, err := datapath.OpenPinnedMaps(e.bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// serviceID is the frontend's service ID in the pinned services map.
func serviceID(t *testing.T, m *datapath.Maps, f frontend) uint32 {
	t.Helper()
	for s, err := range m.Services() {
		if err != nil {
			t.Fatalf("looking for %s in the pinned services map: %v", f, err)
		}
		if s.Frontend.String() == f.String() {
			return s.ID
		}
	}
	t.Fatalf("%s is not in the pinned services map", f)
	return 0
}

// serviceStats reads the per-service counters of the frontend from the
// pinned maps, summed over the CPUs.
func (e *lbEnv) serviceStats(t *testing.T, f frontend) datapath.Stats {
	t.Helper()
	m := e.openMaps(t)
	defer m.Close()
	s, err := m.ServiceStats(serviceID(t, m, f))
	if err != nil {
		t.Fatalf("stats of %s: %v", f, err)
	}
	return s
}

// statsDiff says what a service's counters gained between two reads.
func statsDiff(before, after datapath.Stats) string {
	s := fmt.Sprintf("+%d packets, +%d bytes", after.Packets-before.Packets, after.Bytes-before.Bytes)
	for i := range after.Drops {
		if d := after.Drops[i] - before.Drops[i]; d != 0 {
			s += fmt.Sprintf(", +%d %s drops", d, datapath.DropReason(i))
		}
	}
	return s
}
