// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// BenchmarkMaglevTable measures what a table costs the agent: making and
// filling a new one, and rewriting one in place, through the memory
// mapping of the tables the datapath makes (mapped) and through the batch
// update of tables that cannot be mapped (batch).
func BenchmarkMaglevTable(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates BPF maps")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		b.Fatal(err)
	}
	spec, err := bpf.LoadL4xds()
	if err != nil {
		b.Fatal(err)
	}
	const size = 1021
	mapped := spec.Maps[bpf.L4xdsMapL4xdsMaglev].InnerMap.Copy()
	mapped.MaxEntries, mapped.Key, mapped.Value = size, nil, nil
	batch := mapped.Copy()
	batch.Flags &^= unix.BPF_F_MMAPABLE
	tables := [2][]uint32{
		BuildMaglev(backendsWithWeights(1, 1, 1), size),
		BuildMaglev(backendsWithWeights(1, 1, 1, 1), size),
	}
	for _, c := range []struct {
		name string
		spec *ebpf.MapSpec
	}{{"mapped", mapped}, {"batch", batch}} {
		m := &Maps{slotKeys: make([]uint32, size)}
		for i := range m.slotKeys {
			m.slotKeys[i] = uint32(i)
		}
		b.Run(c.name+"/new", func(b *testing.B) {
			for b.Loop() {
				inner, err := ebpf.NewMap(c.spec)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.fillArray(inner, tables[0]); err != nil {
					b.Fatal(err)
				}
				inner.Close()
			}
		})
		b.Run(c.name+"/rewrite", func(b *testing.B) {
			inner, err := ebpf.NewMap(c.spec)
			if err != nil {
				b.Fatal(err)
			}
			defer inner.Close()
			i := 0
			for b.Loop() {
				if err := m.fillArray(inner, tables[i%2]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			var got uint32
			if err := inner.Lookup(uint32(size-1), &got); err != nil || got != tables[(i-1)%2][size-1] {
				b.Fatalf("last slot %d (%v), want %d", got, err, tables[(i-1)%2][size-1])
			}
		})
	}
}

// New tables are filled through mappings side by side in each worker's
// region, several regions' worth in a round here: each is inserted with
// the slots it was built with, and none stays mapped after the insert.
func TestPrivilegedNewMaglevTablesThroughRegions(t *testing.T) {
	needRoot(t)
	dp := load(t, testConfig(bpffs(t)))
	defer dp.Close()
	defer func(b uintptr) { regionBytes = b }(regionBytes)
	regionBytes = 3 * tableBytes(1021) // 3 tables a region

	want := map[uint32][]uint32{}
	for round := range 2 {
		for i := range 20 {
			id := uint32(100*round + i + 1)
			weights := make([]uint16, 1+i%5)
			for j := range weights {
				weights[j] = uint16(1 + (i+j)%3)
			}
			bes := backendsWithWeights(weights...)
			want[id] = BuildMaglev(bes, 1021)
			if i%4 == 0 {
				// A table built by the reconciler, made by a worker.
				if err := dp.Maps.newMaglev(id, want[id]); err != nil {
					t.Fatal(err)
				}
				continue
			}
			var b maglevBuilder
			for _, be := range bes {
				b.add(be.ID, []byte(be.Key), be.Weight)
			}
			if err := dp.Maps.buildMaglev(id, &b, 1021); err != nil {
				t.Fatal(err)
			}
			if len(b.inputs) != 0 {
				t.Fatalf("service %d: the builder keeps %d backends after buildMaglev", id, len(b.inputs))
			}
		}
		if err := dp.Maps.insertMaglevs(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		// (The loader keeps read-only mappings of the programs' data.)
		var writable int
		for _, line := range strings.Split(string(maps), "\n") {
			if strings.Contains(line, " rw-s ") && strings.HasSuffix(line, "bpf-map") {
				writable++
			}
		}
		if writable != 0 {
			t.Errorf("round %d: %d tables stay mapped after the insert", round, writable)
		}
	}
	for id, table := range want {
		got, ok, err := dp.Maps.MaglevTable(id)
		if err != nil || !ok || !slices.Equal(got, table) {
			t.Errorf("service %d: table found %v (%v), equal to its build %v", id, ok, err, slices.Equal(got, table))
		}
	}
	if err := dp.Maps.buildMaglev(1, &maglevBuilder{}, 2039); err == nil || !strings.Contains(err.Error(), "2039 slots, not 1021") {
		t.Errorf("a table of the wrong size: %v", err)
	}
}
