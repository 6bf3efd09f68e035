// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// Inside the LB namespace, new for every run: the ports are free and stay
// the same across restarts.
const (
	controlPlaneAddr = "127.0.0.1:18000"
	metricsAddr      = "127.0.0.1:9970"
)

// env is the soak's topology: servers on every backend, the control plane
// and the agent (BPF datapath) in the LB namespace, both restartable.
type env struct {
	bin, dir, bpfRoot  string
	resources, socket  string
	topo               *netns.Topology
	mu                 sync.Mutex
	cp, agent          *netns.Proc
	cpKilled, agentOff bool // ended on purpose
	procs              []*netns.Proc
}

func newEnv(t *testing.T, services []*service) *env {
	t.Helper()
	e := &env{bin: netns.AgentBinaries(t), dir: t.TempDir()}
	e.bpfRoot = netns.MountBPFFS(t)
	topo, err := netns.New(netns.UniquePrefix(), backends)
	if err != nil {
		t.Fatal(err)
	}
	e.topo = topo
	t.Cleanup(func() {
		e.mu.Lock()
		procs := e.procs
		e.mu.Unlock()
		for _, p := range procs {
			p.Stop()
		}
		if t.Failed() {
			for _, p := range []*netns.Proc{e.cp, e.agent} {
				if p != nil {
					t.Logf("%s output:\n%s", p.Name, tail(p.Output(), 60))
				}
			}
		}
		if err := topo.Delete(); err != nil {
			t.Errorf("deleting the topology: %v", err)
		}
	})
	// Thousands of connections a minute, each leaving its port in
	// TIME_WAIT for a minute: every port above 1023.
	if out, err := netns.Command(context.Background(), topo.Client, "sh", "-c",
		"echo 1024 65535 > /proc/sys/net/ipv4/ip_local_port_range").CombinedOutput(); err != nil {
		t.Fatalf("widening the client's ephemeral ports: %v\n%s", err, out)
	}
	tcp, udp := servedPorts(services)
	for i, b := range topo.Backends {
		args := []string{"serve", "--name", fmt.Sprintf("b%d", i)}
		for _, p := range tcp {
			args = append(args, "--tcp", fmt.Sprintf(":%d", p))
		}
		for _, p := range udp {
			args = append(args, "--udp", fmt.Sprintf(":%d", p))
		}
		p, err := e.start(b.NS, "l4xds-traffic", args...)
		if err != nil {
			t.Fatal(err)
		}
		p.WaitOutput(t, "ready", 10*time.Second)
	}
	if out, err := exec.Command(filepath.Join(e.bin, "l4xds-control-plane"), "certs", "--out", e.path("certs")).CombinedOutput(); err != nil {
		t.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	e.resources, e.socket = e.path("resources.yaml"), e.path("agent.sock")
	return e
}

func (e *env) path(name string) string { return filepath.Join(e.dir, name) }

// start runs one of the binaries in namespace ns; the test's cleanup
// stops it.
func (e *env) start(ns, bin string, args ...string) (*netns.Proc, error) {
	name := bin + " " + args[0] + " in " + ns
	p, err := netns.StartProc(name, netns.Command(context.Background(), ns, filepath.Join(e.bin, bin), args...))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

func (e *env) startControlPlane() error {
	p, err := e.start(e.topo.LB, "l4xds-control-plane", "serve",
		"--resources", e.resources, "--listen", controlPlaneAddr,
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt"))
	e.mu.Lock()
	e.cp, e.cpKilled = p, false
	e.mu.Unlock()
	return err
}

func (e *env) startAgent() error {
	p, err := e.start(e.topo.LB, "l4xds-agent",
		"--enable-xds-control-plane", "--xds-server-address", controlPlaneAddr,
		"--xds-server-name", "localhost", "--xds-node-id", "soak-lb",
		"--xds-client-cert-path", e.path("certs/client.crt"),
		"--xds-client-key-path", e.path("certs/client.key"),
		"--xds-ca-cert-path", e.path("certs/ca.crt"),
		"--api-socket", e.socket,
		"--datapath", "bpf", "--devices", netns.ClientDevice+","+netns.BridgeDevice,
		"--bpf-root", e.bpfRoot,
		"--prometheus-serve-addr", metricsAddr)
	e.mu.Lock()
	e.agent, e.agentOff = p, false
	e.mu.Unlock()
	return err
}

// killControlPlane ends the control plane, by SIGKILL or SIGTERM.
func (e *env) killControlPlane(hard bool) {
	e.mu.Lock()
	p := e.cp
	e.cpKilled = true
	e.mu.Unlock()
	if hard {
		p.Kill()
	} else {
		p.Stop()
	}
}

// killAgent ends the agent with SIGKILL: nothing of it runs on, but its
// pinned maps and links, which keep forwarding.
func (e *env) killAgent() {
	e.mu.Lock()
	p := e.agent
	e.agentOff = true
	e.mu.Unlock()
	p.Kill()
}

// crashed names a control plane or agent that exited on its own.
func (e *env) crashed() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range []struct {
		p      *netns.Proc
		onPurp bool
	}{{e.cp, e.cpKilled}, {e.agent, e.agentOff}} {
		if c.p != nil && !c.onPurp && c.p.Exited() {
			return fmt.Errorf("%s exited on its own (%v):\n%s", c.p.Name, c.p.Cmd.ProcessState, tail(c.p.Output(), 40))
		}
	}
	return nil
}

// apply replaces the served resources; the control plane picks the file up
// by its watch. Written by rename, so it never reads half a file.
func (e *env) apply(yaml string) error {
	tmp := e.resources + ".new"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, e.resources)
}

// dbgJSON runs l4xds-dbg with -o json and decodes what it prints: one
// value, or a row per value into rows.
func (e *env) dbgJSON(args ...string) ([]json.RawMessage, string, error) {
	b, err := exec.Command(filepath.Join(e.bin, "l4xds-dbg"), append(args, "-o", "json")...).CombinedOutput()
	if err != nil {
		return nil, string(b), fmt.Errorf("l4xds-dbg %s: %w", strings.Join(args, " "), err)
	}
	var out []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var v json.RawMessage
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out, string(b), nil
		} else if err != nil {
			return nil, string(b), fmt.Errorf("decoding l4xds-dbg %s: %w", strings.Join(args, " "), err)
		}
		out = append(out, v)
	}
}

// frontendRow is a row of `l4xds-dbg statedb frontends -o json`.
type frontendRow struct {
	Address     string
	ServiceName string
	Backends    []struct {
		Address string
		State   string
	}
	Status struct {
		Kind string `json:"kind"`
	}
}

func (e *env) frontendRows() ([]frontendRow, string, error) {
	raw, out, err := e.dbgJSON("--socket", e.socket, "statedb", "frontends")
	if err != nil {
		return nil, out, err
	}
	rows := make([]frontendRow, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &rows[i]); err != nil {
			return nil, out, err
		}
	}
	return rows, out, nil
}

// tableFrontends is the frontends table as frontend -> its backends as
// the table prints them (with their state when not active), sorted, and
// whether every row is reconciled (Done).
func tableFrontends(rows []frontendRow) (map[string][]string, bool) {
	out := map[string][]string{}
	done := true
	for _, r := range rows {
		var bes []string
		for _, b := range r.Backends {
			s := b.Address
			if b.State != "active" {
				s += " " + b.State
			}
			bes = append(bes, s)
		}
		slices.Sort(bes)
		out[r.Address] = bes
		done = done && r.Status.Kind == "Done"
	}
	return out, done
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{fmt.Sprintf("[... %d lines before]", len(l)-lines)}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}
