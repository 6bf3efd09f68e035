// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/pkg/xds"
)

var (
	protocols = []string{xds.ProtocolSotW, xds.ProtocolDelta}
	// 50000x1 is the shape of Cilium's load-balancer benchmark;
	// 10000x100 is a million backends.
	convergenceShapes = []shape{{50000, 1}, {10000, 10}, {1000, 100}, {10000, 100}}
	updateShape       = shape{10000, 10}
)

const updateCount = 1000

// shapesEnv replaces convergenceShapes: "50000x1,10000x10".
const shapesEnv = "L4XDS_BENCH_SHAPES"

// BenchmarkConvergence prints a BENCH convergence line per shape and
// protocol (each run is a fresh server and agent; run with -benchtime=1x).
func BenchmarkConvergence(b *testing.B) {
	shapes := convergenceShapes
	if v := os.Getenv(shapesEnv); v != "" {
		shapes = nil
		for f := range strings.SplitSeq(v, ",") {
			var s shape
			if _, err := fmt.Sscanf(f, "%dx%d", &s.N, &s.M); err != nil || s.N < 1 || s.M < 1 || f != s.String() {
				b.Fatalf("$%s: %q is not a shape NxM", shapesEnv, f)
			}
			shapes = append(shapes, s)
		}
	}
	for _, s := range shapes {
		for _, p := range protocols {
			b.Run(s.String()+"/"+p, func(b *testing.B) {
				for range b.N {
					c := measureConvergence(b, s, p)
					fmt.Println(c)
					b.ReportMetric(c.seconds, "s/converge")
				}
			})
		}
	}
}

// BenchmarkUpdate prints a BENCH update line per protocol.
func BenchmarkUpdate(b *testing.B) {
	for _, p := range protocols {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				u := measureUpdates(b, updateShape, p, updateCount)
				fmt.Println(u)
				b.ReportMetric(float64(u.quantile(0.99).Microseconds())/1000, "p99-ms")
			}
		})
	}
}

// The harness on a small shape, as `go test` runs it: it converges, its
// maps hold every service and backend, and it reports what it measured.
func TestConvergence(t *testing.T) {
	for _, p := range protocols {
		t.Run(p, func(t *testing.T) {
			c := measureConvergence(t, shape{300, 3}, p)
			line := c.String()
			t.Log(line)
			if c.seconds <= 0 || c.agentHeap <= 0 || c.mallocs == 0 || c.rss <= 0 {
				t.Errorf("implausible figures: %+v", c)
			}
			for _, key := range []string{"shape=300x3 ", "protocol=" + p + " ", "maps=" + mapsKind() + " ", "services_per_s=", "heap_inuse_bytes_per_service="} {
				if !strings.Contains(line, key) {
					t.Errorf("%q lacks %q", line, key)
				}
			}
		})
	}
}

func TestUpdateLatency(t *testing.T) {
	for _, p := range protocols {
		t.Run(p, func(t *testing.T) {
			u := measureUpdates(t, shape{300, 3}, p, 30)
			t.Log(u)
			if len(u.latencies) != 30 || u.latencies[0] <= 0 || len(u.agent) != 30 || u.agent[0] <= 0 || u.agent[29] > u.latencies[29] {
				t.Errorf("latencies %v, the agent's %v", u.latencies, u.agent)
			}
		})
	}
}

func TestAgentProcessUpdateLatency(t *testing.T) {
	agent := agentBinary(t)
	for _, p := range protocols {
		t.Run(p, func(t *testing.T) {
			u := measureAgentProcessUpdates(t, agent, shape{300, 3}, p, 30)
			t.Log(u)
			if len(u.latencies) != 30 || u.latencies[0] <= 0 || len(u.agent) != 30 || u.agent[0] <= 0 || u.agent[29] > u.latencies[29] {
				t.Errorf("latencies %v, the agent's %v", u.latencies, u.agent)
			}
			if !strings.HasPrefix(u.String(), "BENCH agent_process_update shape=300x3 protocol="+p+" ") {
				t.Errorf("%q", u)
			}
		})
	}
}
