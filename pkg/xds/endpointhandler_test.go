// SPDX-License-Identifier: Apache-2.0

package xds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/xds"
)

// TestEndpointHandlerSlices: the controller's EDS handler takes a response
// in growing slices exactly when it has a wait for new clusters (the
// Cilium cell), in slices of one size otherwise (the standalone agent).
// The controller writes each slice in a transaction of its own: with
// resources of one size, a first slice of one and a most of four, seven
// ClusterLoadAssignments are 1+2+4 when growing, 4+3 when not.
func TestEndpointHandlerSlices(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		txns int
	}{
		{0, 2},
		{time.Hour, 3},
	} {
		t.Run(fmt.Sprintf("wait=%s", tc.wait), func(t *testing.T) {
			db, w, c := newDrivenClient(t, xds.ProtocolSotW)
			sink := &countingSink{Sink: l4lb.NewTablesSink(w)}
			ctrl := l4lb.NewController(sink, c)
			ctrl.SetNewClusterWait(tc.wait, nil)
			t.Cleanup(ctrl.Stop)
			c.Watch(xds.ClusterType, true, ctrl.ClusterHandler())
			c.Watch(xds.EndpointType, false, ctrl.EndpointHandler())
			d, err := xds.NewDriver(c)
			if err != nil {
				t.Fatal(err)
			}

			var names []string
			var clusters, clas []*anypb.Any
			for i := range 7 { // names of one length: resources of one size
				name := fmt.Sprintf("e%d", i)
				names = append(names, name)
				clusters = append(clusters, anyOf(t, sliceCluster(name, i)))
				clas = append(clas, anyOf(t, fuzzEndpoints(name, 0)))
			}
			size := len(clas[0].GetValue())
			for _, a := range clas {
				if len(a.GetValue()) != size {
					t.Fatalf("resources of %d and %d bytes, want one size", size, len(a.GetValue()))
				}
			}
			xds.SetSliceBytes(t, size, 4*size)

			if nack, err := d.Respond(xds.ClusterType, "1", names, clusters, nil); err != nil || nack != "" {
				t.Fatalf("clusters: %q, %v", nack, err)
			}
			before := sink.txns
			if nack, err := d.Respond(xds.EndpointType, "1", names, clas, nil); err != nil || nack != "" {
				t.Fatalf("endpoints: %q, %v", nack, err)
			}
			if got := sink.txns - before; got != tc.txns {
				t.Errorf("the response of 7 ClusterLoadAssignments was written in %d transactions, want %d", got, tc.txns)
			}
			if got := strings.Count(dumpTables(db, w), "backend "); got != len(names) {
				t.Errorf("%d backends written, want %d:\n%s", got, len(names), dumpTables(db, w))
			}
		})
	}
}

// countingSink counts the controller's transactions: one per update, or
// per slice of one.
type countingSink struct {
	l4lb.Sink
	txns int
}

func (s *countingSink) WriteTxn() l4lb.SinkTxn {
	s.txns++
	return s.Sink.WriteTxn()
}

// sliceCluster is an EDS cluster of its own name and VIP.
func sliceCluster(name string, i int) *clusterv3.Cluster {
	md := map[string]*structpb.Value{
		"vip":  structpb.NewStringValue(fmt.Sprintf("10.0.1.%d", i+1)),
		"port": structpb.NewNumberValue(80),
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: name},
		Metadata:             &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{l4lb.MetadataKey: {Fields: md}}},
	}
}
