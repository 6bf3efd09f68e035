// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/prototext"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// A pools ConfigMap that does not parse when the source starts does not
// keep the cluster from being served: the --address-pool pools serve, the
// addresses objects hold stay theirs (they may be in the ConfigMap's
// pools), and the error is reported.
func TestBadPoolsConfigMapAtStart(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0))
	svc := func(name, held string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: at},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: new(DefaultLoadBalancerClass),
				Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}},
		}
		if held != "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: held}}
		}
		return s
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "l4xds-pools"},
		Data:       map[string]string{"lan": "10.1.0.0/24", "typo": "10.2.0.0/33"},
	}
	kube := fake.NewClientset(cm, svc("holder", "10.1.0.5"), svc("new", ""))
	flagPool, _ := ParsePool("flags=10.0.0.1-10.0.0.2")
	published := make(chan controlplane.Resources, 100)
	problems := make(chan error, 100)
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	s := &Source{
		opts: Options{
			Config:         Config{Pools: Pools{flagPool}}.withDefaults(),
			PoolsConfigMap: "kube-system/l4xds-pools",
			Publish: func(res controlplane.Resources) ([]controlplane.Conflict, error) {
				published <- res
				return nil, nil
			},
			Problem: func(err error) { problems <- err },
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

	var res controlplane.Resources
	select {
	case res = <-published:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing published")
	}
	for name, vip := range map[string]string{"service/default/holder": "10.1.0.5", "service/default/new": "10.0.0.1"} {
		c, ok := res[resource.ClusterType][name]
		if !ok {
			t.Fatalf("%s not published: %v", name, res)
		}
		if got := prototext.Format(c); !contains(got, `"`+vip+`"`) {
			t.Errorf("%s published without its VIP %s: %s", name, vip, got)
		}
	}
	deadline := time.After(30 * time.Second)
	for reported := ""; !contains(reported, "address pools ConfigMap kube-system/l4xds-pools"); {
		select {
		case err := <-problems:
			reported = fmt.Sprint(err)
		case <-deadline:
			t.Fatalf("the ConfigMap's error is not reported (last: %q)", reported)
		}
	}
	// Its status is written after the publish.
	for name, want := range map[string]string{"holder": "10.1.0.5", "new": "10.0.0.1"} {
		for {
			got, err := kube.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ing := got.Status.LoadBalancer.Ingress
			if len(ing) == 1 && ing[0].IP == want {
				break
			}
			select {
			case <-deadline:
				t.Fatalf("Service %s status %v, want %s", name, ing, want)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
