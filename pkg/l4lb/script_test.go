// SPDX-License-Identifier: Apache-2.0

package l4lb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

// TestScript runs testdata/*.txtar: each scenario gets an in-process
// go-control-plane ADS server (plaintext gRPC) and a hive with the real xDS
// client, this package's cell and the load-balancing tables. "xds/serve
// file" replaces what the server serves; db/* commands show the tables.
func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(),
		func(t testing.TB, args []string) *script.Engine {
			srv := startServer(t)
			log := hivetest.Logger(t)
			h := hive.New(
				statedb.Cell,
				job.Cell,
				cell.SimpleHealthCell,
				loadbalancer.Cell,
				xds.Cell,
				l4lb.Cell,
				cell.Provide(srv.commands),
			)
			flags := pflag.NewFlagSet("", pflag.ContinueOnError)
			h.RegisterFlags(flags)
			for k, v := range map[string]string{
				"enable-xds-control-plane": "true",
				"xds-server-address":       srv.addr,
				"xds-insecure":             "true",
				"xds-node-id":              "test-node",
			} {
				if err := flags.Set(k, v); err != nil {
					t.Fatal(err)
				}
			}
			if err := flags.Parse(args); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Stop(log, context.Background()) })
			cmds, err := h.ScriptCommands(log)
			if err != nil {
				t.Fatalf("ScriptCommands: %v", err)
			}
			maps.Insert(cmds, maps.All(script.DefaultCmds()))
			return &script.Engine{Cmds: cmds}
		}, nil, "testdata/*.txtar")
}

type testServer struct {
	addr      string
	clusters  *cache.LinearCache
	endpoints *cache.LinearCache
}

func startServer(t testing.TB) *testServer {
	s := &testServer{
		clusters:  cache.NewLinearCache(xds.ClusterType),
		endpoints: cache.NewLinearCache(xds.EndpointType),
	}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cache.Cache{xds.ClusterType: s.clusters, xds.EndpointType: s.endpoints},
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, server.NewServer(context.Background(), mux, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return s
}

func (s *testServer) commands() hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"xds/serve": script.Command(
			script.CmdUsage{
				Summary: "Serve exactly the resources of a YAML file",
				Args:    "file",
				Detail: []string{
					"The file holds YAML documents of the form {resource: {'@type': ..., ...}}.",
				},
			},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				clusters, endpoints, err := readResources(st.Path(args[0]))
				if err != nil {
					return nil, err
				}
				s.clusters.SetResources(clusters)
				s.endpoints.SetResources(endpoints)
				return nil, nil
			}),
	})
}

func readResources(path string) (clusters, endpoints map[string]types.Resource, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	clusters, endpoints = map[string]types.Resource{}, map[string]types.Resource{}
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Resource any `yaml:"resource"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return clusters, endpoints, nil
		} else if err != nil {
			return nil, nil, err
		}
		if doc.Resource == nil {
			continue
		}
		b, err := json.Marshal(doc.Resource)
		if err != nil {
			return nil, nil, err
		}
		a := &anypb.Any{}
		if err := protojson.Unmarshal(b, a); err != nil {
			return nil, nil, err
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, nil, err
		}
		switch m := m.(type) {
		case *clusterv3.Cluster:
			clusters[m.GetName()] = m
		case *endpointv3.ClusterLoadAssignment:
			endpoints[m.GetClusterName()] = m
		default:
			return nil, nil, fmt.Errorf("%s: %T is neither a Cluster nor a ClusterLoadAssignment", path, m)
		}
	}
}
