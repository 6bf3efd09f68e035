// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// probeReport is what `l4xds-traffic probe -o json` prints.
type probeReport struct {
	To       string            `json:"to"`
	Proto    string            `json:"proto"`
	Flows    int               `json:"flows"`
	Size     int               `json:"size"`
	Answered int               `json:"answered"`
	Backends map[string]int    `json:"backends"`
	Errors   map[string]int    `json:"errors"`
	Examples map[string]string `json:"examples"`
}

func (r probeReport) String() string {
	sized := ""
	if r.Size > 0 {
		sized = fmt.Sprintf(" of %d bytes", r.Size)
	}
	s := fmt.Sprintf("%s %s: %d flows%s, %d answered", r.Proto, r.To, r.Flows, sized, r.Answered)
	for _, b := range slices.Sorted(maps.Keys(r.Backends)) {
		s += fmt.Sprintf(", %s %d", b, r.Backends[b])
	}
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		s += fmt.Sprintf(", %d %q (%s)", r.Errors[k], k, r.Examples[k])
	}
	return s
}

// share is the percentage of the flows backend answered.
func (r probeReport) share(backend string) float64 {
	return 100 * float64(r.Backends[backend]) / float64(r.Flows)
}

// probe opens flows new flows from namespace ns to the address
// (l4xds-traffic probe) and returns the report, failed flows included.
func probe(t *testing.T, bin, ns, to, proto string, flows int, extra ...string) probeReport {
	t.Helper()
	r, err := runProbe(bin, ns, to, proto, flows, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runProbe is probe for a goroutine other than the test's.
func runProbe(bin, ns, to, proto string, flows int, extra ...string) (probeReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{"probe", "--to", to, "--proto", proto, "--flows", fmt.Sprint(flows), "-o", "json"}, extra...)
	out, err := netns.Command(ctx, ns, filepath.Join(bin, "l4xds-traffic"), args...).Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return probeReport{}, fmt.Errorf("l4xds-traffic %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr(err))
	}
	var r probeReport
	if err := json.Unmarshal(out, &r); err != nil {
		return probeReport{}, fmt.Errorf("l4xds-traffic %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return r, nil
}

func stderr(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(exit.Stderr)
	}
	return ""
}

// probe sends flows from the client to the frontend.
func (e *lbEnv) probe(t *testing.T, f frontend, flows int, extra ...string) probeReport {
	t.Helper()
	r := probe(t, e.bin, e.topo.Client, f.dial(), strings.ToLower(f.proto), flows, extra...)
	t.Logf("%s", r)
	return r
}

// hold is a long-lived TCP connection from the client (l4xds-traffic hold).
type hold struct {
	*nsProc
	backend string
}

func (e *lbEnv) hold(t *testing.T, f frontend) *hold {
	t.Helper()
	p := startIn(t, t, e.topo.Client, filepath.Join(e.bin, "l4xds-traffic"), "hold", "--to", f.dial(), "--interval", "100ms")
	p.WaitOutput(t, "connected ", 10*time.Second)
	h := &hold{nsProc: p}
	for _, l := range strings.Split(p.Output(), "\n") {
		if b, ok := strings.CutPrefix(l, "connected "); ok {
			h.backend = b
		}
	}
	return h
}

// echoes counts the successful echoes so far.
func (h *hold) echoes() int { return strings.Count(h.Output(), "\nok ") }

// check fails the test when the connection failed or moved, and waits
// until it has echoed at least n more times, so that a check right after a
// change proves the connection carries traffic after it.
func (h *hold) check(t *testing.T, more int) {
	t.Helper()
	want := h.echoes() + more
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := h.Output()
		if h.Exited() || strings.Contains(out, "\nfail ") {
			t.Fatalf("the long-lived connection to %s failed:\n%s", h.backend, tail(out, 10))
		}
		if strings.Count(out, "\nok ") != strings.Count(out, "\nok "+h.backend+" ") {
			t.Fatalf("the long-lived connection to %s was answered by another backend:\n%s", h.backend, tail(out, 10))
		}
		if h.echoes() >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the long-lived connection to %s stalled (want %d echoes):\n%s", h.backend, want, tail(out, 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// flowLoop makes new flows to a frontend from the client, in rounds of 20,
// until stopped or the test ends.
type flowLoop struct {
	fe             frontend
	stopping, done chan struct{}
	halt           sync.Once

	mu     sync.Mutex
	rounds []probeReport
}

func (e *lbEnv) newFlowLoop(t *testing.T, fe frontend) *flowLoop {
	l := &flowLoop{fe: fe, stopping: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(l.end) // a failed check ends the test before it stops the loop
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stopping:
				return
			default:
			}
			r, err := runProbe(e.bin, e.topo.Client, fe.dial(), strings.ToLower(fe.proto), 20, "--concurrency", "4", "--timeout", "3s")
			if err != nil {
				r = probeReport{Proto: fe.proto, To: fe.dial(), Flows: 1,
					Errors: map[string]int{"probe failed": 1}, Examples: map[string]string{"probe failed": err.Error()}}
			}
			l.mu.Lock()
			l.rounds = append(l.rounds, r)
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *flowLoop) roundsSoFar() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rounds)
}

// waitRounds waits until more rounds have been made.
func (l *flowLoop) waitRounds(t *testing.T, more int) {
	t.Helper()
	want := l.roundsSoFar() + more
	for deadline := time.Now().Add(30 * time.Second); l.roundsSoFar() < want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: fewer than %d rounds of new flows in 30s", l.fe, more)
		}
	}
}

// end ends the loop, once, and waits for its last round.
func (l *flowLoop) end() {
	l.halt.Do(func() { close(l.stopping) })
	<-l.done
}

// stop ends the loop and returns the number of flows and the rounds that
// had failed flows.
func (l *flowLoop) stop() (flows int, failed []string) {
	l.end()
	for _, r := range l.rounds {
		flows += r.Flows
		if r.Answered != r.Flows {
			failed = append(failed, r.String())
		}
	}
	return flows, failed
}

// flowLoops are loops run side by side.
type flowLoops []*flowLoop

// waitRounds waits until every loop has made more rounds.
func (ls flowLoops) waitRounds(t *testing.T, more int) {
	t.Helper()
	for _, l := range ls {
		l.waitRounds(t, more)
	}
}
