// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The Cilium tier (cilium/run.sh, `make test-kind-cilium`): Cilium v1.20.2
// installed by its own chart as the cluster's CNI, with our agent image; the
// l4xds cell serves the VIPs of the reference control plane with Cilium's
// datapath.
const (
	ciliumNS       = "kube-system"
	ciliumSelector = "k8s-app=cilium"
	// The control plane, in the control-plane node's network namespace,
	// where the agents dial it (cilium/values.yaml).
	ciliumCPName = "l4xds-control-plane"
	cpPort       = 18000
)

func TestKindCilium(t *testing.T) {
	chart, values := os.Getenv("L4XDS_KIND_CILIUM_CHART"), os.Getenv("L4XDS_KIND_CILIUM_VALUES")
	if chart == "" || os.Getenv("L4XDS_KIND_CLUSTER") == "" {
		t.Skip("the Cilium kind tier needs a cluster with Cilium: run `make test-kind-cilium` (root with a Docker engine), which creates one and runs this test")
	}
	c := setup(t)
	// Cilium compiles its datapath with clang on the nodes, beside the
	// cluster's own work: on a small shared machine an answer can take
	// more than the standalone tier's 2 s without any flow being lost.
	c.flowTimeout = "5s"
	c.ciliumDumpOnFailure(t)
	start := time.Now()

	c.apply(t, fmt.Sprintf(backendsYAML, testNS, c.image))
	c.apply(t, fmt.Sprintf(ewClientYAML, testNS, c.image))
	c.apply(t, fmt.Sprintf(nodePortYAML, testNS))
	c.kubectl(t, "-n", testNS, "rollout", "status", "deploy/backend", "--timeout", "3m")
	c.kubectl(t, "-n", testNS, "wait", "--for=condition=Ready", "pod/ew-client", "--timeout", "3m")
	b := c.backends(t)
	if len(b) != 2 || b[0].node == b[1].node {
		t.Fatalf("want a backend pod on each node, have %+v", b)
	}
	t.Logf("backends: %+v", b)

	c.apply(t, fmt.Sprintf(controlPlaneYAML, ciliumNS, c.image, c.name+"-control-plane", cpPort, indent(ciliumResources(b), "    "), cpPort+1))
	c.kubectl(t, "-n", ciliumNS, "rollout", "status", "deploy/"+ciliumCPName, "--timeout", "3m")

	t.Run("cilium-dbg shows the xDS services", func(t *testing.T) {
		c.waitCiliumServing(t, b)
		for nodeName, pod := range c.ciliumPods(t) {
			out := c.ciliumDbg(t, pod, "version")
			if !strings.Contains(out, "Client: 1.20.2 ") || !strings.Contains(out, "Daemon: 1.20.2 ") {
				t.Errorf("cilium-dbg version on %s:\n%s", nodeName, out)
			}
			out = c.ciliumDbg(t, pod, "shell", "--", "db/show", "frontends")
			for _, w := range []string{"10.1.2.3:3306/TCP", "xds/my-database-service", "10.1.2.7:7777/UDP", "xds/udp-game", "Done"} {
				if !strings.Contains(out, w) {
					t.Errorf("cilium-dbg shell -- db/show frontends on %s: no %q:\n%s", nodeName, w, out)
				}
			}
			t.Logf("cilium-dbg shell -- db/show frontends on %s:\n%s", nodeName, out)
			out = c.ciliumDbg(t, pod, "bpf", "lb", "list")
			for _, w := range []string{"10.1.2.3:3306/TCP", "10.1.2.7:7777/UDP", b[0].ip + ":3306/TCP", b[1].ip + ":3306/TCP", b[0].ip + ":7777/UDP", b[1].ip + ":7777/UDP"} {
				if !strings.Contains(out, w) {
					t.Errorf("cilium-dbg bpf lb list on %s: no %q:\n%s", nodeName, w, out)
				}
			}
			t.Logf("cilium-dbg bpf lb list on %s:\n%s", nodeName, out)
		}
	})

	if !t.Run("north-south through each node", func(t *testing.T) { c.checkTraffic(t, "installed", b) }) {
		t.FailNow()
	}
	t.Logf("serving through both nodes %v after the test started", time.Since(start).Round(time.Second))

	t.Run("socket-LB: the nodes' processes only", func(t *testing.T) { c.checkSocketLBScope(t) })

	t.Run("east-west from a pod and from the nodes", func(t *testing.T) { c.checkEastWest(t, "installed", b) })

	t.Run("ClusterIP Service beside the xDS ones", func(t *testing.T) {
		c.apply(t, fmt.Sprintf(clusterIPYAML, testNS))
		var svc struct{ Spec struct{ ClusterIP string } }
		c.kubectlJSON(t, &svc, "-n", testNS, "get", "service", "backend", "-o", "json")
		measureSplit(t, "ClusterIP "+svc.Spec.ClusterIP, c.podSplit(t, svc.Spec.ClusterIP+":3306", "tcp"),
			map[string]float64{b[0].name: 50, b[1].name: 50})
		// And the xDS VIPs still serve, from outside and from the pod.
		c.checkTraffic(t, "beside the ClusterIP Service", b)
		c.checkEastWest(t, "beside the ClusterIP Service", b)
	})

	t.Run("Cilium pod deleted", func(t *testing.T) {
		before := c.ciliumPods(t)
		worker := c.name + "-worker"
		tr, own := c.startTraffic(t), c.startTrafficTo(t, ciliumOwnTargets)
		c.kubectl(t, "-n", ciliumNS, "delete", "pod", before[worker], "--wait=true")
		c.kubectl(t, "-n", ciliumNS, "rollout", "status", "ds/cilium", "--timeout", "5m")
		after := c.waitCiliumReady(t, 5*time.Minute)
		expectLossesOfCiliumOnly(t, "a Cilium pod deleted and recreated", tr, own)
		if after[worker] == before[worker] {
			t.Errorf("the Cilium pod on %s was not recreated", worker)
		}
		c.waitCiliumSettled(t, after)
		c.waitCiliumServing(t, b)
		c.checkTraffic(t, "after the Cilium pod was recreated", b)
	})

	t.Run("control plane down", func(t *testing.T) {
		tr := c.startTraffic(t)
		c.kubectl(t, "-n", ciliumNS, "scale", "deploy/"+ciliumCPName, "--replicas=0")
		c.kubectl(t, "-n", ciliumNS, "wait", "--for=delete", "pod", "-l", "app="+ciliumCPName, "--timeout", "2m")
		// The agents have noticed: their streams are down.
		connected := regexp.MustCompile(`\bconnected\b`)
		for nodeName, pod := range c.ciliumPods(t) {
			deadline := time.Now().Add(2 * time.Minute)
			for out := ""; ; time.Sleep(time.Second) {
				if out = c.ciliumDbg(t, pod, "shell", "--", "xds/status"); !connected.MatchString(out) {
					t.Logf("xds/status on %s with the control plane down:\n%s", nodeName, out)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("xds/status on %s still connected with the control plane down:\n%s", nodeName, out)
				}
			}
		}
		for nodeName, pod := range c.ciliumPods(t) {
			out := c.ciliumDbg(t, pod, "shell", "--", "db/show", "frontends")
			for _, w := range []string{"10.1.2.3:3306/TCP", "10.1.2.7:7777/UDP"} {
				if !strings.Contains(out, w) {
					t.Errorf("with the control plane down, db/show frontends on %s has no %q:\n%s", nodeName, w, out)
				}
			}
		}
		expectNoFailures(t, "control plane down", tr)
		c.checkTraffic(t, "control plane down", b)
		c.kubectl(t, "-n", ciliumNS, "scale", "deploy/"+ciliumCPName, "--replicas=1")
		c.kubectl(t, "-n", ciliumNS, "rollout", "status", "deploy/"+ciliumCPName, "--timeout", "3m")
	})

	t.Run("helm upgrade changing an xDS setting", func(t *testing.T) {
		// The block of Documentation/cilium.md with Delta xDS in place of
		// SotW; rollOutCiliumPods rolls the agents on a changed cilium-config.
		v, err := os.ReadFile(values)
		if err != nil {
			t.Fatal(err)
		}
		delta := strings.Replace(string(v), "    enabled: true\n", "    enabled: true\n    protocol: delta\n", 1)
		if delta == string(v) {
			t.Fatalf("%s: no xds-control-plane block to change", values)
		}
		deltaValues := filepath.Join(c.work, "values-delta.yaml")
		if err := os.WriteFile(deltaValues, []byte(delta), 0o644); err != nil {
			t.Fatal(err)
		}
		before := c.ciliumPods(t)
		tr, own := c.startTraffic(t), c.startTrafficTo(t, ciliumOwnTargets)
		c.must(t, "helm", "upgrade", "cilium", chart, "-n", ciliumNS, "-f", deltaValues, "--set", "rollOutCiliumPods=true", "--wait", "--timeout", "10m")
		c.kubectl(t, "-n", ciliumNS, "rollout", "status", "ds/cilium", "--timeout", "5m")
		after := c.waitCiliumReady(t, 5*time.Minute)
		expectLossesOfCiliumOnly(t, "helm upgrade rolling the Cilium agents", tr, own)
		for nodeName, pod := range after {
			if pod == before[nodeName] {
				t.Errorf("the Cilium pod on %s did not roll", nodeName)
			}
		}
		c.waitCiliumSettled(t, after)
		c.waitCiliumServing(t, b)
		for nodeName, pod := range after {
			out := c.ciliumDbg(t, pod, "shell", "--", "xds/status")
			if !strings.Contains(out, "delta") {
				t.Errorf("xds/status on %s after the upgrade to Delta:\n%s", nodeName, out)
			}
		}
		c.checkTraffic(t, "after the upgrade", b)
		c.checkEastWest(t, "after the upgrade", b)
	})
}

// ciliumOwnTargets are the NodePorts of nodePortYAML on each node: the
// same backends served by Cilium's own Kubernetes source.
var ciliumOwnTargets = []target{{":30306", "tcp"}, {":30777", "udp"}}

// ciliumRestartSlack bounds the new flows the xDS VIPs may lose while
// Cilium's agents restart: at most twice what Cilium's own NodePort Service
// of the same backends, probed beside them through the same nodes, lost,
// and this many more. Cilium's datapath loses an occasional new flow then,
// to its own Service as to ours and at the same moments (here in 2 of 40
// rollouts: 1 and 2 TCP flows of each through the same node; 6 flows once
// under heavy load), one stream or the other as it happens. A service of
// the cell's gone or without backends for a moment loses every flow
// through the node while it lasts: about 200 a second.
const ciliumRestartSlack = 3

// expectLossesOfCiliumOnly ends the traffic to the xDS VIPs (ours) and to
// Cilium's own Service (own) of a fault that restarts Cilium's agents, and
// asserts that ours lost no more than Cilium's restart explains.
func expectLossesOfCiliumOnly(t *testing.T, what string, ours, own *traffic) {
	t.Helper()
	failed := ours.report(t, what)
	ownFailed := own.report(t, what+", Cilium's own NodePort Service")
	switch {
	case failed > 2*ownFailed+ciliumRestartSlack:
		t.Errorf("%s: the xDS VIPs lost %d flows, Cilium's own Service %d: more than Cilium's restart explains (2×%d+%d): %s\nCilium's own Service: %s",
			what, failed, ownFailed, ownFailed, ciliumRestartSlack, ours.failures(), own.failures())
	case failed > 0:
		t.Logf("%s: the xDS VIPs lost %d flows while Cilium's agents restarted, Cilium's own Service %d: %s\nCilium's own Service: %s",
			what, failed, ownFailed, ours.failures(), own.failures())
	}
}

// ciliumResources are the xDS resources: the docs' trial service on TCP 3306
// over both backends, and a UDP service weighted 70/30.
func ciliumResources(b []backend) string {
	return fmt.Sprintf(`resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: my-database-service
  metadata:
    filter_metadata:
      io.cilium.l4lb: {vip: "10.1.2.3", port: 3306, protocol: TCP}
  type: EDS
  eds_cluster_config: {service_name: my-database-service}
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: my-database-service
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {socket_address: {address: %[1]s, port_value: 3306}}}
    - endpoint: {address: {socket_address: {address: %[2]s, port_value: 3306}}}
---
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
    - endpoint: {address: {socket_address: {address: %[1]s, port_value: 7777}}}
      load_balancing_weight: 70
    - endpoint: {address: {socket_address: {address: %[2]s, port_value: 7777}}}
      load_balancing_weight: 30
`, b[0].ip, b[1].ip)
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+prefix)
}

// ciliumPods returns the Cilium agent pods that are Ready, by node.
func (c *cluster) ciliumPods(t *testing.T) map[string]string {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				Name              string
				DeletionTimestamp *string
			}
			Spec   struct{ NodeName string }
			Status struct {
				Conditions []struct{ Type, Status string }
			}
		}
	}
	c.kubectlJSON(t, &pods, "-n", ciliumNS, "get", "pods", "-l", ciliumSelector, "-o", "json")
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Metadata.DeletionTimestamp != nil {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				out[p.Spec.NodeName] = p.Metadata.Name
			}
		}
	}
	return out
}

func (c *cluster) waitCiliumReady(t *testing.T, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pods := c.ciliumPods(t)
		if len(pods) == len(c.nodes) {
			return pods
		}
		if time.Now().After(deadline) {
			out, _ := c.run("kubectl", "-n", ciliumNS, "get", "pods", "-o", "wide")
			t.Fatalf("Cilium not Ready on every node after %v: %v\n%s", timeout, pods, out)
		}
		time.Sleep(time.Second)
	}
}

// waitCiliumSettled waits until every endpoint of each Cilium agent has
// been ready for three polls in a row. A restarted agent reports Ready and
// then regenerates its endpoints, compiling and loading their datapath (some
// seconds of clang on a busy node): a check of new flows in that window
// measures Cilium's reload, not the xDS VIPs.
func (c *cluster) waitCiliumSettled(t *testing.T, pods map[string]string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	for nodeName, pod := range pods {
		for ready := 0; ready < 3; time.Sleep(time.Second) {
			var eps []struct {
				ID     int64 `json:"id"`
				Status struct {
					State string `json:"state"`
				} `json:"status"`
			}
			out := c.ciliumDbg(t, pod, "endpoint", "list", "-o", "json")
			if err := json.Unmarshal([]byte(out), &eps); err != nil {
				t.Fatalf("cilium-dbg endpoint list -o json on %s: %v\n%s", nodeName, err, out)
			}
			var busy []string
			for _, ep := range eps {
				if ep.Status.State != "ready" {
					busy = append(busy, fmt.Sprintf("%d %s", ep.ID, ep.Status.State))
				}
			}
			if ready++; len(busy) > 0 {
				ready = 0
				if time.Now().After(deadline) {
					t.Fatalf("Cilium's endpoints on %s not ready after %v: %v", nodeName, time.Since(start).Round(time.Second), busy)
				}
			}
		}
	}
	t.Logf("Cilium's endpoints ready on every node %v after the agents were", time.Since(start).Round(time.Second))
}

func (c *cluster) ciliumDbg(t *testing.T, pod string, args ...string) string {
	t.Helper()
	return c.kubectl(t, append([]string{"-n", ciliumNS, "exec", pod, "-c", "cilium-agent", "--", "cilium-dbg"}, args...)...)
}

// waitCiliumServing waits until both VIPs answer through each node and from
// the pod: the xDS resources reach the agents a moment after they start.
func (c *cluster) waitCiliumServing(t *testing.T, b []backend) {
	t.Helper()
	for _, n := range c.nodes {
		c.route(t, n)
		for _, p := range []struct{ vip, proto string }{{tcpVIP, "tcp"}, {udpVIP, "udp"}} {
			deadline := time.Now().Add(3 * time.Minute)
			for {
				r, err := c.probe(p.vip, p.proto, 10)
				if err == nil && r.failed() == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s/%s through %s does not answer: %v %+v", p.vip, p.proto, n.name, err, r)
				}
				time.Sleep(time.Second)
			}
		}
	}
}

// podProbe opens n new flows to vip from the east-west client pod.
func (c *cluster) podProbe(vip, proto string, n int) (probeResult, error) {
	var r probeResult
	out, err := c.run("kubectl", "-n", testNS, "exec", "ew-client", "--", "l4xds-traffic", "probe", "--to", vip, "--proto", proto,
		"--flows", fmt.Sprint(n), "--timeout", c.timeout(), "-o", "json")
	// Exit status 1: some flows failed, and the report says which;
	// kubectl's output then ends with its own error line.
	if i := strings.LastIndex(out, "}"); i >= 0 {
		out = out[:i+1]
	}
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		return r, fmt.Errorf("probe from the pod %s/%s: %w: %v %s", vip, proto, jerr, err, out)
	}
	return r, nil
}

func (c *cluster) eventuallyPodProbe(t *testing.T, vip, proto string) probeResult {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := c.podProbe(vip, proto, 10)
		if err == nil && r.failed() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s from the pod does not answer: %v %+v", vip, proto, err, r)
		}
		time.Sleep(time.Second)
	}
	r, err := c.podProbe(vip, proto, flows)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkEastWest asserts both services' splits from inside the cluster, all
// flows answered, where Cilium balances them two ways (cilium/values.yaml,
// socketLB.hostNamespaceOnly):
//   - from a pod, per packet by bpf_lxc, which selects with the service's
//     Maglev table (lb4_select_backend_id in bpf/lib/lb.h: the cell asks for
//     Maglev per service, honoured with bpf.lbAlgorithmAnnotation), so the
//     weights hold: TCP 50/50, UDP 70/30;
//   - from each node's own network namespace, by socket-LB at connect(),
//     which picks one of the service's backend slots uniformly
//     (__sock4_xlate_fwd in bpf/bpf_sock.c: (sock_select_slot() %
//     svc->count) + 1) whatever the weights: 50/50 for both. Flows answered
//     there are socket-LB's: nothing else translates what the node's own
//     sockets send to a VIP.
func (c *cluster) checkEastWest(t *testing.T, what string, b []backend) {
	t.Helper()
	even := map[string]float64{b[0].name: 50, b[1].name: 50}
	measureSplit(t, "east-west tcp from a pod, "+what, c.podSplit(t, tcpVIP, "tcp"), even)
	measureSplit(t, "east-west udp from a pod (Maglev per packet), "+what, c.podSplit(t, udpVIP, "udp"),
		map[string]float64{b[0].name: 70, b[1].name: 30})
	for _, n := range c.nodes {
		for _, p := range []struct{ vip, proto string }{{tcpVIP, "tcp"}, {udpVIP, "udp"}} {
			measureSplit(t, fmt.Sprintf("east-west %s from %s's network namespace (socket-LB, uniform), %s", p.proto, n.name, what),
				func() (probeResult, error) { return c.nodeProbe(n, p.vip, p.proto, flows) }, even)
		}
	}
}

// podSplit is a probe for measureSplit: flows new flows from the pod to
// vip, once it answers.
func (c *cluster) podSplit(t *testing.T, vip, proto string) func() (probeResult, error) {
	return func() (probeResult, error) { return c.eventuallyPodProbe(t, vip, proto), nil }
}

func (c *cluster) ciliumDumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"get", "pods", "-A", "-o", "wide"},
			{"-n", ciliumNS, "logs", "-l", ciliumSelector, "-c", "cilium-agent", "--tail", "40", "--prefix"},
			{"-n", ciliumNS, "logs", "-l", "app=" + ciliumCPName, "--tail", "30", "--prefix"},
			{"-n", ciliumNS, "get", "events", "--sort-by", ".lastTimestamp"},
		} {
			out, _ := c.runFor(dumpTimeout, "kubectl", args...)
			t.Logf("kubectl %s\n%s", strings.Join(args, " "), out)
		}
		// The host's conntrack and TCP counters: a flow lost between the
		// client's container and a node (Docker's bridge) counts there.
		for _, f := range []string{"/proc/net/stat/nf_conntrack", "/proc/net/netstat"} {
			b, _ := os.ReadFile(f)
			t.Logf("the host's %s\n%s", f, b)
		}
		// The datapath's drop and forward counters by reason, per node:
		// where lost flows went.
		for nodeName, pod := range c.ciliumPods(t) {
			out, _ := c.runFor(dumpTimeout, "kubectl", "-n", ciliumNS, "exec", pod, "-c", "cilium-agent", "--", "cilium-dbg", "bpf", "metrics", "list")
			t.Logf("cilium-dbg bpf metrics list on %s\n%s", nodeName, out)
		}
	})
}

// The client pod of the east-west checks: l4xds-traffic serving on a port
// of its own keeps it running; the test execs probes in it.
const ewClientYAML = `apiVersion: v1
kind: Pod
metadata: {name: ew-client, namespace: %[1]s}
spec:
  tolerations: [{operator: Exists}]
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: %[2]s
    imagePullPolicy: IfNotPresent
    command: [l4xds-traffic, serve, --name, ew-client, --tcp, ":9"]
`

// A Kubernetes Service of the same backends, served by Cilium's own
// Kubernetes source beside the xDS services.
const clusterIPYAML = `apiVersion: v1
kind: Service
metadata: {name: backend, namespace: %[1]s}
spec:
  type: ClusterIP
  selector: {app: backend}
  ports:
  - {name: tcp, port: 3306, protocol: TCP}
`

// A NodePort Service of the same backends, on the xDS services' ports:
// Cilium's own source, probed beside the xDS VIPs while Cilium's agents
// restart.
const nodePortYAML = `apiVersion: v1
kind: Service
metadata: {name: backend-nodeport, namespace: %[1]s}
spec:
  type: NodePort
  selector: {app: backend}
  ports:
  - {name: tcp, port: 3306, nodePort: 30306, protocol: TCP}
  - {name: udp, port: 7777, nodePort: 30777, protocol: UDP}
`

// The reference control plane serving the resources file from a ConfigMap,
// with the certificates run.sh made (Secret l4xds-control-plane-tls), in the
// control-plane node's network namespace.
const controlPlaneYAML = `apiVersion: v1
kind: ConfigMap
metadata: {name: l4xds-control-plane-resources, namespace: %[1]s}
data:
  resources.yaml: |
%[5]s
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: l4xds-control-plane, namespace: %[1]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: l4xds-control-plane}}
  strategy: {type: Recreate}
  template:
    metadata: {labels: {app: l4xds-control-plane}}
    spec:
      hostNetwork: true
      nodeSelector: {kubernetes.io/hostname: %[3]s}
      tolerations: [{operator: Exists}]
      terminationGracePeriodSeconds: 1
      containers:
      - name: control-plane
        image: %[2]s
        imagePullPolicy: IfNotPresent
        command: [l4xds-control-plane, serve, --resources=/etc/l4xds/resources/resources.yaml,
          "--listen=:%[4]d", "--health-listen=:%[6]d",
          --cert=/var/lib/l4xds/tls/tls.crt, --key=/var/lib/l4xds/tls/tls.key, --client-ca=/var/lib/l4xds/tls/ca.crt]
        readinessProbe:
          httpGet: {path: /readyz, port: %[6]d}
          periodSeconds: 2
        volumeMounts:
        - {name: resources, mountPath: /etc/l4xds/resources, readOnly: true}
        - {name: tls, mountPath: /var/lib/l4xds/tls, readOnly: true}
      volumes:
      - name: resources
        configMap: {name: l4xds-control-plane-resources}
      - name: tls
        secret: {secretName: l4xds-control-plane-tls}
`
