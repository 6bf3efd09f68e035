// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"cmp"
	"fmt"
	"slices"
)

// MaglevBackend is one backend of a Maglev table.
type MaglevBackend struct {
	// ID is what the table's slots hold.
	ID uint32
	// Key places the backend in the table; it must be stable across
	// processes and restarts (e.g. the backend's address), so that every
	// node and every restart builds the same table.
	Key string
	// Weight is the backend's share of the slots relative to the others;
	// 0 counts as 1.
	Weight uint16
}

// BuildMaglev builds a weighted Maglev lookup table of m slots (Eisenbud et
// al., "Maglev: A Fast and Reliable Software Network Load Balancer", NSDI
// 2016): each backend walks its own permutation of the slots, taking the
// next free one on each of its turns. A backend of weight w gets w/maxW
// turns per round through a credit that accumulates w each round, so its
// share of the slots is w over the sum of the weights.
//
// The table depends only on the set of backends and m, not on their order,
// and removing one backend moves few of the others' slots. It returns nil
// for no backends. m must be a prime (Config.Validate checks
// --lb-maglev-table-size): BuildMaglev panics otherwise.
func BuildMaglev(backends []MaglevBackend, m uint32) []uint32 {
	if !isPrime(uint(m)) {
		panic(fmt.Sprintf("maglev: table size %d is not a prime", m))
	}
	if len(backends) == 0 {
		return nil
	}
	table := make([]uint32, m)
	buildMaglevInto(table, backends)
	return table
}

// Seeds of the two hashes that place a backend. Changing them reshuffles
// every table, and with it every flow that is not in conntrack.
const (
	maglevOffsetSeed = "l4xds-maglev-offset"
	maglevSkipSeed   = "l4xds-maglev-skip"
)

// maglevState is one backend's walk through its permutation.
type maglevState struct {
	id     uint32
	weight uint64
	credit uint64
	pos    uint64 // the next slot it prefers
	skip   uint64
}

func buildMaglevInto(table []uint32, backends []MaglevBackend) {
	m := uint64(len(table))
	order := slices.Clone(backends)
	slices.SortFunc(order, func(a, b MaglevBackend) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.ID, b.ID))
	})
	states := make([]maglevState, len(order))
	var maxWeight uint64
	for i, be := range order {
		w := max(uint64(be.Weight), 1)
		maxWeight = max(maxWeight, w)
		states[i] = maglevState{
			id:     be.ID,
			weight: w,
			pos:    fnv1a(maglevOffsetSeed, be.Key) % m,
			skip:   fnv1a(maglevSkipSeed, be.Key)%(m-1) + 1,
		}
	}

	filled := make([]bool, m)
	for n := uint64(0); n < m; {
		for i := range states {
			s := &states[i]
			s.credit += s.weight
			if s.credit < maxWeight {
				continue
			}
			s.credit -= maxWeight
			for filled[s.pos] {
				s.pos = (s.pos + s.skip) % m
			}
			table[s.pos] = s.id
			filled[s.pos] = true
			s.pos = (s.pos + s.skip) % m
			if n++; n == m {
				break
			}
		}
	}
}

// fnv1a is the 64-bit FNV-1a hash of seed followed by key.
func fnv1a(seed, key string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(seed); i++ {
		h = (h ^ uint64(seed[i])) * prime64
	}
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime64
	}
	return h
}
