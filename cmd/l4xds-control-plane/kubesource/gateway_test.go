// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
)

// installGatewayCRDs applies the experimental channel's CRDs that the
// pinned sigs.k8s.io/gateway-api module ships (those of the resources
// named; all the source uses when none), and waits until they are served.
func installGatewayCRDs(t *testing.T, api *apiServer, resources ...string) {
	t.Helper()
	if len(resources) == 0 {
		resources = []string{"gatewayclasses", "gateways", "tcproutes", "udproutes", "referencegrants"}
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil {
		t.Fatalf("finding the gateway-api module: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "experimental")
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, name := range resources {
		data, err := os.ReadFile(filepath.Join(dir, "gateway.networking.k8s.io_"+name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if obj == nil {
				continue
			}
			if _, err := crds.Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating CRD %s: %v", name, err)
			}
		}
	}
	kube := mustKube(t, api)
	deadline := time.Now().Add(60 * time.Second)
	for {
		rl, err := kube.Discovery().ServerResourcesForGroupVersion("gateway.networking.k8s.io/v1")
		served := err == nil
		for _, name := range resources {
			served = served && (name == "referencegrants" || slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == name }))
		}
		if served {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Gateway API not served after 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestGatewayRoutesOnARealAPIServer: a GatewayClass of ours, a Gateway
// with a UDP and a TCP listener, a UDPRoute weighted 70/30, a backendRef
// scaled to zero and back, then to a missing Service, and the status of all
// three.
func TestGatewayRoutesOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	installGatewayCRDs(t, api)
	e := startSource(t, api, kubesource.Options{Config: kubesource.Config{Pools: kubesource.Pools{mustPool(t, "gw=10.3.0.0/30")}}}, nil)
	gw, err := gwclient.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	g := gw.GatewayV1()

	for _, name := range []string{"game-a", "game-b"} {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "game", Port: 7777, Protocol: corev1.ProtocolUDP}},
		}}
		e.create(s)
	}
	e.applySlice(slice("game-a", "game-a", discoveryv1.AddressTypeIPv4, []port{{"game", 7000, corev1.ProtocolUDP}},
		ep{addr: "10.244.5.1", ready: true, serving: true}, ep{addr: "10.244.5.2", ready: true, serving: true}))
	e.applySlice(slice("game-b", "game-b", discoveryv1.AddressTypeIPv4, []port{{"game", 7001, corev1.ProtocolUDP}},
		ep{addr: "10.244.6.1", ready: true, serving: true}))

	if _, err := g.GatewayClasses().Create(e.ctx, &gatewayv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: "l4xds"},
		Spec:       gatewayv1.GatewayClassSpec{ControllerName: kubesource.DefaultControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Gateways("default").Create(e.ctx, &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "default"},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "l4xds", Listeners: []gatewayv1.Listener{
			{Name: "game", Port: 7777, Protocol: gatewayv1.UDPProtocolType},
			{Name: "db", Port: 3306, Protocol: gatewayv1.TCPProtocolType},
			{Name: "web", Port: 443, Protocol: gatewayv1.HTTPSProtocolType, Hostname: new(gatewayv1.Hostname("example.com")), TLS: &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "x"}}}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	route := &gatewayv1.UDPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "game", Namespace: "default"},
		Spec: gatewayv1.UDPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "edge", SectionName: new(gatewayv1.SectionName("game"))}}},
			Rules: []gatewayv1.UDPRouteRule{{BackendRefs: []gatewayv1.BackendRef{
				{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "game-a", Port: new(gatewayv1.PortNumber(7777))}, Weight: new(int32(70))},
				{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "game-b", Port: new(gatewayv1.PortNumber(7777))}, Weight: new(int32(30))},
			}}},
		},
	}
	if _, err := g.UDPRoutes("default").Create(e.ctx, route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// 70 % over game-a's two pods (21000 each), 30 % to game-b's one.
	e.expectServed("gateway/default/edge/game", "frontends 10.3.0.0:7777/UDP backends [10.244.5.1:7000 w21000 active, 10.244.5.2:7000 w21000 active, 10.244.6.1:7001 w18000 active]")
	e.expectServed("gateway/default/edge/db", "frontends 10.3.0.0:3306/TCP backends []")
	e.eventually("GatewayClass status", func() string {
		gc, err := g.GatewayClasses().Get(e.ctx, "l4xds", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return want(condition(gc.Status.Conditions, "Accepted"), "True Accepted: handled by l4xds")
	})
	e.eventually("Gateway status", func() string {
		gwy, err := g.Gateways("default").Get(e.ctx, "edge", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		var ls []string
		for _, l := range gwy.Status.Listeners {
			ls = append(ls, fmt.Sprintf("%s routes=%d %s", l.Name, l.AttachedRoutes, condition(l.Conditions, "Accepted")))
		}
		var addrs []string
		for _, a := range gwy.Status.Addresses {
			addrs = append(addrs, a.Value)
		}
		return want(fmt.Sprintf("addresses %v; %s; %s", addrs, condition(gwy.Status.Conditions, "Programmed"), strings.Join(ls, "; ")),
			"addresses [10.3.0.0]; True Programmed: serving on 10.3.0.0; game routes=1 True Accepted: ; db routes=0 True Accepted: ; web routes=0 False UnsupportedProtocol: l4xds serves TCP and UDP listeners, not HTTPS")
	})
	routeStatus := func() string {
		r, err := g.UDPRoutes("default").Get(e.ctx, "game", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(r.Status.Parents) != 1 {
			return fmt.Sprintf("%d parents in status", len(r.Status.Parents))
		}
		p := r.Status.Parents[0]
		return fmt.Sprintf("%s; %s; %s", condition(p.Conditions, "Accepted"), condition(p.Conditions, "ResolvedRefs"), condition(p.Conditions, kubesource.ConditionBackendsAvailable))
	}
	const accepted, resolved = "True Accepted: attached to 1 listener(s)", "True ResolvedRefs: every backendRef resolved"
	const available = "True BackendsAvailable: every backendRef has ready endpoints"
	e.eventually("UDPRoute status", func() string {
		return want(routeStatus(), accepted+"; "+resolved+"; "+available)
	})

	// game-b scaled to zero: its Service resolves, but its 30 % are
	// refused (GEP-2645), not given to game-a, and the route says so.
	e.applySlice(slice("game-b", "game-b", discoveryv1.AddressTypeIPv4, []port{{"game", 7001, corev1.ProtocolUDP}},
		ep{addr: "10.244.6.1", serving: true, terminating: true}))
	e.expectServed("gateway/default/edge/game", "frontends 10.3.0.0:7777/UDP reject 18000 backends [10.244.5.1:7000 w21000 active, 10.244.5.2:7000 w21000 active]")
	e.eventually("UDPRoute status with a backend scaled to zero", func() string {
		return want(routeStatus(), accepted+"; "+resolved+"; False NoReadyEndpoints: 30% of new flows are refused: Service default/game-b has no ready endpoint (30%)")
	})

	// Scaled back: nothing refused.
	e.applySlice(slice("game-b", "game-b", discoveryv1.AddressTypeIPv4, []port{{"game", 7001, corev1.ProtocolUDP}},
		ep{addr: "10.244.6.2", ready: true, serving: true}))
	e.expectServed("gateway/default/edge/game", "frontends 10.3.0.0:7777/UDP backends [10.244.5.1:7000 w21000 active, 10.244.5.2:7000 w21000 active, 10.244.6.2:7001 w18000 active]")
	e.eventually("UDPRoute status with the backend back", func() string {
		return want(routeStatus(), accepted+"; "+resolved+"; "+available)
	})

	// game-b deleted: BackendNotFound in the route's status, and its share
	// refused again.
	if err := e.kube.CoreV1().Services("default").Delete(e.ctx, "game-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("UDPRoute status with a missing backend", func() string {
		return want(routeStatus(), accepted+"; False BackendNotFound: Service default/game-b not found; False RefsNotResolved: 30% of new flows are refused: Service default/game-b not found (30%)")
	})
	e.expectServed("gateway/default/edge/game", "frontends 10.3.0.0:7777/UDP reject 18000 backends [10.244.5.1:7000 w21000 active, 10.244.5.2:7000 w21000 active]")

	// The route deleted: the listener has no backends and rejects.
	if err := g.UDPRoutes("default").Delete(e.ctx, "game", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectServed("gateway/default/edge/game", "frontends 10.3.0.0:7777/UDP backends []")
}

func want(got, want string) string {
	if got != want {
		return fmt.Sprintf("got\n  %s\nwant\n  %s", got, want)
	}
	return ""
}

// A Gateway API CRD missing keeps the source from publishing (a partial
// state would remove the routes of the missing kind from every client),
// and it says which kind and why; the CRD installed, it publishes.
func TestGatewayCRDMissingOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	installGatewayCRDs(t, api, "gatewayclasses", "gateways", "udproutes")
	problems := make(chan error, 100)
	e := startSource(t, api, kubesource.Options{
		Config:  kubesource.Config{Pools: kubesource.Pools{mustPool(t, "gw=10.3.0.0/30")}},
		Problem: func(err error) { problems <- err },
	}, nil)
	deadline := time.After(60 * time.Second)
	reported := ""
	for !strings.Contains(reported, "TCPRoutes (") || strings.Contains(reported, "TCPRoutes (not listed yet)") {
		select {
		case err := <-problems:
			reported = fmt.Sprint(err)
		case <-deadline:
			t.Fatalf("no problem reported for TCPRoutes (last: %q)", reported)
		}
	}
	if e.srv.Serving() {
		t.Fatal("published without TCPRoutes")
	}
	t.Log("reported:", reported)
	installGatewayCRDs(t, api, "tcproutes")
	for {
		select {
		case err := <-problems:
			if err == nil {
				if !e.srv.Serving() {
					t.Fatal("no problem left, nothing published")
				}
				return
			}
		case <-deadline:
			t.Fatal("still not published once the CRD is installed")
		}
	}
}

// A Service created after a Gateway got its address gets another one: the
// Gateway's is kept before any Service is given one, and it does not move.
func TestGatewayKeepsItsAddressOnARealAPIServer(t *testing.T) {
	api := startAPIServer(t)
	installGatewayCRDs(t, api)
	e := startSource(t, api, kubesource.Options{Config: kubesource.Config{Pools: kubesource.Pools{mustPool(t, "shared=10.3.0.0/31")}}}, nil)
	gw, err := gwclient.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	g := gw.GatewayV1()
	if _, err := g.GatewayClasses().Create(e.ctx, &gatewayv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: "l4xds"},
		Spec:       gatewayv1.GatewayClassSpec{ControllerName: kubesource.DefaultControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Gateways("default").Create(e.ctx, &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "default"},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "l4xds", Listeners: []gatewayv1.Listener{
			{Name: "dns", Port: 53, Protocol: gatewayv1.UDPProtocolType},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gatewayAddrs := func() string {
		gwy, err := g.Gateways("default").Get(e.ctx, "edge", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		var addrs []string
		for _, a := range gwy.Status.Addresses {
			addrs = append(addrs, a.Value)
		}
		return fmt.Sprint(addrs)
	}
	e.eventually("Gateway address", func() string { return want(gatewayAddrs(), "[10.3.0.0]") })

	e.create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "default"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(kubesource.DefaultLoadBalancerClass),
		Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP}},
	}})
	e.expectStatus("late", "10.3.0.1(VIP)[53/TCP]", nil)
	e.expectServed("gateway/default/edge/dns", "frontends 10.3.0.0:53/UDP backends []")
	if got := gatewayAddrs(); got != "[10.3.0.0]" {
		t.Errorf("the Gateway moved to %s", got)
	}
}
