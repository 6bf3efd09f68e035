// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/credentials"
)

// gathered is every sample of reg as "name{label=value,...}" -> value,
// labels sorted.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(labels)
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

// waitForMetrics waits until every sample of want has its value.
func waitForMetrics(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		got := gathered(t, reg)
		var wrong []string
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if v, ok := got[k]; !ok || v != want[k] {
				wrong = append(wrong, fmt.Sprintf("%s = %v (present %v), want %v", k, v, ok, want[k]))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s\ngathered: %v", strings.Join(wrong, "\n"), got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The metrics follow the clients: how many are connected, each node's
// ACKs, NACKs and the version it last ACKed per type, and readiness.
func TestServerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startServerWith(t, Options{Registerer: reg})
	health := NewHealth(env.srv)
	health.Register(reg)
	waitForMetrics(t, reg, map[string]float64{"l4xds_control_plane_ready{}": 0, "l4xds_control_plane_connected_clients{}": 0})

	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	resp, _ := c.recv() // and ACK
	cds := "node=node-1,type=" + resource.ClusterType
	waitForMetrics(t, reg, map[string]float64{
		"l4xds_control_plane_ready{}":                                                          1,
		"l4xds_control_plane_connected_clients{}":                                              1,
		"l4xds_control_plane_acks_total{" + cds + "}":                                          1,
		"l4xds_control_plane_acked_version{" + cds + ",version=" + resp.GetVersionInfo() + "}": 1,
	})

	// A change NACKed: the ACKed version stays the last good one.
	if err := env.srv.Set(withVIP(t, cfpResources(t), "10.1.2.4")); err != nil {
		t.Fatal(err)
	}
	next, err := c.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	c.send(&discovery.DiscoveryRequest{
		TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: next.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "no"},
	})
	waitForMetrics(t, reg, map[string]float64{
		"l4xds_control_plane_acks_total{" + cds + "}":                                          1,
		"l4xds_control_plane_nacks_total{" + cds + "}":                                         1,
		"l4xds_control_plane_acked_version{" + cds + ",version=" + resp.GetVersionInfo() + "}": 1,
	})
}

// A Delta ACK names only the nonce: the version is the one of the response
// it answers, for the ACKed version and the ACK latency alike. A node's
// series go with its last stream.
func TestServerMetricsDelta(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startServerWith(t, Options{Registerer: reg})
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testContext(t))
	stream, err := env.dial(t, credentials.NewTLS(env.clientTLS(t, true))).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: testNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	resp := c.recv() // and ACK
	if resp.GetSystemVersionInfo() == "" {
		t.Fatal("the Delta response has no system_version_info")
	}
	cds := "node=node-1,type=" + resource.ClusterType
	waitForMetrics(t, reg, map[string]float64{
		"l4xds_control_plane_connected_clients{}":                                                    1,
		"l4xds_control_plane_acks_total{" + cds + "}":                                                1,
		"l4xds_control_plane_acked_version{" + cds + ",version=" + resp.GetSystemVersionInfo() + "}": 1,
	})
	// A change ACKed (by nonce): one ACK latency sample.
	if err := env.srv.Set(withVIP(t, cfpResources(t), "10.1.2.4")); err != nil {
		t.Fatal(err)
	}
	c.recv() // and ACK
	waitForMetrics(t, reg, map[string]float64{"l4xds_control_plane_acks_total{" + cds + "}": 2})
	if n := histogram(t, reg, "l4xds_control_plane_ack_latency_seconds", resource.ClusterType); n != 1 {
		t.Fatalf("a Delta change ACKed: %d ACK latency samples, want 1", n)
	}
	cancel()
	deadline := time.Now().Add(testTimeout)
	for {
		got := gathered(t, reg)
		if _, ok := got["l4xds_control_plane_acks_total{"+cds+"}"]; !ok && got["l4xds_control_plane_connected_clients{}"] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's series outlive its stream: %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// histogram is the sample count of name{type=typeURL}.
func histogram(t *testing.T, reg *prometheus.Registry, name, typeURL string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" && l.GetValue() == typeURL {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// The ACK latency counts each published version once per stream that had
// it sent as a change: not a node's first response after it connected (a
// sync), not a NACK, not an ACK repeated.
func TestServerAckLatency(t *testing.T) {
	const name = "l4xds_control_plane_ack_latency_seconds"
	reg := prometheus.NewRegistry()
	env := startServerWith(t, Options{Registerer: reg})
	if err := env.srv.Set(cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	first, _ := c.recv() // and ACK
	cds := "node=node-1,type=" + resource.ClusterType
	waitForMetrics(t, reg, map[string]float64{"l4xds_control_plane_acks_total{" + cds + "}": 1})
	if n := histogram(t, reg, name, resource.ClusterType); n != 0 {
		t.Fatalf("the first response of a new stream was measured: %d samples, want 0", n)
	}

	// A change ACKed: one sample.
	if err := env.srv.Set(withVIP(t, cfpResources(t), "10.1.2.4")); err != nil {
		t.Fatal(err)
	}
	second, _ := c.recv() // and ACK
	waitForMetrics(t, reg, map[string]float64{"l4xds_control_plane_acks_total{" + cds + "}": 2})
	if n := histogram(t, reg, name, resource.ClusterType); n != 1 {
		t.Fatalf("a change ACKed once: %d samples, want 1", n)
	}
	// The same ACK again, and a NACK of the next change: no sample.
	c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: second.GetVersionInfo(), ResponseNonce: second.GetNonce()})
	if err := env.srv.Set(withVIP(t, cfpResources(t), "10.1.2.5")); err != nil {
		t.Fatal(err)
	}
	third, err := c.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	c.send(&discovery.DiscoveryRequest{
		TypeUrl: resource.ClusterType, VersionInfo: second.GetVersionInfo(), ResponseNonce: third.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "no"},
	})
	waitForMetrics(t, reg, map[string]float64{
		"l4xds_control_plane_acks_total{" + cds + "}":  3,
		"l4xds_control_plane_nacks_total{" + cds + "}": 1,
	})
	if n := histogram(t, reg, name, resource.ClusterType); n != 1 {
		t.Fatalf("after a repeated ACK and a NACK: %d samples, want 1", n)
	}
	if first.GetVersionInfo() == second.GetVersionInfo() {
		t.Fatalf("two changes, one version %q", first.GetVersionInfo())
	}
}
