// SPDX-License-Identifier: Apache-2.0

// Package e2e runs the three l4xds binaries together: the reference control
// plane, the agent and l4xds-dbg, talking real gRPC over mTLS.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/ports"
)

// binDir builds the binaries once per test run, or uses $L4XDS_BIN (set by
// `make test`, which has just built them).
func binDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("L4XDS_BIN"); dir != "" {
		return dir
	}
	dir := t.TempDir()
	for _, args := range [][]string{
		{"build", "-o", dir + "/", "../../cmd/l4xds-agent", "../../cmd/l4xds-dbg"},
		{"build", "-C", "../../cmd/l4xds-control-plane", "-o", dir + "/", "."}, // a module of its own
	} {
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	return dir
}

// freePort is a loopback address for a server the test starts later.
func freePort(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", ports.Free(t, "tcp", 1)[0])
}

// proc is a binary running until the test ends; its output goes to the
// test log when the test fails.
type proc struct {
	name string
	out  syncBuffer
	done chan struct{}
}

// syncBuffer is the output of a running process, readable while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// exited reports a process that ended before the test did.
var exited = make(chan *proc, 8)

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: filepath.Base(bin), done: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopping := make(chan struct{})
	go func() {
		cmd.Wait()
		close(p.done)
		select {
		case <-stopping:
		default:
			exited <- p
		}
	}()
	t.Cleanup(func() {
		close(stopping)
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.out.String())
		}
	})
	return p
}

// cfpServer is the CFP example for l4xds-control-plane to serve over mTLS:
// the certificates it made and the resources file it watches.
type cfpServer struct {
	certs, resources string
	// cfp is the example as the resources file first holds it.
	cfp []byte
}

// writeCFP makes the certificates and writes the CFP example's resources
// into dir.
func writeCFP(t *testing.T, bin, dir string) cfpServer {
	t.Helper()
	s := cfpServer{certs: filepath.Join(dir, "certs"), resources: filepath.Join(dir, "resources.yaml")}
	if out, err := exec.Command(filepath.Join(bin, "l4xds-control-plane"), "certs", "--out", s.certs).CombinedOutput(); err != nil {
		t.Fatalf("certs: %v\n%s", err, out)
	}
	var err error
	if s.cfp, err = os.ReadFile("../../examples/cfp.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.resources, s.cfp, 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// serveArgs are l4xds-control-plane's arguments to serve the resources on
// addr to clients with a certificate of the CA.
func (s cfpServer) serveArgs(addr string) []string {
	return []string{"serve", "--resources", s.resources, "--listen", addr,
		"--cert", filepath.Join(s.certs, "server.crt"), "--key", filepath.Join(s.certs, "server.key"),
		"--client-ca", filepath.Join(s.certs, "ca.crt")}
}

// xdsArgs are the agent's flags to connect to the server on addr.
func (s cfpServer) xdsArgs(addr string) []string {
	return []string{"--enable-xds-control-plane", "--xds-server-address", addr, "--xds-server-name", "localhost",
		"--xds-client-cert-path", filepath.Join(s.certs, "client.crt"),
		"--xds-client-key-path", filepath.Join(s.certs, "client.key"),
		"--xds-ca-cert-path", filepath.Join(s.certs, "ca.crt")}
}

// eventually runs l4xds-dbg with args until its output satisfies ok.
func eventually(t *testing.T, dbg, socket string, args []string, what string, ok func(string) bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last string
	for ctx.Err() == nil {
		out, err := exec.Command(dbg, append([]string{"--socket", socket}, args...)...).CombinedOutput()
		last = string(out)
		if err == nil && ok(last) {
			return last
		}
		select {
		case p := <-exited:
			t.Fatalf("%s exited early", p.name)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("l4xds-dbg %s never showed %s; last output:\n%s", strings.Join(args, " "), what, last)
	return ""
}

func shows(t *testing.T, dbg, socket string, args []string, want ...string) {
	t.Helper()
	eventually(t, dbg, socket, args, strings.Join(want, ", "), func(out string) bool { return containsAll(out, want) })
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func TestBinariesServeTheCFPExampleOverMTLS(t *testing.T) {
	bin := binDir(t)
	dir := t.TempDir()
	example := writeCFP(t, bin, dir)

	addr := freePort(t)
	start(t, filepath.Join(bin, "l4xds-control-plane"), example.serveArgs(addr)...)

	// The agent reads the CFP's configuration block verbatim.
	config := filepath.Join(dir, "l4xds.yaml")
	if err := os.WriteFile(config, []byte(`xds-control-plane:
  # Enables the xDS client in the Cilium agent for L4 LB
  enabled: true
  # Address of the external xDS management server
  server-address: "`+addr+`"
  # Optional: Path to a client certificate for mTLS authentication
  client-cert-path: "`+filepath.Join(example.certs, "client.crt")+`"
  # Optional: Path to a client key for mTLS authentication
  client-key-path: "`+filepath.Join(example.certs, "client.key")+`"
  # Optional: Path to the CA certificate for verifying the xDS server
  ca-cert-path: "`+filepath.Join(example.certs, "ca.crt")+`"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "agent.sock")
	start(t, filepath.Join(bin, "l4xds-agent"), "--config-file", config,
		"--api-socket", socket, "--datapath", "none", "--xds-server-name", "localhost", "--xds-node-id", "e2e-node")

	dbg := filepath.Join(bin, "l4xds-dbg")
	shows(t, dbg, socket, []string{"statedb", "frontends"}, "10.1.2.3:3306/TCP", "my-database-service", "192.168.1.10:3306", "192.168.1.11:3306")
	shows(t, dbg, socket, []string{"statedb", "backends"}, "192.168.1.10:3306", "192.168.1.11:3306")
	shows(t, dbg, socket, []string{"statedb", "services", "-o", "json"}, `"my-database-service"`)
	shows(t, dbg, socket, []string{"xds", "status"}, "connected", "my-database-service", "acked")
	shows(t, dbg, socket, []string{"shell", "--", "db/show", "frontends"}, "10.1.2.3:3306/TCP")

	watchFrontends(t, dbg, socket, "10.1.2.3:3306/TCP")

	// Edit the file: a third backend, the first one draining.
	edited := strings.Replace(string(example.cfp),
		"socket_address: { address: 192.168.1.11, port_value: 3306 }",
		"socket_address: { address: 192.168.1.11, port_value: 3306 }\n"+
			"    - endpoint:\n        address:\n          socket_address: { address: 192.168.1.12, port_value: 3306 }", 1)
	if edited == string(example.cfp) {
		t.Fatal("examples/cfp.yaml changed: the edit no longer applies")
	}
	if err := os.WriteFile(example.resources, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	shows(t, dbg, socket, []string{"statedb", "backends"}, "192.168.1.12:3306")

	// Remove the cluster: its rows go.
	if err := os.WriteFile(example.resources, []byte("# nothing served\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, dbg, socket, []string{"statedb", "frontends"}, "no 10.1.2.3 frontend", func(out string) bool {
		return strings.Contains(out, "Address") && !strings.Contains(out, "10.1.2.3")
	})
}

func TestBinariesAgentIsDisabledByDefault(t *testing.T) {
	bin := binDir(t)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	agent := start(t, filepath.Join(bin, "l4xds-agent"), "--api-socket", socket, "--datapath", "none")
	dbg := filepath.Join(bin, "l4xds-dbg")
	shows(t, dbg, socket, []string{"xds", "status"}, "xDS control plane disabled")
	shows(t, dbg, socket, []string{"statedb", "frontends"}, "Address")
	if !strings.Contains(agent.out.String(), "disabled") {
		t.Errorf("the agent's log does not say that xDS is disabled:\n%s", agent.out.String())
	}
}

func TestBinariesAgentRefusesABadConfigFileNamingTheKey(t *testing.T) {
	bin := binDir(t)
	config := filepath.Join(t.TempDir(), "l4xds.yaml")
	if err := os.WriteFile(config, []byte("xds-control-plane:\n  server-adress: x:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "l4xds-agent"), "--config-file", config, "--api-socket", filepath.Join(t.TempDir(), "s"), "--datapath", "none").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "xds-control-plane.server-adress") {
		t.Errorf("agent with a typo in its config file: %v\n%s\nwant a failure naming xds-control-plane.server-adress", err, out)
	}
}

// watchFrontends runs `l4xds-dbg statedb frontends -w` until it streams a
// line containing want.
func watchFrontends(t *testing.T, dbg, socket, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, dbg, "--socket", socket, "statedb", "frontends", "-w")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cancel()
	lines := bufio.NewScanner(stdout)
	var seen []string
	for lines.Scan() {
		if strings.Contains(lines.Text(), want) {
			return
		}
		seen = append(seen, lines.Text())
	}
	t.Fatalf("statedb frontends -w never streamed %q; got:\n%s", want, strings.Join(seen, "\n"))
}
