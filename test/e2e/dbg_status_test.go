// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// dbgRun is one run of l4xds-dbg: what it printed and how it exited.
type dbgRun struct {
	stdout, stderr string
	code           int
}

// squeezed is the output with the columns' padding squeezed to one blank,
// for checks that do not depend on the widths of the other rows.
func (r dbgRun) squeezed() string { return padding.ReplaceAllString(r.stdout, " ") }

var padding = regexp.MustCompile(`  +`)

func runDbg(t *testing.T, dbg string, args ...string) dbgRun {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(dbg, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := dbgRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("l4xds-dbg %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// waitDbg runs l4xds-dbg until ok holds for its run.
func waitDbg(t *testing.T, what, dbg string, args []string, ok func(dbgRun) bool) dbgRun {
	t.Helper()
	var r dbgRun
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if r = runDbg(t, dbg, args...); ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("l4xds-dbg %s never showed %s; last run exited %d:\n%s%s", strings.Join(args, " "), what, r.code, r.stdout, r.stderr)
		}
	}
}

// `l4xds-dbg status` is a probe: 0 while the agent is healthy, 1 once it is
// degraded (here: its control plane gone), with the reason on the screen
// and on stderr. `status --readiness` is 0 once the agent has served a
// first state, degraded or not, and 1 before.
func TestBinariesDbgStatusIsAProbe(t *testing.T) {
	bin := binDir(t)
	dir := t.TempDir()
	example := writeCFP(t, bin, dir)

	// The control plane is the test's own process: the test stops it.
	addr := freePort(t)
	var cpOut syncBuffer
	cp := exec.Command(filepath.Join(bin, "l4xds-control-plane"), example.serveArgs(addr)...)
	cp.Stdout, cp.Stderr = &cpOut, &cpOut
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan struct{})
	go func() { cp.Wait(); close(cpDone) }()
	stopCP := func() {
		cp.Process.Signal(os.Interrupt)
		select {
		case <-cpDone:
		case <-time.After(10 * time.Second):
			cp.Process.Kill()
			<-cpDone
		}
	}
	t.Cleanup(func() {
		stopCP()
		if t.Failed() {
			t.Logf("l4xds-control-plane output:\n%s", cpOut.String())
		}
	})

	socket := filepath.Join(dir, "agent.sock")
	start(t, filepath.Join(bin, "l4xds-agent"), append([]string{"--api-socket", socket, "--datapath", "none"},
		example.xdsArgs(addr)...)...)
	dbg := filepath.Join(bin, "l4xds-dbg")
	status := []string{"--socket", socket, "status"}

	healthy := waitDbg(t, "a healthy agent with the CFP example", dbg, status, func(r dbgRun) bool {
		return r.code == 0 && containsAll(r.squeezed(), []string{"Resources: 2 acked", "Frontends: 1 (1 Pending)"})
	})
	t.Logf("l4xds-dbg status, healthy:\n%s", healthy.stdout)
	for _, want := range []string{
		"Health: OK",
		"xDS server: " + addr + " (sotw)",
		"xDS state: connected for ",
		"Cluster: version ",
		"Services: 1",
		"Backends: 2 (2 active)",
		"Datapath: none: no forwarding, tables only",
	} {
		if !strings.Contains(healthy.squeezed(), want) {
			t.Errorf("healthy status lacks %q", want)
		}
	}

	stopCP()
	degraded := waitDbg(t, "the agent degraded without its control plane", dbg, status, func(r dbgRun) bool {
		return r.code != 0 && strings.Contains(r.squeezed(), "Health: Degraded")
	})
	t.Logf("l4xds-dbg status, control plane stopped (exit %d):\n%s%s", degraded.code, degraded.stdout, degraded.stderr)
	if degraded.code != 1 {
		t.Errorf("exit status %d while degraded, want 1", degraded.code)
	}
	// The reason names the server, on the screen and on stderr; the
	// tables keep their last good state.
	health := strings.SplitN(degraded.stdout, "xDS server:", 2)[0]
	if !strings.Contains(health, addr) || !strings.Contains(degraded.stderr, "degraded: ") || !strings.Contains(degraded.stderr, addr) {
		t.Errorf("the degraded status does not name %s as the reason", addr)
	}
	if !containsAll(degraded.squeezed(), []string{"Resources: 2 acked", "Backends: 2 (2 active)"}) {
		t.Errorf("the tables changed with the control plane gone:\n%s", degraded.stdout)
	}
	// Degraded, yet ready: it serves its last good state (the chart's
	// readiness probe is `status --readiness`).
	if !strings.Contains(degraded.squeezed(), "Readiness: ready: serving the last complete state") {
		t.Errorf("the degraded status does not say the agent is still ready:\n%s", degraded.stdout)
	}
	if r := runDbg(t, dbg, append(status, "--readiness")...); r.code != 0 {
		t.Errorf("status --readiness: exit %d without the control plane after the first state, want 0 (ready)\n%s%s", r.code, r.stdout, r.stderr)
	}

	// An agent that never had a state from a server is not ready.
	lonely := filepath.Join(dir, "lonely.sock")
	start(t, filepath.Join(bin, "l4xds-agent"), append([]string{"--api-socket", lonely, "--datapath", "none"},
		example.xdsArgs(freePort(t))...)...)
	notReady := waitDbg(t, "an agent that never had a state", dbg, []string{"--socket", lonely, "status", "--readiness"}, func(r dbgRun) bool {
		return r.code != 0 && strings.Contains(r.squeezed(), "Readiness: not ready")
	})
	if notReady.code != 1 || !strings.Contains(notReady.stderr, "not ready: waiting for datapath: the first complete state is served") {
		t.Errorf("status --readiness before any state: exit %d, stderr %q", notReady.code, notReady.stderr)
	}

	// No agent at all: non-zero, and the socket named.
	gone := runDbg(t, dbg, "--socket", filepath.Join(dir, "none.sock"), "status")
	if gone.code == 0 || !strings.Contains(gone.stderr, "none.sock") {
		t.Errorf("status without an agent: exit %d, stderr %q", gone.code, gone.stderr)
	}
}
