// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/l4xds/l4xds/pkg/xds"
)

// Cell translates the l4lb clusters the xDS client receives into services,
// frontends and backends. It needs *xds.Client and a Sink (TablesCell for
// l4xds's own tables).
var Cell = cell.Module(
	"l4lb",
	"Translates xDS clusters into load-balancing services",

	cell.Config(DefaultConfig),
	cell.Provide(newCellController),
	cell.Invoke(func(*Controller) {}),
)

// NewClusterWait, when provided, is how long a new EDS cluster waits for
// its first ClusterLoadAssignment before its service is written without
// backends (Controller.SetNewClusterWait). Inside Cilium, where each
// frontend programmed costs an RCU grace period, the cell provides it;
// the standalone agent writes at once.
type NewClusterWait time.Duration

type controllerParams struct {
	cell.In

	Config    Config
	Sink      Sink
	Client    *xds.Client
	Jobs      job.Registry
	Health    cell.Health
	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	Wait      NewClusterWait `optional:"true"`
}

// newController watches every cluster (wildcard CDS) and the EDS names the
// l4lb clusters ask for. Watches are registered at construction, before the
// client starts, so that no update is missed.
func newCellController(p controllerParams) (*Controller, error) {
	c, err := NewControllerWith(p.Config, p.Sink, p.Client)
	if err != nil {
		return nil, err
	}
	if p.Wait > 0 {
		c.SetNewClusterWait(time.Duration(p.Wait), p.Log)
		c.SetHealth(p.Health)
		p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { c.Stop(); return nil }})
	}
	p.Client.Watch(xds.ClusterType, true, c.ClusterHandler())
	p.Client.Watch(xds.EndpointType, false, c.EndpointHandler())

	// The first CDS response may change nothing (no clusters at all) and
	// then reaches no handler; a disabled client never responds. Both
	// report the type synced, which completes the initialization.
	g := p.Jobs.NewGroup(p.Health)
	g.Add(job.OneShot("wait-for-clusters", func(ctx context.Context, _ cell.Health) error {
		select {
		case <-ctx.Done():
		case <-p.Client.Synced(xds.ClusterType):
			c.ClustersSynced()
		}
		return nil
	}))
	return c, nil
}
