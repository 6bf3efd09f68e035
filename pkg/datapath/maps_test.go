// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"os"
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
