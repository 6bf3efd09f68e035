// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// What a failed flow is blamed on: a removal excuses the flows it may have
// broken (its frontend's, or its backend's), from when it was written until
// it has surely reached the datapath, later when the control plane or the
// agent was down meanwhile; nothing else excuses a failure.
func TestBlame(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	db := frontend{"10.1.2.4", 3306, "TCP"}
	game := frontend{"10.1.2.6", 7777, "UDP"}
	moverOld := frontend{"10.1.4.1", 9100, "UDP"}

	h := newHistory(10*time.Second, 5*time.Second)
	h.record(at(-10), change{service: "db", backend: -1, added: []frontend{db}})
	h.record(at(-10), change{service: "game", backend: -1, added: []frontend{game}})
	h.record(at(100), change{what: "backend removed", service: "db", backend: 2})
	h.record(at(200), change{what: "VIP moved", service: "mover", backend: -1, gone: []frontend{moverOld}})
	// The control plane is down from 300 to 330: a removal at 305 reaches
	// the datapath only after it returns.
	h.down("control plane", at(300))
	h.record(at(305), change{what: "backend removed", service: "game", backend: 1})
	h.up("control plane", at(330))

	failed := func(fe frontend, service string, backend int, start, end float64) flow {
		return flow{frontend: fe, service: service, backend: backend, start: at(start), end: at(end), err: errors.New("reset")}
	}
	for _, c := range []struct {
		name string
		f    flow
		want verdict
	}{
		{"its backend removed while it ran", failed(db, "db", 2, 90, 101), removedBackend},
		{"its backend removed, the reset seen a timeout later", failed(db, "db", 2, 105, 114), removedBackend},
		{"started after the removal took effect", failed(db, "db", 2, 111, 112), onStable},
		{"failed before the removal was written", failed(db, "db", 2, 90, 99), onStable},
		{"another backend of the service removed", failed(db, "db", 0, 90, 101), onStable},
		{"no answer while the service lost a backend", failed(db, "db", -1, 100, 103), serviceLostBackend},
		{"no answer, no removal near", failed(db, "db", -1, 150, 153), onStable},
		{"its VIP moved away", failed(moverOld, "mover", 3, 190, 201), removedFrontend},
		{"a removal during an outage, felt after it", failed(game, "game", 1, 310, 332), removedBackend},
		{"the same, started after it took effect", failed(game, "game", 1, 341, 342), onStable},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := h.blame(c.f, at(1000)); got != c.want {
				t.Errorf("%s: blamed on %q, want %q", c.f, got, c.want)
			}
		})
	}
}

// Frontends that come and go get flows only once the datapath surely has
// them: settle after they were added, or after the last outage ended.
func TestSettled(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tmp := frontend{"10.1.3.10", 9200, "TCP"}
	h := newHistory(10*time.Second, 5*time.Second)
	h.record(at(0), change{what: "service added", service: "tmp-0", backend: -1, added: []frontend{tmp}})
	for _, c := range []struct {
		at   float64
		want bool
	}{{5, false}, {10, true}} {
		if got := h.settled(tmp, at(c.at)); got != c.want {
			t.Errorf("%gs after it was added: settled %v, want %v", c.at, got, c.want)
		}
	}
	h.down("agent", at(20))
	if h.settled(tmp, at(21)) {
		t.Errorf("settled while the agent is down")
	}
	h.up("agent", at(22))
	if h.settled(tmp, at(31)) || !h.settled(tmp, at(32)) {
		t.Errorf("want settled 10 s after the agent came back, at 32 s")
	}
	h.record(at(40), change{what: "service removed", service: "tmp-0", backend: -1, gone: []frontend{tmp}})
	if h.settled(tmp, at(60)) {
		t.Errorf("a removed frontend settled")
	}
}

// The churn keeps every served service with a backend for new flows, never
// removes the frontends or backends of a steady service, and the same seed
// makes the same changes.
func TestChurnKeepsABackendForNewFlows(t *testing.T) {
	run := func(seed uint64) []change {
		w := newWorld()
		rnd := rand.New(rand.NewPCG(seed, 100))
		var log []change
		for range 5000 {
			c := w.mutate(rnd)
			log = append(log, c)
			for _, s := range w.servedServices() {
				if s.active() == 0 {
					t.Fatalf("after %q: %s has no backend for new flows: %+v", c, s.name, s.endpoints)
				}
			}
			if c.what == "backend removed" || len(c.gone) > 0 {
				for _, s := range w.services {
					if s.name == c.service && s.kind == steady {
						t.Fatalf("%q changed a steady service", c)
					}
				}
			}
		}
		return log
	}
	a, b := run(7), run(7)
	kinds := map[string]int{}
	for i := range a {
		if a[i].String() != b[i].String() {
			t.Fatalf("seed 7 made %q then %q as change %d", a[i], b[i], i)
		}
		kinds[a[i].what]++
	}
	for _, k := range []string{"weight", "draining", "backend added", "backend removed", "service added", "service removed", "VIP moved"} {
		if kinds[k] == 0 {
			t.Errorf("5000 changes and no %q: %v", k, kinds)
		}
	}
}
