// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
)

// Health says over plaintext HTTP whether a control plane serves:
// /healthz answers 200 while the process runs, /readyz 200 once the server
// has its first complete state and no source reports a problem, and 503
// with the reasons, one a line, otherwise. It is what an orchestrator's
// probes ask.
type Health struct {
	srv *Server
	mux *http.ServeMux

	mu       sync.Mutex
	problems map[string]error // by source
}

// NewHealth reports the readiness of srv.
func NewHealth(srv *Server) *Health {
	h := &Health{srv: srv, mux: http.NewServeMux(), problems: map[string]error{}}
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := h.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return h
}

// Report sets why source cannot serve its complete state, or clears it
// (nil). A source with a problem keeps the control plane not ready.
func (h *Health) Report(source string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.problems, source)
		return
	}
	h.problems[source] = err
}

// Ready returns nil when the server serves its first complete state and no
// source has a problem, else why not.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	if !h.srv.Serving() {
		errs = append(errs, errors.New("not serving xDS: the first complete state is not read yet"))
	}
	for _, src := range slices.Sorted(maps.Keys(h.problems)) {
		errs = append(errs, fmt.Errorf("%s: %w", src, h.problems[src]))
	}
	return errors.Join(errs...)
}

func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }
