// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
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
	var b maglevBuilder
	for _, be := range backends {
		b.add(be.ID, []byte(be.Key), be.Weight)
	}
	return slices.Clone(b.build(m))
}

// Seeds of the two hashes that place a backend. Changing them reshuffles
// every table, and with it every flow that is not in conntrack.
const (
	maglevOffsetSeed = "l4xds-maglev-offset"
	maglevSkipSeed   = "l4xds-maglev-skip"
)

// rejectKey places the reject share (backend 0) in a table; no backend's
// key, an address, is this.
var rejectKey = []byte("reject")

// The FNV-1a states after each seed, where every key's hash starts.
var (
	maglevOffsetBasis = fnv1a(fnv1aOffset, []byte(maglevOffsetSeed))
	maglevSkipBasis   = fnv1a(fnv1aOffset, []byte(maglevSkipSeed))
)

// maglevBuilder builds tables in buffers it keeps from one build to the
// next: the reconciler builds one per changed service, and a build should
// cost the walk, not allocations.
type maglevBuilder struct {
	keys   []byte // the keys, one after the other
	inputs []maglevInput
	states []maglevState
	filled []bool
	table  []uint32
}

type maglevInput struct {
	id       uint32
	weight   uint16
	from, to int // the key, in keys
}

// maglevState is one backend's walk through its permutation.
type maglevState struct {
	id     uint32
	weight uint64
	credit uint64
	pos    uint64 // the next slot it prefers
	skip   uint64
}

// add adds a backend to the next table; key is copied.
func (b *maglevBuilder) add(id uint32, key []byte, weight uint16) {
	from := len(b.keys)
	b.keys = append(b.keys, key...)
	b.inputs = append(b.inputs, maglevInput{id: id, weight: weight, from: from, to: len(b.keys)})
}

// addAddr adds a backend whose key is its address, as AddrPort.String
// writes it, without allocating it.
func (b *maglevBuilder) addAddr(id uint32, addr netip.AddrPort, weight uint16) {
	from := len(b.keys)
	b.keys = addr.AppendTo(b.keys)
	b.inputs = append(b.inputs, maglevInput{id: id, weight: weight, from: from, to: len(b.keys)})
}

// reset forgets the backends added since the last build.
func (b *maglevBuilder) reset() { b.keys, b.inputs = b.keys[:0], b.inputs[:0] }

// build returns the table of m slots of the backends added since the last
// build, in a buffer that the next build reuses; nil without backends. m
// must be a prime.
func (b *maglevBuilder) build(m uint32) []uint32 {
	defer b.reset()
	if len(b.inputs) == 0 {
		return nil
	}
	b.table = slices.Grow(b.table[:0], int(m))[:m]
	table := b.table
	if len(b.inputs) == 1 {
		// The walk would give every slot to the one backend.
		id := b.inputs[0].id
		for i := range table {
			table[i] = id
		}
		return table
	}

	key := func(in maglevInput) []byte { return b.keys[in.from:in.to] }
	slices.SortFunc(b.inputs, func(x, y maglevInput) int {
		return cmp.Or(bytes.Compare(key(x), key(y)), cmp.Compare(x.id, y.id))
	})
	mm := uint64(m)
	b.states = slices.Grow(b.states[:0], len(b.inputs))[:len(b.inputs)]
	var maxWeight uint64
	for i, in := range b.inputs {
		w := max(uint64(in.weight), 1)
		maxWeight = max(maxWeight, w)
		b.states[i] = maglevState{
			id:     in.id,
			weight: w,
			pos:    fnv1a(maglevOffsetBasis, key(in)) % mm,
			skip:   fnv1a(maglevSkipBasis, key(in))%(mm-1) + 1,
		}
	}

	b.filled = slices.Grow(b.filled[:0], int(m))[:m]
	filled := b.filled
	clear(filled)
	// pos and skip are below m, so a step wraps with a subtraction rather
	// than a division.
	next := func(s *maglevState) {
		if s.pos += s.skip; s.pos >= mm {
			s.pos -= mm
		}
	}
	for n := uint64(0); n < mm; {
		for i := range b.states {
			s := &b.states[i]
			s.credit += s.weight
			if s.credit < maxWeight {
				continue
			}
			s.credit -= maxWeight
			for filled[s.pos] {
				next(s)
			}
			table[s.pos] = s.id
			filled[s.pos] = true
			next(s)
			if n++; n == mm {
				break
			}
		}
	}
	return table
}

const (
	fnv1aOffset = 14695981039346656037
	fnv1aPrime  = 1099511628211
)

// fnv1a continues the 64-bit FNV-1a hash h with data: the hash of a seed
// followed by a key is fnv1a(fnv1a(fnv1aOffset, seed), key).
func fnv1a(h uint64, data []byte) uint64 {
	for _, c := range data {
		h = (h ^ uint64(c)) * fnv1aPrime
	}
	return h
}
