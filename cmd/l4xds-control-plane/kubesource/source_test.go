// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/l4lb"
)

// env is a real API server, the source watching it, and the reference
// xDS server it publishes to.
type env struct {
	t    *testing.T
	ctx  context.Context
	kube kubernetes.Interface
	srv  *controlplane.Server
	api  *apiServer
}

func startSource(t *testing.T, api *apiServer, opts kubesource.Options, file controlplane.Resources) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	srv := controlplane.NewServer(controlplane.Options{Logger: log})
	// Served once every source has published: the file only when given.
	order := []string{kubesource.SourceName}
	if file != nil {
		order = []string{"file", kubesource.SourceName}
	}
	sources := controlplane.NewSources(srv, order...)
	if file != nil {
		if _, err := sources.Set("file", file); err != nil {
			t.Fatal(err)
		}
	}
	opts.Publish = func(res controlplane.Resources) ([]controlplane.Conflict, error) {
		return sources.Set(kubesource.SourceName, res)
	}
	opts.Logger = log
	src, err := kubesource.New(api.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		srv.Stop()
	})
	kube, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, kube: kube, srv: srv, api: api}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// eventually retries check until it returns "" (30 s at most: a machine
// under load is slow, and no timing is asserted).
func (e *env) eventually(what string, check func() string) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// served describes a served cluster the way the assertions read: its
// frontends, source ranges, affinity and backends with their health and
// weight, after the agent's own translation (so it is also proof that the
// agent accepts it).
func (e *env) served(name string) string {
	res := e.srv.Resources()
	c, ok := res[resource.ClusterType][name].(*clusterv3.Cluster)
	if !ok {
		return "<none>"
	}
	spec, err := l4lb.TranslateCluster(c)
	if err != nil {
		return "agent rejects it: " + err.Error()
	}
	var fes []string
	for _, f := range spec.Frontends {
		s := f.Address.String()
		if f.ServicePort != 0 {
			s += fmt.Sprintf("->%d", f.ServicePort)
		}
		fes = append(fes, s)
	}
	sort.Strings(fes)
	out := "frontends " + strings.Join(fes, " ")
	if len(spec.Service.SourceRanges) > 0 {
		out += fmt.Sprintf(" ranges %v", spec.Service.SourceRanges)
	}
	if spec.Service.SessionAffinity {
		out += fmt.Sprintf(" affinity %s", spec.Service.SessionAffinityTimeout)
	}
	if spec.Service.RejectWeight > 0 {
		out += fmt.Sprintf(" reject %d", spec.Service.RejectWeight)
	}
	cla, ok := res[resource.EndpointType][name].(*endpointv3.ClusterLoadAssignment)
	if !ok {
		return out + " no ClusterLoadAssignment"
	}
	bes, err := l4lb.TranslateEndpoints(cla)
	if err != nil {
		return out + " agent rejects endpoints: " + err.Error()
	}
	var bs []string
	for _, b := range bes {
		bs = append(bs, fmt.Sprintf("%s w%d %s", b.Address, b.Weight, b.State))
	}
	sort.Strings(bs)
	return out + " backends [" + strings.Join(bs, ", ") + "]"
}

func (e *env) expectServed(name, want string) {
	e.t.Helper()
	e.eventually("cluster "+name, func() string {
		if got := e.served(name); got != want {
			return fmt.Sprintf("served\n  %s\nwant\n  %s", got, want)
		}
		return ""
	})
}

func (e *env) service(name string) *corev1.Service {
	e.t.Helper()
	s, err := e.kube.CoreV1().Services("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// lbStatus is status.loadBalancer of a Service, as a line.
func lbStatus(s *corev1.Service) string {
	var parts []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		mode := ""
		if in.IPMode != nil {
			mode = string(*in.IPMode)
		}
		var ps []string
		for _, p := range in.Ports {
			x := fmt.Sprintf("%d/%s", p.Port, p.Protocol)
			if p.Error != nil {
				x += "=" + *p.Error
			}
			ps = append(ps, x)
		}
		parts = append(parts, fmt.Sprintf("%s(%s)[%s]", in.IP, mode, strings.Join(ps, " ")))
	}
	return strings.Join(parts, " ")
}

func condition(conds []metav1.Condition, t string) string {
	c := meta.FindStatusCondition(conds, t)
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
}

func (e *env) expectStatus(name, wantLB string, wantConds map[string]string) {
	e.t.Helper()
	e.eventually("status of Service "+name, func() string {
		s := e.service(name)
		if got := lbStatus(s); got != wantLB {
			return fmt.Sprintf("status.loadBalancer %q, want %q", got, wantLB)
		}
		for t, want := range wantConds {
			if got := condition(s.Status.Conditions, t); got != want {
				return fmt.Sprintf("condition %s %q, want %q", t, got, want)
			}
		}
		return ""
	})
}

func (e *env) expectEvent(object, reason, message string) {
	e.t.Helper()
	e.eventually("Event "+reason+" on "+object, func() string {
		evs, err := e.kube.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == object && ev.Reason == reason && strings.Contains(ev.Message, message) {
				return ""
			}
			seen = append(seen, ev.InvolvedObject.Name+" "+ev.Reason+": "+ev.Message)
		}
		return fmt.Sprintf("not among %q", seen)
	})
}

func (e *env) create(s *corev1.Service) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Services(s.Namespace).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating Service %s: %v", s.Name, err)
	}
}

func (e *env) update(name string, edit func(*corev1.Service)) {
	e.t.Helper()
	for {
		s := e.service(name)
		edit(s)
		_, err := e.kube.CoreV1().Services("default").Update(e.ctx, s, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			e.t.Fatalf("updating Service %s: %v", name, err)
		}
	}
}

func (e *env) applySlice(es *discoveryv1.EndpointSlice) {
	e.t.Helper()
	c := e.kube.DiscoveryV1().EndpointSlices(es.Namespace)
	old, err := c.Get(e.ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = c.Update(e.ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = c.Create(e.ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatalf("EndpointSlice %s: %v", es.Name, err)
	}
}

const lbClass = "l4xds.io/l4lb"

type port struct {
	name  string
	port  int32
	proto corev1.Protocol
}

func lbService(name string, ports ...port) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: new(lbClass),
			Selector:          map[string]string{"app": name},
		},
	}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: p.name, Port: p.port, Protocol: p.proto, TargetPort: intstr.FromInt32(p.port)})
	}
	return s
}

type ep struct {
	addr                        string
	ready, serving, terminating bool
	node                        string
}

func slice(service, name string, family discoveryv1.AddressType, ports []port, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: family,
	}
	for _, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: new(p.name), Port: new(p.port), Protocol: new(p.proto)})
	}
	for _, x := range eps {
		e := discoveryv1.Endpoint{Addresses: []string{x.addr}, Conditions: discoveryv1.EndpointConditions{Ready: new(x.ready), Serving: new(x.serving), Terminating: new(x.terminating)}}
		if x.node != "" {
			e.NodeName = new(x.node)
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

func mustPool(t *testing.T, s string) kubesource.Pool {
	p, err := kubesource.ParsePool(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustKube(t *testing.T, api *apiServer) kubernetes.Interface {
	t.Helper()
	k, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
