// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// heldWatch forwards a watch's events, except those of one object while
// held: the informer then lags behind the API server for that object, as
// it does on a loaded machine after a status write.
type heldWatch struct {
	in   watch.Interface
	out  chan watch.Event
	name string

	mu      sync.Mutex
	holding bool
	held    []watch.Event
	release chan struct{}
}

func (h *heldWatch) Stop()                          { h.in.Stop() }
func (h *heldWatch) ResultChan() <-chan watch.Event { return h.out }

func (h *heldWatch) run() {
	defer close(h.out)
	for {
		select {
		case ev, ok := <-h.in.ResultChan():
			if !ok {
				return
			}
			h.mu.Lock()
			if o, isSvc := ev.Object.(*corev1.Service); h.holding && isSvc && o.Name == h.name {
				h.held = append(h.held, ev)
				h.mu.Unlock()
				continue
			}
			h.mu.Unlock()
			h.out <- ev
		case <-h.release:
			h.mu.Lock()
			held := h.held
			h.held, h.holding, h.release = nil, false, nil
			h.mu.Unlock()
			for _, ev := range held {
				h.out <- ev
			}
		}
	}
}

// A leader whose informer has not yet seen its own status write must not
// give the address it wrote to another Service. Two Services created in the
// same second sort by name; the informer lagging behind the leader's write
// of z's address made the leader compute as if z held nothing, write z's
// address into the status of a (older by the tie-break), and then move z
// to another address once the write showed: z's advertised address
// changed under its clients.
func TestStatusWrittenButNotYetSeenIsKept(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name, rv string, created metav1.Time) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: created, ResourceVersion: rv},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
	}
	kube := fake.NewClientset(svc("z", "1", at))
	gvr := corev1.SchemeGroupVersion.WithResource("services")

	// Status writes as the API server does them: a stale resourceVersion
	// is a conflict, a write gives a new one.
	var rv atomic.Int64
	rv.Store(100)
	kube.PrependReactor("update", "services", func(a ktesting.Action) (bool, runtime.Object, error) {
		u := a.(ktesting.UpdateAction)
		s := u.GetObject().(*corev1.Service).DeepCopy()
		cur, err := kube.Tracker().Get(gvr, s.Namespace, s.Name)
		if err != nil {
			return true, nil, err
		}
		if cur.(*corev1.Service).ResourceVersion != s.ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), s.Name, fmt.Errorf("resourceVersion %s is stale", s.ResourceVersion))
		}
		s.ResourceVersion = strconv.FormatInt(rv.Add(1), 10)
		return true, s, kube.Tracker().Update(gvr, s, s.Namespace)
	})
	// z's events wait until released.
	hw := &heldWatch{name: "z", holding: true, release: make(chan struct{})}
	kube.PrependWatchReactor("services", func(a ktesting.Action) (bool, watch.Interface, error) {
		w, err := kube.Tracker().Watch(gvr, a.GetNamespace(), a.(ktesting.WatchActionImpl).ListOptions)
		if err != nil {
			return true, nil, err
		}
		hw.in, hw.out = w, make(chan watch.Event)
		go hw.run()
		return true, hw, nil
	})

	pool, _ := ParsePool("lan=10.0.0.1-10.0.0.9")
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	s := &Source{
		opts: Options{
			Config:  Config{Pools: Pools{pool}}.withDefaults(),
			Publish: func(controlplane.Resources) ([]controlplane.Conflict, error) { return nil, nil },
		},
		log: log, kube: kube,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	status := func(name string) string {
		o, err := kube.Tracker().Get(gvr, "default", name)
		if err != nil {
			return ""
		}
		var ips string
		for _, in := range o.(*corev1.Service).Status.LoadBalancer.Ingress {
			ips += in.IP
		}
		return ips
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: z has %q, a has %q, later has %q", what, status("z"), status("a"), status("later"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	waitFor("z's address written", func() bool { return status("z") == "10.0.0.1" })
	// a: created in the same second as z, first by name.
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc("a", "2", at), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a's address written", func() bool { return status("a") != "" })
	close(hw.release)
	// A later Service is handled after z's held events: once it has its
	// address, the source has seen z's status.
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc("later", "3", metav1.NewTime(at.Add(time.Minute))), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("later's address written", func() bool { return status("later") != "" })

	if got := status("z"); got != "10.0.0.1" {
		t.Errorf("z's address moved from 10.0.0.1 to %q (a has %q)", got, status("a"))
	}
	if status("a") == status("z") {
		t.Errorf("a and z both hold %q", status("a"))
	}
}

// A new leader whose informer has not yet seen the last status write of
// the leader before it must not give that address to another Service: it
// reads the objects afresh when it starts leading.
func TestNewLeaderSeesItsPredecessorsLastWrite(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name, rv string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: at, ResourceVersion: rv},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
	}
	// The previous leader holds the Lease, until it expires.
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "l4xds"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("previous"), LeaseDurationSeconds: new(int32(3)),
			AcquireTime: &now, RenewTime: &now},
	}
	kube := fake.NewClientset(svc("z", "1"), lease)
	gvr := corev1.SchemeGroupVersion.WithResource("services")
	var rv atomic.Int64
	rv.Store(100)
	kube.PrependReactor("update", "services", func(a ktesting.Action) (bool, runtime.Object, error) {
		s := a.(ktesting.UpdateAction).GetObject().(*corev1.Service).DeepCopy()
		cur, err := kube.Tracker().Get(gvr, s.Namespace, s.Name)
		if err != nil {
			return true, nil, err
		}
		if cur.(*corev1.Service).ResourceVersion != s.ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), s.Name, fmt.Errorf("resourceVersion %s is stale", s.ResourceVersion))
		}
		s.ResourceVersion = strconv.FormatInt(rv.Add(1), 10)
		return true, s, kube.Tracker().Update(gvr, s, s.Namespace)
	})
	hw := &heldWatch{name: "z", holding: true, release: make(chan struct{})}
	kube.PrependWatchReactor("services", func(a ktesting.Action) (bool, watch.Interface, error) {
		w, err := kube.Tracker().Watch(gvr, a.GetNamespace(), a.(ktesting.WatchActionImpl).ListOptions)
		if err != nil {
			return true, nil, err
		}
		hw.in, hw.out = w, make(chan watch.Event)
		go hw.run()
		return true, hw, nil
	})

	pool, _ := ParsePool("lan=10.0.0.1-10.0.0.9")
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	published := make(chan controlplane.Resources, 100)
	s := &Source{
		opts: Options{
			Config: Config{Pools: Pools{pool}}.withDefaults(),
			Publish: func(res controlplane.Resources) ([]controlplane.Conflict, error) {
				published <- res
				return nil, nil
			},
			Election: Election{Namespace: "default", Name: "l4xds", Identity: "next",
				LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
		},
		log: log, kube: kube,
	}
	status := func(name string) string {
		o, err := kube.Tracker().Get(gvr, "default", name)
		if err != nil {
			return ""
		}
		var ips string
		for _, in := range o.(*corev1.Service).Status.LoadBalancer.Ingress {
			ips += in.IP
		}
		return ips
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: z has %q, a has %q, later has %q", what, status("z"), status("a"), status("later"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-published: // synced, following
	case <-time.After(30 * time.Second):
		t.Fatal("nothing published")
	}
	if s.lead.writes() {
		t.Fatal("leading while the Lease is held")
	}
	// The previous leader's last write, not yet seen by this replica.
	z, err := kube.CoreV1().Services("default").Get(ctx, "z", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	z.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.1"}}
	if _, err := kube.CoreV1().Services("default").UpdateStatus(ctx, z, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc("a", "2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a's address written by the new leader", func() bool { return status("a") != "" })
	close(hw.release)
	later := svc("later", "3")
	later.CreationTimestamp = metav1.NewTime(at.Add(time.Minute))
	if _, err := kube.CoreV1().Services("default").Create(ctx, later, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("later's address written", func() bool { return status("later") != "" })

	if got := status("z"); got != "10.0.0.1" {
		t.Errorf("z's address moved from 10.0.0.1 to %q (a has %q)", got, status("a"))
	}
	if status("a") == status("z") {
		t.Errorf("a and z both hold %q", status("a"))
	}
}
