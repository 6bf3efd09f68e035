// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The gRPC health service's Watch is a stream too: it answers at once
// with NOT_SERVING before the first state (what grpc-go's client-side
// health checking reads), not only once the xDS streams are let through.
func TestHealthWatchBeforeFirstState(t *testing.T) {
	env := startServer(t)
	conn, err := grpc.NewClient(env.addr, grpc.WithTransportCredentials(credentials.NewTLS(env.clientTLS(t, true))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := w.Recv()
	if err != nil {
		t.Fatalf("health Watch before the first state: %v, want NOT_SERVING at once", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health Watch: %v, want NOT_SERVING", resp.GetStatus())
	}
}
