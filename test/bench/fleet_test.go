// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
)

// The fleet: thousands of agents on one control-plane replica. Each
// simulated agent is a real ADS stream over mTLS (SotW: a wildcard CDS
// subscription and EDS by name, every response ACKed), all in this process;
// the control plane is the l4xds-control-plane binary serving a file, so
// that its memory and CPU are its own.
//
// BenchmarkFleet prints, for L4XDS_BENCH_FLEET_STREAMS streams (5000):
//
//	BENCH fleet streams=… shape=… change_ack_p50_ms=… change_ack_p99_ms=… change_ack_max_ms=…
//	  server_rss_peak_bytes_per_stream=… server_rss_rest_bytes_per_stream=…
//	  server_heap_live_bytes_per_stream=… server_stack_bytes_per_stream=…
//	  server_goroutines_per_stream=… server_cpu_us_per_stream_change=…
//	  restart_all_synced_s=… partial_states=0 reconnects=…
//
// The server's memory per stream is over what it held before the first
// stream: rss_peak is its resident high-water mark (VmHWM) through the sync
// and the changes, rss_rest its resident memory at rest after the changes:
// after two collections (an idle Go process makes one every 2 minutes),
// once it has stopped falling (the runtime returns freed pages to the
// system in the background). heap_live (after those collections), stack
// and goroutines are the runtime's figures at rest.
// change_ack: from the file's write to each stream's receipt of the new
// version (its ACK follows at once), over several changes; its max is the
// time until every node has it. restart: the server SIGKILLed and started
// again on its address while every stream reconnects at once: time from the
// new process's start to every stream holding the full state again.
// partial_states counts responses that lacked part of the served state
// (an empty one included): a node that took one would have removed VIPs.
// reconnects counts the streams that broke before the restart (a stream
// reconnects at once).
func BenchmarkFleet(b *testing.B) {
	streams := 5000
	if v := os.Getenv("L4XDS_BENCH_FLEET_STREAMS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("L4XDS_BENCH_FLEET_STREAMS=%q: want a positive number", v)
		}
		streams = n
	}
	// L4XDS_BENCH_FLEET_SERVER_MEMORY_PER_STREAM=BYTES runs the server in a
	// memory cgroup sized as Documentation/kubernetes.md sizes the control
	// plane's container: 64 MiB and BYTES per agent. The server takes 90 %
	// of that as its Go memory limit, as it does in a pod.
	var perStream int64
	if v := os.Getenv("L4XDS_BENCH_FLEET_SERVER_MEMORY_PER_STREAM"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("L4XDS_BENCH_FLEET_SERVER_MEMORY_PER_STREAM=%q: want a positive number of bytes", v)
		}
		perStream = n
	}
	for range b.N {
		fmt.Println(measureFleet(b, streams, shape{100, 10}, 5, 10*time.Second, perStream))
	}
}

// The same harness on a small fleet: every stream gets every change and
// the state back after a restart, and never a partial one.
func TestFleet(t *testing.T) {
	// As root, in a memory cgroup (16 MiB a stream, more than it needs):
	// the server must find its limit there.
	var perStream int64
	if os.Geteuid() == 0 {
		perStream = 16 << 20
	}
	f := measureFleet(t, 40, shape{20, 3}, 2, time.Second, perStream)
	t.Log(f)
	if len(f.latencies) != 40*2 || f.partial != 0 || f.restart <= 0 || f.rssPeak == 0 || f.goroutines == 0 {
		t.Errorf("fleet = %+v", f)
	}
}

type fleet struct {
	streams int
	shape   shape
	// latencies from a change's write to its receipt, every stream and
	// change, sorted.
	latencies []time.Duration
	// memory per stream, over the server's before the first stream (see
	// BenchmarkFleet)
	rssPeak, rssRest, heapLive, stack int64
	goroutines                        float64
	cpuPerChange                      time.Duration // server CPU per stream and change
	restart                           time.Duration
	partial                           int64
	// reconnects: streams that broke before the restart
	reconnects int64
	// memoryPerStream sized the server's memory cgroup; 0 for none.
	memoryPerStream int64
}

func (f fleet) String() string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds()*1000, 'f', 1, 64) }
	var limit string
	if f.memoryPerStream > 0 {
		limit = fmt.Sprintf(" server_cgroup_memory=64MiB+%d*streams", f.memoryPerStream)
	}
	return fmt.Sprintf("BENCH fleet streams=%d shape=%s change_ack_p50_ms=%s change_ack_p99_ms=%s change_ack_max_ms=%s "+
		"server_rss_peak_bytes_per_stream=%d server_rss_rest_bytes_per_stream=%d server_heap_live_bytes_per_stream=%d "+
		"server_stack_bytes_per_stream=%d server_goroutines_per_stream=%.2f "+
		"server_cpu_us_per_stream_change=%.1f restart_all_synced_s=%.3f partial_states=%d reconnects=%d",
		f.streams, f.shape, ms(quantile(f.latencies, 0.5)), ms(quantile(f.latencies, 0.99)), ms(f.latencies[len(f.latencies)-1]),
		f.rssPeak, f.rssRest, f.heapLive, f.stack, f.goroutines,
		float64(f.cpuPerChange.Microseconds()), f.restart.Seconds(), f.partial, f.reconnects) + limit
}

// measureFleet runs streams against the shape's resources through changes;
// its resident memory is at rest once it has not fallen for settle. With
// memoryPerStream the server runs in a memory cgroup of 64 MiB and that
// per stream.
func measureFleet(tb testing.TB, streams int, s shape, changes int, settle time.Duration, memoryPerStream int64) fleet {
	bin := os.Getenv("L4XDS_BIN")
	if bin == "" {
		tb.Skip("needs L4XDS_BIN, the directory of the built binaries (make test sets it)")
	}
	dir := tb.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{}); err != nil {
		tb.Fatal(err)
	}
	file := filepath.Join(dir, "resources.json")
	writeFleetState(tb, file, s, 0)
	// The server serves its metrics and profiles, read at rest.
	// L4XDS_BENCH_FLEET_PROFILE=DIR also writes its heap and goroutine
	// profiles and metrics at rest after the changes, and its CPU profile
	// over the changes (L4XDS_BENCH_FLEET_PROFILE_SECONDS, 30), into DIR.
	profileDir := os.Getenv("L4XDS_BENCH_FLEET_PROFILE")
	var cgroup string
	if memoryPerStream > 0 {
		cgroup = memoryCgroup(tb, 64<<20+memoryPerStream*int64(streams))
	}
	cp := startFleetServer(tb, filepath.Join(bin, "l4xds-control-plane"), cgroup, dir, file, "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--pprof")
	addr := cp.addr
	m := healthRE.FindStringSubmatch(cp.Output())
	if m == nil {
		tb.Fatalf("no health address in the control plane's output:\n%s", cp.Output())
	}
	health := "http://" + m[1]
	if cgroup != "" && !strings.Contains(cp.Output(), "Go memory limit taken from the container's") {
		tb.Fatalf("the control plane did not take its memory limit from its cgroup:\n%s", cp.Output())
	}
	runtimeBefore := serverRuntime(tb, health)
	rssBefore := procStatus(tb, cp.Cmd.Process.Pid, "VmRSS")

	tlsConfig := fleetClientTLS(tb, dir)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	var partial, reconnects atomic.Int64
	nodes := make([]*fleetNode, streams)
	for i := range nodes {
		nodes[i] = &fleetNode{id: "node-" + strconv.Itoa(i), want: s.N, partial: &partial, reconnects: &reconnects}
		wg.Go(func() { nodes[i].run(ctx, addr, tlsConfig) })
	}
	synced := func(round int) bool {
		for _, n := range nodes {
			if n.round.Load() < int64(round) {
				return false
			}
		}
		return true
	}
	connected := func() int {
		c := 0
		for _, n := range nodes {
			if n.connected.Load() {
				c++
			}
		}
		return c
	}
	// progress says how far the fleet got, when a wait times out.
	progress := func(round int) string {
		behind := 0
		for _, n := range nodes {
			if n.round.Load() < int64(round) {
				behind++
			}
		}
		return fmt.Sprintf("%d of %d streams lack round %d, %d connected; %s", behind, len(nodes), round, connected(), dumpGoroutines(health))
	}
	waitFleet(tb, "every stream synced", 5*time.Minute, func() bool { return synced(1) }, func() string { return progress(1) })
	f := fleet{streams: streams, shape: s, memoryPerStream: memoryPerStream}

	var cpuProfile chan error
	if profileDir != "" {
		seconds := cmp.Or(os.Getenv("L4XDS_BENCH_FLEET_PROFILE_SECONDS"), "30")
		cpuProfile = make(chan error, 1)
		go func() {
			cpuProfile <- fetchProfile(health+"/debug/pprof/profile?seconds="+seconds, filepath.Join(profileDir, "cpu-changes.pb.gz"))
		}()
		time.Sleep(time.Second) // the profile has started
	}
	for c := 1; c <= changes; c++ {
		cpu := procCPU(tb, cp.Cmd.Process.Pid)
		start := time.Now()
		writeFleetState(tb, file, s, c)
		waitFleet(tb, fmt.Sprintf("change %d on every stream", c), 5*time.Minute, func() bool { return synced(1 + c) }, func() string { return progress(1 + c) })
		f.cpuPerChange += (procCPU(tb, cp.Cmd.Process.Pid) - cpu) / time.Duration(streams*changes)
		for _, n := range nodes {
			f.latencies = append(f.latencies, n.at(1+c).Sub(start))
		}
	}
	slices.Sort(f.latencies)
	if cpuProfile != nil {
		if err := <-cpuProfile; err != nil {
			tb.Fatal(err)
		}
	}

	// At rest: every stream holds the last change.
	perStream := func(after, before int64) int64 { return (after - before) / int64(streams) }
	f.rssPeak = perStream(procStatus(tb, cp.Cmd.Process.Pid, "VmHWM"), rssBefore)
	if profileDir != "" {
		for _, p := range []string{"heap", "goroutine"} {
			if err := fetchProfile(health+"/debug/pprof/"+p, filepath.Join(profileDir, p+"-rest.pb.gz")); err != nil {
				tb.Fatal(err)
			}
		}
		if err := fetchProfile(health+"/metrics", filepath.Join(profileDir, "metrics-rest.txt")); err != nil {
			tb.Fatal(err)
		}
	}
	// The collections serverRuntime asks for are those an idle Go
	// process makes itself (one every 2 minutes); the freed pages go back
	// to the system after them.
	rt := serverRuntime(tb, health)
	f.heapLive = perStream(rt.heapLive, runtimeBefore.heapLive)
	f.stack = perStream(rt.stack, runtimeBefore.stack)
	f.goroutines = (rt.goroutines - runtimeBefore.goroutines) / float64(streams)
	f.rssRest = perStream(restingRSS(tb, cp.Cmd.Process.Pid, settle), rssBefore)

	f.reconnects = reconnects.Load()

	// The restart storm: every stream reconnects at once to a new process.
	// A process killed with thousands of connections ends them all at
	// once, and a few clients were seen never to hear of it (their sockets
	// established, the server's gone): such a client learns of the dead
	// server from its keepalive, as an agent does.
	cp.Kill()
	waitFleet(tb, "every stream disconnected", xds.Keepalive.Time+xds.Keepalive.Timeout+30*time.Second,
		func() bool { return connected() == 0 },
		func() string {
			return fmt.Sprintf("%d of %d streams connected; %s", connected(), len(nodes), dumpGoroutines(""))
		})
	for _, n := range nodes {
		n.resync.Store(true)
	}
	restart := time.Now()
	startFleetServer(tb, filepath.Join(bin, "l4xds-control-plane"), cgroup, dir, file, addr)
	waitFleet(tb, "every stream synced after the restart", 5*time.Minute, func() bool {
		for _, n := range nodes {
			if n.resync.Load() {
				return false
			}
		}
		return true
	})
	f.restart = time.Since(restart)
	f.partial = partial.Load()
	return f
}

// restingRSS is pid's resident memory once it has stopped falling: not by
// more than 0.5 % for settle, or after 3 minutes. The Go runtime returns
// the pages freed by a collection to the system in the background.
func restingRSS(tb testing.TB, pid int, settle time.Duration) int64 {
	low := procStatus(tb, pid, "VmRSS")
	fell := time.Now()
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline) && time.Since(fell) < settle; {
		time.Sleep(time.Second)
		rss := procStatus(tb, pid, "VmRSS")
		if rss < low-low/200 {
			fell = time.Now()
		}
		low = min(low, rss)
	}
	return low
}

// runtimeFigures are a Go server's runtime metrics.
type runtimeFigures struct {
	heapLive, stack int64
	goroutines      float64
}

// serverRuntime has the server at health (serving --pprof) collect its
// garbage (twice), and reads its live heap, goroutine stacks and goroutines from
// its metrics.
func serverRuntime(tb testing.TB, health string) runtimeFigures {
	tb.Helper()
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			tb.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			tb.Fatalf("GET %s: %s %v", url, resp.Status, err)
		}
		return string(b)
	}
	// Twice: a sync.Pool keeps what it holds through one collection.
	get(health + "/debug/pprof/heap?gc=1")
	get(health + "/debug/pprof/heap?gc=1")
	values := map[string]float64{}
	for line := range strings.Lines(get(health + "/metrics")) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			values[name] = f
		}
	}
	want := func(name string) float64 {
		v, ok := values[name]
		if !ok {
			tb.Fatalf("no %s in the server's metrics", name)
		}
		return v
	}
	return runtimeFigures{
		heapLive:   int64(want("go_memstats_heap_alloc_bytes")),
		stack:      int64(want("go_memstats_stack_inuse_bytes")),
		goroutines: want("go_goroutines"),
	}
}

// dumpGoroutines writes the stacks of the server at health and of this
// process (the clients) into files to look at after a fleet stalled, and
// says where they are.
func dumpGoroutines(health string) string {
	dir, err := os.MkdirTemp("", "fleet-stall-")
	if err != nil {
		return err.Error()
	}
	if health != "" { // else the server is gone
		server := filepath.Join(dir, "server-goroutines.txt")
		if err := fetchProfile(health+"/debug/pprof/goroutine?debug=1", server); err != nil {
			return err.Error()
		}
	}
	f, err := os.Create(filepath.Join(dir, "clients-goroutines.txt"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 1); err != nil {
		return err.Error()
	}
	return "the server's and the clients' goroutines are in " + dir
}

// waitFleet waits for cond; describe, if given, tells how far it got.
func waitFleet(tb testing.TB, what string, timeout time.Duration, cond func() bool, describe ...func() string) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			var got string
			for _, d := range describe {
				got = ": " + d()
			}
			tb.Fatalf("timed out after %s waiting for %s%s", timeout, what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeFleetState writes the shape's resources, the weights of round r, as
// Envoy's filesystem form; the control plane follows the file.
func writeFleetState(tb testing.TB, path string, s shape, r int) {
	var docs []string
	add := func(m proto.Message) {
		a, err := anypb.New(m)
		if err != nil {
			tb.Fatal(err)
		}
		j, err := protojson.Marshal(a)
		if err != nil {
			tb.Fatal(err)
		}
		docs = append(docs, string(j))
	}
	for i := range s.N {
		add(cluster(i))
		add(cla(i, s.M, func(j int) uint32 { return uint32(1 + (i+j+r)%10) }))
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(`{"resources": [`+strings.Join(docs, ",\n")+`]}`), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

var (
	servingRE = regexp.MustCompile(`msg="Serving xDS" address=(\S+)`)
	healthRE  = regexp.MustCompile(`msg="Serving health and metrics" address=(\S+)`)
)

// fetchProfile writes what url answers to path.
func fetchProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

type fleetServer struct {
	*netns.Proc
	addr string
}

// startFleetServer runs the control plane on addr ("…:0" for any port), in
// cgroup unless that is "", retrying while a killed predecessor's address
// is not free yet.
func startFleetServer(tb testing.TB, bin, cgroup, certs, file, addr string, extra ...string) *fleetServer {
	tb.Helper()
	for attempt := 0; ; attempt++ {
		args := append([]string{"serve", "--resources", file, "--listen", addr,
			"--cert", filepath.Join(certs, devcerts.ServerCert), "--key", filepath.Join(certs, devcerts.ServerKey),
			"--client-ca", filepath.Join(certs, devcerts.CACert), "--log-level", "info"}, extra...)
		cmd := exec.Command(bin, args...)
		if cgroup != "" {
			// Into the cgroup before the server starts: it reads its
			// limit at start. exec keeps the PID that is measured.
			cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ >"$0" && exec "$@"`, filepath.Join(cgroup, "cgroup.procs"), bin}, args...)...)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		// L4XDS_BENCH_FLEET_SERVER_GOGC is the server's GOGC alone: its
		// resident memory is its live heap and stacks plus the heap's
		// growth allowed before a collection (GOGC percent of the live
		// heap, 100 by default).
		if v := os.Getenv("L4XDS_BENCH_FLEET_SERVER_GOGC"); v != "" {
			cmd.Env = append(os.Environ(), "GOGC="+v)
		}
		p, err := netns.StartProc("l4xds-control-plane", cmd)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(p.Stop)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) && !p.Exited() {
			if m := servingRE.FindStringSubmatch(p.Output()); m != nil {
				return &fleetServer{Proc: p, addr: m[1]}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !p.Exited() || attempt == 50 || !strings.Contains(p.Output(), "address already in use") {
			tb.Fatalf("l4xds-control-plane did not serve:\n%s", p.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procCPU is a process's user and system time.
func procCPU(tb testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command, which may hold spaces, start at 3.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// fleetNode is one simulated agent: a SotW ADS stream that subscribes to
// every cluster and its endpoints and ACKs every response, reconnecting at
// once when the stream breaks.
type fleetNode struct {
	id      string
	want    int // clusters in a full state
	partial *atomic.Int64

	connected atomic.Bool
	// reconnects counts the streams that broke, the restart's aside.
	reconnects *atomic.Int64
	// round counts the EDS versions received, over the node's streams:
	// a new stream's first response is the version the node holds
	// already, unless the fleet changed meanwhile. times holds when each
	// came.
	edsVersion string
	round      atomic.Int64
	mu         sync.Mutex
	times      []time.Time
	resync     atomic.Bool // set by the test; cleared once a full state came
}

func (n *fleetNode) at(round int) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.times[round-1]
}

func (n *fleetNode) run(ctx context.Context, addr string, tlsConfig *tls.Config) {
	for ctx.Err() == nil {
		err := n.stream(ctx, addr, tlsConfig)
		n.connected.Store(false)
		if ctx.Err() == nil && !n.resync.Load() {
			n.reconnects.Add(1)
		}
		if ctx.Err() == nil && err != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (n *fleetNode) stream(ctx context.Context, addr string, tlsConfig *tls.Config) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
		grpc.WithKeepaliveParams(xds.Keepalive))
	if err != nil {
		return err
	}
	defer conn.Close()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	names := make([]string, n.want)
	for i := range names {
		names[i] = clusterName(i)
	}
	node := &corev3.Node{Id: n.id}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: xds.ClusterType}); err != nil {
		return err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xds.EndpointType, ResourceNames: names}); err != nil {
		return err
	}
	n.connected.Store(true)
	full := map[string]bool{}
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		if len(resp.GetResources()) != n.want {
			n.partial.Add(1)
		} else {
			full[resp.GetTypeUrl()] = true
		}
		if resp.GetTypeUrl() == xds.EndpointType && resp.GetVersionInfo() != n.edsVersion && !n.resync.Load() {
			n.edsVersion = resp.GetVersionInfo()
			n.mu.Lock()
			n.times = append(n.times, now)
			n.mu.Unlock()
			n.round.Add(1)
		}
		if full[xds.ClusterType] && full[xds.EndpointType] && n.resync.Load() {
			n.resync.Store(false)
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if resp.GetTypeUrl() == xds.EndpointType {
			req.ResourceNames = names
		}
		if err := st.Send(req); err != nil {
			return errors.Join(err, ctx.Err())
		}
	}
}

// fleetClientTLS is the agents' side of mTLS with the development
// certificates of dir.
func fleetClientTLS(tb testing.TB, dir string) *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, devcerts.ClientCert), filepath.Join(dir, devcerts.ClientKey))
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, devcerts.CACert))
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13}
}

// memoryCgroup makes a memory cgroup of limit bytes beside this process's
// own and removes it at the end, once what ran in it has ended.
func memoryCgroup(tb testing.TB, limit int64) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("a memory cgroup for the server needs root")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		tb.Fatal(err)
	}
	// cgroup v2 where the unified hierarchy is mounted at the root, else
	// v1's memory hierarchy.
	root, file, match := "/sys/fs/cgroup/memory", "memory.limit_in_bytes", func(c string) bool { return slices.Contains(strings.Split(c, ","), "memory") }
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		root, file, match = "/sys/fs/cgroup", "memory.max", func(c string) bool { return c == "" }
	}
	var own string
	for line := range strings.Lines(string(self)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && match(parts[1]) {
			own = parts[2]
		}
	}
	// Beside ours, not in it: cgroup v2 lets only leaves hold processes.
	dir := filepath.Join(root, filepath.Dir(own), fmt.Sprintf("l4xds-bench-fleet-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatalf("a memory cgroup for the server: %v", err)
	}
	tb.Cleanup(func() {
		// The server's processes are reaped by now (their cleanups run
		// first); the kernel may take a moment to let the cgroup go.
		for i := 0; ; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if i == 50 {
				tb.Errorf("removing the server's cgroup: %v", err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		tb.Fatalf("the server's memory cgroup %s: %s: %v", dir, file, err)
	}
	return dir
}
