// SPDX-License-Identifier: Apache-2.0

package agenttest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4xds/l4xds/cilium/internal/agenttest"
	"github.com/l4xds/l4xds/test/netns"
)

// xdsResources are the CFP's example (its backends in the backends
// namespace) and a UDP service split 70/30, as the control plane serves them.
const xdsResources = `
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: my-database-service
  metadata:
    filter_metadata:
      io.cilium.l4lb:
        vip: "10.1.2.3"
        port: 3306
        protocol: TCP
  type: EDS
  eds_cluster_config:
    service_name: my-database-service
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: my-database-service
  endpoints:
  - lb_endpoints:
    - endpoint:
        address:
          socket_address: { address: 192.168.1.10, port_value: 3306 }
    - endpoint:
        address:
          socket_address: { address: 192.168.1.11, port_value: 3306 }
---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: game
  metadata:
    filter_metadata:
      io.cilium.l4lb: { vip: "10.1.2.4", port: 7777, protocol: UDP }
  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: game
  endpoints:
  - lb_endpoints:
    - endpoint: { address: { socket_address: { address: 192.168.1.10, port_value: 7777 } } }
      load_balancing_weight: 70
    - endpoint: { address: { socket_address: { address: 192.168.1.11, port_value: 7777 } } }
      load_balancing_weight: 30
`

// TestPrivilegedCiliumAgentXDS is the CFP inside Cilium, end to end: this
// module's cilium-agent (Cilium's agent plus the l4xds cell) subscribes to
// the reference control plane over mTLS, configured by the CFP's block, and
// Cilium's own datapath serves the VIPs:
//   - north-south: a client sends through the node to the VIPs, TCP and
//     UDP, split per the weights over 1,000 flows each;
//   - socket-LB: a process in the agent's cgroup connects to the VIP;
//   - cilium-dbg shows the frontends, the xDS resources and the maps;
//   - the control plane killed: traffic unchanged; the agent restarted while
//     it is down: the VIPs are served from Cilium's pinned maps before any
//     xDS response (the tables are still empty), and once the control plane
//     is back the tables fill again.
func TestPrivilegedCiliumAgentXDS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs cilium-agent in network namespaces")
	}
	bin := os.Getenv("L4XDS_CILIUM_BIN")
	if bin == "" {
		t.Skip("needs L4XDS_CILIUM_BIN, the directory of cilium-agent and cilium-dbg (make -C cilium build)")
	}
	traffic := agenttest.TrafficBin(t)
	cp := agenttest.Bin(t, "l4xds-control-plane")

	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if out, err := exec.Command(cp, "certs", "--out", certs).CombinedOutput(); err != nil {
		t.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	resources := filepath.Join(dir, "resources.yaml")
	if err := os.WriteFile(resources, []byte(xdsResources), 0o644); err != nil {
		t.Fatal(err)
	}
	block := strings.Join([]string{
		"enabled: true",
		`server-address: "10.0.0.2:18000"`,
		"server-name: localhost",
		"client-cert-path: " + filepath.Join(certs, "client.crt"),
		"client-key-path: " + filepath.Join(certs, "client.key"),
		"ca-cert-path: " + filepath.Join(certs, "ca.crt"),
	}, "\n")
	// The control plane runs outside the node, in the client's namespace,
	// and listens before the agent dials it; so do the backends.
	var control *netns.Proc
	startControlPlane := func(e *agenttest.Env) error {
		var err error
		control, err = e.StartProc(e.Client, cp, "serve", "--resources", resources, "--listen", "10.0.0.2:18000",
			"--cert", filepath.Join(certs, "server.crt"), "--key", filepath.Join(certs, "server.key"),
			"--client-ca", filepath.Join(certs, "ca.crt"))
		return err
	}
	env := agenttest.Start(t, agenttest.Config{
		BinDir: bin,
		BeforeAgent: func(e *agenttest.Env) error {
			e.StartBackend(traffic, "b0", []string{"192.168.1.10:3306"}, []string{"192.168.1.10:7777"})
			e.StartBackend(traffic, "b1", []string{"192.168.1.11:3306"}, []string{"192.168.1.11:7777"})
			return startControlPlane(e)
		},
		Flags: []string{"--xds-control-plane=" + block, "--bpf-lb-algorithm-annotation=true"},
	})

	first := env.WaitAnswer(traffic, env.Client, "tcp", "10.1.2.3:3306", 3*time.Minute)
	t.Logf("first answer from the VIP %s after the agent started", first.Round(100*time.Millisecond))

	services := []struct {
		proto, addr string
		weights     map[string]float64
	}{
		{"tcp", "10.1.2.3:3306", map[string]float64{"b0": 50, "b1": 50}},
		{"udp", "10.1.2.4:7777", map[string]float64{"b0": 70, "b1": 30}},
	}
	// 1,000 flows are split within 5 points of the weights; the 200 of
	// each fault within 12 (about 3.5 standard deviations).
	split := func(when string, flows int) {
		t.Helper()
		for _, c := range services {
			p, err := env.RunProbe(traffic, env.Client, c.proto, c.addr, flows)
			if err != nil {
				t.Fatal(err)
			}
			tolerance := 5.0
			if flows < 1000 {
				tolerance = 12
			}
			checkSplitWithin(t, when+": "+c.proto+" "+c.addr, p, c.weights, tolerance)
		}
	}
	// The UDP service may be programmed a moment after the TCP one.
	env.WaitAnswer(traffic, env.Client, "udp", "10.1.2.4:7777", time.Minute)
	split("north-south", 1000)

	checkSocketLB(t, env, traffic, "10.1.2.3:3306")

	// cilium-dbg, built from the same Cilium module.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"shell", "--", "db/show", "frontends"}, []string{"10.1.2.3:3306/TCP", "xds/my-database-service", "10.1.2.4:7777/UDP", "xds/game", "Done"}},
		{[]string{"shell", "--", "db/show", "backends"}, []string{"192.168.1.10:3306/TCP", "192.168.1.11:7777/UDP"}},
		{[]string{"shell", "--", "db/show", "services"}, []string{"xds/my-database-service", "xds/game"}},
		{[]string{"shell", "--", "db/show", "xds-resources"}, []string{"my-database-service", "acked"}},
		{[]string{"shell", "--", "xds/status"}, []string{"10.0.0.2:18000"}},
		{[]string{"statedb", "dump"}, []string{"xds/my-database-service", "10.1.2.4"}},
	} {
		var out string
		var err error
		if c.args[0] == "shell" {
			out, err = env.Shell(c.args[2:]...)
		} else {
			out, err = env.Dbg(c.args...)
		}
		if err != nil {
			t.Errorf("cilium-dbg %s: %v\n%s", strings.Join(c.args, " "), err, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("cilium-dbg %s has no %q:\n%s", strings.Join(c.args, " "), w, out)
			}
		}
		if c.args[0] == "shell" {
			t.Logf("cilium-dbg %s:\n%s", strings.Join(c.args, " "), out)
		}
	}
	if out, err := env.BPF("lb", "list"); err != nil || !strings.Contains(out, "10.1.2.3:3306") || !strings.Contains(out, "10.1.2.4:7777") {
		t.Errorf("cilium-dbg bpf lb list (%v) lacks a VIP:\n%s", err, out)
	} else {
		t.Logf("cilium-dbg bpf lb list:\n%s", out)
	}

	// The control plane dies: nothing changes.
	control.Stop()
	split("control plane down", 200)

	// The agent restarts while the control plane is down: Cilium's maps are
	// pinned, the cell holds back pruning until a first full state, so the
	// VIPs are served although the tables have nothing from xDS.
	env.Restart()
	again := env.WaitAnswer(traffic, env.Client, "tcp", "10.1.2.3:3306", 3*time.Minute)
	t.Logf("restarted without a control plane: answered %s after the agent started", again.Round(100*time.Millisecond))
	if out, err := env.Shell("db/show", "frontends"); err != nil || strings.Contains(out, "xds/") {
		t.Fatalf("the tables already hold xDS frontends (%v), so this proves nothing about the maps:\n%s", err, out)
	}
	split("restarted, before any xDS response", 200)

	// The control plane is back: the tables fill again.
	if err := startControlPlane(env); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := env.Shell("db/show", "frontends")
		if err == nil && strings.Contains(out, "xds/game") && strings.Contains(out, "xds/my-database-service") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the frontends did not come back from the control plane (%v):\n%s", err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	split("control plane back", 200)
}
