// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"context"
	"fmt"
	"maps"
	"os"
	"testing"
	"time"

	uhive "github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	daemonk8s "github.com/cilium/cilium/daemon/k8s"
	cmtypes "github.com/cilium/cilium/pkg/clustermesh/types"
	"github.com/cilium/cilium/pkg/datapath/tables"
	envoyCfg "github.com/cilium/cilium/pkg/envoy/config"
	"github.com/cilium/cilium/pkg/hive"
	k8sClient "github.com/cilium/cilium/pkg/k8s/client/testutils"
	k8sTables "github.com/cilium/cilium/pkg/k8s/tables"
	k8sTestutils "github.com/cilium/cilium/pkg/k8s/testutils"
	"github.com/cilium/cilium/pkg/k8s/version"
	"github.com/cilium/cilium/pkg/kpr"
	"github.com/cilium/cilium/pkg/lbipamconfig"
	"github.com/cilium/cilium/pkg/loadbalancer"
	lbcell "github.com/cilium/cilium/pkg/loadbalancer/cell"
	lbmaps "github.com/cilium/cilium/pkg/loadbalancer/maps"
	"github.com/cilium/cilium/pkg/maglev"
	"github.com/cilium/cilium/pkg/metrics"
	"github.com/cilium/cilium/pkg/node"
	nodeTypes "github.com/cilium/cilium/pkg/node/types"
	"github.com/cilium/cilium/pkg/nodeipamconfig"
	"github.com/cilium/cilium/pkg/option"
	"github.com/cilium/cilium/pkg/source"

	"github.com/l4xds/l4xds/pkg/controlplane/cptest"
	"github.com/l4xds/l4xds/pkg/xds"
)

// TestScript runs testdata/*.txtar against Cilium's load-balancing cells
// (tables, writer, BPF reconciler, Maglev) plus this module's cell, fed by
// the reference control plane over gRPC with mTLS, once per xDS protocol.
// Without root Cilium's maps are its in-memory fakes; as root they are real
// BPF maps (unpinned), so the same scripts prove what the kernel holds.
func TestScript(t *testing.T) {
	version.Force(k8sTestutils.DefaultVersion)
	nodeTypes.SetName("testnode")
	mountBPFFS(t)
	variants := []string{"fake"}
	if os.Getuid() == 0 {
		variants = append(variants, "bpf")
	}
	for _, protocol := range []string{xds.ProtocolSotW, xds.ProtocolDelta} {
		for _, maps := range variants {
			t.Run(protocol+"/maps="+maps, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				t.Cleanup(cancel)
				scripttest.Test(t, ctx,
					func(tb testing.TB, args []string) *script.Engine {
						return newEngine(tb, protocol, maps == "fake", args)
					},
					nil, "testdata/*.txtar")
			})
		}
	}
}

// newEngine builds the agent (newAgent) with a fresh reference control
// plane, over Cilium's fake LB maps or its real BPF maps. hive/recreate
// restarts the agent over the fake maps: a fresh StateDB and the maps as
// they were. (The real maps of a test are unpinned: scripts that restart
// skip there, and TestPrivilegedCiliumAgentXDS restarts a real agent over
// its pinned maps.)
func newEngine(tb testing.TB, protocol string, fake bool, args []string) *script.Engine {
	log := hivetest.Logger(tb)
	srv := cptest.Start(tb)
	e := &script.Engine{
		Conds:            map[string]script.Cond{"bpf": script.BoolCondition("the LB maps are real BPF maps", !fake)},
		RetryInterval:    50 * time.Millisecond,
		MaxRetryInterval: time.Second,
	}

	var lbMaps lbmaps.LBMaps
	if fake {
		lbMaps = lbmaps.NewFakeLBMaps()
	}
	newHive := func(extra []string) (map[string]script.Cmd, error) {
		h, err := newAgent(srv, protocol, append(append([]string(nil), args...), extra...), lbMaps)
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { h.Stop(log, context.Background()) })
		cmds, err := h.ScriptCommands(log)
		if err != nil {
			return nil, err
		}
		maps.Insert(cmds, maps.All(script.DefaultCmds()))
		maps.Insert(cmds, maps.All(srv.Commands()))
		return cmds, nil
	}
	cmds, err := newHive(nil)
	if err != nil {
		tb.Fatal(err)
	}
	cmds["hive/recreate"] = script.Command(
		script.CmdUsage{Summary: "A new agent (fresh StateDB, same LB maps) after `hive stop`", Args: "[flags...]"},
		func(_ *script.State, extra ...string) (script.WaitFunc, error) {
			cmds, err := newHive(extra)
			if err != nil {
				return nil, err
			}
			recreate := e.Cmds["hive/recreate"]
			clear(e.Cmds)
			maps.Copy(e.Cmds, cmds)
			e.Cmds["hive/recreate"] = recreate
			return nil, nil
		})
	e.Cmds = cmds
	return e
}

// newAgent builds (does not start) Cilium's load-balancing control plane as
// its own script tests do (a fake Kubernetes client nothing uses), with
// this module's cell pointed at srv, and args as flags. It uses lbMaps when
// given, else new BPF maps (unpinned; root only).
func newAgent(srv *cptest.Server, protocol string, args []string, lbMaps lbmaps.LBMaps, extra ...cell.Cell) (*hive.Hive, error) {
	app := cell.Group(
		k8sClient.FakeClientCell(),
		daemonk8s.ResourcesCell,
		k8sTables.TablesCell,
		cell.Config(envoyCfg.SecretSyncConfig{}),
		kpr.Cell,
		cell.Config(loadbalancer.TestConfig{}),
		metrics.Cell,
		maglev.Cell,
		lbipamconfig.Cell,
		nodeipamconfig.Cell,
		node.LocalNodeStoreTestCell,
		cell.Provide(
			func() cmtypes.ClusterInfo { return cmtypes.ClusterInfo{} },
			func(cfg loadbalancer.TestConfig) *loadbalancer.TestConfig { return &cfg },
			tables.NewNodeAddressTable,
			statedb.RWTable[tables.NodeAddress].ToTable,
			source.NewSources,
			func() *option.DaemonConfig { return &option.DaemonConfig{EnableIPv4: true, EnableIPv6: true} },
		),
		lbcell.Cell,
		Cell,
		cell.Group(extra...),
	)
	if lbMaps != nil {
		app = cell.Decorate(func(lbmaps.LBMaps) lbmaps.LBMaps { return lbMaps }, app)
	}
	h := hive.New(app)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	for name, value := range map[string]string{
		"kube-proxy-replacement":      "true",
		"bpf-lb-algorithm-annotation": "true",
		"lb-retry-backoff-min":        "10ms",
		"lb-retry-backoff-max":        "10ms",
		"bpf-lb-maglev-table-size":    "1021",
	} {
		if err := flags.Set(name, value); err != nil {
			return nil, fmt.Errorf("--%s: %w", name, err)
		}
	}
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	uhive.AddConfigOverride(h, func(c *xds.Config) { srv.Configure(c, protocol) })
	return h, nil
}
