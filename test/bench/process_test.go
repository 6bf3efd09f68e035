// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/devcerts"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
)

// BenchmarkAgentProcess runs the agent binary ($L4XDS_BIN/l4xds-agent, as
// make bench builds it) against the in-process server: at 10000x100 it
// prints the agent's peak resident set (the rss_bytes of the convergence
// lines are the benchmark's process, the server's memory included); at
// 10000x10, the update latencies of BenchmarkUpdate with the agent apart
// from the server and its garbage collector.
func BenchmarkAgentProcess(b *testing.B) {
	agent := agentBinary(b)
	for _, p := range protocols {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				fmt.Println(measureAgentProcess(b, agent, shape{10000, 100}, p))
				fmt.Println(measureAgentProcessUpdates(b, agent, shape{10000, 10}, p, 1000))
			}
		})
	}
}

// agentBinary is $L4XDS_BIN/l4xds-agent, for the benchmarks of the agent
// process; they skip without it or without root (the agent writes real BPF
// maps, where convergence is observed).
func agentBinary(tb testing.TB) string {
	tb.Helper()
	if !useBPF() {
		tb.Skip("needs root and real maps (not L4XDS_BENCH_MAPS=fake): the agent process writes its BPF maps, where convergence is observed")
	}
	return filepath.Join(netns.AgentBinaries(tb), "l4xds-agent")
}

// agentProcess is the agent binary running against the in-process server.
type agentProcess struct {
	cmd  *exec.Cmd
	srv  *server
	root string // bpffs of its pinned maps
	api  *api.Client
	log  string
}

// startAgentProcess starts the agent once the server is up and empty, and
// waits for it to subscribe. It is stopped when the test ends.
func startAgentProcess(tb testing.TB, agentBin string, srv *server, protocol string) *agentProcess {
	tb.Helper()
	root, dir := netns.MountBPFFS(tb), tb.TempDir()
	p := &agentProcess{srv: srv, root: root, log: filepath.Join(dir, "agent.log")}
	logFile, err := os.Create(p.log)
	if err != nil {
		tb.Fatal(err)
	}
	socket := filepath.Join(dir, "api.sock")
	p.api = api.NewClient(socket)
	p.cmd = exec.Command(agentBin,
		"--enable-xds-control-plane",
		"--xds-server-address", srv.addr,
		"--xds-server-name", "localhost",
		"--xds-ca-cert-path", filepath.Join(srv.certs, devcerts.CACert),
		"--xds-client-cert-path", filepath.Join(srv.certs, devcerts.ClientCert),
		"--xds-client-key-path", filepath.Join(srv.certs, devcerts.ClientKey),
		"--xds-node-id", "bench-node",
		"--xds-protocol", protocol,
		"--bpf-root", root,
		"--api-socket", socket,
		"--datapath-attach", netns.DatapathAttach(),
		// The largest shapes have more frontends than the default.
		"--lb-service-map-max", strconv.Itoa(datapath.MaxServiceMapMax),
	)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
		logFile.Close()
	})
	deadline := time.Now().Add(time.Minute)
	for srv.clusters.NumWildcardWatches() == 0 {
		if time.Now().After(deadline) {
			p.fail(tb, "did not subscribe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p
}

func (p *agentProcess) fail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	log, _ := os.ReadFile(p.log)
	tb.Fatalf("agent process: "+format+"\n%s", append(args, log)...)
}

// converge serves the shape and waits until every service entry in the
// agent's maps has the shape's backends; it returns the seconds taken.
func (p *agentProcess) converge(tb testing.TB, s shape) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	clusters, clas := resources(s)
	start := time.Now()
	p.srv.set(clusters, clas)
	var maps *datapath.Maps
	for {
		if maps == nil {
			maps, _ = datapath.OpenPinnedMaps(p.root)
		}
		if maps != nil && servicesWith(tb, maps, s.M) == s.N {
			break
		}
		if ctx.Err() != nil {
			p.fail(tb, "not converged: %v", ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	seconds := time.Since(start).Seconds()
	maps.Close()
	return seconds
}

func measureAgentProcess(tb testing.TB, agentBin string, s shape, protocol string) string {
	tb.Helper()
	p := startAgentProcess(tb, agentBin, startServer(tb), protocol)
	seconds := p.converge(tb, s)
	return fmt.Sprintf("BENCH agent_process shape=%s protocol=%s maps=bpf seconds=%.3f rss_bytes=%d",
		s, protocol, seconds, procStatus(tb, p.cmd.Process.Pid, "VmHWM"))
}

// measureAgentProcessUpdates is measureUpdates with the agent in its own
// process: the benchmark's server and its garbage collector are no longer
// in the agent's. The agent's own timestamps say when: its frontend's
// reconciler status turned Done (after the map writes), and its
// xds-resources row of the ClusterLoadAssignment was updated (the xDS
// client took the response in). They are read over its API socket once the
// update is done, polled every millisecond, outside what is measured.
func measureAgentProcessUpdates(tb testing.TB, agentBin string, s shape, protocol string, n int) updates {
	tb.Helper()
	if n > s.N {
		tb.Fatalf("%d updates need as many clusters, not %d", n, s.N)
	}
	p := startAgentProcess(tb, agentBin, startServer(tb), protocol)
	p.converge(tb, s)
	frontends := api.RemoteTable[*lb.Frontend](p.api, lb.FrontendsTableName)
	rows := api.RemoteTable[*xds.ResourceStatus](p.api, xds.ResourcesTableName)

	if path := os.Getenv("L4XDS_BENCH_AGENT_CPU_PROFILE"); path != "" {
		// The agent's CPU over the first seconds of the updates, for go
		// tool pprof (through the API socket, /debug/pprof/).
		profiled := make(chan error, 1)
		defer func() {
			if err := <-profiled; err != nil {
				tb.Errorf("the agent's CPU profile: %v", err)
			}
		}()
		go func() {
			f, err := os.Create(fmt.Sprintf("%s.%s.%s", path, s, protocol))
			if err == nil {
				err = p.api.CPUProfile(context.Background(), 5*time.Second, f)
				f.Close()
			}
			profiled <- err
		}()
	}
	u := updates{shape: s, protocol: protocol, process: true}
	for k := range n {
		i, j := k*updateStride%s.N, k%s.M
		start := time.Now()
		if err := p.srv.endpoints.UpdateResource(clusterName(i), weightChanged(i, s.M, j)); err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		done := remoteSince(ctx, tb, frontends, lb.FrontendByAddress.Query(vip(i)), start, func(fe *lb.Frontend) (time.Time, bool) {
			return fe.Status.UpdatedAt, fe.Status.Kind == reconciler.StatusKindDone
		})
		handled := remoteSince(ctx, tb, rows, xds.ResourceByName(xds.EndpointType, clusterName(i)), start, func(r *xds.ResourceStatus) (time.Time, bool) {
			return r.Updated, true
		})
		cancel()
		if done.IsZero() || handled.IsZero() {
			p.fail(tb, "update %d: frontend %s not written in a minute", k, vip(i))
		}
		u.latencies = append(u.latencies, done.Sub(start))
		u.agent = append(u.agent, done.Sub(handled))
	}
	slices.Sort(u.latencies)
	slices.Sort(u.agent)
	return u
}

// remoteSince polls a remote table's row until at says it changed after
// since, and returns that time (zero once ctx is done).
func remoteSince[Obj any](ctx context.Context, tb testing.TB, t *statedb.RemoteTable[Obj], q statedb.Query[Obj], since time.Time, at func(Obj) (time.Time, bool)) time.Time {
	tb.Helper()
	for ctx.Err() == nil {
		objs, errs := t.Get(ctx, q)
		for obj := range objs {
			if when, ok := at(obj); ok && when.After(since) {
				return when
			}
		}
		if err := <-errs; err != nil && ctx.Err() == nil {
			tb.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Time{}
}

// servicesWith counts the service entries with m backends in their table.
func servicesWith(tb testing.TB, maps *datapath.Maps, m int) int {
	n := 0
	for e, err := range maps.Services() {
		if err != nil {
			tb.Fatal(err)
		}
		if e.Count == uint32(m) {
			n++
		}
	}
	return n
}

// procStatus returns a "kB" field of /proc/<pid>/status, in bytes.
func procStatus(tb testing.TB, pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				tb.Fatalf("%s %q: %v", field, rest, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
