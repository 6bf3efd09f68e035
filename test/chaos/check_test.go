// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/l4xds/l4xds/pkg/xds"
)

// Bounds of the checks: liveness bounds from what the agent does by design,
// never timings; generous, for a loaded machine.
const (
	// sampleEvery is how often the agent's tables and status are read,
	// during the bursts as during the settles.
	sampleEvery = 100 * time.Millisecond
	// convergeBase bounds a settle in which nothing hung and no backoff
	// grew: the first backoff step (1 s), a connection, a response, the
	// tables written.
	convergeBase = 30 * time.Second
	// hungStream is how long a stream to a hung server may last: the
	// agent's keepalive pings after a minute of silence and gives up 20 s
	// later.
	hungStream = 80 * time.Second
	// hungConnect is how long an attempt on a hung server may wait: gRPC's
	// connect timeout, 20 s.
	hungConnect = 20 * time.Second
	// downStatus is how long status may say connected to a killed server,
	// whose socket closed as it died.
	downStatus = 15 * time.Second
	// hungStatus is how long status may say connected to a hung one.
	hungStatus = hungStream + convergeBase
	// quiet: with no server up, the tables have settled once they stayed
	// the same this long.
	quiet = 2 * time.Second
)

// observer samples the agent every sampleEvery and checks every sample:
// status names only servers that run, and the tables lack nothing that
// every server the agent may have used since the last settle serves; and
// it decides when a settle is reached. One goroutine does both, so that a
// sample is judged against the settle it was read after.
type observer struct {
	e  *env
	tr *truth

	mu sync.Mutex
	// settledAt and settled are the last settle: when, and the tables.
	settledAt time.Time
	settled   view
	// lastAllGood is the last settle on the first server with every
	// server up: no backoff of the agent's has grown since.
	lastAllGood time.Time
	pending     *settlement
	// violated is closed at the first violation, which failure says.
	violated chan struct{}
	failure  string

	samples, readErrors int
	settles             map[string]int
	took                []time.Duration
}

// settlement is a settle being waited for.
type settlement struct {
	target  int // -1: none up
	allDown bool
	bound   time.Duration
	began   time.Time
	done    chan struct{}
	// With no target: the tables as last seen, and since when.
	last    view
	changed time.Time
	seen    bool
	// last sample, for the report.
	sample sample
}

func newObserver(e *env, tr *truth) *observer {
	return &observer{e: e, tr: tr, lastAllGood: tr.begin, violated: make(chan struct{}), settles: map[string]int{}}
}

func (o *observer) run(ctx context.Context) {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := o.e.read(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			o.mu.Lock()
			o.readErrors++
			if o.e.agent.Exited() {
				o.violate("the agent exited (%v)", o.e.agent.Cmd.ProcessState)
			}
			o.mu.Unlock()
		} else {
			o.check(s)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// violate records the first violation; o.mu is held.
func (o *observer) violate(format string, args ...any) {
	if o.failure != "" {
		return
	}
	o.failure = fmt.Sprintf("at %s: ", o.tr.since(time.Now())) + fmt.Sprintf(format, args...)
	close(o.violated)
}

func (o *observer) check(s sample) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failure != "" {
		return
	}
	o.samples++
	o.checkStatus(s)
	if !o.settledAt.IsZero() {
		need, sources := o.tr.required(o.settledAt, o.settled)
		have := s.view.members()
		var missing []string
		for k := range need {
			if !have[k] {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			o.violate("the agent's tables lack %s, which the tables held at the last settle (%s) and every server the agent may have used since serves (%s); the tables:\n%s",
				strings.Join(missing, ", "), o.tr.since(o.settledAt), sources, s.view)
		}
	}
	if p := o.pending; p != nil && o.failure == "" {
		o.checkSettle(p, s)
	}
}

// checkStatus: the agent says connected to a server only while it runs:
// not a bound after it was killed, nor after it hung.
func (o *observer) checkStatus(s sample) {
	says := map[string][]string{}
	for _, r := range s.servers {
		if r.State == xds.ConnConnected {
			says[r.Address] = append(says[r.Address], fmt.Sprintf("xds-servers row %d", r.Priority))
		}
	}
	for _, r := range s.types {
		if r.State == xds.ConnConnected {
			says[r.Server] = append(says[r.Server], "xds-status "+xds.ShortTypeName(r.TypeURL))
		}
	}
	if addr, ok := healthConnected(s); ok {
		says[addr] = append(says[addr], fmt.Sprintf("health %q", s.xdsHealth.Message))
	}
	for addr, what := range says {
		i := slices.Index(o.e.addresses(), addr)
		if i < 0 {
			o.violate("%s names %q, which is not a server of the list", strings.Join(what, ", "), addr)
			return
		}
		r, since := o.tr.run(i)
		switch {
		case r == down && s.at.Sub(since) > downStatus:
			o.violate("%s say connected to cp%d (%s), killed %s before (bound %s)",
				strings.Join(what, ", "), i+1, addr, s.at.Sub(since).Round(time.Millisecond), downStatus)
		case r == hung && s.at.Sub(since) > hungStatus:
			o.violate("%s say connected to cp%d (%s), hung %s before (bound %s)",
				strings.Join(what, ", "), i+1, addr, s.at.Sub(since).Round(time.Millisecond), hungStatus)
		}
	}
}

// healthConnected is the server the xDS client's health says it is
// connected to and synced from, if it says so.
func healthConnected(s sample) (string, bool) {
	rest, ok := strings.CutPrefix(s.xdsHealth.Message, "connected to ")
	if !ok || s.xdsHealth.Level != cell.StatusOK {
		return "", false
	}
	addr, _, _ := strings.Cut(rest, ",")
	return addr, true
}

// checkSettle decides whether the sample reaches the pending settle:
// with a target, its state in the tables and the target in use,
// connected and healthy; with none, the tables unchanged for a while, and
// (every server down) status not connected.
func (o *observer) checkSettle(p *settlement, s sample) {
	p.sample = s
	reached := false
	if p.target >= 0 {
		want := o.tr.current(p.target).view()
		i := slices.IndexFunc(s.servers, func(r *xds.ServerStatus) bool { return r.Priority == p.target+1 })
		addr, healthy := healthConnected(s)
		reached = s.view.equal(want) && i >= 0 && s.servers[i].InUse && s.servers[i].State == xds.ConnConnected &&
			healthy && addr == o.e.servers[p.target].addr
	} else {
		if !p.seen || !s.view.equal(p.last) {
			p.last, p.changed, p.seen = s.view, s.at, true
		}
		_, healthy := healthConnected(s)
		connected := healthy || slices.ContainsFunc(s.servers, func(r *xds.ServerStatus) bool { return r.State == xds.ConnConnected })
		reached = s.at.Sub(p.changed) >= quiet && (!p.allDown || !connected)
		if reached {
			// Last-known-good: nothing the agent could not have had.
			possible := o.tr.possible(o.settledAt, o.settled)
			var extra []string
			for k := range s.view.members() {
				if !possible[k] {
					extra = append(extra, k)
				}
			}
			if len(extra) > 0 {
				slices.Sort(extra)
				o.violate("with no server up the agent's tables hold %s, which no server served since the last settle:\n%s",
					strings.Join(extra, ", "), s.view)
				return
			}
		}
	}
	if reached {
		o.settledAt, o.settled = s.at, s.view
		if p.target == 0 && o.tr.allUp() {
			o.lastAllGood = s.at
		}
		o.took = append(o.took, s.at.Sub(p.began))
		if p.target >= 0 {
			o.settles[fmt.Sprintf("on cp%d", p.target+1)]++
		} else {
			o.settles["none up"]++
		}
		o.pending = nil
		close(p.done)
		return
	}
	if time.Since(p.began) > p.bound {
		o.violate("the agent did not settle within %s: %s", p.bound, o.settleGoal(p))
	}
}

// settleGoal says what a settle waits for, and how the last sample
// differs.
func (o *observer) settleGoal(p *settlement) string {
	s := p.sample
	var b strings.Builder
	if p.target >= 0 {
		st := o.tr.current(p.target)
		fmt.Fprintf(&b, "want the state of cp%d (%s), the first server up, in the tables, and cp%d in use, connected and healthy", p.target+1, st.describe(), p.target+1)
		if d := s.view.diff(st.view()); len(d) > 0 {
			fmt.Fprintf(&b, "\ntables differ:\n  %s", strings.Join(d, "\n  "))
		}
	} else {
		fmt.Fprintf(&b, "no server up: want the tables unchanged for %s", quiet)
		if p.allDown {
			b.WriteString(" and status not connected")
		}
		fmt.Fprintf(&b, "\ntables:\n%s", s.view)
	}
	b.WriteString("\nxds-servers:")
	for _, r := range s.servers {
		fmt.Fprintf(&b, "\n  %d %s in-use=%t %s since %s, %d attempts, %d failures %s", r.Priority, r.Address, r.InUse, r.State,
			o.tr.since(r.Since), r.Attempts, r.Failures, r.Error)
	}
	fmt.Fprintf(&b, "\nhealth: %s: %s %s", s.xdsHealth.Level, s.xdsHealth.Message, s.xdsHealth.Error)
	return b.String()
}

// settle waits until the agent reaches the settle the servers call for,
// and returns how long that took; false on a violation.
func (o *observer) settle() (time.Duration, bool) {
	target, allDown := o.tr.target(), o.tr.allDown()
	o.mu.Lock()
	now := time.Now()
	bound := convergeBase + min(xds.DefaultBackoff.Max, now.Sub(o.lastAllGood)) + o.tr.hangAllowance(o.settledAt, now)
	p := &settlement{target: target, allDown: allDown, bound: bound, began: now, done: make(chan struct{})}
	o.pending = p
	o.mu.Unlock()
	select {
	case <-p.done:
		return time.Since(now), true
	case <-o.violated:
		return 0, false
	}
}

// hangAllowance is what hangs add to a settle's bound: a hang since t0
// delays the agent as long as it lasted; a server still hung holds a
// stream (hungStream) or an attempt (hungConnect).
func (tr *truth) hangAllowance(t0, now time.Time) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var d time.Duration
	still := 0
	for _, s := range tr.servers {
		d += s.hungFor(t0, now)
		if r, _ := s.runAt(now); r == hung {
			still++
		}
	}
	if still > 0 {
		d += hungStream + time.Duration(still)*hungConnect
	}
	return d
}

func (tr *truth) run(i int) (run, time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.servers[i].now()
}

func (tr *truth) current(i int) *state {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.servers[i].current()
}

func (tr *truth) runs() []run {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []run
	for _, s := range tr.servers {
		r, _ := s.now()
		out = append(out, r)
	}
	return out
}

func (tr *truth) allUp() bool {
	return !slices.ContainsFunc(tr.runs(), func(r run) bool { return r != up })
}

func (tr *truth) allDown() bool {
	return !slices.ContainsFunc(tr.runs(), func(r run) bool { return r != down })
}

// figures are the observer's counts for the report.
func (o *observer) figures() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	took := slices.Clone(o.took)
	slices.Sort(took)
	var median, longest time.Duration
	if len(took) > 0 {
		median, longest = took[len(took)/2], took[len(took)-1]
	}
	var settles []string
	for _, k := range slices.Sorted(maps.Keys(o.settles)) {
		settles = append(settles, fmt.Sprintf("%s %d", k, o.settles[k]))
	}
	return fmt.Sprintf("settles: %d (%s), median %s, longest %s; %d samples, %d failed reads",
		len(took), strings.Join(settles, ", "), median.Round(time.Millisecond), longest.Round(time.Millisecond), o.samples, o.readErrors)
}
