// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// TestScript runs testdata/*.txtar: each gets a hive with this package's
// Cell, a consumer that watches all clusters and the endpoints of each, and
// a plaintext go-control-plane server driven by xds-server/* commands.
// A "#! delta" first line selects the Delta protocol; "fallback" adds a
// second server, after the first in --xds-server-address, driven by
// xds-fallback/* commands (gRFC A71).
func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(), func(tb testing.TB, args []string) *script.Engine {
		protocol := ProtocolSotW
		if slices.Contains(args, "delta") {
			protocol = ProtocolDelta
		}
		srv := &scriptServer{tb: tb, prefix: "xds-server", clusters: map[string]string{}}
		srv.start()
		addresses := srv.addr
		var fallback *scriptServer
		if slices.Contains(args, "fallback") {
			fallback = &scriptServer{tb: tb, prefix: "xds-fallback", clusters: map[string]string{}}
			fallback.start()
			addresses += "," + fallback.addr
		}

		log := hivetest.Logger(tb)
		h := hive.New(
			statedb.Cell,
			job.Cell,
			cell.SimpleHealthCell,
			cell.Provide(func(h *cell.SimpleHealth) hive.ScriptCmdOut {
				return hive.NewScriptCmd("health", cell.SimpleHealthCmd(h))
			}),
			Cell,
			cell.Invoke(watchClustersAndEndpoints),
		)
		hive.AddConfigOverride(h, func(c *Config) {
			c.EnableXDSControlPlane = true
			c.XDSServerAddress = addresses
			c.XDSInsecure = true
			c.XDSNodeID = "node-1"
			c.XDSProtocol = protocol
			c.XDSResourceDoesNotExistTimeout = 500 * time.Millisecond
		})
		tb.Cleanup(func() { h.Stop(log, context.Background()) })

		cmds, err := h.ScriptCommands(log)
		if err != nil {
			tb.Fatal(err)
		}
		maps.Insert(cmds, maps.All(script.DefaultCmds()))
		maps.Insert(cmds, maps.All(srv.commands()))
		if fallback != nil {
			maps.Insert(cmds, maps.All(fallback.commands()))
		}
		return &script.Engine{Cmds: cmds}
	}, nil, "testdata/*.txtar")
}

// watchClustersAndEndpoints is the consumer the load balancer will be:
// every cluster, and the endpoints named after each cluster.
func watchClustersAndEndpoints(c *Client) {
	var (
		mu    sync.Mutex
		known = map[string]struct{}{}
	)
	c.Watch(ClusterType, true, HandlerFunc(func(_ context.Context, u Update) map[string]error {
		mu.Lock()
		defer mu.Unlock()
		rejected := map[string]error{}
		for _, r := range u.Upserted {
			if tag := r.Message.(*clusterv3.Cluster).GetAltStatName(); tag == "bad" {
				rejected[r.Name] = errors.New(badPortError)
				continue
			}
			known[r.Name] = struct{}{}
		}
		for _, n := range u.Removed {
			delete(known, n)
		}
		c.SetNames(EndpointType, slices.Collect(maps.Keys(known)))
		return rejected
	}))
	c.Watch(EndpointType, false, HandlerFunc(func(context.Context, Update) map[string]error { return nil }))
}

// scriptServer keeps the resources the script set, so that a restarted
// server serves them from its first response.
type scriptServer struct {
	tb testing.TB
	// prefix of its commands: xds-server, xds-fallback.
	prefix    string
	addr      string
	srv       *testServer
	clusters  map[string]string // name to tag
	endpoints []string
}

func (s *scriptServer) start() {
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s.srv = startServer(s.tb, addr, "", func(ts *testServer) { s.apply(ts) })
	s.addr = s.srv.addr
}

func (s *scriptServer) apply(ts *testServer) {
	var cs []*clusterv3.Cluster
	for n, tag := range s.clusters {
		cs = append(cs, cluster(n, tag))
	}
	ts.setClusters(cs...)
	var es []*endpointv3.ClusterLoadAssignment
	for _, n := range s.endpoints {
		es = append(es, endpoints(n, 0))
	}
	ts.setEndpoints(es...)
}

func (s *scriptServer) commands() map[string]script.Cmd {
	return map[string]script.Cmd{
		s.prefix + "/clusters": script.Command(
			script.CmdUsage{Summary: "Serve exactly these clusters", Args: "name[=tag]..."},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				s.clusters = map[string]string{}
				for _, a := range args {
					n, tag, _ := strings.Cut(a, "=")
					s.clusters[n] = tag
				}
				if s.srv != nil {
					s.apply(s.srv)
				}
				return nil, nil
			}),
		s.prefix + "/endpoints": script.Command(
			script.CmdUsage{Summary: "Serve exactly these cluster load assignments", Args: "name..."},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				s.endpoints = args
				if s.srv != nil {
					s.apply(s.srv)
				}
				return nil, nil
			}),
		s.prefix + "/stop": script.Command(
			script.CmdUsage{Summary: "Stop the server"},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				s.srv.stop()
				s.srv = nil
				return nil, nil
			}),
		s.prefix + "/start": script.Command(
			script.CmdUsage{Summary: "Start the server again, on the same address, with the resources set"},
			func(st *script.State, args ...string) (script.WaitFunc, error) {
				s.start()
				return nil, nil
			}),
	}
}
