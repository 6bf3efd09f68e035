// SPDX-License-Identifier: Apache-2.0

// Package tests states the control-plane half's behaviour as hive scripts:
// a real go-control-plane server (pkg/controlplane) serves the resources a
// script gives it over real gRPC with real mTLS certificates, and the agent's
// cells (xDS client, l4lb, load-balancing tables) must show the rows the
// script expects. Every script runs twice: over SotW and over Delta.
package tests

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"

	"github.com/l4xds/l4xds/pkg/controlplane/cptest"
	"github.com/l4xds/l4xds/pkg/health"
	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

func TestScript(t *testing.T) {
	for _, protocol := range []string{xds.ProtocolSotW, xds.ProtocolDelta} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			scripttest.Test(t, context.Background(),
				func(tb testing.TB, args []string) *script.Engine { return newEngine(tb, protocol) },
				nil, "testdata/*.txtar")
		})
	}
}

// newEngine starts an xDS server with mTLS and builds (but does not start:
// scripts say `hive start`) the agent's control-plane hive connected to it.
func newEngine(tb testing.TB, protocol string) *script.Engine {
	log := hivetest.Logger(tb)
	srv := cptest.Start(tb)

	h := hive.New(
		job.Cell,
		statedb.Cell,
		health.Cell,
		loadbalancer.Cell,
		xds.Cell,
		l4lb.Cell,
		l4lb.TablesCell,
	)
	hive.AddConfigOverride(h, func(c *xds.Config) { srv.Configure(c, protocol) })
	tb.Cleanup(func() { h.Stop(log, context.Background()) })

	cmds, err := h.ScriptCommands(log)
	if err != nil {
		tb.Fatal(err)
	}
	maps.Insert(cmds, maps.All(script.DefaultCmds()))
	maps.Insert(cmds, maps.All(srv.Commands()))
	return &script.Engine{Cmds: cmds, RetryInterval: 100 * time.Millisecond, MaxRetryInterval: time.Second}
}
