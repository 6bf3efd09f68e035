// SPDX-License-Identifier: Apache-2.0

// Package kind tests l4xds on a real two-node Kubernetes cluster made by
// run.sh (`make test-kind`): the chart installed with the commands of
// Documentation/kubernetes.md, backends in pods, traffic from a client
// outside the nodes, and faults under traffic. It drives kubectl, helm and
// docker, so this module needs nothing but the standard library.
package kind

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// Where Documentation/kubernetes.md installs the chart.
	ns     = "kube-system"
	testNS = "l4xds-test"
	// The release: not the docs' l4xds, so that every name the docs and
	// the test use must hold for any release (<fullname>, see the docs'
	// Names).
	release  = "edge"
	fullname = "edge-l4xds"
	cpName   = fullname + "-control-plane"
	// The docs' trial service (2 backends), and a UDP one weighted 70/30,
	// both served by the same two backend pods.
	tcpVIP = "10.1.2.3:3306"
	udpVIP = "10.1.2.7:7777"
	// The VIP pool of the control plane's Kubernetes mode
	// (loadbalancer_test.go), in a prefix the client routes like the VIPs.
	kubePool      = "10.1.3.10-10.1.3.19"
	kubePoolRoute = "10.1.3.0/24"
	// New flows per check, and how far a backend's share of them may be
	// from its share of the weights, in percentage points.
	flows     = 1000
	tolerance = 5.0
)

// cluster is what run.sh made: the kind cluster and the client container.
type cluster struct {
	name   string // kind cluster name; node containers are <name>-control-plane, <name>-worker
	image  string // our image, loaded into the nodes
	bin    string // host binaries (l4xds-control-plane for the certs, l4xds-traffic for the client)
	repo   string
	client string // container on kind's network, outside the nodes
	work   string
	nodes  []node
	// flowTimeout is how long a probe's flow may wait for its answer:
	// probeTimeout unless a tier sets more.
	flowTimeout string
}

// probeTimeout is the time a probed flow has to be answered.
const probeTimeout = "2s"

type node struct{ name, ip, mac, podCIDR string }

type backend struct{ name, ip, node string }

func setup(t *testing.T) *cluster {
	name := os.Getenv("L4XDS_KIND_CLUSTER")
	if name == "" {
		t.Skip("the kind tier needs a cluster: run `make test-kind` (root with a Docker engine), which creates one and runs this test")
	}
	c := &cluster{
		name:   name,
		image:  os.Getenv("L4XDS_KIND_IMAGE"),
		bin:    os.Getenv("L4XDS_BIN"),
		client: os.Getenv("L4XDS_KIND_CLIENT"),
		work:   t.TempDir(),
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	c.repo = repo
	if c.image == "" || c.bin == "" || c.client == "" {
		t.Fatal("run.sh sets L4XDS_KIND_IMAGE, L4XDS_BIN and L4XDS_KIND_CLIENT with L4XDS_KIND_CLUSTER")
	}
	var nodes struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct{ PodCIDR string }
			Status   struct {
				Addresses []struct{ Type, Address string }
			}
		}
	}
	c.kubectlJSON(t, &nodes, "get", "nodes", "-o", "json")
	for _, n := range nodes.Items {
		nd := node{name: n.Metadata.Name, podCIDR: n.Spec.PodCIDR}
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				nd.ip = a.Address
			}
		}
		nd.mac = strings.TrimSpace(c.must(t, "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.MacAddress}}{{end}}", nd.name))
		c.nodes = append(c.nodes, nd)
	}
	if len(c.nodes) != 2 {
		t.Fatalf("want 2 nodes, have %+v", c.nodes)
	}
	return c
}

// commandTimeout bounds every command of the tests: longer than any of
// them waits on purpose (helm upgrade --timeout 10m), so that a kubectl
// exec or docker exec that hangs fails its test with its command line
// instead of ending in go test's -timeout panic, which runs no failure dump.
const commandTimeout = 12 * time.Minute

// dumpTimeout bounds each command of a failure dump: a wedged cluster must
// not hold the run.
const dumpTimeout = time.Minute

// run runs a command and returns its combined output.
func (c *cluster) run(name string, args ...string) (string, error) {
	return c.runFor(commandTimeout, name, args...)
}

// runFor is run killed after d.
func (c *cluster) runFor(d time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("no answer after %v: %w", d, err)
	}
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (c *cluster) must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := c.run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (c *cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return c.must(t, "kubectl", args...)
}

func (c *cluster) kubectlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	if err := json.Unmarshal([]byte(c.kubectl(t, args...)), v); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) apply(t *testing.T, manifest string) {
	t.Helper()
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// sh runs a shell snippet of the docs in dir, with the built binaries first
// on PATH (l4xds-control-plane) and the chart reachable as
// install/kubernetes/l4xds.
func (c *cluster) sh(t *testing.T, dir, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+c.bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s\n%s", script, out)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(out)
}

// docBlocks returns the fenced code blocks of Documentation/kubernetes.md.
func (c *cluster) docBlocks(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(c.repo, "Documentation/kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// forRelease is a command of the docs, which name the release l4xds, for
// the release of this test.
func forRelease(cmd string) string {
	for _, verb := range []string{"install", "upgrade", "uninstall"} {
		cmd = strings.ReplaceAll(cmd, "helm "+verb+" l4xds ", "helm "+verb+" "+release+" ")
	}
	return cmd
}

// docBlock returns the one code block of the docs that contains marker.
func (c *cluster) docBlock(t *testing.T, marker string) string {
	t.Helper()
	var found []string
	for _, b := range c.docBlocks(t) {
		if strings.Contains(b, marker) {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Documentation/kubernetes.md: %d code blocks contain %q, want 1", len(found), marker)
	}
	return found[0]
}

// backends returns the backend pods that are running and not terminating,
// sorted by name.
func (c *cluster) backends(t *testing.T) []backend {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				Name              string
				DeletionTimestamp *string
			}
			Spec   struct{ NodeName string }
			Status struct{ PodIP, Phase string }
		}
	}
	c.kubectlJSON(t, &pods, "-n", testNS, "get", "pods", "-l", "app=backend", "-o", "json")
	var out []backend
	for _, p := range pods.Items {
		if p.Metadata.DeletionTimestamp == nil && p.Status.Phase == "Running" && p.Status.PodIP != "" {
			out = append(out, backend{p.Metadata.Name, p.Status.PodIP, p.Spec.NodeName})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// agents returns the agent pods by node.
func (c *cluster) agents(t *testing.T) map[string]agentPod {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				Name, UID         string
				DeletionTimestamp *string
			}
			Spec   struct{ NodeName string }
			Status struct {
				Conditions []struct{ Type, Status string }
			}
		}
	}
	c.kubectlJSON(t, &pods, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=agent", "-o", "json")
	out := map[string]agentPod{}
	for _, p := range pods.Items {
		if p.Metadata.DeletionTimestamp != nil {
			continue
		}
		a := agentPod{name: p.Metadata.Name, uid: p.Metadata.UID}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				a.ready = true
			}
		}
		out[p.Spec.NodeName] = a
	}
	return out
}

type agentPod struct {
	name, uid string
	ready     bool
}

// waitAgentsReady waits until every node has a Ready agent and returns them.
func (c *cluster) waitAgentsReady(t *testing.T, timeout time.Duration) map[string]agentPod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		agents := c.agents(t)
		ready := 0
		for _, a := range agents {
			if a.ready {
				ready++
			}
		}
		if ready == len(c.nodes) {
			return agents
		}
		if time.Now().After(deadline) {
			out, _ := c.run("kubectl", "-n", ns, "get", "pods", "-o", "wide")
			t.Fatalf("agents not Ready on every node after %v: %+v\n%s", timeout, agents, out)
		}
		time.Sleep(time.Second)
	}
}

// resources renders the xDS resources: the docs' trial file with the
// backend pods' addresses in place of its example addresses, and the UDP
// service weighted 70/30 appended.
func resources(doc string, b []backend) string {
	doc = strings.ReplaceAll(doc, "192.168.1.10", b[0].ip)
	doc = strings.ReplaceAll(doc, "192.168.1.11", b[1].ip)
	return doc + fmt.Sprintf(`    ---
    resource:
      '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: udp-game
      metadata:
        filter_metadata:
          io.cilium.l4lb: {vip: "10.1.2.7", port: 7777, protocol: UDP}
      type: EDS
      eds_cluster_config: {service_name: udp-game}
    ---
    resource:
      '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
      cluster_name: udp-game
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: %s, port_value: 7777}}}
          load_balancing_weight: 70
        - endpoint: {address: {socket_address: {address: %s, port_value: 7777}}}
          load_balancing_weight: 30
`, b[0].ip, b[1].ip)
}

// probeResult is `l4xds-traffic probe -o json`.
type probeResult struct {
	Flows    int            `json:"flows"`
	Answered int            `json:"answered"`
	Backends map[string]int `json:"backends"`
	Errors   map[string]int `json:"errors"`
}

func (p probeResult) failed() int { return p.Flows - p.Answered }

// route sends the client's traffic to the VIPs (and the Kubernetes
// mode's pool) through node n.
func (c *cluster) route(t *testing.T, n node) {
	t.Helper()
	for _, dst := range []string{host(tcpVIP) + "/32", host(udpVIP) + "/32", kubePoolRoute} {
		c.must(t, "docker", "exec", c.client, "ip", "route", "replace", dst, "via", n.ip)
	}
}

func (c *cluster) timeout() string {
	if c.flowTimeout != "" {
		return c.flowTimeout
	}
	return probeTimeout
}

func host(addr string) string {
	h, _, _ := strings.Cut(addr, ":")
	return h
}

// probe opens n new flows from the client to vip (through the node the
// routes point at).
func (c *cluster) probe(vip, proto string, n int) (probeResult, error) {
	var r probeResult
	out, err := exec.Command("docker", "exec", c.client, "l4xds-traffic", "probe", "--to", vip, "--proto", proto,
		"--flows", fmt.Sprint(n), "--timeout", c.timeout(), "-o", "json").Output()
	// Exit status 1: some flows failed, and the report says which.
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
		return r, fmt.Errorf("probe %s/%s: %w %s", vip, proto, err, out)
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("probe %s/%s: %w: %s", vip, proto, err, out)
	}
	return r, nil
}

// checkSplit asserts that every flow was answered and that each backend's
// share is within tolerance of want (backend name → percent).
func checkSplit(t *testing.T, what string, r probeResult, want map[string]float64) {
	t.Helper()
	checkSplitRefused(t, what, r, want, 0)
}

// Kinds of failed probe flows (l4xds-traffic probe) that are a refusal:
// a RST answered the SYN, or ICMP port unreachable the datagram.
var refusedKinds = []string{"connection refused", "ICMP unreachable"}

// checkSplitRefused is checkSplit with a share of the flows (percent)
// refused, within tolerance; no flow fails otherwise.
func checkSplitRefused(t *testing.T, what string, r probeResult, want map[string]float64, refused float64) {
	t.Helper()
	var shares []string
	for name, pct := range want {
		got := r.share(name)
		shares = append(shares, fmt.Sprintf("%s %d (%.1f%%, want %.0f%%)", name, r.Backends[name], got, pct))
		if !nearShare(got, pct) {
			t.Errorf("%s: backend %s got %.1f%% of the flows, want %.0f±%.0f", what, name, got, pct, tolerance)
		}
	}
	sort.Strings(shares)
	n := 0
	if refused > 0 {
		for _, k := range refusedKinds {
			n += r.Errors[k]
		}
		got := r.percent(n)
		shares = append(shares, fmt.Sprintf("refused %d (%.1f%%, want %.0f%%)", n, got, refused))
		if !nearShare(got, refused) {
			t.Errorf("%s: %.1f%% of the flows refused, want %.0f±%.0f", what, got, refused, tolerance)
		}
	}
	t.Logf("%s: %d/%d answered, %s, errors %v", what, r.Answered, r.Flows, strings.Join(shares, ", "), r.Errors)
	if r.failed() != n {
		t.Errorf("%s: %d of %d flows failed (%d refused as wanted): %v", what, r.failed(), r.Flows, n, r.Errors)
	}
	for name := range r.Backends {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: flows answered by %s, not a current backend", what, name)
		}
	}
}

// traffic probes both VIPs through alternating nodes (via) until stopped, and
// counts the flows and the failures: the load during a fault.
type traffic struct {
	stop  chan struct{}
	once  sync.Once // closes stop
	done  chan struct{}
	mu    sync.Mutex
	flows int
	fails map[string]int
	// failedAt are the batches that lost flows, with the time each ended:
	// to set beside the cluster's events when the fault's cause is asked.
	failedAt []string
	errs     []error
	names    map[string]int
}

func (c *cluster) startTraffic(t *testing.T, via ...node) *traffic {
	return c.startTrafficTo(t, []target{{tcpVIP, "tcp"}, {udpVIP, "udp"}}, via...)
}

// target is a VIP:port the traffic probes, and its protocol (tcp, udp).
// A vip of ":port" is that port of each node's own address (a NodePort),
// reached without a route of the client's.
type target struct{ vip, proto string }

// onNode says whether the target is a port of each node's own address.
func (p target) onNode() bool { return strings.HasPrefix(p.vip, ":") }

// at is the address the target is probed at through n.
func (p target) at(n node) string {
	if p.onNode() {
		return n.ip + p.vip
	}
	return p.vip
}

// startTrafficTo is startTraffic through the VIPs of targets.
func (c *cluster) startTrafficTo(t *testing.T, targets []target, via ...node) *traffic {
	if len(via) == 0 {
		via = c.nodes
	}
	tr := &traffic{stop: make(chan struct{}), done: make(chan struct{}), fails: map[string]int{}, names: map[string]int{}}
	// A test that stops before expectNoFailures (t.Fatal) stops its
	// traffic too: left running, it would switch the client's routes and
	// probe the VIPs under the next subtests' checks.
	t.Cleanup(tr.halt)
	go func() {
		defer close(tr.done)
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			default:
			}
			// Routes are the client's: switching them between batches sends
			// alternate batches through each node.
			n := via[i%len(via)]
			for _, p := range targets {
				if p.onNode() {
					continue
				}
				ip, _, _ := strings.Cut(p.vip, ":")
				if _, err := c.run("docker", "exec", c.client, "ip", "route", "replace", ip+"/32", "via", n.ip); err != nil {
					tr.add(nil, err)
				}
			}
			for _, p := range targets {
				r, err := c.probe(p.at(n), p.proto, 100)
				tr.add(&r, err)
				if err == nil && r.failed() > 0 {
					// By kind: refused or unreachable is a datapath
					// without the service's backends, a timeout a flow
					// lost or a starved machine.
					where := fmt.Sprintf("%s %s via %s", p.proto, p.at(n), n.name)
					tr.mu.Lock()
					counted := 0
					for kind, k := range r.Errors {
						tr.fails[where+": "+kind] += k
						counted += k
					}
					if rest := r.failed() - counted; rest > 0 {
						tr.fails[where] += rest
					}
					tr.failedAt = append(tr.failedAt, fmt.Sprintf("%s %s: %d of %d flows %v",
						time.Now().UTC().Format("15:04:05.000"), where, r.failed(), r.Flows, r.Errors))
					tr.mu.Unlock()
				}
			}
		}
	}()
	return tr
}

func (tr *traffic) add(r *probeResult, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if err != nil {
		tr.errs = append(tr.errs, err)
		return
	}
	if r != nil {
		tr.flows += r.Flows
		for n, k := range r.Backends {
			tr.names[n] += k
		}
	}
}

// halt stops the traffic and waits for its last batch; once or more.
func (tr *traffic) halt() {
	tr.once.Do(func() { close(tr.stop) })
	<-tr.done
}

// end stops the traffic and returns the flows, the failures and the
// backends that answered.
func (tr *traffic) end() (flows, failed int, fails, names map[string]int, errs []error) {
	tr.halt()
	for _, k := range tr.fails {
		failed += k
	}
	return tr.flows, failed, tr.fails, tr.names, tr.errs
}

// expectNoFailures ends tr and asserts that every flow was answered.
func expectNoFailures(t *testing.T, what string, tr *traffic) {
	t.Helper()
	if failed := tr.report(t, what); failed != 0 {
		t.Errorf("%s: %s", what, tr.failures())
	}
}

// report ends tr, logs its figures and asserts that it ran; it returns the
// flows that failed.
func (tr *traffic) report(t *testing.T, what string) (failed int) {
	t.Helper()
	flows, failed, fails, names, errs := tr.end()
	t.Logf("%s: %d flows, %d failed %v, answered by %v", what, flows, failed, fails, names)
	if len(errs) > 0 {
		t.Errorf("%s: the traffic could not run: %v", what, errs)
	}
	if flows == 0 {
		t.Errorf("%s: no flows ran", what)
	}
	return failed
}

// failures says which flows of an ended tr failed, and when.
func (tr *traffic) failures() string {
	flows, failed, fails, _, _ := tr.end()
	return fmt.Sprintf("%d of %d flows failed: %v; the batches (UTC):\n%s", failed, flows, fails, strings.Join(tr.failedAt, "\n"))
}

// checkTraffic asserts the splits of both services through each node.
func (c *cluster) checkTraffic(t *testing.T, what string, b []backend) {
	t.Helper()
	for _, n := range c.nodes {
		c.route(t, n)
		c.probeSplit(t, fmt.Sprintf("%s: TCP %s via %s", what, tcpVIP, n.name), tcpVIP, "tcp", map[string]float64{b[0].name: 50, b[1].name: 50})
		c.probeSplit(t, fmt.Sprintf("%s: UDP %s via %s", what, udpVIP, n.name), udpVIP, "udp", map[string]float64{b[0].name: 70, b[1].name: 30})
	}
}

// probeSplit opens flows new flows to vip and checks their split. Each
// flow is a draw of the hash: a fair 50/50 split misses ±5 points over 1000
// flows once in about 600 checks (3.2 σ), and a run makes a score of them.
// So a miss with every flow answered is measured once more with new flows,
// and fails only if that misses too (about once in 400,000). A failed flow
// is never measured again.
func (c *cluster) probeSplit(t *testing.T, what, vip, proto string, want map[string]float64) {
	t.Helper()
	measureSplit(t, what, func() (probeResult, error) { return c.probe(vip, proto, flows) }, want)
}

// measureSplit checks the split of the flows probe opens, measured once
// more with new flows when every flow was answered but a share missed
// (probeSplit). Every split check of a random draw goes through it: a
// single 50/50 measurement misses once in about 700, and a run of the
// Cilium tier makes a score of them.
func measureSplit(t *testing.T, what string, probe func() (probeResult, error), want map[string]float64) {
	t.Helper()
	r, err := probe()
	if err != nil {
		t.Fatal(err)
	}
	if r.failed() == 0 && !withinTolerance(r, want) {
		t.Logf("%s: shares %v out of tolerance; measured again with new flows", what, r.Backends)
		if r, err = probe(); err != nil {
			t.Fatal(err)
		}
	}
	checkSplit(t, what, r, want)
}

// withinTolerance tells whether every backend's share of r's flows is
// within tolerance of want's.
func withinTolerance(r probeResult, want map[string]float64) bool {
	for name, pct := range want {
		if !nearShare(r.share(name), pct) {
			return false
		}
	}
	return true
}

// share is the percentage of r's flows that backend name answered.
func (r probeResult) share(name string) float64 { return r.percent(r.Backends[name]) }

// percent is n as a percentage of r's flows.
func (r probeResult) percent(n int) float64 { return 100 * float64(n) / float64(r.Flows) }

// nearShare tells whether a share (percent) is within tolerance of want.
func nearShare(got, want float64) bool { return got >= want-tolerance && got <= want+tolerance }

// returnPath makes each node send the replies of its pods to a client
// outside the cluster back through the node that forwarded the request (see
// Documentation/kubernetes.md, The return path): the connection is marked
// with the MAC address of the node it came from, and the mark routes the
// replies to that node, whose datapath reverse-NATs them.
func (c *cluster) returnPath(t *testing.T) {
	for _, n := range c.nodes {
		for i, m := range c.nodes {
			if m.name == n.name {
				continue
			}
			mark, table := fmt.Sprint(0x4c00+i), fmt.Sprint(100+i)
			c.iptablesOnce(t, n, "-i", "eth0", "-d", n.podCIDR, "-m", "mac", "--mac-source", m.mac, "-j", "CONNMARK", "--set-mark", mark)
			c.run("docker", "exec", n.name, "ip", "rule", "del", "fwmark", mark, "lookup", table)
			c.must(t, "docker", "exec", n.name, "ip", "rule", "add", "fwmark", mark, "lookup", table)
			c.must(t, "docker", "exec", n.name, "ip", "route", "replace", "default", "via", m.ip, "dev", "eth0", "table", table)
		}
		c.iptablesOnce(t, n, "-i", "cni0", "-j", "CONNMARK", "--restore-mark")
	}
}

// iptablesOnce appends a rule to the mangle table's PREROUTING of node n
// unless it is there.
func (c *cluster) iptablesOnce(t *testing.T, n node, rule ...string) {
	t.Helper()
	args := append([]string{"exec", n.name, "iptables", "-t", "mangle", "-C", "PREROUTING"}, rule...)
	if _, err := c.run("docker", args...); err == nil {
		return
	}
	args[5] = "-A"
	c.must(t, "docker", args...)
}

// reset removes what a previous run on a kept cluster (KEEP=1) left; a
// new cluster has none of it.
func (c *cluster) reset(t *testing.T) {
	c.run("helm", "uninstall", release, "-n", ns, "--wait")
	c.run("kubectl", "delete", "namespace", testNS, "--ignore-not-found", "--wait")
	c.run("kubectl", "-n", ns, "delete", "service", dnsService, "--ignore-not-found")
	c.run("kubectl", "delete", "gatewayclass", gatewayClass, "--ignore-not-found")
	for _, n := range c.nodes {
		c.run("docker", "exec", n.name, "rm", "-rf", "/sys/fs/bpf/l4xds")
	}
}

func (c *cluster) dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"get", "pods", "-A", "-o", "wide"},
			{"-n", ns, "logs", "-l", "app.kubernetes.io/component=agent", "--tail", "30", "--prefix"},
			{"-n", ns, "logs", "-l", "app.kubernetes.io/component=control-plane", "--tail", "30", "--prefix"},
			{"-n", ns, "get", "events", "--sort-by", ".lastTimestamp"},
		} {
			out, _ := c.run("kubectl", args...)
			t.Logf("kubectl %s\n%s", strings.Join(args, " "), out)
		}
	})
}

// nodeLacksBPF reports whether the nodes' runtime cannot grant CAP_BPF (bit
// 39): the bounding set of the node's init process lacks it.
func (c *cluster) nodeLacksBPF(t *testing.T) bool {
	out := c.must(t, "docker", "exec", c.nodes[0].name, "grep", "CapBnd", "/proc/1/status")
	var set uint64
	if _, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(out, "CapBnd:")), "%x", &set); err != nil {
		t.Fatalf("CapBnd %q: %v", out, err)
	}
	return set&(1<<39) == 0
}

func TestKind(t *testing.T) {
	c := setup(t)
	c.dumpOnFailure(t)
	start := time.Now()
	c.reset(t)

	// The backend pods, one per node, serving TCP 3306 and UDP 7777 and
	// answering with their pod name.
	c.apply(t, fmt.Sprintf(backendsYAML, testNS, c.image))
	c.kubectl(t, "-n", testNS, "rollout", "status", "deploy/backend", "--timeout", "3m")
	b := c.backends(t)
	if len(b) != 2 || b[0].node == b[1].node {
		t.Fatalf("want a backend pod on each node, have %+v", b)
	}
	t.Logf("backends: %+v", b)
	c.returnPath(t)

	legacy := c.nodeLacksBPF(t)
	if legacy {
		t.Run("missing capabilities are named", func(t *testing.T) { c.missingCapabilities(t) })
	}

	// The docs' commands, verbatim but for the release name: the trial
	// values (their certificates by tls.auto.method=helm) with the backend
	// pods' addresses, helm install.
	docs := filepath.Join(c.work, "docs")
	if err := os.MkdirAll(docs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(c.repo, "install"), filepath.Join(docs, "install")); err != nil {
		t.Fatal(err)
	}
	trial := c.docBlock(t, "# trial.yaml")
	if !strings.Contains(trial, "method: helm") {
		t.Fatalf("the docs' trial.yaml does not use tls.auto.method helm:\n%s", trial)
	}
	if err := os.WriteFile(filepath.Join(docs, "trial.yaml"), []byte(resources(trial, b)), 0o644); err != nil {
		t.Fatal(err)
	}
	install := forRelease(strings.TrimSpace(c.docBlock(t, "-f trial.yaml")))
	if legacy {
		// As the docs' Security section says for such runtimes.
		install += " --set legacyCapabilities=true"
	}
	// The agents' metrics on the nodes, for the monitoring below (from the
	// install, so that turning on the monitors later rolls no agent).
	install += " --set prometheus.enabled=true"
	installStart := time.Now()
	c.sh(t, docs, install)
	t.Logf("helm install returned after %v", time.Since(installStart).Round(time.Second))

	t.Run("install waits for agents", func(t *testing.T) {
		// --wait returns once all agents but maxUnavailable (1) are Ready:
		// with 2 nodes at least one, never none.
		ready := 0
		for _, a := range c.agents(t) {
			if a.ready {
				ready++
			}
		}
		if ready < len(c.nodes)-1 || ready == 0 {
			t.Errorf("helm install --wait returned with %d of %d agents Ready", ready, len(c.nodes))
		}
	})
	agents := c.waitAgentsReady(t, 3*time.Minute)
	t.Logf("agents Ready on both nodes %v after helm install started (%v after the test started)",
		time.Since(installStart).Round(time.Second), time.Since(start).Round(time.Second))

	t.Run("cert-manager objects accepted", func(t *testing.T) { c.certManagerObjects(t, docs) })

	t.Run("dbg status synced", func(t *testing.T) {
		for nodeName, a := range agents {
			out := c.kubectl(t, "-n", ns, "exec", a.name, "--", "l4xds-dbg", "status")
			if !strings.Contains(out, "synced") || strings.Contains(out, "not synced") {
				t.Errorf("l4xds-dbg status on %s:\n%s", nodeName, out)
			}
		}
	})

	if !t.Run("traffic through each node", func(t *testing.T) {
		c.waitServing(t, b)
		c.checkTraffic(t, "installed", b)
	}) {
		t.FailNow()
	}

	t.Run("control plane deleted", func(t *testing.T) {
		tr := c.startTraffic(t)
		c.kubectl(t, "-n", ns, "delete", "pod", "-l", "app.kubernetes.io/component=control-plane", "--wait=true")
		c.kubectl(t, "-n", ns, "rollout", "status", "deploy/"+cpName, "--timeout", "3m")
		// The agents stay Ready throughout (they serve their last state);
		// they reconnect to the new server: l4xds-dbg status, which exits
		// 1 while an agent is degraded, exits 0 again on every node.
		for nodeName, a := range c.waitAgentsReady(t, 3*time.Minute) {
			c.eventually(t, "l4xds-dbg status on "+nodeName+" after the control plane came back", func() string {
				out, err := c.run("kubectl", "-n", ns, "exec", a.name, "--", "l4xds-dbg", "status")
				if err != nil {
					return fmt.Sprintf("%v:\n%s", err, out)
				}
				return ""
			})
		}
		expectNoFailures(t, "control plane pod deleted and rescheduled", tr)
	})

	t.Run("agent deleted", func(t *testing.T) { c.agentDeleted(t) })

	t.Run("helm upgrade", func(t *testing.T) {
		before := c.agents(t)
		tr := c.startTraffic(t)
		// A changed value the agents roll for, and the hardest one: a new
		// Maglev table size, which the new agents cannot write into the
		// pinned maps. They fill new ones before their program replaces
		// the running one (Documentation/kubernetes.md).
		certs := c.autoCerts(t)
		c.sh(t, docs, forRelease("helm upgrade l4xds install/kubernetes/l4xds -n kube-system --reuse-values --set maglevTableSize=2039 --wait"))
		after := c.waitAgentsReady(t, 3*time.Minute)
		c.kubectl(t, "-n", ns, "rollout", "status", "ds/"+fullname, "--timeout", "3m")
		after = c.waitAgentsReady(t, 3*time.Minute)
		expectNoFailures(t, "helm upgrade rolling the agents", tr)
		for nodeName, a := range after {
			if a.uid == before[nodeName].uid {
				t.Errorf("the agent on %s did not roll", nodeName)
			}
			var pinned struct {
				Services []struct {
					Frontend    string
					MaglevSlots int
				}
			}
			out := c.kubectl(t, "-n", ns, "exec", a.name, "--", "l4xds-dbg", "bpf", "lb", "list", "-o", "json")
			if err := json.Unmarshal([]byte(out), &pinned); err != nil || len(pinned.Services) == 0 {
				t.Errorf("l4xds-dbg bpf lb list on %s (%v):\n%s", nodeName, err, out)
			}
			for _, s := range pinned.Services {
				if s.MaglevSlots != 2039 {
					t.Errorf("on %s, %s has a Maglev table of %d slots after the upgrade, want 2039", nodeName, s.Frontend, s.MaglevSlots)
				}
			}
		}
		c.checkTraffic(t, "after the upgrade", b)
		// tls.auto.method=helm looked its Secrets up in the API server and
		// kept them: the agents that rolled connected with them.
		if after := c.autoCerts(t); !maps.Equal(certs, after) {
			t.Errorf("helm upgrade changed the certificates of tls.auto.method=helm: before %v, after %v", certs, after)
		}
	})

	t.Run("backend deleted", func(t *testing.T) { b = c.backendDeleted(t, docs, trial, b) })

	t.Run("LoadBalancer Services and routes", func(t *testing.T) { c.loadBalancer(t, docs) })

	t.Run("monitoring", func(t *testing.T) { c.monitoring(t, docs) })

	t.Run("uninstall", func(t *testing.T) { c.uninstall(t, docs) })
}

// waitServing waits until both VIPs answer through each node: the agents
// are Ready once synced, the first flows may still race the last writes.
func (c *cluster) waitServing(t *testing.T, b []backend) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, n := range c.nodes {
		c.route(t, n)
		for {
			rt, err1 := c.probe(tcpVIP, "tcp", 10)
			ru, err2 := c.probe(udpVIP, "udp", 10)
			if err1 == nil && err2 == nil && rt.failed() == 0 && ru.failed() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("VIPs not answered via %s: %+v %v / %+v %v", n.name, rt, err1, ru, err2)
			}
			time.Sleep(time.Second)
		}
	}
}

// missingCapabilities runs the agent with the chart's default capabilities
// on this runtime: it must stop naming the missing capability, not blame
// the memlock rlimit.
func (c *cluster) missingCapabilities(t *testing.T) {
	c.apply(t, fmt.Sprintf(capsPodYAML, testNS, c.image))
	defer c.run("kubectl", "-n", testNS, "delete", "pod", "caps", "--wait=false")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		phase := c.kubectl(t, "-n", testNS, "get", "pod", "caps", "-o", "jsonpath={.status.phase}")
		if phase == "Failed" || phase == "Succeeded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent without BPF did not stop (phase %s)", phase)
		}
		time.Sleep(time.Second)
	}
	logs := c.kubectl(t, "-n", testNS, "logs", "caps")
	t.Logf("agent with NET_ADMIN, BPF, PERFMON on a runtime without CAP_BPF:\n%s", lastLines(logs, 3))
	if !strings.Contains(logs, "missing capabilities") || !strings.Contains(logs, "CAP_BPF (or CAP_SYS_ADMIN") || strings.Contains(logs, "memlock") {
		t.Errorf("the agent's error does not name CAP_BPF:\n%s", logs)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// agentDeleted deletes the agent of the node a long-lived connection goes
// through: the DaemonSet recreates it, and the connection and new flows
// keep working meanwhile (the program, maps and links are pinned).
func (c *cluster) agentDeleted(t *testing.T) {
	n := c.nodes[1]
	c.route(t, n)
	h := c.hold(t, tcpVIP)
	time.Sleep(2 * time.Second)
	// New flows through the same node only: the held connection's packets
	// must keep going through the node whose agent is replaced.
	tr := c.startTraffic(t, n)

	old := c.agents(t)[n.name]
	c.kubectl(t, "-n", ns, "delete", "pod", old.name, "--wait=true")
	agents := c.waitAgentsReady(t, 3*time.Minute)
	if agents[n.name].uid == old.uid {
		t.Fatalf("agent on %s not replaced", n.name)
	}
	okBefore := h.echoes()
	time.Sleep(3 * time.Second)
	expectNoFailures(t, "agent pod deleted and recreated", tr)
	h.expectSurvived(t, c, "the held connection via "+n.name+" across the agent's replacement", okBefore)
}

// heldConn is a long-lived TCP connection of the client's to a VIP
// (l4xds-traffic hold), one echo every 100 ms until it is ended.
type heldConn struct {
	cmd *exec.Cmd
	// pid is l4xds-traffic's in the client's container: the one process
	// end signals.
	pid     string
	once    sync.Once
	mu      sync.Mutex
	lines   []string
	scanned chan struct{}
}

// hold opens a held connection to vip, ended when the test ends if not
// before.
func (c *cluster) hold(t *testing.T, vip string) *heldConn {
	t.Helper()
	h := &heldConn{scanned: make(chan struct{})}
	// The shell says its PID and becomes l4xds-traffic.
	h.cmd = exec.Command("docker", "exec", c.client, "sh", "-c",
		`echo "$$"; exec l4xds-traffic hold --to "$1" --interval 100ms`, "sh", vip)
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		_ = h.cmd.Wait()
		t.Fatalf("l4xds-traffic hold --to %s in %s did not start: %v", vip, c.client, sc.Err())
	}
	h.pid = sc.Text()
	go func() {
		defer close(h.scanned)
		for sc.Scan() {
			h.mu.Lock()
			h.lines = append(h.lines, sc.Text())
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { h.end(c) })
	return h
}

// echoes counts the echoes answered so far.
func (h *heldConn) echoes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return countPrefix(h.lines, "ok ")
}

func countPrefix(lines []string, prefix string) (n int) {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// end stops the connection (SIGINT to its PID; it may have ended on its
// own) and returns what it printed; once or more.
func (h *heldConn) end(c *cluster) []string {
	h.once.Do(func() {
		_, _ = c.run("docker", "exec", c.client, "sh", "-c", `kill -INT "$1"`, "sh", h.pid)
		_ = h.cmd.Wait()
		<-h.scanned
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lines
}

// expectSurvived ends the connection and asserts that it was established,
// that no echo failed and that it answered after okBefore echoes (those
// counted when the fault ended).
func (h *heldConn) expectSurvived(t *testing.T, c *cluster, what string, okBefore int) {
	t.Helper()
	lines := h.end(c)
	first := ""
	if len(lines) > 0 {
		first = lines[0]
	}
	ok, fail := countPrefix(lines, "ok "), countPrefix(lines, "fail")
	t.Logf("%s (%s): %d echoes when the fault ended, %d in all, %d failed", what, first, okBefore, ok, fail)
	if !strings.HasPrefix(first, "connected ") || fail != 0 || ok <= okBefore {
		t.Errorf("%s: the established connection did not survive: %s", what, lastLines(strings.Join(lines, "\n"), 5))
	}
}

// backendDeleted deletes a backend pod: the Deployment replaces it with a
// pod at a new address; once the resources name the new address, new flows
// avoid the deleted pod and all are answered.
func (c *cluster) backendDeleted(t *testing.T, docs, trial string, b []backend) []backend {
	gone := b[0]
	c.kubectl(t, "-n", testNS, "delete", "pod", gone.name, "--wait=true")
	c.kubectl(t, "-n", testNS, "rollout", "status", "deploy/backend", "--timeout", "3m")
	nb := c.backends(t)
	if len(nb) != 2 || slices.ContainsFunc(nb, func(x backend) bool { return x.name == gone.name }) {
		t.Fatalf("backends after deleting %s: %+v", gone.name, nb)
	}
	// The new resources through the chart, as the docs say (helm upgrade
	// with new xdsResources); the server follows the ConfigMap's file.
	if err := os.WriteFile(filepath.Join(docs, "trial.yaml"), []byte(resources(trial, nb)), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	c.sh(t, docs, forRelease("helm upgrade l4xds install/kubernetes/l4xds -n kube-system --reuse-values -f trial.yaml"))
	deadline := time.Now().Add(3 * time.Minute)
	for _, n := range c.nodes {
		c.route(t, n)
		for {
			r, err := c.probe(tcpVIP, "tcp", 100)
			if err == nil && r.failed() == 0 && r.Backends[gone.name] == 0 && len(r.Backends) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("via %s, flows still fail or reach %s: %+v %v", n.name, gone.name, r, err)
			}
			time.Sleep(2 * time.Second)
		}
	}
	t.Logf("new backend %v in service %v after the resources changed", nb, time.Since(changed).Round(time.Second))
	c.checkTraffic(t, "after a backend was replaced", nb)
	return nb
}

// uninstall: helm uninstall removes the objects; the pins stay and keep
// forwarding (as the docs say) until the docs' removal on each node, after
// which nothing is pinned and the VIP is not forwarded.
func (c *cluster) uninstall(t *testing.T, docs string) {
	c.sh(t, docs, forRelease(c.docBlock(t, "helm uninstall l4xds -n kube-system")))
	deadline := time.Now().Add(2 * time.Minute)
	for len(c.agents(t)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("agent pods still there after helm uninstall")
		}
		time.Sleep(time.Second)
	}
	removal := c.docBlock(t, "rm -rf /sys/fs/bpf/l4xds")
	for _, n := range c.nodes {
		pins := c.must(t, "docker", "exec", n.name, "ls", "/sys/fs/bpf/l4xds/links")
		c.route(t, n)
		r, err := c.probe(tcpVIP, "tcp", 100)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("after helm uninstall, %s keeps links %q and answers %d/%d flows", n.name, strings.Fields(pins), r.Answered, r.Flows)
		if r.failed() != 0 {
			t.Errorf("the docs say the VIP is still forwarded after helm uninstall; via %s %d failed", n.name, r.failed())
		}
		c.must(t, "docker", "exec", n.name, "bash", "-euc", removal)
		if out, err := c.run("docker", "exec", n.name, "ls", "-A", "/sys/fs/bpf"); err != nil || strings.Contains(out, "l4xds") {
			t.Errorf("%s: /sys/fs/bpf still holds l4xds: %q %v", n.name, out, err)
		}
		r, err = c.probe(tcpVIP, "tcp", 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("after the removal, %s answers %d/%d flows", n.name, r.Answered, r.Flows)
		if r.Answered != 0 {
			t.Errorf("%s still forwards the VIP after its pins were removed: nothing may stay attached", n.name)
		}
	}
}

const backendsYAML = `apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: backend, namespace: %[1]s}
spec:
  replicas: 2
  selector: {matchLabels: {app: backend}}
  template:
    metadata: {labels: {app: backend}}
    spec:
      # One on each node, the control plane's included.
      tolerations: [{operator: Exists}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: backend}}
            topologyKey: kubernetes.io/hostname
      terminationGracePeriodSeconds: 1
      containers:
      - name: serve
        image: %[2]s
        imagePullPolicy: IfNotPresent
        command: [l4xds-traffic, serve, --name, $(POD_NAME), --tcp, ":3306", --udp, ":7777"]
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
`

// The agent as the chart runs it without legacyCapabilities, enough to
// reach the datapath's load.
const capsPodYAML = `apiVersion: v1
kind: Pod
metadata: {name: caps, namespace: %[1]s}
spec:
  restartPolicy: Never
  hostNetwork: true
  tolerations: [{operator: Exists}]
  containers:
  - name: agent
    image: %[2]s
    imagePullPolicy: IfNotPresent
    command: [l4xds-agent, --datapath=bpf, --bpf-root=/sys/fs/bpf, --api-socket=/tmp/agent.sock]
    securityContext:
      capabilities:
        drop: [ALL]
        add: [NET_ADMIN, BPF, PERFMON]
    volumeMounts: [{name: tmp, mountPath: /tmp}]
  volumes: [{name: tmp, emptyDir: {}}]
`
