// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"sync"
	"time"
)

// flow is a flow that ended, as a client saw it.
type flow struct {
	frontend frontend
	service  string
	// long: a long-lived connection, echoing until its lifetime ends.
	long       bool
	start, end time.Time
	// backend answered the flow (its greeting or datagram named it); -1
	// when it failed before any answer.
	backend int
	err     error
}

func (f flow) String() string {
	b := "no answer"
	if f.backend >= 0 {
		b = fmt.Sprintf("b%d", f.backend)
	}
	kind := "new flow"
	if f.long {
		kind = "long-lived connection"
	}
	return fmt.Sprintf("%s %s (%s, %s): %s to %s after %s: %v", kind, f.frontend, f.service,
		f.start.Format("15:04:05.000"), b, f.end.Format("15:04:05.000"), f.end.Sub(f.start).Round(time.Millisecond), f.err)
}

// verdict is what a failed flow is blamed on.
type verdict int

const (
	// onStable: nothing the churn did excuses the failure.
	onStable verdict = iota
	// removedFrontend: its frontend left the resources (service removed,
	// VIP moved) while it ran.
	removedFrontend
	// removedBackend: the backend that answered it left the service.
	removedBackend
	// serviceLostBackend: it failed before any answer while one of its
	// service's backends was being removed: it may have been that one's.
	serviceLostBackend
)

var verdictNames = map[verdict]string{
	onStable:           "failed on a stable service",
	removedFrontend:    "its frontend was removed",
	removedBackend:     "reset: its backend was removed",
	serviceLostBackend: "no answer while its service lost a backend",
}

func (v verdict) String() string { return verdictNames[v] }

// outage is a time the control plane or the agent was down.
type outage struct {
	what     string
	from, to time.Time // to is zero while it lasts
}

// history is what the churn did and when: the removals a failure may be
// blamed on, and the outages that delay their effect.
type history struct {
	// settle is how long after a change in the resources its effect on
	// the datapath may still show: the control plane's watch, the xDS
	// push and the reconciler, on a loaded machine.
	settle time.Duration
	// ioTimeout is the longest a client waits before it reports a failure.
	ioTimeout time.Duration

	mu      sync.Mutex
	outages []outage
	// The times a frontend left the resources, a backend left its
	// service (service/b<i>), and a service lost any backend.
	frontendGone map[string][]time.Time
	backendGone  map[string][]time.Time
	serviceLost  map[string][]time.Time
	// frontendSince is when each served frontend entered the resources.
	frontendSince map[string]time.Time
	changes       map[string]int
}

func newHistory(settle, ioTimeout time.Duration) *history {
	return &history{settle: settle, ioTimeout: ioTimeout,
		frontendGone: map[string][]time.Time{}, backendGone: map[string][]time.Time{},
		serviceLost: map[string][]time.Time{}, frontendSince: map[string]time.Time{}, changes: map[string]int{}}
}

func backendKey(service string, backend int) string { return fmt.Sprintf("%s/b%d", service, backend) }

// record notes a change written at time at.
func (h *history) record(at time.Time, c change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.what != "" { // "": what was served at the start
		h.changes[c.what]++
	}
	for _, f := range c.gone {
		h.frontendGone[f.String()] = append(h.frontendGone[f.String()], at)
		delete(h.frontendSince, f.String())
	}
	for _, f := range c.added {
		h.frontendSince[f.String()] = at
	}
	if c.what == "backend removed" {
		h.backendGone[backendKey(c.service, c.backend)] = append(h.backendGone[backendKey(c.service, c.backend)], at)
		h.serviceLost[c.service] = append(h.serviceLost[c.service], at)
	}
}

func (h *history) down(what string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.outages = append(h.outages, outage{what: what, from: at})
}

func (h *history) up(what string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.outages) - 1; i >= 0; i-- {
		if h.outages[i].what == what && h.outages[i].to.IsZero() {
			h.outages[i].to = at
			return
		}
	}
}

// settled tells whether a frontend that came and goes has been in the
// resources long enough, with the control plane and the agent up, for the
// datapath to serve it: only then do clients start flows to it.
func (h *history) settled(f frontend, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	since, ok := h.frontendSince[f.String()]
	if !ok {
		return false
	}
	for _, o := range h.outages {
		if o.to.IsZero() {
			return false
		}
		if o.to.After(since) {
			since = o.to
		}
	}
	return now.Sub(since) >= h.settle
}

// effectEnd is when a change written at at has surely reached the
// datapath: settle later, or settle after the end of an outage that
// began before then.
func (h *history) effectEnd(at time.Time, now time.Time) time.Time {
	end := at.Add(h.settle)
	for changed := true; changed; {
		changed = false
		for _, o := range h.outages {
			to := o.to
			if to.IsZero() {
				to = now
			}
			if o.from.Before(end) && !to.Before(at) && to.Add(h.settle).After(end) {
				end, changed = to.Add(h.settle), true
			}
		}
	}
	return end
}

// during tells whether one of the changes at the times overlaps the flow:
// written before it failed, and the flow started before the change had
// surely taken effect and failed at most a client timeout after that.
func (h *history) during(times []time.Time, f flow, now time.Time) bool {
	for _, at := range times {
		end := h.effectEnd(at, now)
		if !at.After(f.end) && !f.start.After(end) && !f.end.After(end.Add(h.ioTimeout)) {
			return true
		}
	}
	return false
}

// blame classifies a failed flow.
func (h *history) blame(f flow, now time.Time) verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.during(h.frontendGone[f.frontend.String()], f, now):
		return removedFrontend
	case f.backend >= 0 && h.during(h.backendGone[backendKey(f.service, f.backend)], f, now):
		return removedBackend
	case f.backend < 0 && h.during(h.serviceLost[f.service], f, now):
		return serviceLostBackend
	}
	return onStable
}

// backendEverRemoved tells whether backend ever left the service.
func (h *history) backendEverRemoved(service string, backend int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.backendGone[backendKey(service, backend)]) > 0
}

func (h *history) frontendEverRemoved(f string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.frontendGone[f]) > 0
}

// restarts counts the outages of what.
func (h *history) restarts(what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, o := range h.outages {
		if o.what == what {
			n++
		}
	}
	return n
}
