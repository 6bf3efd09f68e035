// SPDX-License-Identifier: Apache-2.0

// Package health provides the agent's cell.Health: every component reports
// into a named scope, and the registry answers "is everything OK, and if not,
// why" for /healthz, `l4xds-dbg status` and the `health` shell command.
package health

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
)

// Status is the last report of one scope.
type Status struct {
	Scope   string     `json:"scope"`
	Level   cell.Level `json:"level"`
	Message string     `json:"message"`
	Error   string     `json:"error,omitempty"`
	Since   time.Time  `json:"since"`
}

func (s Status) String() string {
	line := fmt.Sprintf("%s: %s: %s", s.Scope, s.Level, s.Message)
	if s.Error != "" {
		line += ": " + s.Error
	}
	return line
}

// Registry holds the status of every scope.
type Registry struct {
	mu     sync.Mutex
	scopes map[string]Status
}

func NewRegistry() *Registry { return &Registry{scopes: map[string]Status{}} }

// Root returns the unscoped reporter; components call NewScope on it.
func (r *Registry) Root() cell.Health { return &reporter{r: r} }

// All returns every scope's status, sorted by scope.
func (r *Registry) All() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.scopes))
	for _, k := range slices.Sorted(maps.Keys(r.scopes)) {
		out = append(out, r.scopes[k])
	}
	return out
}

// Degraded returns the scopes that are degraded.
func (r *Registry) Degraded() []Status {
	var out []Status
	for _, s := range r.All() {
		if s.Level == cell.StatusDegraded {
			out = append(out, s)
		}
	}
	return out
}

func (r *Registry) set(scope string, level cell.Level, msg string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if scope == "" {
		scope = "agent"
	}
	s := Status{Scope: scope, Level: level, Message: msg, Since: time.Now()}
	if err != nil && err.Error() != msg {
		s.Error = err.Error()
	}
	if old, ok := r.scopes[scope]; ok && old.Level == level && old.Message == msg && old.Error == s.Error {
		return
	}
	r.scopes[scope] = s
}

type reporter struct {
	r     *Registry
	scope string
}

func (h *reporter) OK(status string)      { h.r.set(h.scope, cell.StatusOK, status, nil) }
func (h *reporter) Stopped(reason string) { h.r.set(h.scope, cell.StatusStopped, reason, nil) }
func (h *reporter) Degraded(reason string, err error) {
	h.r.set(h.scope, cell.StatusDegraded, reason, err)
}

func (h *reporter) NewScope(name string) cell.Health {
	if h.scope != "" {
		name = h.scope + "." + name
	}
	return &reporter{r: h.r, scope: name}
}

func (h *reporter) Close() {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	delete(h.r.scopes, h.scope)
}

func afterPoll() <-chan time.Time { return time.After(50 * time.Millisecond) }

// Readiness says whether the agent serves: a latch over conditions that
// components register while the hive is built and mark met once, e.g. "the
// first complete state is in the BPF maps". Once every condition is met the
// agent stays ready: what happens afterwards (the xDS servers lost, a NACK,
// a frontend that fails to reconcile) degrades its health, which /healthz
// and `l4xds-dbg status` report, but it keeps forwarding what it has, so it
// is still ready. An agent whose readiness followed its connection to the
// control plane would turn every node NotReady at once when the control
// plane goes down, while every one of them serves its last good state.
type Readiness struct {
	mu      sync.Mutex
	pending map[string]bool
}

func NewReadiness() *Readiness { return &Readiness{pending: map[string]bool{}} }

// Add registers a condition; the agent is not ready until met is called.
func (r *Readiness) Add(name string) (met func()) {
	r.mu.Lock()
	r.pending[name] = true
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.pending, name)
		r.mu.Unlock()
	}
}

// Waiting returns the conditions not met yet, sorted; none: ready. A nil
// Readiness (a hive without one) has none.
func (r *Readiness) Waiting() []string {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.pending))
}
