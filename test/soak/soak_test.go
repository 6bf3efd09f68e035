// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/test/netns"
)

// As root, the soak runs in network, mount and PID namespaces of its own:
// nothing it makes outlives it.
func TestMain(m *testing.M) { netns.Main(m) }

// Settings of a run.
const (
	// defaultDuration is the run inside `make test`; SOAK_DURATION sets
	// another (`make soak`).
	defaultDuration = 2 * time.Minute
	// settle bounds how long a change of the resources takes to reach the
	// datapath (see history.settle); ioTimeout is the clients' patience.
	settle    = 10 * time.Second
	ioTimeout = 5 * time.Second
	// Clients: workers opening new flows, long-lived connections.
	newFlowWorkers = 4
	longFlows      = 4
)

// The soak: the real control plane rewrites its resources several times a
// second (weights, DRAINING, backends added and removed, services added
// and removed, a VIP moved) and is restarted at random moments, the agent
// is SIGKILLed and restarted, while clients keep opening TCP and UDP flows
// and holding TCP connections through the VIPs. No flow fails unless the
// churn took its frontend or its backend away; at the end the agent's
// tables and the pinned maps agree entry for entry, nothing is left in
// the maps of what was removed, no conntrack entry of a finished flow
// outlives its lifetime, and the agent's heap, goroutines and open files
// are as in the first quarter of the run. Every figure is printed as a
// SOAK line; SOAK_SEED replays the same churn.
func TestPrivilegedSoak(t *testing.T) {
	duration, seed := netns.RunSettings(t, "SOAK", defaultDuration, 20*time.Second)
	w := newWorld()
	e := newEnv(t, w.services)
	report(t, "seed=%d duration=%s (SOAK_SEED=%d replays this churn)", seed, duration, seed)

	if err := e.apply(w.yaml()); err != nil {
		t.Fatal(err)
	}
	if err := e.startControlPlane(); err != nil {
		t.Fatal(err)
	}
	if err := e.startAgent(); err != nil {
		t.Fatal(err)
	}
	e.waitTable(t, w.frontends(), "at the start")

	h := newHistory(settle, ioTimeout)
	var worldMu sync.Mutex
	begin := time.Now()
	for _, s := range w.servedServices() {
		h.record(begin.Add(-settle), change{service: s.name, backend: -1, added: s.frontends})
	}
	c := &clients{ns: e.topo.Client, timeout: ioTimeout, targets: func() []target {
		worldMu.Lock()
		defer worldMu.Unlock()
		now := time.Now()
		var ts []target
		for _, s := range w.servedServices() {
			for _, f := range s.frontends {
				// Frontends that come and go get flows once settled.
				if s.kind == steady || s.kind == members || h.settled(f, now) {
					ts = append(ts, target{f, s.name})
				}
			}
		}
		return ts
	}}
	c.start(seed, newFlowWorkers, longFlows)
	defer c.halt()

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	// The churn: a change every 50 to 250 ms.
	var changes int
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(seed, 100))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50*time.Millisecond + time.Duration(rnd.Int64N(int64(200*time.Millisecond)))):
			}
			worldMu.Lock()
			ch := w.mutate(rnd)
			yaml := w.yaml()
			worldMu.Unlock()
			if err := e.apply(yaml); err != nil {
				errs <- err
				return
			}
			h.record(time.Now(), ch)
			changes++
		}
	}()
	// The faults: the control plane restarted every 10 to 40 s, the agent
	// SIGKILLed every 15 to 45 s in the middle half of the run only, so
	// that the first and the last quarter each see one agent throughout
	// (see the resource check).
	go func() {
		defer wg.Done()
		errs <- e.faults(ctx, rand.New(rand.NewPCG(seed, 200)), h, begin, duration)
	}()

	// Sample the agent's resources while the run lasts.
	scr := newScraper(e.topo.LB, metricsAddr)
	every := min(max(duration/60, 2*time.Second), 30*time.Second)
	var samples []sample
	failedScrapes := 0
	end := begin.Add(duration)
	nextProgress := begin.Add(5 * time.Minute)
	for tick := time.NewTicker(every); time.Now().Before(end); <-tick.C {
		if now := time.Now(); now.After(nextProgress) {
			// A long run says how it goes.
			flows, answered, failed := c.counts()
			t.Logf("after %s: %s, %d answered, %d failed; control plane restarts %d, agent SIGKILLs %d",
				now.Sub(begin).Round(time.Minute), countsLine(flows), answered, len(failed), h.restarts("control plane"), h.restarts("agent"))
			nextProgress = nextProgress.Add(5 * time.Minute)
		}
		if s, err := scr.scrape(); err == nil {
			samples = append(samples, s)
		} else {
			failedScrapes++ // the agent is down or starting
		}
		if len(errs) > 0 {
			break
		}
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	c.halt()
	halted := time.Now()
	runFor := halted.Sub(begin)
	if t.Failed() {
		t.FailNow()
	}

	// Flows: every failure blamed on what the churn did, or on nothing.
	flows, answered, failed := c.counts()
	total := 0
	for _, n := range flows {
		total += n
	}
	verdicts := map[verdict][]flow{}
	for _, f := range failed {
		v := h.blame(f, halted)
		verdicts[v] = append(verdicts[v], f)
	}
	report(t, "churn: %d changes in %s (%.1f/s): %s; control plane restarts %d, agent SIGKILLs %d",
		changes, runFor.Round(time.Second), float64(changes)/runFor.Seconds(), countsLine(h.changes),
		h.restarts("control plane"), h.restarts("agent"))
	report(t, "flows: %d (%s), %d answered; failed on stable services %d; reset on removed backends %d; no answer while the service lost a backend %d; to removed frontends %d",
		total, countsLine(flows), answered, len(verdicts[onStable]), len(verdicts[removedBackend]),
		len(verdicts[serviceLostBackend]), len(verdicts[removedFrontend]))
	for _, v := range []verdict{removedBackend, serviceLostBackend, removedFrontend} {
		for _, f := range verdicts[v][:min(3, len(verdicts[v]))] {
			t.Logf("%s, e.g. %s", v, f)
		}
	}
	if n := len(verdicts[onStable]); n > 0 {
		var lines []string
		for _, f := range verdicts[onStable][:min(20, n)] {
			lines = append(lines, f.String())
		}
		t.Errorf("%d flows failed on services that kept their frontend and backend (seed %d):\n%s", n, seed, strings.Join(lines, "\n"))
	}
	if answered == 0 || flows["new TCP"] == 0 || flows["new UDP"] == 0 || flows["long TCP"] == 0 {
		t.Errorf("the clients made too little traffic to judge: %s", countsLine(flows))
	}

	// The end: the tables hold what the control plane serves, the maps
	// what the tables hold.
	e.waitTable(t, w.frontends(), "after the run")
	var problems []string
	var fig mapsFigures
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var err error
		// Done rows are written; what was removed goes by Prune, after.
		problems, fig, err = e.mapsDiffer(w.frontends())
		if err != nil {
			t.Fatal(err)
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	report(t, "maps: %d services, %d backends, %d Maglev tables; %d differences from the tables", fig.services, fig.backends, fig.maglevTables, len(problems))
	if len(problems) > 0 {
		_, out, _ := e.lbList()
		t.Errorf("the pinned maps and the tables disagree 30 s after the tables converged:\n%s\nl4xds-dbg bpf lb list -o json:\n%s",
			strings.Join(problems, "\n"), tail(out, 80))
	}

	e.checkConntrack(t, w, h, halted)
	checkResources(t, samples, failedScrapes, begin, halted)
	if err := e.crashed(); err != nil {
		t.Error(err)
	}
}

// faults restarts the control plane and the agent at random moments until
// ctx ends, then makes sure both run.
func (e *env) faults(ctx context.Context, rnd *rand.Rand, h *history, begin time.Time, duration time.Duration) error {
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rnd.Int64N(int64(hi-lo))) }
	nextCP := time.Now().Add(between(10*time.Second, 40*time.Second))
	agentFrom, agentTo := begin.Add(duration/4), begin.Add(3*duration/4)
	nextAgent := agentFrom.Add(between(0, 15*time.Second))
	down := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for {
		if err := e.crashed(); err != nil {
			return err
		}
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return nil
		case now.After(nextCP):
			h.down("control plane", now)
			e.killControlPlane(rnd.IntN(2) == 0)
			down(between(200*time.Millisecond, 3*time.Second))
			if err := e.startControlPlane(); err != nil {
				return err
			}
			h.up("control plane", time.Now())
			nextCP = time.Now().Add(between(10*time.Second, 40*time.Second))
		case now.After(nextAgent) && now.Before(agentTo):
			h.down("agent", now)
			e.killAgent()
			down(between(200*time.Millisecond, 2*time.Second))
			if err := e.startAgent(); err != nil {
				return err
			}
			h.up("agent", time.Now())
			nextAgent = time.Now().Add(between(15*time.Second, 45*time.Second))
		default:
			if !down(200 * time.Millisecond) {
				return nil
			}
		}
	}
}

// waitTable waits until the frontends table holds exactly want, every row
// reconciled.
func (e *env) waitTable(t *testing.T, want map[string][]string, when string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		rows, out, err := e.frontendRows()
		last = out
		if err == nil {
			if got, done := tableFrontends(rows); done && maps.EqualFunc(got, want, slices.Equal) {
				return
			}
		}
		if err := e.crashed(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the frontends table never became %v, all Done; last `l4xds-dbg statedb frontends -o json`:\n%s", when, want, tail(last, 60))
		}
	}
}

// checkConntrack reads the conntrack map once every finished flow's entry
// has outlived its lifetime (a closed TCP flow's, a UDP flow's, a flow's
// never established): what is
// left alive belongs to flows whose end the datapath could not see, their
// frontend or backend gone. An entry of a frontend and backend that stayed
// would never expire: a leak.
func (e *env) checkConntrack(t *testing.T, w *world, h *history, halted time.Time) {
	t.Helper()
	wait := time.Until(halted.Add(max(datapath.CTLifetimeNonTCP, datapath.CTLifetimeTCPClosing, datapath.CTLifetimeNew) + 2*time.Second))
	t.Logf("waiting %s for the conntrack entries of the last flows to expire", wait.Round(time.Second))
	time.Sleep(wait)
	// Read in place with the datapath's readers (those of l4xds-dbg bpf
	// ct list): after an hour the LRU map is full, a million entries.
	m, err := datapath.OpenPinnedMaps(e.bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	backendAt := map[uint32]datapath.BackendEntry{}
	for b, err := range m.Backends() {
		if err != nil {
			t.Fatal(err)
		}
		backendAt[b.ID] = b
	}
	flows, err := datapath.OpenPinnedFlows(e.bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer flows.Close()
	now, err := datapath.Ktime()
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]*service{} // frontend -> service, every VIP it had
	for _, s := range w.services {
		for _, f := range s.frontends {
			for _, vip := range append([]string{f.vip}, s.vips...) {
				f.vip = vip
				owner[f.String()] = s
			}
		}
	}
	var entries, expired, gone int
	var leaked []string
	for c, err := range flows.Conntrack() {
		if err != nil {
			t.Fatal(err)
		}
		entries++
		if c.Remaining(now) <= 0 {
			expired++
			continue
		}
		fe := c.Frontend.String() + "/" + string(c.Protocol)
		s := owner[fe]
		addr := c.Backend // a reply entry's; a forward entry names an ID
		if b, ok := backendAt[c.BackendID]; !c.Reply && ok && b.ServiceID == c.ServiceID {
			addr = b.Address
		}
		backend := -1
		for i := range backends {
			if s != nil && addr == netip.AddrPortFrom(netns.BackendIPv4(i), s.port) {
				backend = i
			}
		}
		if s == nil || h.frontendEverRemoved(fe) || backend < 0 || h.backendEverRemoved(s.name, backend) {
			gone++
			continue
		}
		leaked = append(leaked, fmt.Sprintf("%+v", c))
	}
	report(t, "conntrack: %d entries, %d expired, %d alive of frontends or backends removed during the run (their end unseen; reclaimed by the LRU or at their lifetime), %d alive of finished flows on stable services",
		entries, expired, gone, len(leaked))
	if len(leaked) > 0 {
		t.Errorf("%d conntrack entries of finished flows on frontends and backends that stayed are still alive after every flow ended:\n%s",
			len(leaked), strings.Join(leaked[:min(20, len(leaked))], "\n"))
	}
}

// checkResources compares the agent's heap, goroutines and open files of
// the last quarter of the run with the first.
func checkResources(t *testing.T, samples []sample, failed int, begin, end time.Time) {
	t.Helper()
	q := end.Sub(begin) / 4
	var lines []string
	for _, f := range flatnessBounds {
		first := summarise(samples, f.metric, begin, begin.Add(q))
		last := summarise(samples, f.metric, end.Add(-q), end)
		lines = append(lines, fmt.Sprintf("%s %s first quarter %.0f (%d samples, %.0f..%.0f), last %.0f (%d samples, %.0f..%.0f)",
			f.metric, f.label, f.of(first), first.n, first.min, first.max, f.of(last), last.n, last.min, last.max))
		if first.n < 2 || last.n < 2 {
			t.Errorf("%s: %d samples in the first quarter, %d in the last: too few to compare", f.metric, first.n, last.n)
			continue
		}
		if err := f.check(first, last); err != nil {
			t.Error(err)
		}
	}
	first, last := summarise(samples, heapMetric, begin, begin.Add(q)), summarise(samples, heapMetric, end.Add(-q), end)
	lines = append(lines, fmt.Sprintf("%s (not compared) first quarter %.0f..%.0f, last %.0f..%.0f", heapMetric, first.min, first.max, last.min, last.max))
	report(t, "agent (%d scrapes, %d while it was down): %s", len(samples), failed, strings.Join(lines, "; "))
}

// report logs a figure and prints it as a SOAK line.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	fmt.Printf("SOAK %s\n", line)
}

func countsLine(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
