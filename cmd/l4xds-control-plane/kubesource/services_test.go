// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
	"github.com/l4xds/l4xds/pkg/controlplane"
)

// TestServicesOnARealAPIServer is the Services half of the Kubernetes
// source against a real kube-apiserver: every rule of
// Documentation/loadbalancer.md, each as it is written to the API server and
// read back from the xDS server and the objects' status.
func TestServicesOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	file, err := controlplane.ParseResources([]byte(fileCluster))
	if err != nil {
		t.Fatal(err)
	}
	e := startSource(t, api, kubesource.Options{Config: kubesource.Config{Pools: kubesource.Pools{
		mustPool(t, "lan=10.1.2.10-10.1.2.11"),
		mustPool(t, "v6=fd00:1::10/127"),
	}}}, file)
	const addrOK = "True AddressAssigned: serving on "
	const portsOK = "False AllPortsServed: every port is served"

	// DNS: 53 on TCP and UDP, and an SCTP port refused in the status only.
	dnsPorts := []port{{"dns-tcp", 53, corev1.ProtocolTCP}, {"dns", 53, corev1.ProtocolUDP}}
	dns := lbService("dns", append(dnsPorts, port{"sig", 9999, corev1.ProtocolSCTP})...)
	dns.Annotations[kubesource.AnnotationSharingKey] = "edge"
	dns.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	dns.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(300))}}
	dns.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
	e.create(dns)
	slicePorts := []port{{"dns-tcp", 5353, corev1.ProtocolTCP}, {"dns", 5353, corev1.ProtocolUDP}}
	e.applySlice(slice("dns", "dns-a", discoveryv1.AddressTypeIPv4, slicePorts,
		ep{addr: "10.244.0.1", ready: true, serving: true},
		ep{addr: "10.244.0.2", serving: true, terminating: true},
		ep{addr: "10.244.0.3", terminating: true}, // not serving: no backend
		ep{addr: "10.244.0.4"},                    // not ready, not serving
	))
	e.expectServed("service/default/dns", "frontends 10.1.2.10:53/TCP->5353 10.1.2.10:53/UDP->5353 ranges [192.0.2.0/24] affinity 5m0s backends [10.244.0.1:5353 w1 active, 10.244.0.2:5353 w1 terminating]")
	e.expectStatus("dns", "10.1.2.10(VIP)[53/TCP 53/UDP 9999/SCTP=l4xds.io/ProtocolNotSupported]", map[string]string{
		kubesource.ConditionPortsError: "True PortsNotServed: not served: 9999/SCTP: l4xds.io/ProtocolNotSupported",
		kubesource.ConditionAddress:    addrOK + "10.1.2.10",
	})
	e.expectEvent("dns", "PortsNotServed", "9999/SCTP")

	// A Service of another class, and one of no class: not touched.
	other := lbService("other", port{"x", 80, corev1.ProtocolTCP})
	other.Spec.LoadBalancerClass = new("example.com/other")
	e.create(other)
	// An endpoint change is published.
	e.applySlice(slice("dns", "dns-a", discoveryv1.AddressTypeIPv4, slicePorts,
		ep{addr: "10.244.0.1", ready: true, serving: true},
		ep{addr: "10.244.0.5", ready: true, serving: true},
	))
	e.expectServed("service/default/dns", "frontends 10.1.2.10:53/TCP->5353 10.1.2.10:53/UDP->5353 ranges [192.0.2.0/24] affinity 5m0s backends [10.244.0.1:5353 w1 active, 10.244.0.5:5353 w1 active]")
	if s := e.service("other"); len(s.Status.LoadBalancer.Ingress) > 0 || len(s.Status.Conditions) > 0 {
		t.Errorf("Service of another class got a status: %+v", s.Status)
	}
	if got := e.served("service/default/other"); got != "<none>" {
		t.Errorf("Service of another class served: %s", got)
	}

	// Sharing: SIP on the same address as DNS (same key, no overlap).
	sip := lbService("sip", port{"sip", 5060, corev1.ProtocolUDP})
	sip.Annotations[kubesource.AnnotationSharingKey] = "edge"
	e.create(sip)
	e.expectStatus("sip", "10.1.2.10(VIP)[5060/UDP]", map[string]string{kubesource.ConditionAddress: addrOK + "10.1.2.10", kubesource.ConditionPortsError: portsOK})
	e.expectServed("service/default/sip", "frontends 10.1.2.10:5060/UDP->5060 backends []")

	// Same key but an overlapping port, asked for explicitly: refused.
	clash := lbService("clash", port{"dns", 53, corev1.ProtocolUDP})
	clash.Annotations[kubesource.AnnotationSharingKey] = "edge"
	clash.Annotations[kubesource.AnnotationAddresses] = "10.1.2.10"
	e.create(clash)
	e.expectStatus("clash", "", map[string]string{kubesource.ConditionAddress: "False AddressInUse: 10.1.2.10 53/UDP is used by Service default/dns"})
	e.expectEvent("clash", "AddressInUse", "53/UDP is used by Service default/dns")

	// Outside every pool: refused, and nothing else disturbed.
	far := lbService("far", port{"http", 80, corev1.ProtocolTCP})
	far.Spec.LoadBalancerIP = "10.9.9.9"
	e.create(far)
	e.expectStatus("far", "", map[string]string{kubesource.ConditionAddress: "False AddressNotInPool: 10.9.9.9 is in no address pool"})
	e.expectEvent("far", "AddressNotInPool", "10.9.9.9")

	// The last IPv4 address, then the pool is exhausted.
	web := lbService("web", port{"http", 80, corev1.ProtocolTCP})
	e.create(web)
	e.expectStatus("web", "10.1.2.11(VIP)[80/TCP]", map[string]string{kubesource.ConditionAddress: addrOK + "10.1.2.11"})
	late := lbService("late", port{"http", 80, corev1.ProtocolTCP})
	e.create(late)
	e.expectStatus("late", "", map[string]string{kubesource.ConditionAddress: "False PoolExhausted: the address pools have no free IPv4 address"})
	e.expectEvent("late", "PoolExhausted", "no free IPv4 address")
	for _, n := range []string{"clash", "far", "late"} {
		if got := e.served("service/default/" + n); got != "<none>" {
			t.Errorf("Service %s without an address is served: %s", n, got)
		}
	}
	e.expectServed("service/default/dns", "frontends 10.1.2.10:53/TCP->5353 10.1.2.10:53/UDP->5353 ranges [192.0.2.0/24] affinity 5m0s backends [10.244.0.1:5353 w1 active, 10.244.0.5:5353 w1 active]")

	// Deleting web frees its address for the waiting Service.
	if err := e.kube.CoreV1().Services("default").Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectStatus("late", "10.1.2.11(VIP)[80/TCP]", map[string]string{kubesource.ConditionAddress: addrOK + "10.1.2.11"})
	e.expectServed("service/default/web", "<none>")

	// Dual stack: one address of each family, backends of both.
	ds := lbService("dual", port{"http", 8080, corev1.ProtocolTCP})
	ds.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
	ds.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	ds.Annotations[kubesource.AnnotationSharingKey] = "edge"
	e.create(ds)
	e.applySlice(slice("dual", "dual-v4", discoveryv1.AddressTypeIPv4, []port{{"http", 80, corev1.ProtocolTCP}}, ep{addr: "10.244.1.1", ready: true, serving: true}))
	e.applySlice(slice("dual", "dual-v6", discoveryv1.AddressTypeIPv6, []port{{"http", 80, corev1.ProtocolTCP}}, ep{addr: "fd00:244::1", ready: true, serving: true}))
	e.expectStatus("dual", "10.1.2.10(VIP)[8080/TCP] fd00:1::10(VIP)[8080/TCP]", map[string]string{kubesource.ConditionAddress: addrOK + "10.1.2.10, fd00:1::10"})
	e.expectServed("service/default/dual", "frontends 10.1.2.10:8080/TCP->80 [fd00:1::10]:8080/TCP->80 backends [10.244.1.1:80 w1 active, [fd00:244::1]:80 w1 active]")

	// Instance mode: the nodes' InternalIPs at the nodePort; a NotReady
	// node is UNHEALTHY (quarantined), and with externalTrafficPolicy
	// Local so is a node without a ready endpoint.
	e.node("node-a", "192.168.0.1", true)
	e.node("node-b", "192.168.0.2", false)
	e.node("node-c", "192.168.0.3", true)
	e.update("sip", func(s *corev1.Service) { s.Annotations[kubesource.AnnotationBackendMode] = "node-port" })
	np := e.service("sip").Spec.Ports[0].NodePort
	want := func(health ...string) string {
		return "frontends 10.1.2.10:5060/UDP->" + itoa(np) + " backends [192.168.0.1:" + itoa(np) + " w1 " + health[0] + ", 192.168.0.2:" + itoa(np) + " w1 " + health[1] + ", 192.168.0.3:" + itoa(np) + " w1 " + health[2] + "]"
	}
	e.expectServed("service/default/sip", want("active", "quarantined", "active"))
	e.applySlice(slice("sip", "sip-a", discoveryv1.AddressTypeIPv4, []port{{"sip", 5060, corev1.ProtocolUDP}}, ep{addr: "10.244.2.1", ready: true, serving: true, node: "node-a"}))
	e.update("sip", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal })
	e.expectServed("service/default/sip", want("active", "quarantined", "quarantined"))
	e.nodeReady("node-b", true)
	e.update("sip", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })
	e.expectServed("service/default/sip", want("active", "active", "active"))

	// A name the resource file also has: the file's is served.
	conflict := lbService("conflict", port{"http", 81, corev1.ProtocolTCP})
	conflict.Annotations[kubesource.AnnotationSharingKey] = "edge"
	conflict.Namespace = "default"
	e.create(conflict)
	e.expectStatus("conflict", "10.1.2.10(VIP)[81/TCP]", nil)
	if got := e.served("service/default/conflict"); got != "frontends 10.1.2.3:3306/TCP backends [192.168.1.10:3306 w1 active]" {
		t.Errorf("conflicting name: served %s, want the file's cluster", got)
	}

	// No longer a LoadBalancer: no longer served, and its address is free.
	e.update("dns", func(s *corev1.Service) {
		s.Spec.Type, s.Spec.LoadBalancerClass, s.Spec.LoadBalancerSourceRanges = corev1.ServiceTypeClusterIP, nil, nil
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	})
	e.expectServed("service/default/dns", "<none>")
	e.expectStatus("clash", "10.1.2.10(VIP)[53/UDP]", map[string]string{kubesource.ConditionAddress: addrOK + "10.1.2.10"})
}

const fileCluster = `
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: service/default/conflict
  metadata: {filter_metadata: {io.cilium.l4lb: {vip: "10.1.2.3", port: 3306}}}
  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: service/default/conflict
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {socket_address: {address: 192.168.1.10, port_value: 3306}}}
`

func itoa(n int32) string { return fmt.Sprint(n) }

func (e *env) node(name, ip string, ready bool) {
	e.t.Helper()
	n, err := e.kube.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	n.Status.Conditions = []corev1.NodeCondition{readyCondition(ready)}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) nodeReady(name string, ready bool) {
	e.t.Helper()
	n, err := e.kube.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{readyCondition(ready)}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func readyCondition(ready bool) corev1.NodeCondition {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: s, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
}

// The first Service of a sharing key in an IPv6 /64 pool gets its address:
// the key's holder is found by an index, not by walking 2^64 addresses.
func TestSharingKeyInAnIPv6PoolOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	e := startSource(t, api, kubesource.Options{Config: kubesource.Config{Pools: kubesource.Pools{mustPool(t, "v6=fd00:3::/64")}}}, nil)
	for _, p := range []port{{"dns", 53, corev1.ProtocolUDP}, {"dns-tcp", 53, corev1.ProtocolTCP}} {
		s := lbService(p.name, p)
		s.Annotations[kubesource.AnnotationSharingKey] = "dns"
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicySingleStack)
		e.create(s)
		e.expectStatus(p.name, fmt.Sprintf("fd00:3::(VIP)[53/%s]", p.proto), nil)
	}
}

// A pools ConfigMap that does not parse when the source starts: the
// cluster is served from the flags' pools, a Service keeps the address it
// holds from the ConfigMap's pools, the error is an Event on the ConfigMap
// and a problem reported; fixed, the problem is gone.
func TestBadPoolsConfigMapOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	kube := mustKube(t, api)
	ctx := t.Context()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pools", Namespace: "default"},
		Data: map[string]string{"lan": "10.1.0.0/24", "typo": "10.2.0.0/33"}}
	if _, err := kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	holder, err := kube.CoreV1().Services("default").Create(ctx, lbService("holder", port{"dns", 53, corev1.ProtocolUDP}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.1.0.5"}}
	if _, err := kube.CoreV1().Services("default").UpdateStatus(ctx, holder, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	problems := make(chan error, 100)
	e := startSource(t, api, kubesource.Options{
		Config:         kubesource.Config{Pools: kubesource.Pools{mustPool(t, "flags=10.0.0.1-10.0.0.2")}},
		PoolsConfigMap: "default/pools",
		Problem:        func(err error) { problems <- err },
	}, nil)
	e.create(lbService("new", port{"dns", 53, corev1.ProtocolUDP}))
	e.expectStatus("new", "10.0.0.1(VIP)[53/UDP]", nil)
	e.expectStatus("holder", "10.1.0.5(VIP)[53/UDP]", nil)
	e.expectEvent("pools", "InvalidAddressPools", `pool "typo"`)
	last := func() string {
		var s string
		for len(problems) > 0 {
			s = fmt.Sprint(<-problems)
		}
		return s
	}
	var reported string
	e.eventually("problem reported", func() string {
		if s := last(); s != "" {
			reported = s
		}
		return want(fmt.Sprint(strings.Contains(reported, "address pools ConfigMap default/pools")), "true")
	})

	cm.Data = map[string]string{"lan": "10.1.0.0/24"}
	if _, err := kube.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("problem cleared", func() string {
		if s := last(); s != "" {
			reported = s
		}
		return want(reported, "<nil>")
	})
	e.expectStatus("holder", "10.1.0.5(VIP)[53/UDP]", nil)
}
