// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
	"github.com/l4xds/l4xds/pkg/controlplane"
)

// Two replicas on one cluster: both serve every Service over xDS; only the
// holder of the Lease writes status. When it stops, the other takes the
// Lease and writes what comes next: nothing is lost in the handover.
func TestLeaderWritesStatusFollowersServe(t *testing.T) {
	api := startAPIServer(t)
	kube := mustKube(t, api)
	election := func(id string) kubesource.Election {
		return kubesource.Election{Namespace: "default", Name: "l4xds-control-plane", Identity: id,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	}
	// The replicas are given different pools, so that a follower that
	// wrote would show: replicas of one Deployment share their flags.
	pool := func(p string) kubesource.Config { return kubesource.Config{Pools: kubesource.Pools{mustPool(t, p)}} }
	a := startReplica(t, api.Config, "replica-a", kubesource.Options{Config: pool("a=10.1.2.10-10.1.2.20"), Election: election("a")})
	e := &env{t: t, ctx: context.Background(), kube: kube, srv: a.srv, api: api}
	e.eventually("replica a to hold the Lease", func() string { return leaseHolder(t, kube, "a") })
	b := startReplica(t, api.Config, "replica-b", kubesource.Options{Config: pool("b=10.1.2.30-10.1.2.40"), Election: election("b")})

	e.create(lbService("first", port{"http", 80, corev1.ProtocolTCP}))
	e.expectStatus("first", "10.1.2.10(VIP)[80/TCP]", nil)
	(&env{t: t, srv: a.srv}).expectServed("service/default/first", "frontends 10.1.2.10:80/TCP->80 backends []")
	(&env{t: t, srv: b.srv}).expectServed("service/default/first", "frontends 10.1.2.30:80/TCP->80 backends []")
	// The follower served it: it had its round, and wrote nothing.
	for range 20 {
		if got := statusWriters(e.service("first")); !slices.Equal(got, []string{"replica-a"}) {
			t.Fatalf("status of first written by %q, want the leader's only", got)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The leader stops (and hands the Lease over): the follower leads and
	// writes its own view, also of what it did not write before.
	a.stop()
	e.eventually("replica b to hold the Lease", func() string { return leaseHolder(t, kube, "b") })
	e.expectStatus("first", "10.1.2.30(VIP)[80/TCP]", nil)
	e.create(lbService("second", port{"http", 80, corev1.ProtocolTCP}))
	e.expectStatus("second", "10.1.2.31(VIP)[80/TCP]", nil)
	if got := statusWriters(e.service("second")); !slices.Equal(got, []string{"replica-b"}) {
		t.Errorf("status of second written by %q, want the new leader's only", got)
	}
}

type replica struct {
	srv  *controlplane.Server
	stop func()
}

// startReplica runs a source and its server with the client's user agent
// ua, which names it in the managed fields of what it writes.
func startReplica(t *testing.T, cfg *rest.Config, ua string, opts kubesource.Options) *replica {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = ua
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("replica", ua)
	}
	srv := controlplane.NewServer(controlplane.Options{Logger: log})
	sources := controlplane.NewSources(srv, kubesource.SourceName)
	opts.Publish = func(res controlplane.Resources) ([]controlplane.Conflict, error) {
		return sources.Set(kubesource.SourceName, res)
	}
	opts.Logger = log
	src, err := kubesource.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	stopped := false
	r := &replica{srv: srv, stop: func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		srv.Stop()
	}}
	t.Cleanup(r.stop)
	return r
}

// leaseHolder is "" once the Lease names id as its holder.
func leaseHolder(t *testing.T, kube kubernetes.Interface, id string) string {
	l, err := kube.CoordinationV1().Leases("default").Get(context.Background(), "l4xds-control-plane", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != id {
		return fmt.Sprintf("holder %v, want %s", h, id)
	}
	return ""
}

// statusWriters are the managers of an object's status, from its managed
// fields.
func statusWriters(s *corev1.Service) []string {
	var out []string
	for _, m := range s.ManagedFields {
		if m.Subresource == "status" && !slices.Contains(out, m.Manager) {
			out = append(out, m.Manager)
		}
	}
	slices.Sort(out)
	return out
}
