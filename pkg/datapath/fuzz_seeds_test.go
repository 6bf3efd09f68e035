// SPDX-License-Identifier: Apache-2.0

package datapath

// fuzzSeed is a hand-made input of FuzzDatapath, written in the order
// decodeScenario reads it.
type fuzzSeed struct {
	name string
	b    []byte
}

func (s fuzzSeed) bytes() []byte { return s.b }

func fuzzSeeds() []fuzzSeed { return nil }
