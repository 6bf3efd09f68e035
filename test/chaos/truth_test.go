// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// truth is what the control planes did and when: what the agent is judged
// by. Every change is recorded before it is made, so that whatever the
// agent shows of it is already known here.
type truth struct {
	mu      sync.Mutex
	begin   time.Time
	servers []*serverTruth
	// lines is the schedule so far, as run: each step and settle at its
	// time since begin.
	lines []string
}

// serverTruth is one control plane's history.
type serverTruth struct {
	addr   string
	runs   []transition
	writes []write
}

type transition struct {
	at time.Time
	to run
}

type write struct {
	at    time.Time
	state *state
}

func newTruth(addrs []string) *truth {
	tr := &truth{begin: time.Now()}
	for _, a := range addrs {
		tr.servers = append(tr.servers, &serverTruth{addr: a, runs: []transition{{tr.begin, down}}})
	}
	return tr
}

// record notes a step about to be carried out.
func (tr *truth) record(st step) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	now := time.Now()
	s := tr.servers[st.server]
	switch st.action {
	case start, resume:
		s.runs = append(s.runs, transition{now, up})
	case kill:
		s.runs = append(s.runs, transition{now, down})
	case restart:
		s.runs = append(s.runs, transition{now, down}, transition{now, up})
	case hang:
		s.runs = append(s.runs, transition{now, hung})
	case serve:
		s.writes = append(s.writes, write{now, st.state})
	}
	tr.lines = append(tr.lines, fmt.Sprintf("%8s  %s", tr.since(now), st))
}

// note adds a line to the schedule as run.
func (tr *truth) note(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf("%8s  ", tr.since(time.Now()))+fmt.Sprintf(format, args...))
}

func (tr *truth) since(t time.Time) string {
	return fmt.Sprintf("+%.1fs", t.Sub(tr.begin).Seconds())
}

// schedule is the schedule so far, one line a step.
func (tr *truth) schedule() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n")
}

// runAt is the server's run at t and since when.
func (s *serverTruth) runAt(t time.Time) (run, time.Time) {
	r := s.runs[0]
	for _, x := range s.runs {
		if x.at.After(t) {
			break
		}
		r = x
	}
	return r.to, r.at
}

func (s *serverTruth) now() (run, time.Time) { return s.runAt(time.Now()) }

// current is the state its file holds.
func (s *serverTruth) current() *state { return s.stateAt(time.Now()) }

// stateAt is the state its file held at t (its first before it was
// written).
func (s *serverTruth) stateAt(t time.Time) *state {
	st := s.writes[0].state
	for _, w := range s.writes {
		if w.at.After(t) {
			break
		}
		st = w.state
	}
	return st
}

// reloadSlack covers a server's reading of its file: a watch that waits
// for the writes to stop (100 ms, at most a second), on a loaded machine.
const reloadSlack = 5 * time.Second

// mayServe is every state the server may have served since t0: none if it
// never ran since; else the one it held at t0 (or, if it was down then,
// when it first started after), and every state written since.
func (s *serverTruth) mayServe(t0 time.Time) []*state {
	from := t0
	switch r, since := s.runAt(t0); r {
	case hung:
		// Hung since before t0: it holds what its file held then.
		from = since
	case down:
		started := false
		for _, x := range s.runs {
			if x.at.After(t0) && x.to != down {
				from, started = x.at, true
				break
			}
		}
		if !started {
			return nil
		}
	}
	from = from.Add(-reloadSlack)
	out := []*state{s.stateAt(from)}
	for _, w := range s.writes {
		if w.at.After(from) {
			out = append(out, w.state)
		}
	}
	return out
}

// hungFor is how long the server was hung between t0 and t1.
func (s *serverTruth) hungFor(t0, t1 time.Time) time.Duration {
	var d time.Duration
	for i, x := range s.runs {
		if x.to != hung {
			continue
		}
		end := t1
		if i+1 < len(s.runs) && s.runs[i+1].at.Before(t1) {
			end = s.runs[i+1].at
		}
		if from := maxTime(x.at, t0); end.After(from) {
			d += end.Sub(from)
		}
	}
	return d
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// target is the server the agent must use: the first of the list that is
// up, -1 when none is (gRFC A71).
func (tr *truth) target() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, s := range tr.servers {
		if r, _ := s.now(); r == up {
			return i
		}
	}
	return -1
}

// required is what the agent's tables must hold at every moment after a
// settle at t0 that left them as settled: each frontend, and each backend
// of a frontend, that the settled tables held and that every server the
// agent may have used since serves in every state it may have served.
// sources says which servers and states that was.
func (tr *truth) required(t0 time.Time, settled view) (need map[string]bool, sources string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	need = settled.members()
	var parts []string
	for i, s := range tr.servers {
		states := s.mayServe(t0)
		if len(states) == 0 {
			continue
		}
		var names []string
		for _, st := range states {
			names = append(names, st.String())
			m := st.view().members()
			maps.DeleteFunc(need, func(k string, _ bool) bool { return !m[k] })
		}
		parts = append(parts, fmt.Sprintf("cp%d %s", i+1, strings.Join(slices.Compact(names), ",")))
	}
	return need, strings.Join(parts, "; ")
}

// possible is every frontend and backend some state the agent may have
// had since t0 holds: the settled tables', or one a server may have served.
func (tr *truth) possible(t0 time.Time, settled view) map[string]bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	all := settled.members()
	for _, s := range tr.servers {
		for _, st := range s.mayServe(t0) {
			maps.Copy(all, st.view().members())
		}
	}
	return all
}
