// SPDX-License-Identifier: Apache-2.0

package chaos

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

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
	"github.com/l4xds/l4xds/test/ports"
)

// env is the processes of a run: the control planes, each serving its own
// resources file on its own address, and the agent listing them all.
type env struct {
	bin, dir string
	// ns is the network namespace the control planes and the agent run
	// in; "" for the test's own.
	ns      string
	servers []*server
	agent   *netns.Proc
	api     *api.Client
}

// server is one control plane; proc is its latest process.
type server struct {
	addr, resources string
	proc            *netns.Proc
	procs           []*netns.Proc
}

func newEnv(t *testing.T, bin, ns string, n int) *env {
	t.Helper()
	e := &env{bin: bin, dir: t.TempDir(), ns: ns}
	if out, err := exec.Command(filepath.Join(bin, "l4xds-control-plane"), "certs", "--out", e.path("certs")).CombinedOutput(); err != nil {
		t.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	// Below the ephemeral range, no connection of another process takes a
	// server's port while the server is down. As root the test has a network
	// namespace of its own (netns.Main), where the ports are its alone.
	for i, p := range ports.Free(t, "tcp", n) {
		// A directory each: a server watches its file's directory.
		dir := e.path(fmt.Sprintf("cp%d", i+1))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		e.servers = append(e.servers, &server{addr: "127.0.0.1:" + strconv.Itoa(p), resources: filepath.Join(dir, "resources.yaml")})
	}
	t.Cleanup(func() {
		if e.agent != nil {
			e.agent.Stop()
		}
		for _, s := range e.servers {
			for _, p := range s.procs {
				p.Kill() // hung ones too: SIGKILL ends a stopped process
			}
		}
	})
	return e
}

func (e *env) path(name string) string { return filepath.Join(e.dir, name) }

// command runs one of the binaries, in e.ns if set (ip netns exec execs
// in place: the process is the binary, which the signals reach).
func (e *env) command(bin string, args ...string) *exec.Cmd {
	path := filepath.Join(e.bin, bin)
	if e.ns == "" {
		return exec.Command(path, args...)
	}
	return netns.Command(context.Background(), e.ns, path, args...)
}

// write replaces server i's resources file by s, by rename: the server
// never reads half a file.
func (e *env) write(i int, s *state) error {
	path := e.servers[i].resources
	if err := os.WriteFile(path+".new", []byte(s.yaml()), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

// start runs control plane i on its address.
func (e *env) start(i int) error {
	s := e.servers[i]
	name := fmt.Sprintf("l4xds-control-plane cp%d (%s)", i+1, s.addr)
	p, err := netns.StartProc(name, e.command("l4xds-control-plane", "serve",
		"--resources", s.resources, "--listen", s.addr,
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt")))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s.proc = p
	s.procs = append(s.procs, p)
	return nil
}

func (e *env) signal(i int, sig syscall.Signal) error {
	p := e.servers[i].proc
	if err := p.Cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	return nil
}

// apply carries a step out.
func (e *env) apply(st step) error {
	s := e.servers[st.server]
	switch st.action {
	case start:
		return e.start(st.server)
	case kill:
		s.proc.Kill()
	case restart:
		if st.graceful {
			s.proc.Stop()
		} else {
			s.proc.Kill()
		}
		return e.start(st.server)
	case hang:
		return e.signal(st.server, syscall.SIGSTOP)
	case resume:
		return e.signal(st.server, syscall.SIGCONT)
	case serve:
		return e.write(st.server, st.state)
	}
	return nil
}

// crashed names a control plane that should run but exited (its port
// taken, say): the run cannot go on.
func (e *env) crashed(runs []run) error {
	for i, s := range e.servers {
		if runs[i] != down && s.proc != nil && s.proc.Exited() {
			return fmt.Errorf("%s exited on its own (%v):\n%s", s.proc.Name, s.proc.Cmd.ProcessState, tail(s.proc.Output(), 30))
		}
	}
	if e.agent != nil && e.agent.Exited() {
		return fmt.Errorf("the agent exited (%v):\n%s", e.agent.Cmd.ProcessState, tail(e.agent.Output(), 60))
	}
	return nil
}

func (e *env) addresses() []string {
	var out []string
	for _, s := range e.servers {
		out = append(out, s.addr)
	}
	return out
}

// startAgent runs the agent, listing every server in order, with the
// datapath arguments given, and waits for its API.
func (e *env) startAgent(t *testing.T, protocol string, datapath ...string) {
	t.Helper()
	socket := e.path("agent.sock")
	p, err := netns.StartProc("l4xds-agent", e.command("l4xds-agent", append([]string{
		"--enable-xds-control-plane", "--xds-server-address", strings.Join(e.addresses(), ","),
		"--xds-server-name", "localhost", "--xds-node-id", "chaos",
		"--xds-protocol", protocol,
		"--xds-client-cert-path", e.path("certs/client.crt"),
		"--xds-client-key-path", e.path("certs/client.key"),
		"--xds-ca-cert-path", e.path("certs/ca.crt"),
		"--api-socket", socket}, datapath...)...))
	if err != nil {
		t.Fatal(err)
	}
	e.agent = p
	e.api = api.NewClient(socket)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := e.api.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("the agent's API never answered (%v):\n%s", err, tail(p.Output(), 60))
		}
	}
}

// sample is one reading of the agent: its tables, its xDS status and its
// health, read from at on.
type sample struct {
	at        time.Time
	view      view
	servers   []*xds.ServerStatus
	types     []*xds.TypeStatus
	xdsHealth health.Status
}

// read reads the agent's tables and status over its API socket.
func (e *env) read(ctx context.Context) (sample, error) {
	s := sample{at: time.Now()}
	var fes []*lb.Frontend
	var bes []*lb.Backend
	for table, rows := range map[string]any{
		lb.FrontendsTableName: &fes, lb.BackendsTableName: &bes,
		xds.ServersTableName: &s.servers, xds.StatusTableName: &s.types,
	} {
		if err := e.api.Table(ctx, table, rows); err != nil {
			return s, err
		}
	}
	s.view = tablesView(fes, bes)
	rep, err := e.api.Health(ctx)
	if err != nil {
		return s, err
	}
	for _, st := range rep.Statuses {
		if strings.Contains(st.Scope, "xds-client") {
			s.xdsHealth = st
		}
	}
	return s, nil
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{fmt.Sprintf("[... %d lines before]", len(l)-lines)}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}
