// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The control plane's Kubernetes mode (Documentation/loadbalancer.md): a
// LoadBalancer Service in front of CoreDNS, and a Gateway UDP listener
// whose route splits 70/30 over two Deployments.
const (
	dnsService   = "l4xds-dns"
	gatewayClass = "l4xds"
	dnsName      = "kubernetes.default.svc.cluster.local"
	// The listener's port, and the route's Deployments with their weights.
	gamePort = 7777
	gameA    = "game-a"
	gameB    = "game-b"
)

// loadBalancer turns on the control plane's Kubernetes mode with the docs'
// command and proves its LoadBalancer Services and routes with real
// traffic from the client, through each node.
func (c *cluster) loadBalancer(t *testing.T, docs string) {
	c.installGatewayCRDs(t)
	// The docs' helm upgrade, with this cluster's pool.
	upgrade := forRelease(strings.TrimSpace(c.docBlock(t, "controlPlane.kubernetes.enabled=true")))
	upgrade = strings.ReplaceAll(upgrade, "192.0.2.10-192.0.2.50", kubePool) + " --wait"
	c.sh(t, docs, upgrade)
	c.kubectl(t, "-n", ns, "rollout", "status", "deploy/"+cpName, "--timeout", "3m")
	c.waitAgentsReady(t, 3*time.Minute)

	t.Run("DNS through a LoadBalancer Service", func(t *testing.T) { c.dnsThroughVIP(t) })
	var gameVIP string
	t.Run("UDPRoute 70/30, a backend scaled to zero and back", func(t *testing.T) { gameVIP = c.weightedRoute(t) })
	if gameVIP != "" {
		t.Run("control plane HA", func(t *testing.T) { c.controlPlaneHA(t, gameVIP) })
	}
	c.run("kubectl", "-n", ns, "delete", "service", dnsService)
}

// installGatewayCRDs applies the experimental channel's CRDs of the
// gateway-api module the control plane is built with (its go.mod), and
// waits until they are served: the control plane looks for them at start.
func (c *cluster) installGatewayCRDs(t *testing.T) {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api")
	cmd.Dir = filepath.Join(c.repo, "cmd", "l4xds-control-plane")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("finding the gateway-api module: %v\n%s", err, out)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "experimental")
	args := []string{"apply", "--server-side"} // the CRDs are too large for the last-applied annotation
	var crds []string
	for _, kind := range []string{"gatewayclasses", "gateways", "tcproutes", "udproutes", "referencegrants"} {
		args = append(args, "-f", filepath.Join(dir, "gateway.networking.k8s.io_"+kind+".yaml"))
		crds = append(crds, "crd/"+kind+".gateway.networking.k8s.io")
	}
	// A kind apiserver under load can refuse a large write for a moment
	// (a timeout, a conflict): say so and apply again, as an operator would.
	for attempt := 1; ; attempt++ {
		_, err := c.run("kubectl", args...)
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("applying the Gateway API CRDs, attempt %d: %v", attempt, err)
		time.Sleep(2 * time.Second)
	}
	c.kubectl(t, append([]string{"wait", "--for", "condition=Established", "--timeout", "1m"}, crds...)...)
	t.Logf("Gateway API CRDs (experimental) from %s", dir)
}

// dnsThroughVIP: a LoadBalancer Service of our class selecting CoreDNS on
// 53/UDP and 53/TCP gets a VIP and its KEP-1435 status, and real DNS
// queries through the VIP, via each node, are answered with the kubernetes
// Service's ClusterIP.
func (c *cluster) dnsThroughVIP(t *testing.T) {
	c.apply(t, fmt.Sprintf(dnsServiceYAML, dnsService, ns))
	var svc struct {
		Status struct {
			LoadBalancer struct {
				Ingress []struct {
					IP, IPMode string
					Ports      []struct {
						Port     int
						Protocol string
						Error    *string
					}
				}
			}
		}
	}
	c.eventually(t, "the DNS Service's address", func() string {
		c.kubectlJSON(t, &svc, "-n", ns, "get", "service", dnsService, "-o", "json")
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			return "no ingress in the status"
		}
		return ""
	})
	t.Logf("Service %s/%s status: %s", ns, dnsService, c.status(t, "-n", ns, "service", dnsService))
	in := svc.Status.LoadBalancer.Ingress
	var ports []string
	for _, p := range in[0].Ports {
		s := fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if p.Error != nil {
			s += "=" + *p.Error
		}
		ports = append(ports, s)
	}
	slices.Sort(ports)
	if len(in) != 1 || in[0].IPMode != "VIP" || !slices.Equal(ports, []string{"53/TCP", "53/UDP"}) {
		t.Errorf("ingress %+v, want one address, ipMode VIP, ports 53/TCP and 53/UDP without errors", in)
	}
	vip := in[0].IP
	clusterIP := c.kubectl(t, "-n", "default", "get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}")

	for _, n := range c.nodes {
		c.route(t, n)
		for _, proto := range []string{"udp", "tcp"} {
			var r dnsReport
			c.eventually(t, fmt.Sprintf("DNS over %s via %s", proto, n.name), func() string {
				var err error
				if r, err = c.dns(vip+":53", proto, dnsName); err != nil {
					return err.Error()
				}
				return ""
			})
			t.Logf("DNS via %s to %s:53/%s: %s A? -> %s %v", n.name, vip, proto, dnsName, r.RCode, r.Answers)
			if !slices.Equal(r.Answers, []string{clusterIP}) {
				t.Errorf("via %s over %s: answers %v, want the kubernetes Service's ClusterIP %s", n.name, proto, r.Answers, clusterIP)
			}
		}
	}
}

// dnsReport is `l4xds-traffic dns -o json`.
type dnsReport struct {
	RCode   string   `json:"rcode"`
	Answers []string `json:"answers"`
	Error   string   `json:"error"`
}

// dns asks server for name's A records from the client.
func (c *cluster) dns(server, proto, name string) (dnsReport, error) {
	var r dnsReport
	out, err := exec.Command("docker", "exec", c.client, "l4xds-traffic", "dns", "--server", server, "--proto", proto,
		"--name", name, "-o", "json").Output()
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return r, fmt.Errorf("dns %s/%s: %v %v: %s", server, proto, err, jerr, out)
	}
	if err != nil {
		return r, fmt.Errorf("dns %s/%s: %v: %s %s", server, proto, err, r.RCode, r.Error)
	}
	return r, nil
}

// weightedRoute: a Gateway UDP listener whose UDPRoute splits 70/30 over
// two Deployments; game-b scaled to zero has its 30 % refused (ICMP port
// unreachable) and the route says so; scaled back, 70/30 with none refused.
// It returns the listener's VIP:port.
func (c *cluster) weightedRoute(t *testing.T) string {
	for _, d := range []string{gameA, gameB} {
		c.apply(t, fmt.Sprintf(gameYAML, testNS, c.image, d, gamePort))
		c.kubectl(t, "-n", testNS, "rollout", "status", "deploy/"+d, "--timeout", "3m")
	}
	c.apply(t, fmt.Sprintf(gatewayYAML, testNS, gatewayClass, gamePort, gameA, gameB))
	var gw struct {
		Status struct{ Addresses []struct{ Value string } }
	}
	c.eventually(t, "the Gateway's address", func() string {
		c.kubectlJSON(t, &gw, "-n", testNS, "get", "gateway", "edge", "-o", "json")
		if len(gw.Status.Addresses) == 0 {
			return "no address in the status"
		}
		return ""
	})
	t.Logf("Gateway %s/edge status: %s", testNS, c.status(t, "-n", testNS, "gateway", "edge"))
	vip := fmt.Sprintf("%s:%d", gw.Status.Addresses[0].Value, gamePort)

	c.waitBackendsAvailable(t, "True")
	c.checkRoute(t, "UDPRoute 70/30", vip, map[string]float64{gameA: 70, gameB: 30}, 0)

	c.kubectl(t, "-n", testNS, "scale", "deploy/"+gameB, "--replicas", "0")
	c.eventually(t, gameB+"'s pods gone", func() string {
		var pods struct{ Items []struct{} }
		c.kubectlJSON(t, &pods, "-n", testNS, "get", "pods", "-l", "app="+gameB, "-o", "json")
		if len(pods.Items) > 0 {
			return fmt.Sprintf("%d pods left", len(pods.Items))
		}
		return ""
	})
	c.waitBackendsAvailable(t, "False")
	c.checkRoute(t, gameB+" scaled to zero", vip, map[string]float64{gameA: 70}, 30)

	c.kubectl(t, "-n", testNS, "scale", "deploy/"+gameB, "--replicas", "1")
	c.kubectl(t, "-n", testNS, "rollout", "status", "deploy/"+gameB, "--timeout", "3m")
	c.waitBackendsAvailable(t, "True")
	c.checkRoute(t, gameB+" scaled back", vip, map[string]float64{gameA: 70, gameB: 30}, 0)
	return vip
}

// waitBackendsAvailable waits until the route's l4xds.io/BackendsAvailable
// condition has status, and logs the route's status.
func (c *cluster) waitBackendsAvailable(t *testing.T, status string) {
	t.Helper()
	c.eventually(t, "UDPRoute condition l4xds.io/BackendsAvailable "+status, func() string {
		got := c.kubectl(t, "-n", testNS, "get", "udproute", "game", "-o",
			`jsonpath={.status.parents[0].conditions[?(@.type=="l4xds.io/BackendsAvailable")].status}`)
		if got != status {
			return "status " + got
		}
		return ""
	})
	t.Logf("UDPRoute %s/game status: %s", testNS, c.status(t, "-n", testNS, "udproute", "game"))
}

// checkRoute sends flows new UDP flows to vip through each node and checks
// the split by Deployment and the share refused. The agents may still be
// writing the last change when the status says it: the first probe that
// matches is taken, within a minute.
func (c *cluster) checkRoute(t *testing.T, what, vip string, want map[string]float64, refused float64) {
	t.Helper()
	for _, n := range c.nodes {
		c.route(t, n)
		var r probeResult
		deadline := time.Now().Add(time.Minute)
		for {
			var err error
			if r, err = c.probe(vip, "udp", flows); err != nil {
				t.Fatal(err)
			}
			r = byDeployment(r)
			if time.Now().After(deadline) || splitWithin(r, want, refused) {
				break
			}
			time.Sleep(2 * time.Second)
		}
		checkSplitRefused(t, fmt.Sprintf("%s: UDP %s via %s", what, vip, n.name), r, want, refused)
	}
}

// byDeployment counts the answers by Deployment: a pod's name is
// <deployment>-<replicaset hash>-<pod hash>.
func byDeployment(r probeResult) probeResult {
	out := r
	out.Backends = map[string]int{}
	for name, k := range r.Backends {
		parts := strings.Split(name, "-")
		if len(parts) > 2 {
			name = strings.Join(parts[:len(parts)-2], "-")
		}
		out.Backends[name] += k
	}
	return out
}

// splitWithin reports whether r is the split wanted: what
// checkSplitRefused asserts.
func splitWithin(r probeResult, want map[string]float64, refused float64) bool {
	if !withinTolerance(r, want) {
		return false
	}
	n := 0
	for _, k := range refusedKinds {
		n += r.Errors[k]
	}
	if len(r.Backends) != len(want) || r.failed() != n {
		return false
	}
	if refused == 0 {
		return n == 0
	}
	return nearShare(r.percent(n), refused)
}

// status is an object's status, as indented JSON for the log.
func (c *cluster) status(t *testing.T, args ...string) string {
	t.Helper()
	raw := c.kubectl(t, append(append([]string{"get"}, args...), "-o", "jsonpath={.status}")...)
	var out bytes.Buffer
	if err := json.Indent(&out, []byte(raw), "", "  "); err != nil {
		return raw
	}
	return out.String()
}

// eventually retries check until it returns "" (2 minutes at most).
func (c *cluster) eventually(t *testing.T, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(time.Second)
	}
}

// A LoadBalancer Service of our class in front of CoreDNS.
const dnsServiceYAML = `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  type: LoadBalancer
  loadBalancerClass: l4xds.io/l4lb
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
`

// A GatewayClass of ours, a Gateway with a UDP listener, and a UDPRoute
// splitting 70/30 between two Services.
const gatewayYAML = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: %[2]s}
spec: {controllerName: l4xds.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: %[1]s}
spec:
  gatewayClassName: %[2]s
  listeners:
  - {name: game, port: %[3]d, protocol: UDP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {name: game, namespace: %[1]s}
spec:
  parentRefs: [{name: edge, sectionName: game}]
  rules:
  - backendRefs:
    - {name: %[4]s, port: %[3]d, weight: 70}
    - {name: %[5]s, port: %[3]d, weight: 30}
`

// A Deployment answering UDP with its pod's name, and its Service.
const gameYAML = `apiVersion: apps/v1
kind: Deployment
metadata: {name: %[3]s, namespace: %[1]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[3]s}}
  template:
    metadata: {labels: {app: %[3]s}}
    spec:
      tolerations: [{operator: Exists}]
      terminationGracePeriodSeconds: 1
      containers:
      - name: serve
        image: %[2]s
        imagePullPolicy: IfNotPresent
        command: [l4xds-traffic, serve, --name, $(POD_NAME), --udp, ":%[4]d"]
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
---
apiVersion: v1
kind: Service
metadata: {name: %[3]s, namespace: %[1]s}
spec:
  selector: {app: %[3]s}
  ports: [{port: %[4]d, protocol: UDP}]
`
