// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
)

func backendsWithWeights(weights ...uint16) []MaglevBackend {
	bes := make([]MaglevBackend, len(weights))
	for i, w := range weights {
		bes[i] = MaglevBackend{ID: uint32(i + 1), Key: fmt.Sprintf("192.168.1.%d:3306", 10+i), Weight: w}
	}
	return bes
}

func slotCounts(table []uint32) map[uint32]int {
	counts := map[uint32]int{}
	for _, id := range table {
		counts[id]++
	}
	return counts
}

func TestMaglevFillsEverySlotWithAShareOfTheWeight(t *testing.T) {
	for _, c := range []struct {
		m       uint32
		weights []uint16
	}{
		{1021, []uint16{1}},
		{1021, []uint16{70, 30}},
		{1021, []uint16{1, 2, 3, 4}},
		{1021, []uint16{1, 1, 1, 1, 1, 1, 1}},
		{1021, []uint16{0, 1}}, // 0 counts as 1
		{16381, []uint16{65535, 1, 100, 1000}},
		{65537, []uint16{5, 3, 2}},
		{7, []uint16{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}, // more backends than slots
	} {
		t.Run(fmt.Sprintf("m=%d/%v", c.m, c.weights), func(t *testing.T) {
			bes := backendsWithWeights(c.weights...)
			table := BuildMaglev(bes, c.m)
			if len(table) != int(c.m) {
				t.Fatalf("table has %d slots, want %d", len(table), c.m)
			}
			var sum float64
			for _, be := range bes {
				sum += float64(max(be.Weight, 1))
			}
			counts := slotCounts(table)
			total := 0
			for id, n := range counts {
				if id == 0 || id > uint32(len(bes)) {
					t.Fatalf("slot holds unknown backend id %d", id)
				}
				total += n
			}
			if total != int(c.m) {
				t.Fatalf("%d slots filled, want %d", total, c.m)
			}
			if int(c.m) < len(bes) {
				return // not every backend can have a slot
			}
			for _, be := range bes {
				want := 100 * float64(max(be.Weight, 1)) / sum
				got := 100 * float64(counts[be.ID]) / float64(c.m)
				if math.Abs(got-want) > 1 {
					t.Errorf("backend %s (weight %d): %.2f%% of the slots, want %.2f%% ± 1", be.Key, be.Weight, got, want)
				}
			}
		})
	}
}

func TestMaglevIsDeterministicAndIndependentOfOrder(t *testing.T) {
	bes := backendsWithWeights(3, 1, 4, 1, 5, 9, 2, 6)
	want := BuildMaglev(bes, 1021)
	reversed := slices.Clone(bes)
	slices.Reverse(reversed)
	if got := BuildMaglev(reversed, 1021); !slices.Equal(got, want) {
		t.Error("the table depends on the order of the backends")
	}
	if got := BuildMaglev(bes, 1021); !slices.Equal(got, want) {
		t.Error("two builds of the same backends differ")
	}
	// A fixed point: the hash and the walk are part of the datapath's
	// contract across agent versions (a change reshuffles every flow not in
	// conntrack after an upgrade). Update this only on purpose.
	if got := fmt.Sprint(want[:8]); got != maglevGolden {
		t.Errorf("first slots %s, want %s", got, maglevGolden)
	}
}

const maglevGolden = "[7 6 6 2 3 6 8 5]"

func TestMaglevRemovingABackendMovesFewOthers(t *testing.T) {
	for _, n := range []int{3, 10, 50} {
		weights := make([]uint16, n)
		for i := range weights {
			weights[i] = 1
		}
		bes := backendsWithWeights(weights...)
		const m = 1021
		before := BuildMaglev(bes, m)
		gone := bes[n/2].ID
		after := BuildMaglev(slices.Delete(slices.Clone(bes), n/2, n/2+1), m)
		moved := 0
		for i := range before {
			if before[i] != gone && after[i] != before[i] {
				moved++
			}
		}
		// Only the removed backend's slots have to move; Maglev moves a few
		// more. A naive modulo table would move about (n-1)/n of them.
		t.Logf("n=%d: %d of %d slots of the other backends moved", n, moved, m)
		if limit := m / 10; moved > limit {
			t.Errorf("n=%d: removing one backend moved %d slots of the others, want at most %d", n, moved, limit)
		}
	}
}

func TestMaglevRejectsATableSizeThatIsNotPrime(t *testing.T) {
	for _, m := range []uint32{0, 1, 1000, 65536} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("BuildMaglev(m=%d) did not panic", m)
				}
			}()
			BuildMaglev(backendsWithWeights(1), m)
		}()
	}
	if table := BuildMaglev(nil, 1021); table != nil {
		t.Errorf("no backends: got a table of %d slots, want none", len(table))
	}
}

func BenchmarkMaglev(b *testing.B) {
	for _, c := range []struct {
		m uint32
		n int
	}{{1021, 10}, {16381, 100}, {65537, 1000}} {
		weights := make([]uint16, c.n)
		for i := range weights {
			weights[i] = uint16(1 + i%7)
		}
		bes := backendsWithWeights(weights...)
		b.Run(fmt.Sprintf("m=%d/backends=%d", c.m, c.n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				BuildMaglev(bes, c.m)
			}
		})
	}
}

// The reconciler builds tables with a reused builder keyed by the
// backends' addresses: they are BuildMaglev's tables keyed by the
// addresses as strings, build after build.
func TestMaglevBuilderKeysAnAddressAsItsString(t *testing.T) {
	var b maglevBuilder
	for n := range 12 {
		var bes []MaglevBackend
		for i := range n {
			addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 168, byte(n), byte(i)}), uint16(8000+i))
			if i%3 == 0 {
				addr = netip.MustParseAddrPort(fmt.Sprintf("[2001:db8::%x]:80", i))
			}
			w := uint16(1 + i%4)
			bes = append(bes, MaglevBackend{ID: uint32(100 + i), Key: addr.String(), Weight: w})
			b.addAddr(uint32(100+i), addr, w)
		}
		got := b.build(1021)
		if want := BuildMaglev(bes, 1021); n > 0 && !slices.Equal(got, want) {
			t.Errorf("%d backends: the builder's table differs from BuildMaglev's", n)
		}
	}
}
