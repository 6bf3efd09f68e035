// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
	"github.com/l4xds/l4xds/pkg/controlplane"
)

// Two replicas of one Deployment (same flags, same pools ConfigMap) on one
// API server serve the same state once they have seen the same objects,
// whichever leads: an agent that moves from one to the other (a replica
// deleted, a connection aged out) gets that state as a full state, and any
// difference would move or remove a VIP. And no Service's advertised
// address ever moves: Services created in bursts (many in one second, so
// that their order is the tie-break's), sharing keys, addresses asked for,
// a leader change amid creations, a pools edit.
func TestReplicasServeTheSameState(t *testing.T) {
	api := startAPIServer(t)
	kube := mustKube(t, api)
	ctx := context.Background()
	if _, err := kube.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pools"},
		Data:       map[string]string{"lan": "10.7.0.1-10.7.0.40"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	election := func(id string) kubesource.Election {
		return kubesource.Election{Namespace: "default", Name: "l4xds-control-plane", Identity: id,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	}
	opts := func(id string) kubesource.Options {
		return kubesource.Options{PoolsConfigMap: "default/pools", Election: election(id)}
	}
	e := &env{t: t, ctx: ctx, kube: kube, api: api}
	a := startReplica(t, api.Config, "replica-a", opts("a"))
	e.eventually("replica a to hold the Lease", func() string { return leaseHolder(t, kube, "a") })
	b := startReplica(t, api.Config, "replica-b", opts("b"))

	advertised := map[string]string{} // the first address each Service's status gave
	var names []string
	burst := func(prefix string, n int) {
		for i := range n {
			name := fmt.Sprintf("%s-%02d", prefix, n-i) // created in reverse name order
			s := lbService(name, port{"p", int32(1000 + i%3), corev1.ProtocolTCP})
			switch i % 4 {
			case 1:
				s.Annotations[kubesource.AnnotationSharingKey] = "shared-" + prefix
			case 2:
				s.Annotations[kubesource.AnnotationSharingKey] = "shared-" + prefix
				s.Spec.Ports[0].Protocol = corev1.ProtocolUDP
			}
			e.create(s)
			names = append(names, name)
		}
	}
	// converged waits until every Service has an address and both
	// replicas serve the same resources, and checks that no advertised
	// address moved.
	converged := func(step string, live ...*replica) {
		t.Helper()
		e.eventually(step+": replicas converged", func() string {
			for _, n := range names {
				s, err := kube.CoreV1().Services("default").Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return err.Error()
				}
				got := lbStatus(s)
				if got == "" {
					return "Service " + n + " has no address yet"
				}
				if first, ok := advertised[n]; !ok {
					advertised[n] = got
				} else if first != got {
					t.Fatalf("%s: Service %s moved from %s to %s", step, n, first, got)
				}
			}
			return diffServed(live[0].srv.Resources(), live[1].srv.Resources())
		})
		for _, n := range names {
			want := strings.SplitN(advertised[n], "(", 2)[0]
			if got := (&env{t: t, srv: live[0].srv}).served("service/default/" + n); !strings.Contains(got, want+":") {
				t.Errorf("%s: Service %s advertised at %s, served %s", step, n, want, got)
			}
		}
	}

	burst("one", 12)
	converged("a burst", a, b)

	// The leader hands over amid a burst.
	burst("two", 6)
	a.stop()
	burst("three", 6)
	e.eventually("replica b to hold the Lease", func() string { return leaseHolder(t, kube, "b") })
	c := startReplica(t, api.Config, "replica-c", opts("c"))
	converged("a leader change amid bursts", b, c)

	// A pools edit: more addresses, then a burst.
	cm, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "pools", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["more"] = "10.8.0.1-10.8.0.20"
	if _, err := kube.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	burst("four", 12)
	converged("a pools edit", b, c)
}

// diffServed is "" when a and b hold the same resources, else which differ.
func diffServed(a, b controlplane.Resources) string {
	var diffs []string
	for _, typ := range slices.Sorted(maps.Keys(kubesourceTypes(a, b))) {
		for _, name := range slices.Sorted(maps.Keys(kubesourceNames(a[typ], b[typ]))) {
			x, y := a[typ][name], b[typ][name]
			if x == nil || y == nil || !proto.Equal(x, y) {
				diffs = append(diffs, fmt.Sprintf("%s %s: %v vs %v", typ, name, x, y))
			}
		}
	}
	if len(diffs) > 0 {
		return fmt.Sprintf("%d resources differ: %s", len(diffs), strings.Join(diffs[:min(3, len(diffs))], "; "))
	}
	return ""
}

func kubesourceTypes(a, b controlplane.Resources) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func kubesourceNames[M ~map[string]V, V any](a, b M) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
