// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"slices"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// waitReady waits until the agent's readiness has no condition left.
func waitReady(t *testing.T, r *health.Readiness) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(r.Waiting()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %v", r.Waiting())
		}
	}
}

// The agent is not ready before its first complete state is in the maps
// (with --datapath=none: in the tables), and ready for good afterwards.
func TestReadinessAfterTheFirstState(t *testing.T) {
	for _, mode := range []string{"bpf", "none"} {
		t.Run(mode, func(t *testing.T) {
			cfg := DefaultConfig
			cfg.Datapath = mode
			var ready *health.Readiness
			a := startAgentWith(t, cfg, Hooks{FakeMaps: NewFakeMaps()}, cell.Invoke(func(r *health.Readiness) { ready = r }))
			a.upsert(t, &lb.Service{Name: "web", Source: lb.SourceXDS}, "10.5.5.5:80/TCP")
			a.setBackends(t, "web", "192.168.5.5:80")
			if w := ready.Waiting(); !slices.Equal(w, []string{ReadinessCondition}) {
				t.Fatalf("before the first complete state: waiting for %v, want the datapath's condition", w)
			}
			a.initialize(t)
			waitReady(t, ready)

			if mode == "bpf" {
				a.reconciled(t)
			}
			a.upsert(t, &lb.Service{Name: "db", Source: lb.SourceXDS}, "10.5.5.6:5432/TCP")
			if w := ready.Waiting(); len(w) != 0 {
				t.Errorf("waiting for %v after a later change", w)
			}
		})
	}
}
