// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"fmt"
	"strings"
	"testing"
)

// lines is the first bursts of a seed's schedule, as the report prints
// them, with the pauses.
func lines(seed uint64, long bool, bursts int) string {
	s := newSchedule(seed, long)
	n, protocol := s.servers()
	var b strings.Builder
	fmt.Fprintf(&b, "%d servers, %s\n", n, protocol)
	for range n {
		fmt.Fprintln(&b, s.newState().describe())
	}
	for i := range s.plan {
		s.plan[i] = up // as the test starts them
	}
	for range bursts {
		for _, st := range s.burst() {
			fmt.Fprintf(&b, "%s %s\n", st.pause, st)
		}
		b.WriteString("settle\n")
	}
	return b.String()
}

// CHAOS_SEED replays a run: the steps depend on the seed alone.
func TestScheduleIsTheSeeds(t *testing.T) {
	a, b := lines(42, false, 200), lines(42, false, 200)
	if a != b {
		t.Fatalf("seed 42 made two schedules:\n%s\n---\n%s", a, b)
	}
	if lines(43, false, 200) == a {
		t.Error("seeds 42 and 43 made the same schedule")
	}
}

// Short runs settle with no server hung (the agent would wait for its
// keepalive, a minute and more); long runs also settle with some hung.
// Every action is drawn, in both.
func TestScheduleHangsAcrossSettlesOnlyInLongRuns(t *testing.T) {
	for _, long := range []bool{false, true} {
		s := newSchedule(7, long)
		s.servers()
		for i := range s.plan {
			s.plan[i] = up
		}
		seen := map[action]int{}
		hungAtSettle := 0
		for range 500 {
			for _, st := range s.burst() {
				seen[st.action]++
				if st.action == serve && st.state == nil {
					t.Fatalf("a serve step without a state: %s", st)
				}
			}
			for _, r := range s.plan {
				if r == hung {
					hungAtSettle++
				}
			}
		}
		if long != (hungAtSettle > 0) {
			t.Errorf("long run %t: %d settles with a server hung", long, hungAtSettle)
		}
		for _, a := range []action{start, kill, restart, hang, resume, serve} {
			if seen[a] == 0 {
				t.Errorf("long run %t: no %s in 500 bursts: %v", long, a, seen)
			}
		}
	}
}
