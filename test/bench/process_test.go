// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/test/netns"
)

// BenchmarkAgentProcess runs the agent binary ($L4XDS_BIN/l4xds-agent, as
// make bench builds it) against the in-process server at 10000x100 and
// prints its peak resident set: the rss_bytes of the convergence lines are
// the benchmark's process, the server's memory included.
func BenchmarkAgentProcess(b *testing.B) {
	bin := os.Getenv("L4XDS_BIN")
	switch {
	case bin == "":
		b.Skip("needs $L4XDS_BIN, the directory of l4xds-agent (make bench sets it)")
	case !useBPF():
		b.Skip("needs root: the agent writes its BPF maps, where convergence is observed")
	}
	for _, p := range protocols {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				fmt.Println(measureAgentProcess(b, filepath.Join(bin, "l4xds-agent"), shape{10000, 100}, p))
			}
		})
	}
}

// measureAgentProcess starts the agent once the server is up and empty,
// waits for it to subscribe, serves the shape and measures until every
// service entry in its maps has the shape's backends.
func measureAgentProcess(tb testing.TB, agentBin string, s shape, protocol string) string {
	tb.Helper()
	srv := startServer(tb)
	root, dir := netns.MountBPFFS(tb), tb.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(agentBin,
		"--enable-xds-control-plane",
		"--xds-server-address", srv.addr,
		"--xds-server-name", "localhost",
		"--xds-ca-cert-path", filepath.Join(srv.certs, devcerts.CACert),
		"--xds-client-cert-path", filepath.Join(srv.certs, devcerts.ClientCert),
		"--xds-client-key-path", filepath.Join(srv.certs, devcerts.ClientKey),
		"--xds-node-id", "bench-node",
		"--xds-protocol", protocol,
		"--bpf-root", root,
		"--api-socket", filepath.Join(dir, "api.sock"),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	fail := func(format string, args ...any) {
		log, _ := os.ReadFile(logFile.Name())
		tb.Fatalf("agent process: "+format+"\n%s", append(args, log)...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for srv.clusters.NumWildcardWatches() == 0 {
		if ctx.Err() != nil {
			fail("did not subscribe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	clusters, clas := resources(s)
	start := time.Now()
	srv.set(clusters, clas)
	var maps *datapath.Maps
	for {
		if maps == nil {
			maps, _ = datapath.OpenPinnedMaps(root)
		}
		if maps != nil && servicesWith(tb, maps, s.M) == s.N {
			break
		}
		if ctx.Err() != nil {
			fail("not converged: %v", ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	seconds := time.Since(start).Seconds()
	maps.Close()
	return fmt.Sprintf("BENCH agent_process shape=%s protocol=%s maps=bpf seconds=%.3f rss_bytes=%d",
		s, protocol, seconds, procStatus(tb, cmd.Process.Pid, "VmHWM"))
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
