// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

const (
	// defaultDuration is the run inside `make test`; CHAOS_DURATION sets
	// another (`make chaos`).
	defaultDuration = time.Minute
	// longRun is the duration from which servers may stay hung through a
	// settle: the agent then takes its keepalive's minute and more.
	longRun = 5 * time.Minute
)

// One agent, two or three control planes in its list, and a schedule of
// faults from a seed: bursts of starts, kills, restarts, hangs and new
// states, each burst followed by a settle. Checked on every sample (every
// 100 ms), bursts included: status says connected to a server only while
// it runs, and the tables never lack what the tables held at the last
// settle and every server the agent may have used since still serves. At
// every settle: the tables hold the state of the first server that is up,
// which is in use, connected and healthy; with none up, the tables stay
// as they were (last-known-good) and, every server down, status says so.
// A violation fails the test with the seed and the schedule so far. The
// agent runs without a datapath: no root needed.
func TestChaosFaultSchedules(t *testing.T) {
	bin := netns.Binaries(t)
	duration, seed := settings(t, defaultDuration)
	sched := newSchedule(seed, duration >= longRun)
	n, protocol := sched.servers()
	report(t, "seed=%d duration=%s servers=%d protocol=%s datapath=none (CHAOS_SEED=%d replays this schedule)", seed, duration, n, protocol, seed)
	e := newEnv(t, bin, "", n)
	runSchedule(t, e, sched, seed, duration, func(*truth) { e.startAgent(t, protocol, "--datapath", "none") })
}

// settings are the run's duration (CHAOS_DURATION, else def) and seed
// (CHAOS_SEED, else the time).
func settings(t *testing.T, def time.Duration) (time.Duration, uint64) {
	t.Helper()
	return netns.RunSettings(t, "CHAOS", def, 10*time.Second)
}

// runSchedule starts the servers with their first states and the agent
// (startAgent, given the run's truth), then runs the schedule for duration, checking the agent
// throughout; it fails the test with the seed and the schedule so far at
// the first violation. It returns the truth of the run.
func runSchedule(t *testing.T, e *env, sched *schedule, seed uint64, duration time.Duration, startAgent func(*truth)) *truth {
	t.Helper()
	n := len(sched.plan)
	tr := newTruth(e.addresses())
	for i := range n {
		st := step{action: serve, server: i, state: sched.newState()}
		tr.record(st)
		if err := e.apply(st); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		st := step{action: start, server: i}
		tr.record(st)
		if err := e.apply(st); err != nil {
			t.Fatal(err)
		}
		sched.plan[i] = up
	}
	startAgent(tr)

	obs := newObserver(e, tr)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { obs.run(ctx) })
	defer func() {
		stop()
		wg.Wait()
	}()

	// crashed fails the run when a control plane that should run exited:
	// the schedule no longer says what the agent faces.
	crashed := func() {
		t.Helper()
		if err := e.crashed(tr.runs()); err != nil && !e.agent.Exited() {
			t.Fatalf("%v\nschedule so far (seed %d):\n%s", err, seed, tr.schedule())
		}
	}
	settle := func() bool {
		t.Helper()
		took, ok := obs.settle()
		if ok {
			if target := tr.target(); target >= 0 {
				tr.note("settled on cp%d in %s", target+1, took.Round(time.Millisecond))
			} else {
				tr.note("settled with no server up (last-known-good) in %s", took.Round(time.Millisecond))
			}
		}
		crashed()
		return ok
	}
	// pause waits d, or less if a violation comes first.
	pause := func(d time.Duration) bool {
		select {
		case <-obs.violated:
			return false
		case <-time.After(d):
			return true
		}
	}

	begin := time.Now()
	steps := map[action]int{}
	bursts := 0
	ok := settle()
	for ok && time.Since(begin) < duration {
		bursts++
		for _, st := range sched.burst() {
			if ok = pause(st.pause); !ok {
				break
			}
			tr.record(st)
			if err := e.apply(st); err != nil {
				t.Fatalf("%v\nschedule so far (seed %d):\n%s", err, seed, tr.schedule())
			}
			steps[st.action]++
		}
		if ok {
			ok = settle()
		}
	}
	stop()
	wg.Wait()

	var counts []string
	for _, a := range slices.Sorted(maps.Keys(steps)) {
		counts = append(counts, fmt.Sprintf("%s %d", a, steps[a]))
	}
	report(t, "%d bursts in %s: %s; %s", bursts, time.Since(begin).Round(time.Second), strings.Join(counts, ", "), obs.figures())
	if obs.failure != "" {
		t.Errorf("CHAOS violation (seed %d; CHAOS_SEED=%d replays the schedule) %s\n\nschedule so far (servers in priority order: %s):\n%s\n\nagent output:\n%s",
			seed, seed, obs.failure, strings.Join(e.addresses(), ", "), tr.schedule(), tail(e.agent.Output(), 40))
	}
	return tr
}

// report logs a figure and prints it as a CHAOS line.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log("CHAOS " + line)
	fmt.Printf("CHAOS %s\n", line)
}
