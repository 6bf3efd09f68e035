// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"math/rand/v2"
	"time"
)

// Backoff computes the waits between connection attempts: exponential with
// jitter, so that thousands of nodes losing the same server do not come back
// in lockstep. The zero value is not usable; start from DefaultBackoff.
type Backoff struct {
	// Initial is the first wait, and the wait after a stream that received
	// a response.
	Initial time.Duration
	// Max caps every wait, jitter included.
	Max time.Duration
	// Multiplier grows the wait after each failed attempt.
	Multiplier float64
	// Jitter spreads each wait uniformly by ±Jitter of its value.
	Jitter float64
	// Rand returns a number in [0, 1); math/rand when nil. Tests make it
	// deterministic.
	Rand func() float64

	next time.Duration
}

// DefaultBackoff is 1s, ×1.6 per attempt, ±20%, at most 2 minutes.
var DefaultBackoff = Backoff{
	Initial:    time.Second,
	Max:        2 * time.Minute,
	Multiplier: 1.6,
	Jitter:     0.2,
}

// Next returns the wait before the next attempt and grows the following one.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Initial
	}
	base := b.next
	b.next = min(time.Duration(float64(b.next)*b.Multiplier), b.Max)

	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	d := time.Duration(float64(base) * (1 + b.Jitter*(2*r()-1)))
	return max(min(d, b.Max), time.Millisecond)
}

// Reset makes the next wait Initial again.
func (b *Backoff) Reset() { b.next = 0 }
