// SPDX-License-Identifier: Apache-2.0

package e2e

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
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// The control plane listens here inside the LB namespace, which is new for
// every topology: the port is free, and stays the same across a restart.
const controlPlaneAddr = "127.0.0.1:18000"

// Ports every backend serves (l4xds-traffic serve). TCP ports echo lines
// of any size up to 1 MiB (probe --size); padded UDP ports answer a
// datagram with as many bytes.
var (
	servedTCP       = []string{":3306", ":53", ":8080"}
	servedUDP       = []string{":53", ":7777"}
	servedPaddedUDP = []string{":9000"}
)

// newTopology creates a topology with n backends, deleted when the test
// ends, failed or not.
func newTopology(t *testing.T, n int) *netns.Topology {
	t.Helper()
	return ownTopology(t, func(prefix string) (*netns.Topology, error) { return netns.New(prefix, n) })
}

// ownTopology creates a topology (netns.New or netns.NewRouted) deleted when
// the test ends, failed or not.
func ownTopology(t *testing.T, create func(prefix string) (*netns.Topology, error)) *netns.Topology {
	t.Helper()
	topo, err := create(netns.UniquePrefix())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Delete(); err != nil {
			t.Errorf("deleting the topology: %v", err)
		}
	})
	return topo
}

// startServers runs l4xds-traffic serve in every backend namespace, named
// by backendName, and waits until they listen.
func startServers(t *testing.T, bin string, topo *netns.Topology) {
	t.Helper()
	for i, b := range topo.Backends {
		args := []string{"serve", "--name", backendName(i)}
		for _, a := range servedTCP {
			args = append(args, "--tcp", a)
		}
		for _, a := range servedUDP {
			args = append(args, "--udp", a)
		}
		for _, a := range servedPaddedUDP {
			args = append(args, "--udp-padded", a)
		}
		p := startIn(t, t, b.NS, filepath.Join(bin, "l4xds-traffic"), args...)
		p.WaitOutput(t, "ready", 10*time.Second)
	}
}

// nsProc is a process running in a network namespace until it is stopped,
// killed, or the test ends; its output goes to the test log when the test
// fails.
type nsProc struct {
	*netns.Proc
	// killed: the test ended the process on purpose.
	killed bool
}

// startIn starts bin in namespace ns; owner (t or a parent of t) stops it
// when it ends.
func startIn(t, owner *testing.T, ns, bin string, args ...string) *nsProc {
	t.Helper()
	name := filepath.Base(bin) + " " + firstArg(args) + " in " + ns
	proc, err := netns.StartProc(name, netns.Command(context.Background(), ns, bin, args...))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	p := &nsProc{Proc: proc}
	owner.Cleanup(func() {
		p.Stop()
		if owner.Failed() {
			owner.Logf("%s output:\n%s", p.Name, tail(p.Output(), 60))
		}
	})
	return p
}

func firstArg(args []string) string {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0]
	}
	return ""
}

// kill ends the process with SIGKILL, on purpose, and waits for it.
func (p *nsProc) kill() {
	p.killed = true
	p.Kill()
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{fmt.Sprintf("[... %d lines before]", len(l)-lines)}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}

// lbEnv is a topology with servers on every backend, the control plane and
// the agent (BPF datapath) in the LB namespace.
type lbEnv struct {
	// top is the test that owns the environment: scenarios run as its
	// subtests, and processes they restart must outlive them.
	top       *testing.T
	bin       string
	topo      *netns.Topology
	dir       string
	bpfRoot   string
	resources string
	socket    string
	cp, agent *nsProc
	// agentArgs are added to the agent's command line at its next start.
	agentArgs []string
}

func newLBEnv(t *testing.T, backends int) *lbEnv {
	t.Helper()
	return newLBEnvOn(t, func(prefix string) (*netns.Topology, error) { return netns.New(prefix, backends) })
}

// newLBEnvOn is newLBEnv on a topology of another shape (netns.NewRouted).
func newLBEnvOn(t *testing.T, create func(prefix string) (*netns.Topology, error)) *lbEnv {
	t.Helper()
	bin := netns.AgentBinaries(t)
	e := &lbEnv{top: t, bin: bin, dir: t.TempDir()}
	e.bpfRoot = netns.MountBPFFS(t)
	e.topo = ownTopology(t, create)
	startServers(t, bin, e.topo)

	if out, err := exec.Command(filepath.Join(bin, "l4xds-control-plane"), "certs", "--out", e.path("certs")).CombinedOutput(); err != nil {
		t.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	e.resources = e.path("resources.yaml")
	e.socket = e.path("agent.sock")
	e.apply(t, "# nothing served yet\n")
	e.startControlPlane(t)
	e.startAgent(t)
	e.waitFrontends(t)
	return e
}

func (e *lbEnv) path(name string) string { return filepath.Join(e.dir, name) }

func (e *lbEnv) startControlPlane(t *testing.T) {
	t.Helper()
	e.cp = startIn(t, e.top, e.topo.LB, filepath.Join(e.bin, "l4xds-control-plane"), "serve",
		"--resources", e.resources, "--listen", controlPlaneAddr,
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt"))
}

func (e *lbEnv) startAgent(t *testing.T) {
	t.Helper()
	args := []string{"--enable-xds-control-plane", "--xds-server-address", controlPlaneAddr,
		"--xds-server-name", "localhost", "--xds-node-id", "e2e-lb",
		"--xds-client-cert-path", e.path("certs/client.crt"),
		"--xds-client-key-path", e.path("certs/client.key"),
		"--xds-ca-cert-path", e.path("certs/ca.crt"),
		"--api-socket", e.socket,
		"--datapath", "bpf", "--devices", netns.ClientDevice + "," + netns.BridgeDevice,
		"--bpf-root", e.bpfRoot,
		// The flows of a test are new flows in quick succession: a
		// reject share's refusals must not meet the node's limit
		// (TestRejectsAreRateLimited of pkg/datapath/bpf proves it).
		"--lb-reject-rate", "1000000", "--lb-reject-burst", "1000000"}
	args = append(args, netns.DatapathAttachArgs()...)
	e.agent = startIn(t, e.top, e.topo.LB, filepath.Join(e.bin, "l4xds-agent"), append(args, e.agentArgs...)...)
	if m := netns.DatapathAttach(); m != "auto" {
		// The attachment the run asked for (CI's tc pass) is the one made.
		e.agent.WaitOutput(t, " mode="+m+" datapath-attach=", 30*time.Second)
	}
}

// apply replaces the served resources; the control plane picks the file up
// by its watch. Written by rename, so it never reads half a file.
func (e *lbEnv) apply(t *testing.T, yaml string) {
	t.Helper()
	tmp := e.resources + ".new"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, e.resources); err != nil {
		t.Fatal(err)
	}
}

// serve applies clusters and waits until the datapath has them.
func (e *lbEnv) serve(t *testing.T, clusters ...cluster) {
	t.Helper()
	e.apply(t, resourcesYAML(clusters...))
	e.waitFrontends(t, clusters...)
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

func (e *lbEnv) frontends() ([]frontendRow, string, error) {
	return statedbRows[frontendRow](e, "frontends")
}

// statedbRows runs `l4xds-dbg statedb TABLE -o json` and decodes its rows;
// out is what it printed, for messages.
func statedbRows[Row any](e *lbEnv, table string) (rows []Row, out string, err error) {
	b, err := exec.Command(filepath.Join(e.bin, "l4xds-dbg"), "--socket", e.socket, "statedb", table, "-o", "json").CombinedOutput()
	out = string(b)
	if err != nil {
		return nil, out, fmt.Errorf("l4xds-dbg statedb %s: %w", table, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var r Row
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			return rows, out, nil
		} else if err != nil {
			return nil, out, fmt.Errorf("decoding l4xds-dbg statedb %s: %w", table, err)
		}
		rows = append(rows, r)
	}
}

// waitFrontends waits until the frontends table holds exactly the
// clusters' frontends, each with the clusters' backends (and states) and
// reconciled into the datapath (status Done).
func (e *lbEnv) waitFrontends(t *testing.T, clusters ...cluster) {
	t.Helper()
	want := map[string][]string{}
	for _, c := range clusters {
		var backends []string
		for _, ep := range c.endpoints {
			backends = append(backends, ep.String())
		}
		slices.Sort(backends)
		for _, f := range c.frontends {
			want[f.String()] = backends
		}
	}
	var last string
	deadline := time.Now().Add(45 * time.Second)
	for {
		rows, out, err := e.frontends()
		last = out
		if err == nil && frontendsMatch(rows, want) && e.rejectWeightsMatch(clusters) {
			return
		}
		if err != nil {
			last = err.Error() + "\n" + out
		}
		for _, p := range []*nsProc{e.agent, e.cp} {
			if p != nil && p.Exited() && !p.killed {
				t.Fatalf("%s exited (%v) while waiting for the frontends:\n%s", p.Name, p.Cmd.ProcessState, tail(p.Output(), 40))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the frontends never became %v, all Done; last `l4xds-dbg statedb frontends -o json`:\n%s", want, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// serviceRow is a row of `l4xds-dbg statedb services -o json`.
type serviceRow struct {
	Name         string
	RejectWeight int
}

// rejectWeightsMatch: the services have the clusters' reject weights. A
// service change rewrites its frontends in the same transaction, so with
// it, Done frontends are reconciled with the new weight.
func (e *lbEnv) rejectWeightsMatch(clusters []cluster) bool {
	rows, _, err := statedbRows[serviceRow](e, "services")
	if err != nil {
		return false
	}
	for _, c := range clusters {
		i := slices.IndexFunc(rows, func(r serviceRow) bool { return r.Name == c.name })
		if i < 0 || rows[i].RejectWeight != c.rejectWeight {
			return false
		}
	}
	return true
}

func frontendsMatch(rows []frontendRow, want map[string][]string) bool {
	if len(rows) != len(want) {
		return false
	}
	for _, r := range rows {
		backends, ok := want[r.Address]
		if !ok || r.Status.Kind != "Done" {
			return false
		}
		var got []string
		for _, b := range r.Backends {
			s := b.Address
			if b.State != "active" {
				s += " " + b.State
			}
			got = append(got, s)
		}
		slices.Sort(got)
		if !slices.Equal(got, backends) {
			return false
		}
	}
	return true
}
