// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// A replica that may not take the Lease (its Role is missing) never writes
// status: the source says so in its own log, naming the Lease, rather than
// leaving it to client-go's klog lines.
func TestLeaseForbiddenIsLogged(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"},
			"l4xds-control-plane", nil)
	})
	var out syncBuffer
	s := &Source{
		opts: Options{
			Config: Config{}.withDefaults(),
			Publish: func(controlplane.Resources) ([]controlplane.Conflict, error) {
				return nil, nil
			},
			Election: Election{Namespace: "lb", Name: "l4xds-control-plane", Identity: "cp-0",
				LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
		},
		log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn})), kube: kube,
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
	out.waitFor(t, "lb/l4xds-control-plane", 10*time.Second, "the Lease's error is not in the source's log at warning or above")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor waits until the log holds want, failing with why after timeout.
func (b *syncBuffer) waitFor(t *testing.T, want string, timeout time.Duration, why string) {
	t.Helper()
	deadline := time.After(timeout)
	for !strings.Contains(b.String(), want) {
		select {
		case <-deadline:
			t.Fatalf("%s; log:\n%s", why, b.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
