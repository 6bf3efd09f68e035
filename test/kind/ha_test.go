// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The control plane's replicas in Kubernetes mode (two, --leader-elect;
// Documentation/kubernetes.md, Several replicas): every replica serves xDS,
// the holder of the Lease writes status.
const (
	controlPlaneLabel = "app.kubernetes.io/component=control-plane"
	controlPlaneLease = cpName // <fullname>-control-plane, the chart's --leader-elect-lease
)

// controlPlaneHA faults the control plane's replicas and the API server
// under live traffic through the file's VIPs and the Gateway's (gameVIP,
// served from the cluster's objects): the leader's pod deleted, a
// follower's, the Deployment rolled, kube-apiserver killed. None of their
// flows may fail, the Gateway keeps its address, and after each fault a new
// Service still gets its address written: a leader change loses nothing.
func (c *cluster) controlPlaneHA(t *testing.T, gameVIP string) {
	c.kubectl(t, "-n", ns, "rollout", "status", "deploy/"+cpName, "--timeout", "3m")
	if pods := c.controlPlanePods(t); len(pods) != 2 {
		t.Fatalf("want 2 control-plane replicas in Kubernetes mode, have %v", pods)
	}
	gatewayAddr := c.gatewayAddress(t)
	targets := []target{{tcpVIP, "tcp"}, {udpVIP, "udp"}, {gameVIP, "udp"}}
	round := 0
	fault := func(name string, do func(t *testing.T)) {
		round++
		t.Run(name, func(t *testing.T) {
			begin := time.Now()
			before := c.leader(t)
			tr := c.startTrafficTo(t, targets)
			do(t)
			c.kubectl(t, "-n", ns, "rollout", "status", "deploy/"+cpName, "--timeout", "3m")
			c.waitAgentsReady(t, 3*time.Minute)
			// A new address written after the fault: some replica leads.
			c.statusWritten(t, fmt.Sprintf("ha-%d", round))
			expectNoFailures(t, name, tr)
			if t.Failed() {
				// The pods may be replaced by the next fault: their logs now.
				for _, args := range [][]string{
					{"-n", ns, "logs", "-l", "app.kubernetes.io/component=agent", "--tail", "40", "--prefix"},
					{"-n", ns, "logs", "-l", controlPlaneLabel, "--tail", "40", "--prefix"},
				} {
					out, _ := c.run("kubectl", args...)
					t.Logf("kubectl %s\n%s", strings.Join(args, " "), out)
				}
			}
			if got := c.gatewayAddress(t); got != gatewayAddr {
				t.Errorf("the Gateway's address changed from %s to %s", gatewayAddr, got)
			}
			t.Logf("%s: leader %s before, %s after; %v", name, before, c.leader(t), time.Since(begin).Round(time.Second))
		})
	}

	fault("leader deleted", func(t *testing.T) {
		leader := c.leader(t)
		c.kubectl(t, "-n", ns, "delete", "pod", leader, "--wait=true")
		// Another replica takes the Lease: the deleted one hands it over
		// as it stops.
		c.eventually(t, "a new leader", func() string {
			if l := c.leader(t); l == leader {
				return "the Lease is still held by " + l
			}
			return ""
		})
	})
	fault("follower deleted", func(t *testing.T) {
		leader := c.leader(t)
		for _, p := range c.controlPlanePods(t) {
			if p != leader {
				c.kubectl(t, "-n", ns, "delete", "pod", p, "--wait=true")
				return
			}
		}
		t.Fatalf("no follower beside the leader %s", leader)
	})
	fault("rollout restart", func(t *testing.T) {
		c.kubectl(t, "-n", ns, "rollout", "restart", "deploy/"+cpName)
	})
	fault("API server restarted", func(t *testing.T) { c.restartAPIServer(t) })
	t.Run("ACK latency", func(t *testing.T) { c.ackLatency(t) })
}

// ackLatency reads l4xds_control_plane_ack_latency_seconds of both
// replicas (through the API server's pod proxy) and logs it: the changes
// of the faults above (the Services created and deleted) reached the
// agents connected to one of them, so some were counted.
func (c *cluster) ackLatency(t *testing.T) {
	const name = "l4xds_control_plane_ack_latency_seconds"
	counts, sums := map[string]float64{}, map[string]float64{}
	for _, p := range c.controlPlanePods(t) {
		out := c.kubectl(t, "get", "--raw", "/api/v1/namespaces/"+ns+"/pods/"+p+":9001/proxy/metrics")
		for line := range strings.Lines(out) {
			var series string
			var v float64
			if _, err := fmt.Sscanf(line, "%s %g", &series, &v); err != nil {
				continue
			}
			_, typ, _ := strings.Cut(series, `type="type.googleapis.com/`)
			typ, _, _ = strings.Cut(typ, `"`)
			switch {
			case strings.HasPrefix(series, name+"_count{"):
				counts[typ] += v
			case strings.HasPrefix(series, name+"_sum{"):
				sums[typ] += v
			}
		}
	}
	total := 0.0
	for typ, n := range counts {
		total += n
		if n > 0 {
			t.Logf("%s{type=%s}: %g ACKs of changes, mean %.3fs", name, typ, n, sums[typ]/n)
		}
	}
	if total == 0 {
		t.Errorf("no ACK of a change counted by either replica: %v", counts)
	}
}

// controlPlanePods are the names of the control plane's pods that are not
// being deleted.
func (c *cluster) controlPlanePods(t *testing.T) []string {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				Name              string
				DeletionTimestamp *string
			}
		}
	}
	c.kubectlJSON(t, &pods, "-n", ns, "get", "pods", "-l", controlPlaneLabel, "-o", "json")
	var out []string
	for _, p := range pods.Items {
		if p.Metadata.DeletionTimestamp == nil {
			out = append(out, p.Metadata.Name)
		}
	}
	return out
}

// leader is the holder of the control plane's Lease (a pod's name).
func (c *cluster) leader(t *testing.T) string {
	t.Helper()
	var id string
	c.eventually(t, "the Lease's holder", func() string {
		id = c.kubectl(t, "-n", ns, "get", "lease", controlPlaneLease, "-o", "jsonpath={.spec.holderIdentity}")
		if id == "" {
			return "no holder"
		}
		return ""
	})
	return id
}

// gatewayAddress is the address in the status of weightedRoute's Gateway.
func (c *cluster) gatewayAddress(t *testing.T) string {
	t.Helper()
	return c.kubectl(t, "-n", testNS, "get", "gateway", "edge", "-o", "jsonpath={.status.addresses[0].value}")
}

// statusWritten creates a LoadBalancer Service of our class, waits for its
// address in its status, and deletes it.
func (c *cluster) statusWritten(t *testing.T, name string) {
	t.Helper()
	c.apply(t, fmt.Sprintf(haServiceYAML, name, testNS, gameA, gamePort))
	c.eventually(t, "Service "+name+"'s address", func() string {
		if ip := c.kubectl(t, "-n", testNS, "get", "service", name, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"); ip == "" {
			return "no address in the status"
		}
		return ""
	})
	c.kubectl(t, "-n", testNS, "delete", "service", name)
}

// restartAPIServer kills the kube-apiserver container of the control-plane
// node (the kubelet starts it again, as after a crash) and waits until the
// API server is ready again.
func (c *cluster) restartAPIServer(t *testing.T) {
	t.Helper()
	nodeName := c.name + "-control-plane"
	// The node has containerd's ctr, not crictl: the container is found by
	// the label the kubelet gives it, and only its running task is killed.
	script := `set -e
ids=$(ctr -n k8s.io containers ls -q 'labels."io.kubernetes.container.name"==kube-apiserver')
killed=
for id in $ids; do
	if ctr -n k8s.io tasks ls | awk -v id="$id" '$1 == id && $3 == "RUNNING" { found = 1 } END { exit !found }'; then
		ctr -n k8s.io tasks kill -s SIGKILL "$id"
		killed="$killed $id"
	fi
done
[ -n "$killed" ] || { echo "no running kube-apiserver container among: $ids"; ctr -n k8s.io tasks ls; exit 1; }
echo "killed$killed"`
	out := c.must(t, "docker", "exec", nodeName, "sh", "-c", script)
	t.Logf("kube-apiserver on %s: %s", nodeName, strings.TrimSpace(out))
	down := time.Now()
	// Down first (the kill is asynchronous), then ready again.
	deadline := time.Now().Add(3 * time.Minute)
	for wasDown := false; ; time.Sleep(time.Second) {
		_, err := c.run("kubectl", "get", "--raw", "/readyz", "--request-timeout", "2s")
		wasDown = wasDown || err != nil
		if wasDown && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not down and ready again within 3 minutes (down seen: %v): %v", wasDown, err)
		}
	}
	t.Logf("kube-apiserver ready again %v after the kill", time.Since(down).Round(time.Second))
}

// A LoadBalancer Service of our class in front of game-a: the leader
// writes its address.
const haServiceYAML = `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  type: LoadBalancer
  loadBalancerClass: l4xds.io/l4lb
  selector: {app: %[3]s}
  ports: [{port: %[4]d, protocol: UDP}]
`
