// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
)

// convergence is what one convergence run measured.
type convergence struct {
	shape    shape
	protocol string
	// seconds from the server's SetResources to the last frontend Done.
	seconds float64
	// agentHeap is the live heap the agent holds at convergence: the live
	// heap then, less the live heap once the agent is stopped and dropped
	// (what stays is the server's: its resources and their encodings).
	agentHeap int64
	// serverHeap is the live heap the server gained by serving them.
	serverHeap int64
	// mallocs counts the allocations of the process (agent and server)
	// from the SetResources to convergence.
	mallocs uint64
	// rss is the process's peak resident set (VmHWM) during the run.
	rss int64
	// cpu is the process's CPU time (user and system, agent and server)
	// from SetResources to convergence: less sensitive than seconds to
	// other work on the machine.
	cpu float64
}

func (c convergence) String() string {
	n, b := float64(c.shape.N), float64(c.shape.N*c.shape.M)
	return fmt.Sprintf("BENCH convergence shape=%s protocol=%s maps=%s seconds=%.3f services_per_s=%.0f backends_per_s=%.0f "+
		"heap_inuse_bytes_per_service=%.0f allocs_per_service=%.0f server_heap_bytes_per_service=%.0f rss_bytes=%d cpu_seconds=%.3f",
		c.shape, c.protocol, mapsKind(), c.seconds, n/c.seconds, b/c.seconds,
		float64(c.agentHeap)/n, float64(c.mallocs)/n, float64(c.serverHeap)/n, c.rss, c.cpu)
}

// settledHeap is the live heap once it stops shrinking: the goroutines of
// a stopped agent (its streams, the server's side of them) take a moment
// to end and let go of what they hold.
func settledHeap() int64 {
	heap, _ := liveHeap()
	for range 50 {
		time.Sleep(100 * time.Millisecond)
		next, _ := liveHeap()
		if heap-next < heap/200 {
			return next
		}
		heap = next
	}
	return heap
}

// liveHeap is the heap in use by reachable objects, after a collection.
func liveHeap() (int64, runtime.MemStats) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), m
}

// measureConvergence starts a server with nothing and an agent that has
// that empty state (the tables initialized, the reconciler idle), then
// gives the server the shape's resources and measures until the agent has
// written every frontend to the maps: the definition of Cilium's
// load-balancer benchmark, where the agent runs and the objects are fed.
func measureConvergence(tb testing.TB, s shape, protocol string) convergence {
	tb.Helper()
	resetPeakRSS()
	srv := startServer(tb)
	a := startAgent(tb, srv, protocol)
	a.initialized(tb)
	clusters, clas := resources(s)

	heapBefore, before := liveHeap()
	cpuBefore := cpuTime(tb)
	start := time.Now()
	srv.set(clusters, clas)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	last, err := a.converged(ctx, s.N, s.M)
	cancel()
	if err != nil {
		tb.Fatalf("%s %s: %v", s, protocol, err)
	}
	cpu := cpuTime(tb) - cpuBefore
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heapConverged, _ := liveHeap()
	if path := os.Getenv("L4XDS_BENCH_HEAP_PROFILE"); path != "" {
		// The heap at convergence, for go tool pprof -sample_index=inuse_space.
		writeHeapProfile(tb, fmt.Sprintf("%s.%s.%s", path, s, protocol))
	}
	if err := a.checkMaps(s); err != nil {
		tb.Fatalf("%s %s: converged, but %v", s, protocol, err)
	}
	rss := procStatus(tb, os.Getpid(), "VmHWM")

	a.stop()
	a = nil
	heapServer := settledHeap()
	return convergence{
		shape:      s,
		protocol:   protocol,
		seconds:    last.Sub(start).Seconds(),
		agentHeap:  heapConverged - heapServer,
		serverHeap: heapServer - heapBefore,
		mallocs:    after.Mallocs - before.Mallocs,
		rss:        rss,
		cpu:        cpu.Seconds(),
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// updates is what an update-latency run measured.
type updates struct {
	shape    shape
	protocol string
	// process: the agent ran in its own process (agent_process_update).
	process bool
	// latencies from the server's UpdateResource to the write, sorted.
	latencies []time.Duration
	// agent latencies: from the xDS client's taking the response in to the
	// write, sorted. What is left of latencies is the server's (with the
	// SotW ACK of every name it parses) and the transport's.
	agent []time.Duration
}

func (u updates) quantile(q float64) time.Duration { return quantile(u.latencies, q) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func (u updates) String() string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds()*1000, 'f', 3, 64) }
	name := "update"
	if u.process {
		name = "agent_process_update"
	}
	return fmt.Sprintf("BENCH %s shape=%s protocol=%s maps=%s n=%d p50_ms=%s p99_ms=%s max_ms=%s agent_p50_ms=%s agent_p99_ms=%s agent_max_ms=%s",
		name, u.shape, u.protocol, mapsKind(), len(u.latencies), ms(u.quantile(0.5)), ms(u.quantile(0.99)), ms(u.latencies[len(u.latencies)-1]),
		ms(quantile(u.agent, 0.5)), ms(quantile(u.agent, 0.99)), ms(u.agent[len(u.agent)-1]))
}

// measureUpdates converges the shape, then changes one endpoint's weight
// in one ClusterLoadAssignment at a time, n times, each in another cluster,
// and measures from the server's UpdateResource to the reconciler's having
// written that cluster's frontend to the maps (its Maglev table changes);
// and the agent's part of it, from the xDS client's taking the response in.
func measureUpdates(tb testing.TB, s shape, protocol string, n int) updates {
	tb.Helper()
	if n > s.N {
		tb.Fatalf("%d updates need as many clusters, not %d", n, s.N)
	}
	srv := startServer(tb)
	a := startAgent(tb, srv, protocol)
	a.initialized(tb)
	srv.set(resources(s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	_, err := a.converged(ctx, s.N, s.M)
	cancel()
	if err != nil {
		tb.Fatalf("%s %s: %v", s, protocol, err)
	}

	u := updates{shape: s, protocol: protocol}
	for k := range n {
		i, j := k*updateStride%s.N, k%s.M
		fe := vip(i)
		next := weightChanged(i, s.M, j)
		a.watched.Store(&fe)
		start := time.Now()
		if err := srv.endpoints.UpdateResource(clusterName(i), next); err != nil {
			tb.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-a.writes:
			u.latencies = append(u.latencies, at.Sub(start))
		case <-time.After(time.Minute):
			tb.Fatalf("update %d: frontend %s not written in a minute", k, fe)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		handled, err := a.handled(ctx, clusterName(i), start)
		cancel()
		if err != nil {
			tb.Fatalf("update %d: %v", k, err)
		}
		u.agent = append(u.agent, at.Sub(handled))
	}
	slices.Sort(u.latencies)
	slices.Sort(u.agent)
	return u
}

// updateStride, prime to N, makes the k-th update's cluster k*stride mod
// N: n distinct clusters, spread over all.
const updateStride = 7919

// weightChanged is cluster i's ClusterLoadAssignment of m endpoints with
// endpoint j's weight 2 instead of 1: its Maglev table changes.
func weightChanged(i, m, j int) types.Resource {
	return cla(i, m, func(e int) uint32 {
		if e == j {
			return 2
		}
		return 1
	})
}

// resetPeakRSS resets VmHWM to the current RSS (Linux's clear_refs 5), so
// that each run reports its own peak.
func resetPeakRSS() {
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

func writeHeapProfile(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
