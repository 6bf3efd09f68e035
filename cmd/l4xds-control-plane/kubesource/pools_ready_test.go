// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// A pools ConfigMap created with an error while the replicas serve is the
// same error on every replica: it must not make them all not ready at once
// (the control plane's Service would lose every endpoint, and agents could
// not reconnect). The error is logged; the replica stays ready.
func TestBadPoolsConfigMapLaterKeepsReady(t *testing.T) {
	kube := fake.NewClientset()
	var (
		mu      sync.Mutex
		problem error
		synced  = make(chan struct{}, 1)
	)
	var out syncBuffer
	s := &Source{
		opts: Options{
			Config:         Config{}.withDefaults(),
			PoolsConfigMap: "kube-system/l4xds-pools",
			Publish: func(controlplane.Resources) ([]controlplane.Conflict, error) {
				select {
				case synced <- struct{}{}:
				default:
				}
				return nil, nil
			},
			Problem: func(err error) { mu.Lock(); problem = err; mu.Unlock() },
		},
		log: slog.New(slog.NewTextHandler(&out, nil)), kube: kube,
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
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing published")
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "l4xds-pools"},
		Data:       map[string]string{"typo": "10.2.0.0/33"},
	}
	if _, err := kube.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	out.waitFor(t, "Address pools not applied", 30*time.Second, "the ConfigMap's error is not logged")
	// The round that logged it ends with its report: of two publishes
	// after it, the second is of a later round.
	for len(synced) > 0 {
		<-synced
	}
	for _, name := range []string{"next", "after"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
		if _, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-synced:
		case <-deadline:
			t.Fatalf("Service %s is not published", name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if problem != nil {
		t.Errorf("the replica is made not ready by the ConfigMap every replica reads: %v", problem)
	}
}
