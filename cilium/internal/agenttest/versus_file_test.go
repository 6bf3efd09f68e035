// SPDX-License-Identifier: Apache-2.0

package agenttest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/shell"

	"github.com/l4xds/l4xds/cilium/internal/agenttest"
	"github.com/l4xds/l4xds/test/bench/versus"
	"github.com/l4xds/l4xds/test/netns"
)

// BenchmarkVersusCiliumFile runs the real cilium-agent of this module twice
// per round, alternating: fed by Cilium's own file source (--lb-state-file:
// Kubernetes Services and EndpointSlices) and fed by our cell over xDS from
// the reference control plane, with the same N services of M backends,
// Maglev on both (the Services' annotation, the cell's own). Each run is a
// fresh agent in its own namespaces. The input starts empty; once the agent
// has synchronised that and is idle (its cgroup under a tenth of a core for
// two seconds: a new agent compiles its datapath after it is ready), the
// full input is renamed into place, and the run
// is timed from the rename until every one of the N frontends is Done
// (reconciled into Cilium's BPF maps) with its M backends. Both sources
// wait 100 ms for their file to settle (the control plane's fixed
// debounce; Cilium's --lb-state-file-interval set to the same). It prints
// per run
//
//	BENCH versus-cilium-file side=xds|file shape=NxM seconds=… first_frontend_s=… services_per_s=… heap_inuse_bytes_per_service=… agent_cpu_s=… idle_after_s=… polls=…
//
// (first_frontend_s: until a poll first saw one of the frontends, in any
// state: the source's latency, before Cilium's reconciler; idle_after_s:
// the wait for an idle agent before the input; polls: how many times the
// frontends were read, every pollEvery) and per shape
// the medians of three runs and the ratios (xds over file):
//
//	BENCH versus-cilium-file shape=NxM runs=3 xds_services_per_s=… file_services_per_s=… ratio=… xds_heap_bytes_per_service=… file_heap_bytes_per_service=… heap_ratio=… xds_agent_cpu_s=… file_agent_cpu_s=…
//
// The heap is the agent's HeapInuse after a GC (its pprof endpoint), after
// minus before the input; the CPU is the agent's user and system time over
// the timed window. The parsing of the input is the agent's on the file
// side and the control plane's (another process) on the xDS side, where the
// agent decodes protobuf instead. L4XDS_VERSUS_FILE_SHAPES (e.g.
// "10000x1,1000x100", the default) and L4XDS_VERSUS_FILE_ROUNDS (3) change
// the runs; L4XDS_VERSUS_FILE_RCU_EXPEDITED=1 runs them with the kernel's
// RCU grace periods expedited (expediteRCU; the summary ends rcu=expedited
// instead of rcu=kernel). L4XDS_VERSUS_FILE_PROFILES=<dir> writes, per run, the agent's
// CPU profile of the first L4XDS_VERSUS_FILE_CPU_SECONDS (30) of the timed
// window and its heap profiles before and after
// (<side>-<shape>-<run>.cpu.pprof, .heap0.pprof, .heap.pprof: `go tool
// pprof -diff_base` of the two is the input's), and prints the count of Cilium's frontend reconciliations and
// of its BPF map operations (`BENCH versus-cilium-file-reconciler` lines).
func BenchmarkVersusCiliumFile(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: runs cilium-agent in network namespaces")
	}
	bin := os.Getenv("L4XDS_CILIUM_BIN")
	if bin == "" {
		b.Skip("needs L4XDS_CILIUM_BIN, the directory of cilium-agent and cilium-dbg (make -C cilium build)")
	}
	cp := agenttest.Bin(b, "l4xds-control-plane")
	shapes, rounds, err := versusFileSettings()
	if err != nil {
		b.Fatal(err)
	}
	regime := "kernel"
	if os.Getenv("L4XDS_VERSUS_FILE_RCU_EXPEDITED") != "" {
		expediteRCU(b)
		regime = "expedited"
	}
	for range b.N {
		for _, sh := range shapes {
			var figures [2][]fileRun
			side := func(i int, name string, run func(*testing.B, benchShape, string) fileRun) versus.Side {
				return func(context.Context) (versus.Figures, error) {
					var f fileRun
					k := len(figures[i])
					ok := b.Run(fmt.Sprintf("%s/%s/%d", sh, name, k), func(b *testing.B) {
						f = run(b, sh, fmt.Sprintf("%s-%s-%d", name, sh, k))
						fmt.Println(f.line(name, sh))
					})
					if !ok {
						return versus.Figures{}, fmt.Errorf("%s %s failed", name, sh)
					}
					figures[i] = append(figures[i], f)
					return versus.Figures{ServicesPerS: f.rate(sh), HeapBytesPerService: f.heapPerService(sh)}, nil
				}
			}
			if _, err := versus.Alternate(context.Background(), rounds,
				side(0, "xds", func(b *testing.B, sh benchShape, id string) fileRun { return runXDSSide(b, bin, cp, sh, id) }),
				side(1, "file", func(b *testing.B, sh benchShape, id string) fileRun { return runFileSide(b, bin, sh, id) }),
			); err != nil {
				b.Fatal(err)
			}
			fmt.Println(versusFileLine(sh, figures[0], figures[1]), "rcu="+regime)
		}
	}
}

type benchShape struct{ N, M int }

func (s benchShape) String() string { return fmt.Sprintf("%dx%d", s.N, s.M) }

func versusFileSettings() ([]benchShape, int, error) {
	spec := os.Getenv("L4XDS_VERSUS_FILE_SHAPES")
	if spec == "" {
		spec = "10000x1,1000x100"
	}
	var shapes []benchShape
	for _, s := range strings.Split(spec, ",") {
		n, m, ok := strings.Cut(s, "x")
		nn, err1 := strconv.Atoi(n)
		mm, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || nn <= 0 || mm <= 0 || nn > 65000 || nn*mm > 1<<20 {
			return nil, 0, fmt.Errorf("L4XDS_VERSUS_FILE_SHAPES=%q: want NxM,... (N ≤ 65000 services, N×M ≤ 2^20 backends)", spec)
		}
		shapes = append(shapes, benchShape{nn, mm})
	}
	rounds := 3
	if v := os.Getenv("L4XDS_VERSUS_FILE_ROUNDS"); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r <= 0 {
			return nil, 0, fmt.Errorf("L4XDS_VERSUS_FILE_ROUNDS=%q: want a positive number", v)
		}
		rounds = r
	}
	return shapes, rounds, nil
}

// fileRun is one run's figures.
type fileRun struct {
	settle     time.Duration // the wait for an idle agent, before
	elapsed    time.Duration
	first      time.Duration // until the first frontend was seen
	heapBefore int64
	heapAfter  int64
	cpu        time.Duration
	polls      int
}

// pollEvery is the period of the poll of the frontends, or twice the time
// a poll takes if longer: the poll renders every frontend in the agent, so
// its share of the agent's CPU stays under half.
const pollEvery = 100 * time.Millisecond

func (f fileRun) rate(sh benchShape) float64 { return float64(sh.N) / f.elapsed.Seconds() }

func (f fileRun) heapPerService(sh benchShape) float64 {
	return float64(f.heapAfter-f.heapBefore) / float64(sh.N)
}

func (f fileRun) line(side string, sh benchShape) string {
	return fmt.Sprintf("BENCH versus-cilium-file side=%s shape=%s seconds=%.3f first_frontend_s=%.3f services_per_s=%.0f heap_inuse_bytes_per_service=%.0f agent_cpu_s=%.2f idle_after_s=%.1f polls=%d",
		side, sh, f.elapsed.Seconds(), f.first.Seconds(), f.rate(sh), f.heapPerService(sh), f.cpu.Seconds(), f.settle.Seconds(), f.polls)
}

func versusFileLine(sh benchShape, xds, file []fileRun) string {
	med := func(rs []fileRun, get func(fileRun) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = get(r)
		}
		return versus.Median(xs)
	}
	rate := func(r fileRun) float64 { return r.rate(sh) }
	heap := func(r fileRun) float64 { return r.heapPerService(sh) }
	cpu := func(r fileRun) float64 { return r.cpu.Seconds() }
	xr, fr := med(xds, rate), med(file, rate)
	xh, fh := med(xds, heap), med(file, heap)
	return fmt.Sprintf("BENCH versus-cilium-file shape=%s runs=%d xds_services_per_s=%.0f file_services_per_s=%.0f ratio=%.2f "+
		"xds_heap_bytes_per_service=%.0f file_heap_bytes_per_service=%.0f heap_ratio=%.2f xds_agent_cpu_s=%.2f file_agent_cpu_s=%.2f",
		sh, min(len(xds), len(file)), xr, fr, xr/fr, xh, fh, xh/fh, med(xds, cpu), med(file, cpu))
}

// The services: bench/s<i>, VIP 172.16.0.0+i port 80/TCP, backends
// 10.128.0.0+i*M+j port 8080, all of weight 1 (nothing probes them).
func benchVIP(i int) string { return ipv4(172<<24 | 16<<16 + uint32(i)) }

func benchBackend(sh benchShape, i, j int) string { return ipv4(10<<24 | 128<<16 + uint32(i*sh.M+j)) }

func ipv4(a uint32) string { return fmt.Sprintf("%d.%d.%d.%d", a>>24, a>>16&255, a>>8&255, a&255) }

// commonFlags are both sides' agent flags: Maglev per service by
// annotation (a small table: the sources are measured, not Maglev), LB maps
// large enough for the shape, and the pprof endpoint the heap is read from.
func commonFlags(sh benchShape) []string {
	return append([]string{
		"--bpf-lb-algorithm-annotation=true",
		"--bpf-lb-maglev-table-size=1021",
		"--bpf-lb-map-max=" + strconv.Itoa(2*sh.N*(sh.M+1)+1024),
		"--pprof=true", "--pprof-address=127.0.0.1", "--pprof-port=6060",
	}, profileFlags()...)
}

// stateFileJSON is Cilium's --lb-state-file input for the shape.
func stateFileJSON(sh benchShape) []byte {
	var b strings.Builder
	b.WriteString(`{"services":[`)
	for i := range sh.N {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"s%d","namespace":"bench","annotations":{"service.cilium.io/lb-algorithm":"maglev"}},`+
			`"spec":{"type":"LoadBalancer","ports":[{"name":"p","port":80,"protocol":"TCP"}]},`+
			`"status":{"loadBalancer":{"ingress":[{"ip":%q}]}}}`, i, benchVIP(i))
	}
	b.WriteString(`],"endpoints":[`)
	for i := range sh.N {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"s%d","namespace":"bench","labels":{"kubernetes.io/service-name":"s%d"}},"addressType":"IPv4","endpoints":[`, i, i)
		for j := range sh.M {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"addresses":[%q],"conditions":{"ready":true}}`, benchBackend(sh, i, j))
		}
		b.WriteString(`],"ports":[{"name":"p","port":8080,"protocol":"TCP"}]}`)
	}
	b.WriteString("]}")
	return []byte(b.String())
}

// resourcesJSON is the control plane's resource file for the shape.
func resourcesJSON(sh benchShape) []byte {
	var b strings.Builder
	b.WriteString(`{"resources":[`)
	for i := range sh.N {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"s%d","type":"EDS",`+
			`"metadata":{"filterMetadata":{"io.cilium.l4lb":{"vip":%q,"port":80}}}},`, i, benchVIP(i))
		fmt.Fprintf(&b, `{"@type":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment","clusterName":"s%d","endpoints":[{"lbEndpoints":[`, i)
		for j := range sh.M {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"endpoint":{"address":{"socketAddress":{"address":%q,"portValue":8080}}}}`, benchBackend(sh, i, j))
		}
		b.WriteString(`]}]}`)
	}
	b.WriteString("]}")
	return []byte(b.String())
}

// replace renames content into place at path, as the sources expect a
// file to change: at once.
func replace(tb testing.TB, path string, content []byte) {
	tb.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

func runFileSide(b *testing.B, bin string, sh benchShape, id string) fileRun {
	dir := b.TempDir()
	state := filepath.Join(dir, "state.json")
	replace(b, state, []byte(`{"services":[],"endpoints":[]}`))
	input := stateFileJSON(sh)
	env := agenttest.Start(b, agenttest.Config{
		BinDir: bin,
		Flags:  append(commonFlags(sh), "--lb-state-file="+state, "--lb-state-file-interval=100ms"),
	})
	waitFor(b, "the file source's first synchronisation", 2*time.Minute, func() (bool, string) {
		out := env.AgentOutput()
		return strings.Contains(out, "Synchronized from local state"), ""
	})
	return measure(b, env, sh, id, func() { replace(b, state, input) })
}

var clusterSynced = regexp.MustCompile(`(?m)^Cluster\s+true\s*$`)

func runXDSSide(b *testing.B, bin, cp string, sh benchShape, id string) fileRun {
	dir := b.TempDir()
	certs := filepath.Join(dir, "certs")
	if out, err := exec.Command(cp, "certs", "--out", certs).CombinedOutput(); err != nil {
		b.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	resources := filepath.Join(dir, "resources.json")
	replace(b, resources, []byte(`{"resources":[]}`))
	input := resourcesJSON(sh)
	block := strings.Join([]string{
		"enabled: true",
		`server-address: "10.0.0.2:18000"`,
		"server-name: localhost",
		"namespace: bench",
		"client-cert-path: " + filepath.Join(certs, "client.crt"),
		"client-key-path: " + filepath.Join(certs, "client.key"),
		"ca-cert-path: " + filepath.Join(certs, "ca.crt"),
	}, "\n")
	env := agenttest.Start(b, agenttest.Config{
		BinDir: bin,
		BeforeAgent: func(e *agenttest.Env) error {
			_, err := e.StartProc(e.Client, cp, "serve", "--resources", resources, "--listen", "10.0.0.2:18000",
				"--cert", filepath.Join(certs, "server.crt"), "--key", filepath.Join(certs, "server.key"),
				"--client-ca", filepath.Join(certs, "ca.crt"))
			return err
		},
		Flags: append(commonFlags(sh), "--xds-control-plane="+block),
	})
	// Synced with the empty state (no clusters: no endpoints to watch).
	waitFor(b, "the cell's first state", 2*time.Minute, func() (bool, string) {
		out, err := env.Shell("db/show", "xds-status", "--columns=Type,Synced")
		return err == nil && clusterSynced.MatchString(out), out
	})
	return measure(b, env, sh, id, func() { replace(b, resources, input) })
}

// measure reads the agent's heap, puts the input in place, and waits until
// every frontend is Done with its backends.
func measure(b *testing.B, env *agenttest.Env, sh benchShape, id string, put func()) fileRun {
	pid := env.AgentPID()
	var f fileRun
	f.settle = waitIdle(b, env)
	f.heapBefore = agentHeapInuse(b, env)
	cpu := processCPU(b, pid)
	prof := startProfiles(b, env, id)
	start := time.Now()
	put()
	// Each poll renders every frontend, a large share of the agent's CPU
	// while both its source and its reconciler need it: the next poll
	// waits as long as the last one took. A run ends at the start of the
	// poll that saw every frontend Done, the snapshot it read.
	deadline := start.Add(10 * time.Minute)
	for {
		polled := time.Now()
		// The shell's protocol: cilium-dbg would add a process start to
		// every poll.
		var buf strings.Builder
		if err := shell.ShellExchange(shell.Config{ShellSockPath: env.ShellSocket()}, &buf,
			"db/show frontends --columns=Status,ServiceName,Backends"); err != nil {
			b.Fatalf("db/show frontends: %v", err)
		}
		f.polls++
		out := buf.String()
		done, err := doneFrontends(out, sh.M)
		if err != nil {
			b.Fatal(err)
		}
		if f.first == 0 && strings.Contains(out, " bench/") {
			f.first = polled.Sub(start)
		}
		if done == sh.N {
			f.elapsed = polled.Sub(start)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s frontends Done with %d backends each: %d of %d within 10m", sh, sh.M, done, sh.N)
		}
		// A fixed period, not one that follows the poll's own cost: that
		// cost differs by side (how fast Cilium renders each source's
		// rows), and every poll lengthens the kernel's waits it measures.
		took := time.Since(polled)
		time.Sleep(max(pollEvery-took, took))
	}
	f.cpu = processCPU(b, pid) - cpu
	f.heapAfter = agentHeapInuse(b, env)
	prof(sh)
	return f
}

// waitIdle waits until the agent's cgroup has used under a tenth of a core
// for two seconds, and returns how long that took. A new agent compiles its
// datapath (clang, for seconds on this machine's two cores) after it reports
// ready and after the sources synchronise: measured then, a source would be
// timed against the compiler's share of the CPU, which falls on either side
// as the two happen to overlap.
func waitIdle(tb testing.TB, env *agenttest.Env) time.Duration {
	tb.Helper()
	const (
		window  = 2 * time.Second
		maxBusy = window / 10
		timeout = 3 * time.Minute
	)
	start := time.Now()
	last, err := env.CgroupCPU()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		time.Sleep(window)
		now, err := env.CgroupCPU()
		if err != nil {
			tb.Fatal(err)
		}
		if now-last < maxBusy {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			tb.Fatalf("the agent was not idle within %s: its cgroup used %s of CPU in the last %s", timeout, now-last, window)
		}
		last = now
	}
}

// doneFrontends counts the rows of `db/show frontends
// --columns=Status,ServiceName,Backends` of a bench service that are Done
// with m backends. Cilium shows five backends and "+ K more ...".
func doneFrontends(table string, m int) (int, error) {
	done := 0
	sc := bufio.NewScanner(strings.NewReader(table))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "Done" || !strings.HasPrefix(f[1], "bench/") {
			continue
		}
		backends := 0
		for k, w := range f[2:] {
			switch {
			case strings.Contains(w, ":"):
				backends++
			case w == "more":
				more, err := strconv.Atoi(f[2+k-1])
				if err != nil {
					return 0, fmt.Errorf("frontends row %q: %w", sc.Text(), err)
				}
				backends += more
			}
		}
		if backends == m {
			done++
		}
	}
	return done, sc.Err()
}

// rcuExpedited is the kernel's switch that makes every RCU grace period an
// expedited one.
const rcuExpedited = "/sys/kernel/rcu_expedited"

// expediteRCU makes the kernel's RCU grace periods expedited until the
// benchmark ends, then restores the setting. Each frontend Cilium programs
// updates its Maglev map of maps, and the kernel makes such an update wait
// for a grace period: a few ticks (10 to 15 ms here) unless expedited. With
// that wait, which Cilium pays alike whatever its source, the runs measure
// the kernel; expedited, as on a machine whose grace periods are short,
// they measure the sources.
func expediteRCU(tb testing.TB) {
	tb.Helper()
	old, err := os.ReadFile(rcuExpedited)
	if err != nil {
		tb.Fatalf("L4XDS_VERSUS_FILE_RCU_EXPEDITED: %v", err)
	}
	if err := os.WriteFile(rcuExpedited, []byte("1"), 0o644); err != nil {
		tb.Fatalf("L4XDS_VERSUS_FILE_RCU_EXPEDITED: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.WriteFile(rcuExpedited, old, 0o644); err != nil {
			tb.Errorf("restore %s: %v", rcuExpedited, err)
		}
	})
}

// profileFlags are the agent's flags for L4XDS_VERSUS_FILE_PROFILES: the
// reconcilers' metrics, which Cilium leaves off by default.
func profileFlags() []string {
	if os.Getenv("L4XDS_VERSUS_FILE_PROFILES") == "" {
		return nil
	}
	return []string{"--metrics=+cilium_reconciler_count,+cilium_reconciler_duration_seconds,+cilium_bpf_map_ops_total"}
}

// startProfiles starts the CPU profile of L4XDS_VERSUS_FILE_PROFILES; the
// function it returns waits for it, writes the heap profile and prints the
// reconciler's figures.
func startProfiles(tb testing.TB, env *agenttest.Env, id string) func(benchShape) {
	dir := os.Getenv("L4XDS_VERSUS_FILE_PROFILES")
	if dir == "" {
		return func(benchShape) {}
	}
	secs := 30
	if v := os.Getenv("L4XDS_VERSUS_FILE_CPU_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			tb.Fatalf("L4XDS_VERSUS_FILE_CPU_SECONDS=%q: want a positive number", v)
		}
		secs = n
	}
	if err := fetchPprof(env, "/debug/pprof/heap?gc=1", filepath.Join(dir, id+".heap0.pprof")); err != nil {
		tb.Error(err)
	}
	cpuDone := make(chan error, 1)
	go func() {
		cpuDone <- fetchPprof(env, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(dir, id+".cpu.pprof"))
	}()
	return func(sh benchShape) {
		if err := <-cpuDone; err != nil {
			tb.Error(err)
		}
		if err := fetchPprof(env, "/debug/pprof/heap?gc=1", filepath.Join(dir, id+".heap.pprof")); err != nil {
			tb.Error(err)
		}
		out, err := env.Shell("metrics", "reconciler")
		if err != nil {
			tb.Errorf("the agent's reconciler metrics: %v", err)
		}
		ops, err := env.Shell("metrics", "bpf_map_ops")
		if err != nil {
			tb.Errorf("the agent's map metrics: %v", err)
		}
		fmt.Printf("BENCH versus-cilium-file-reconciler id=%s shape=%s\n%s\n%s\n", id, sh, out, ops)
	}
}

// fetchPprof writes the agent's pprof endpoint path to file.
func fetchPprof(env *agenttest.Env, path, file string) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.Dial(ctx, env.Node, network, addr)
		},
	}}
	resp, err := client.Get("http://127.0.0.1:6060" + path)
	if err != nil {
		return fmt.Errorf("the agent's %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the agent's %s: %s %v", path, resp.Status, err)
	}
	return os.WriteFile(file, body, 0o644)
}

// agentHeapInuse is the agent's HeapInuse after a GC, from its pprof
// endpoint in the node's namespace.
func agentHeapInuse(tb testing.TB, env *agenttest.Env) int64 {
	tb.Helper()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.Dial(ctx, env.Node, network, addr)
		},
	}, Timeout: time.Minute}
	resp, err := client.Get("http://127.0.0.1:6060/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		tb.Fatalf("the agent's heap profile: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("the agent's heap profile: %v", err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "# HeapInuse = "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("the agent's heap profile: %q: %v", line, err)
			}
			return n
		}
	}
	tb.Fatalf("the agent's heap profile has no HeapInuse line (%s)", resp.Status)
	return 0
}

// processCPU is pid's user and system time.
func processCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command's name, which ends with the last ')'.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	const ticks = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticks
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(tb testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %s (last: %s)", what, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
