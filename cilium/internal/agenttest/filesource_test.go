// SPDX-License-Identifier: Apache-2.0

package agenttest_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/l4xds/l4xds/cilium/internal/agenttest"
)

// stateFile is Cilium's --lb-state-file input: Kubernetes Services and
// EndpointSlices. One EndpointSlice per backend, because Cilium's weight
// annotation applies to a whole slice; weights take effect with Maglev only.
var stateFile = `services:
- metadata:
    name: db
    namespace: test
    annotations:
      service.cilium.io/lb-algorithm: maglev
  spec:
    type: LoadBalancer
    ports:
    - name: mysql
      port: 3306
      protocol: TCP
  status:
    loadBalancer:
      ingress:
      - ip: 10.1.2.3
- metadata:
    name: dns
    namespace: test
    annotations:
      service.cilium.io/lb-algorithm: maglev
  spec:
    type: LoadBalancer
    ports:
    - name: dns
      port: 53
      protocol: UDP
  status:
    loadBalancer:
      ingress:
      - ip: 10.1.2.4
endpoints:
` + slice("db", "b0", "192.168.1.10", "mysql", 3306, "TCP", 100) +
	slice("db", "b1", "192.168.1.11", "mysql", 3306, "TCP", 50) +
	slice("dns", "b0", "192.168.1.10", "dns", 53, "UDP", 70) +
	slice("dns", "b1", "192.168.1.11", "dns", 53, "UDP", 30)

func slice(svc, name, addr, port string, num int, proto string, weight int) string {
	r := strings.NewReplacer("SVC", svc, "NAME", name, "ADDR", addr, "PORTNAME", port,
		"NUM", strconv.Itoa(num), "PROTO", proto, "WEIGHT", strconv.Itoa(weight))
	return r.Replace(`- metadata:
    name: SVC-NAME
    namespace: test
    labels:
      kubernetes.io/service-name: SVC
    annotations:
      service.cilium.io/weight: "WEIGHT"
  addressType: IPv4
  endpoints:
  - addresses:
    - ADDR
    conditions:
      ready: true
  ports:
  - name: PORTNAME
    port: NUM
    protocol: PROTO
`)
}

// TestPrivilegedCiliumFileSource runs the plain cilium-agent with Cilium's
// file source (--lb-state-file) and real traffic: new flows from the
// client through the node split by the backends' weights, a process in the
// agent's cgroup reaches the VIP through socket-LB, and the agent's tables
// show the frontends. With $L4XDS_CILIUM_BIN, the directory of cilium-agent
// and cilium-dbg (built from this module), and as root.
func TestPrivilegedCiliumFileSource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs cilium-agent in network namespaces")
	}
	bin := os.Getenv("L4XDS_CILIUM_BIN")
	if bin == "" {
		t.Skip("needs L4XDS_CILIUM_BIN, the directory of cilium-agent and cilium-dbg (go build ./cmd/cilium-agent ./cmd/cilium-dbg)")
	}
	traffic := agenttest.TrafficBin(t)
	state := filepath.Join(t.TempDir(), "state.yaml")
	if err := os.WriteFile(state, []byte(stateFile), 0o644); err != nil {
		t.Fatal(err)
	}
	env := agenttest.Start(t, agenttest.Config{
		BinDir: bin,
		// The backends listen before the agent starts, as an xDS test's
		// control plane would.
		BeforeAgent: func(e *agenttest.Env) error {
			e.StartBackend(traffic, "b0", []string{"192.168.1.10:3306"}, []string{"192.168.1.10:53"})
			e.StartBackend(traffic, "b1", []string{"192.168.1.11:3306"}, []string{"192.168.1.11:53"})
			return nil
		},
		Flags: []string{"--lb-state-file=" + state, "--bpf-lb-algorithm-annotation=true"},
	})

	first := env.WaitAnswer(traffic, env.Client, "tcp", "10.1.2.3:3306", 3*time.Minute)
	t.Logf("first answer from the VIP %s after the agent started", first.Round(100*time.Millisecond))

	for _, c := range []struct {
		proto, addr string
		weights     map[string]float64
	}{
		{"tcp", "10.1.2.3:3306", map[string]float64{"b0": 100, "b1": 50}},
		{"udp", "10.1.2.4:53", map[string]float64{"b0": 70, "b1": 30}},
	} {
		p, err := env.RunProbe(traffic, env.Client, c.proto, c.addr, 1000)
		if err != nil {
			t.Fatal(err)
		}
		checkSplit(t, c.proto+" "+c.addr, p, c.weights)
	}

	// Socket-LB: the node has no route to the VIPs, so only the agent's
	// cgroup programs (translating connect() to a backend) get a process
	// in its cgroup there.
	checkSocketLB(t, env, traffic, "10.1.2.3:3306")
	// The same from outside the confined cgroup: not translated, so the
	// agent's programs are not on the test's own cgroup; bpftool shows
	// them on the agent's cgroup and none new on the host's root.
	if p, err := env.RunProbe(traffic, env.Node, "tcp", "10.1.2.3:3306", 1); err != nil || p.Answered != 0 {
		t.Errorf("a process outside the agent's cgroup reached the VIP (%+v, %v): socket-LB is not confined", p, err)
	}
	if err := env.CheckConfined(); err != nil {
		t.Error(err)
	}

	frontends, err := env.Shell("db/show", "frontends")
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range []string{"10.1.2.3:3306/TCP", "10.1.2.4:53/UDP"} {
		if !strings.Contains(frontends, fe) {
			t.Errorf("db/show frontends has no %s:\n%s", fe, frontends)
		}
	}
	if out, err := env.BPF("lb", "list"); err != nil || !strings.Contains(out, "10.1.2.3:3306") {
		t.Errorf("cilium-dbg bpf lb list (%v) has no 10.1.2.3:3306:\n%s", err, out)
	}
	if out, err := env.StateDB(); err != nil || !strings.Contains(out, "10.1.2.3") {
		t.Errorf("cilium-dbg statedb dump (%v) has no 10.1.2.3", err)
	}

	// A restarted agent finds its state and pinned maps and serves again.
	env.Restart()
	first = env.WaitAnswer(traffic, env.Client, "tcp", "10.1.2.3:3306", 3*time.Minute)
	t.Logf("after a restart, first answer %s after the agent started", first.Round(100*time.Millisecond))
	p, err := env.RunProbe(traffic, env.Client, "tcp", "10.1.2.3:3306", 1000)
	if err != nil {
		t.Fatal(err)
	}
	checkSplit(t, "after restart: tcp 10.1.2.3:3306", p, map[string]float64{"b0": 100, "b1": 50})
}

// checkSocketLB wants every one of 20 TCP flows to addr from a process in
// the agent's cgroup answered: its socket-LB programs translate connect().
func checkSocketLB(t *testing.T, env *agenttest.Env, traffic, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _ := env.OutputInAgentCgroup(ctx, traffic, "probe", "--to", addr, "--proto", "tcp", "--flows", "20", "-o", "json")
	p, err := agenttest.ParseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if p.Answered != p.Flows {
		t.Errorf("socket-LB: %d of %d flows from the agent's cgroup answered: %v %v", p.Answered, p.Flows, p.Errors, p.Examples)
	} else {
		t.Logf("socket-LB: %d of %d flows from the agent's cgroup answered: %v", p.Answered, p.Flows, p.Backends)
	}
}

// checkSplit wants every flow answered and each backend's share within 5
// points of its weight's.
func checkSplit(t *testing.T, what string, p agenttest.Probe, weights map[string]float64) {
	checkSplitWithin(t, what, p, weights, 5)
}

// checkSplitWithin is checkSplit within tolerance points: fewer flows than
// 1,000 need a wider one (200 flows at 50% vary by 3.5 points, one standard
// deviation).
func checkSplitWithin(t *testing.T, what string, p agenttest.Probe, weights map[string]float64, tolerance float64) {
	t.Helper()
	if p.Answered != p.Flows {
		t.Errorf("%s: %d of %d flows answered: %v %v", what, p.Answered, p.Flows, p.Errors, p.Examples)
	}
	var total float64
	for _, w := range weights {
		total += w
	}
	for b, w := range weights {
		want := 100 * w / total
		if got := p.Share(b); math.Abs(got-want) > tolerance {
			t.Errorf("%s: %s answered %.1f%% of the flows, want %.1f%% ± %g", what, b, got, want, tolerance)
		}
	}
	t.Logf("%s: %d flows, %d answered, split %v", what, p.Flows, p.Answered, p.Backends)
}
