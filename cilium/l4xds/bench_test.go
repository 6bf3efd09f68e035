// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"

	k8sTestutils "github.com/cilium/cilium/pkg/k8s/testutils"
	"github.com/cilium/cilium/pkg/k8s/version"
	"github.com/cilium/cilium/pkg/loadbalancer"
	lbmaps "github.com/cilium/cilium/pkg/loadbalancer/maps"
	nodeTypes "github.com/cilium/cilium/pkg/node/types"

	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/controlplane/cptest"
	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/xds"
)

// BenchmarkConvergence is the standalone agent's convergence benchmark
// (test/bench) for the agent inside Cilium: N clusters of M endpoints
// served at once, timed from the server's update until the last of Cilium's
// frontends is reconciled (Done) into Cilium's LB maps with its M backends.
// As root the maps are real BPF maps, otherwise Cilium's fakes. It prints
//
//	BENCH convergence path=cilium-module shape=NxM protocol=P maps=bpf|fake seconds=… services_per_s=… backends_per_s=… heap_inuse_bytes_per_service=…
func BenchmarkConvergence(b *testing.B) {
	version.Force(k8sTestutils.DefaultVersion)
	nodeTypes.SetName("testnode")
	mountBPFFS(b)
	maps := "fake"
	if os.Getuid() == 0 {
		maps = "bpf"
	}
	for _, sh := range [][2]int{{50000, 1}, {10000, 10}, {1000, 100}, {10000, 100}} {
		for _, protocol := range []string{xds.ProtocolSotW, xds.ProtocolDelta} {
			n, m := sh[0], sh[1]
			b.Run(fmt.Sprintf("%dx%d/%s", n, m, protocol), func(b *testing.B) {
				for range b.N {
					seconds, heap := converge(b, n, m, protocol)
					fmt.Printf("BENCH convergence path=cilium-module shape=%dx%d protocol=%s maps=%s seconds=%.3f services_per_s=%.0f backends_per_s=%.0f heap_inuse_bytes_per_service=%d\n",
						n, m, protocol, maps, seconds, float64(n)/seconds, float64(n*m)/seconds, heap/int64(n))
				}
			})
		}
	}
}

func converge(b *testing.B, n, m int, protocol string) (seconds float64, heapPerRun int64) {
	log := hivetest.Logger(b)
	srv := cptest.Start(b)
	var (
		db  *statedb.DB
		fes statedb.Table[*loadbalancer.Frontend]
		lbm lbmaps.LBMaps
	)
	if os.Getuid() != 0 {
		lbm = lbmaps.NewFakeLBMaps()
	}
	h, err := newAgent(srv, protocol, []string{"--bpf-lb-map-max=" + strconv.Itoa(2*n*(m+1)+1024)}, lbm,
		cell.Invoke(func(d *statedb.DB, t statedb.Table[*loadbalancer.Frontend]) { db, fes = d, t }))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := h.Start(log, ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Stop(log, context.Background())

	res := controlplane.Resources{}
	for i := range n {
		if err := res.Add(benchCluster(i)); err != nil {
			b.Fatal(err)
		}
		if err := res.Add(benchCLA(i, m)); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	start := time.Now()
	if err := srv.Set(res); err != nil {
		b.Fatal(err)
	}
	for {
		done := 0
		for fe := range fes.All(db.ReadTxn()) {
			if fe.Status.Kind != reconciler.StatusKindDone {
				break
			}
			bes := 0
			for range fe.Backends {
				bes++
			}
			if bes != m {
				break
			}
			done++
		}
		if done == n {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("%d of %d frontends converged", done, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	seconds = time.Since(start).Seconds()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return seconds, int64(after.HeapInuse) - int64(before.HeapInuse)
}

// benchCluster is cluster i: VIP 10.0.0.0+i+1, port 80/TCP, endpoints by EDS.
func benchCluster(i int) *clusterv3.Cluster {
	name := "svc-" + strconv.Itoa(i)
	md, err := structpb.NewStruct(map[string]any{"vip": addr4(10<<24 + uint32(i) + 1).String(), "port": 80})
	if err != nil {
		panic(err)
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		Metadata:             &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{l4lb.MetadataKey: md}},
	}
}

// benchCLA is the ClusterLoadAssignment of cluster i: m distinct endpoints
// in 100.64.0.0/10, port 8080.
func benchCLA(i, m int) *endpointv3.ClusterLoadAssignment {
	eps := make([]*endpointv3.LbEndpoint, m)
	for j := range eps {
		eps[j] = &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       addr4(100<<24 | 64<<16 + uint32(i*m+j)).String(),
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080},
			}}},
		}}}
	}
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: "svc-" + strconv.Itoa(i),
		Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}},
	}
}

func addr4(u uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
}
