// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// run is what a control plane's process is doing.
type run int

const (
	down run = iota // not running: never started, killed
	up              // running
	hung            // SIGSTOPped
)

func (r run) String() string { return [...]string{"down", "up", "hung"}[r] }

// action is one fault, or one repair, of a control plane.
type action string

const (
	start   action = "start"   // start it on its address
	kill    action = "kill"    // SIGKILL
	restart action = "restart" // SIGKILL or SIGTERM, then start on the same address
	hang    action = "hang"    // SIGSTOP
	resume  action = "resume"  // SIGCONT
	serve   action = "serve"   // rewrite its resources file: another state
)

// step is one action of the schedule, after a pause.
type step struct {
	pause  time.Duration
	action action
	server int // index in the agent's list, from 0
	// state is the state a serve step writes.
	state *state
	// graceful: a restart by SIGTERM rather than SIGKILL.
	graceful bool
}

func (s step) String() string {
	line := fmt.Sprintf("%s cp%d", s.action, s.server+1)
	switch {
	case s.action == serve:
		line += " " + s.state.describe()
	case s.action == restart && s.graceful:
		line += " (SIGTERM)"
	case s.action == restart:
		line += " (SIGKILL)"
	}
	return line
}

// schedule makes the faults from the seed: bursts of steps, each burst
// followed by a settle. The steps depend on the seed and the run's
// settings only, never on timing: a seed replays the same steps.
type schedule struct {
	rnd *rand.Rand
	// plan is each server's run as the steps so far leave it.
	plan []run
	// hangsAcrossSettles lets a server stay hung through a settle. An
	// agent connected to a hung server notices only when its keepalive
	// fails (a minute and more): long runs only.
	hangsAcrossSettles bool
	states             int
}

func newSchedule(seed uint64, long bool) *schedule {
	return &schedule{rnd: rand.New(rand.NewPCG(seed, 0x636861)), hangsAcrossSettles: long}
}

// servers is how many control planes the seed runs (two or three), and
// protocol the xDS protocol the agent speaks.
func (s *schedule) servers() (n int, protocol string) {
	n = 2 + s.rnd.IntN(2)
	s.plan = make([]run, n)
	protocol = "sotw"
	if s.rnd.IntN(2) == 1 {
		protocol = "delta"
	}
	return n, protocol
}

// newState makes the next state.
func (s *schedule) newState() *state {
	st := randomState(s.rnd, s.states)
	s.states++
	return st
}

// burst is the next burst of steps: one to four faults with pauses of up
// to 2.5 s (none at times, so that faults land together), half of them on
// the first server up, then maybe the repairs that bring every server
// back.
func (s *schedule) burst() []step {
	var steps []step
	add := func(st step) {
		steps = append(steps, st)
		switch st.action {
		case start, restart, resume:
			s.plan[st.server] = up
		case kill:
			s.plan[st.server] = down
		case hang:
			s.plan[st.server] = hung
		}
	}
	pause := func() time.Duration {
		if s.rnd.IntN(100) < 30 {
			return 0
		}
		return 100*time.Millisecond + time.Duration(s.rnd.Int64N(int64(2400*time.Millisecond)))
	}
	for range 1 + s.rnd.IntN(4) {
		// Half the faults hit the server the agent should be using: a
		// failure there is what moves it along the list.
		i := s.rnd.IntN(len(s.plan))
		if first := slices.Index(s.plan, up); first >= 0 && s.rnd.IntN(2) == 0 {
			i = first
		}
		st := step{pause: pause(), server: i}
		p := s.rnd.IntN(100)
		switch s.plan[i] {
		case down:
			st.action = start
			if p < 30 {
				st.action = serve
			}
		case up:
			switch {
			case p < 25:
				st.action = kill
			case p < 45:
				st.action = restart
				st.graceful = s.rnd.IntN(2) == 0
			case p < 60:
				st.action = hang
			default:
				st.action = serve
			}
		case hung:
			switch {
			case p < 50:
				st.action = resume
			case p < 75:
				st.action = kill
			default:
				st.action = serve
			}
		}
		if st.action == serve {
			st.state = s.newState()
		}
		add(st)
	}
	heal := s.rnd.IntN(100) < 25
	for i, r := range s.plan {
		switch {
		case r == hung && (heal || !s.hangsAcrossSettles):
			add(step{pause: pause(), action: resume, server: i})
		case r == down && heal:
			add(step{pause: pause(), action: start, server: i})
		}
	}
	return steps
}
