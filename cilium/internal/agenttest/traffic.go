// SPDX-License-Identifier: Apache-2.0

package agenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Probe is what `l4xds-traffic probe -o json` reports.
type Probe struct {
	Flows    int               `json:"flows"`
	Answered int               `json:"answered"`
	Backends map[string]int    `json:"backends"`
	Errors   map[string]int    `json:"errors"`
	Examples map[string]string `json:"examples"`
}

// Share is the percentage of the flows that backend answered.
func (p Probe) Share(backend string) float64 {
	if p.Flows == 0 {
		return 0
	}
	return 100 * float64(p.Backends[backend]) / float64(p.Flows)
}

// ParseProbe reads a probe's JSON report. A probe whose flows failed exits
// 1 after printing it, so the report is read whatever the exit status.
func ParseProbe(out []byte) (Probe, error) {
	var p Probe
	if err := json.Unmarshal(out, &p); err != nil {
		return p, fmt.Errorf("probe report: %w: %s", err, out)
	}
	return p, nil
}

// Source ports of the probes of several flows: above the ports the tests
// listen on and below the kernel's ephemeral range (32768 and up), so that
// no port the kernel picks for another flow is taken.
const (
	firstProbePort = 20000
	lastProbePort  = 32767
)

// RunProbe runs `l4xds-traffic probe` in namespace ns: flows new flows of
// proto ("tcp", "udp") to addr.
//
// Cilium picks a weighted backend by a Maglev hash of the 5-tuple, so the
// source ports are the sample a split is measured on. With the kernel's
// ports every run drew a new one, and a fair 50/50 split of 200 flows
// missed ±12 points about once in 1,400 checks; the kernel may also give a
// closed flow's port to a later one. So a probe of several flows takes
// ports of its own, the next ones of the test's sequence: each check is one
// fixed sample of distinct flows, which passes or fails on every run.
func (e *Env) RunProbe(traffic, ns, proto, addr string, flows int) (Probe, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"probe", "--to", addr, "--proto", proto, "--flows", strconv.Itoa(flows), "-o", "json"}
	if flows > 1 {
		e.mu.Lock()
		port := max(e.nextPort, firstProbePort)
		e.nextPort = port + flows
		e.mu.Unlock()
		if port+flows-1 > lastProbePort {
			return Probe{}, fmt.Errorf("probe of %d flows: the test has used its %d source ports", flows, lastProbePort-firstProbePort+1)
		}
		args = append(args, "--source-port", strconv.Itoa(port))
	}
	out, _ := e.Command(ctx, ns, traffic, args...).Output()
	return ParseProbe(out)
}

// WaitAnswer probes addr with one flow at a time until one is answered and
// returns the time since the agent started. Fails the test after timeout.
func (e *Env) WaitAnswer(traffic, ns, proto, addr string, timeout time.Duration) time.Duration {
	e.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p, err := e.RunProbe(traffic, ns, proto, addr, 1)
		if err == nil && p.Answered == 1 {
			return time.Since(e.Started())
		}
		if time.Now().After(deadline) {
			e.tb.Fatalf("%s %s not answered within %s (last probe: %+v, %v)", proto, addr, timeout, p, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// StartBackend starts `l4xds-traffic serve` in the backends namespace,
// answering with name on the given "tcp" and "udp" addresses, and waits
// until it listens. It is stopped by the cleanup.
func (e *Env) StartBackend(traffic, name string, tcp, udp []string) {
	e.tb.Helper()
	args := []string{"serve", "--name", name}
	for _, a := range tcp {
		args = append(args, "--tcp", a)
	}
	for _, a := range udp {
		args = append(args, "--udp", a)
	}
	p, err := e.StartProc(e.Backends, traffic, args...)
	if err != nil {
		e.tb.Fatal(err)
	}
	p.WaitOutput(e.tb, "ready", 30*time.Second)
}

// TrafficBin is the l4xds-traffic binary (see Bin).
func TrafficBin(tb testing.TB) string { return Bin(tb, "l4xds-traffic") }

// Bin is one of the project's binaries (l4xds-traffic, l4xds-control-plane):
// $L4XDS_BIN/name when make has built it, or else built from the
// repository's root module into the test's temporary directory.
func Bin(tb testing.TB, name string) string {
	tb.Helper()
	if dir := os.Getenv("L4XDS_BIN"); dir != "" {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/l4xds/l4xds").Output()
	if err != nil {
		tb.Fatalf("find the root module: %v", err)
	}
	pkg, dir := "./cmd/"+name, strings.TrimSpace(string(root))
	switch name {
	case "l4xds-traffic":
		pkg = "./test/l4xds-traffic"
	case "l4xds-control-plane": // a module of its own
		pkg, dir = ".", filepath.Join(dir, "cmd", name)
	}
	bin := filepath.Join(tb.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v: %s", pkg, err, out)
	}
	return bin
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
