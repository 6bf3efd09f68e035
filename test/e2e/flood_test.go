// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/l4xds/l4xds/test/netns"
)

const clusterTypeURL = "type.googleapis.com/" + clusterType

// A server that floods the agent, pushing responses as fast as the stream
// takes them, does not starve the agent: l4xds-dbg status
// answers throughout, and a cluster added during the flood reaches the
// tables (and, as root, is written into the BPF maps by the reconciler).
// How fast status answers is printed, not asserted.
func TestBinariesAgentAnswersDuringAnXDSFlood(t *testing.T) {
	for _, protocol := range []string{"sotw", "delta"} {
		t.Run(protocol, func(t *testing.T) { testFlood(t, protocol) })
	}
}

func testFlood(t *testing.T, protocol string) {
	bin := binDir(t)
	dir := t.TempDir()
	srv := newFloodServer(t, 50)
	socket := filepath.Join(dir, "agent.sock")
	args := []string{"--api-socket", socket, "--enable-xds-control-plane", "--xds-insecure",
		"--xds-server-address", srv.addr, "--xds-protocol", protocol, "--xds-node-id", "flooded"}
	if os.Geteuid() == 0 {
		// The package runs in namespaces of its own (netns.Main): lo is
		// its own, and the maps are pinned in a BPF filesystem of the test.
		args = append(args, "--datapath", "bpf", "--devices", "lo", "--bpf-root", netns.MountBPFFS(t))
		args = append(args, netns.DatapathAttachArgs()...)
	} else {
		args = append(args, "--datapath", "none")
	}
	start(t, filepath.Join(bin, "l4xds-agent"), args...)
	dbg := filepath.Join(bin, "l4xds-dbg")
	// Registered after start: runs while the agent still answers.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("the server sent %d responses; the last request it received: %s", srv.sent.Load(), srv.lastRequestSeen())
		for _, args := range [][]string{{"xds", "status"}, {"status"}} {
			r := runDbg(t, dbg, append([]string{"--socket", socket}, args...)...)
			t.Logf("l4xds-dbg %s:\n%s%s", strings.Join(args, " "), r.stdout, r.stderr)
		}
	})
	shows(t, dbg, socket, []string{"statedb", "frontends"}, "10.0.0.1:80/TCP", "10.0.0.50:80/TCP")

	// Before the flood, for comparison; then during it: status answers,
	// again and again.
	calm := statusRuns(t, dbg, socket, "before the flood", 0)
	before, flooding := srv.sent.Load(), time.Now()
	srv.flooding.Store(true)
	// Ten seconds at least: long enough for a stream whose requests or
	// responses stop being read to fill gRPC's windows and stall.
	took := statusRuns(t, dbg, socket, "during the flood", 10*time.Second)
	// A cluster added during the flood is applied (and written).
	srv.late.Store(true)
	late := time.Now()
	want := []string{"10.0.1.1:80/TCP"}
	if os.Geteuid() == 0 {
		eventually(t, dbg, socket, []string{"statedb", "frontends"}, "10.0.1.1:80/TCP written", func(out string) bool {
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "10.0.1.1:80/TCP") && strings.Contains(line, "Done") {
					return true
				}
			}
			return false
		})
		want = append(want, "10.0.1.1:80/TCP")
	}
	shows(t, dbg, socket, []string{"statedb", "frontends"}, want...)
	lateTook := time.Since(late)
	sent, elapsed := srv.sent.Load()-before, time.Since(flooding)
	if sent == 0 {
		t.Fatal("the server sent nothing while status ran: no flood")
	}
	fmt.Printf("BENCH xds-flood protocol=%s responses_per_s=%.0f late_applied_ms=%.0f status_runs=%d status_p50_ms=%.1f status_max_ms=%.1f calm_p50_ms=%.1f calm_max_ms=%.1f\n",
		protocol, float64(sent)/elapsed.Seconds(), ms(lateTook), len(took), ms(took[len(took)/2]), ms(took[len(took)-1]), ms(calm[len(calm)/2]), ms(calm[len(calm)-1]))
}

// statusRuns runs l4xds-dbg status 20 times at least, and for least at
// least, each run answering, and returns how long each took, sorted.
func statusRuns(t *testing.T, dbg, socket, when string, least time.Duration) []time.Duration {
	t.Helper()
	var took []time.Duration
	for end := time.Now().Add(least); len(took) < 20 || time.Now().Before(end); {
		begin := time.Now()
		r := runDbg(t, dbg, "--socket", socket, "status")
		took = append(took, time.Since(begin))
		if !strings.Contains(r.stdout, "xDS") || (r.code != 0 && r.code != 1) {
			t.Fatalf("l4xds-dbg status %s exited %d:\n%s%s", when, r.code, r.stdout, r.stderr)
		}
	}
	slices.Sort(took)
	return took
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// floodServer is a hostile ADS server: once flooding, it pushes a new
// version of n clusters (the first one's weight changes each time) as fast
// as the stream takes them. Until then it answers the first request of a
// stream only.
type floodServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	addr string
	n    int
	// sent counts the responses; late adds a cluster to the next ones.
	sent     atomic.Int64
	late     atomic.Bool
	flooding atomic.Bool
	// lastRequest describes the last request received, for a failure.
	lastRequest atomic.Pointer[string]
	// stable are the encoded clusters 2..n, which never change.
	stable []*anypb.Any
}

func newFloodServer(t *testing.T, n int) *floodServer {
	t.Helper()
	s := &floodServer{n: n}
	for i := 2; i <= n; i++ {
		s.stable = append(s.stable, floodCluster(fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.0.%d", i), 1))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return s
}

// floodCluster is an l4lb cluster with its endpoints inline (STATIC).
func floodCluster(name, vip string, weight uint32) *anypb.Any {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		"vip": structpb.NewStringValue(vip), "port": structpb.NewNumberValue(80),
	}}
	ep := func(addr string, w uint32) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 80},
				}},
			}}},
			LoadBalancingWeight: wrapperspb.UInt32(w),
		}
	}
	a, err := anypb.New(&clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		Metadata:             &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"io.cilium.l4lb": md}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{ep("192.168.0.1", weight), ep("192.168.0.2", 1)}}},
		},
	})
	if err != nil {
		panic(err) // a valid message always encodes
	}
	return a
}

// next is the resources of a new version: svc-1's weight is the version's.
func (s *floodServer) next() (version int64, rs []*anypb.Any) {
	version = s.sent.Add(1)
	rs = append([]*anypb.Any{floodCluster("svc-1", "10.0.0.1", uint32(version%100+1))}, s.stable...)
	if s.late.Load() {
		rs = append(rs, floodCluster("late", "10.0.1.1", 1))
	}
	return version, rs
}

func (s *floodServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	send := func() error {
		v, rs := s.next()
		return stream.Send(&discoveryv3.DiscoveryResponse{TypeUrl: clusterTypeURL, VersionInfo: fmt.Sprint(v), Nonce: fmt.Sprint(v), Resources: rs})
	}
	return s.flood(stream.Context(), send, func() (bool, error) {
		req, err := stream.Recv()
		s.noteRequest(fmt.Sprintf("version %q nonce %q error %v", req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail()))
		return req.GetTypeUrl() == clusterTypeURL, err
	})
}

func (s *floodServer) noteRequest(d string) { s.lastRequest.Store(&d) }

func (s *floodServer) lastRequestSeen() string {
	if d := s.lastRequest.Load(); d != nil {
		return *d
	}
	return "none"
}

func (s *floodServer) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	send := func() error {
		v, rs := s.next()
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: clusterTypeURL, SystemVersionInfo: fmt.Sprint(v), Nonce: fmt.Sprint(v)}
		for i, a := range rs {
			name := fmt.Sprintf("svc-%d", i+1)
			if i == s.n {
				name = "late"
			}
			resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: name, Version: fmt.Sprint(v), Resource: a})
		}
		return stream.Send(resp)
	}
	return s.flood(stream.Context(), send, func() (bool, error) {
		req, err := stream.Recv()
		s.noteRequest(fmt.Sprintf("nonce %q error %v", req.GetResponseNonce(), req.GetErrorDetail()))
		return req.GetTypeUrl() == clusterTypeURL, err
	})
}

// flood answers the first request of the cluster type and, once flooding,
// pushes responses as fast as the stream takes them, until it ends. The
// requests are read all along, apart from the sending: a server that read
// no request while a send waited for the agent would deadlock with it once
// the agent's ACKs filled the stream's window (gRPC's flow control), and
// the agent would be blamed for a stall of the server's making.
func (s *floodServer) flood(ctx context.Context, send func() error, recv func() (bool, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := make(chan struct{}, 1)
	go func() {
		defer cancel()
		for ctx.Err() == nil {
			if !s.flooding.Load() {
				select {
				case <-first:
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
					continue
				}
			}
			if err := send(); err != nil {
				return
			}
		}
	}()
	for answered := false; ; {
		isCluster, err := recv()
		if err != nil {
			return err
		}
		if isCluster && !answered {
			answered = true
			first <- struct{}{}
		}
	}
}
