// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"slices"
	"testing"
	"time"
)

// What a server may have served since a settle: the checks of "never
// removed" are only as right as this.
func TestServerMayServe(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s0, s1, s2, s3 := &state{id: 0}, &state{id: 1}, &state{id: 2}, &state{id: 3}
	for _, c := range []struct {
		name   string
		runs   []transition
		writes []write
		want   []*state
	}{{
		name:   "up throughout: what it held, and what was written since",
		runs:   []transition{{at(-100), down}, {at(-50), up}},
		writes: []write{{at(-90), s0}, {at(-20), s1}, {at(5), s2}},
		want:   []*state{s1, s2},
	}, {
		name:   "a write just before the settle may not be read yet",
		runs:   []transition{{at(-100), down}, {at(-50), up}},
		writes: []write{{at(-90), s0}, {at(-3), s1}},
		want:   []*state{s0, s1},
	}, {
		name:   "hung since before: what it held when it hung, and every write since",
		runs:   []transition{{at(-100), down}, {at(-50), up}, {at(-30), hung}},
		writes: []write{{at(-90), s0}, {at(-20), s1}, {at(5), s2}},
		want:   []*state{s0, s1, s2},
	}, {
		name:   "down, then started: what its file held then, and later writes",
		runs:   []transition{{at(-100), down}, {at(-50), up}, {at(-10), down}, {at(20), up}},
		writes: []write{{at(-90), s0}, {at(-20), s1}, {at(10), s2}, {at(30), s3}},
		want:   []*state{s2, s3},
	}, {
		name:   "down throughout: nothing",
		runs:   []transition{{at(-100), down}, {at(-50), up}, {at(-10), down}},
		writes: []write{{at(-90), s0}, {at(10), s2}},
		want:   nil,
	}} {
		s := &serverTruth{runs: c.runs, writes: c.writes}
		if got := s.mayServe(t0); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Required is what the settled tables held that every state of every
// server the agent may have used holds, frontends and backends apart.
func TestRequiredIsWhatEveryCandidateServes(t *testing.T) {
	t0 := time.Now()
	a := &state{id: 0, services: map[string][]endpoint{"web": {{backend: 0, weight: 1}, {backend: 1, weight: 1}}, "db": {{backend: 2, weight: 1}}}}
	b := &state{id: 1, services: map[string][]endpoint{"web": {{backend: 0, weight: 5, draining: true}}, "dns": {{backend: 0, weight: 1}}}}
	tr := &truth{begin: t0.Add(-time.Minute), servers: []*serverTruth{
		{addr: "cp1", runs: []transition{{t0.Add(-time.Minute), up}}, writes: []write{{t0.Add(-time.Minute), a}}},
		{addr: "cp2", runs: []transition{{t0.Add(-time.Minute), down}, {t0.Add(time.Second), up}}, writes: []write{{t0.Add(-time.Minute), b}}},
	}}
	need, sources := tr.required(t0, a.view())
	want := map[string]bool{"10.1.2.3:8080/TCP web": true, "10.1.2.3:8080/TCP web @ 192.168.1.10:8080": true}
	if len(need) != len(want) {
		t.Fatalf("required %v (from %s), want %v", need, sources, want)
	}
	for k := range want {
		if !need[k] {
			t.Errorf("required %v (from %s) lacks %s", need, sources, k)
		}
	}
	if sources != "cp1 s0; cp2 s1" {
		t.Errorf("sources %q", sources)
	}
}
