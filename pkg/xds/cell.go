// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
)

// Cell provides the *Client, its tables (read-only) and its script
// commands. Consumers Watch and SetNames on the client; the client runs as
// a job once the hive starts.
var Cell = cell.Module(
	"xds-client",
	"xDS client with ADS stream and last-known-good cache",

	cell.Config(DefaultConfig),
	cell.Provide(
		newHiveClient,
		(*Client).Resources,
		(*Client).Status,
		(*Client).Servers,
		scriptCommands,
	),
)

type clientParams struct {
	cell.In

	Config Config
	Log    *slog.Logger
	DB     *statedb.DB
	Jobs   job.Registry
	Health cell.Health
	// Metrics is the agent's registry (metrics.Cell), when it has one.
	Metrics prometheus.Registerer `optional:"true"`
}

func newHiveClient(p clientParams) (*Client, error) {
	c, err := NewClient(p.Config, p.Log, p.DB)
	if err != nil || c.disabled {
		return c, err
	}
	if p.Metrics != nil {
		if err := p.Metrics.Register(c.Metrics()); err != nil {
			return nil, fmt.Errorf("xDS client metrics: %w", err)
		}
	}
	g := p.Jobs.NewGroup(p.Health)
	g.Add(job.OneShot("xds-client", func(ctx context.Context, health cell.Health) error {
		return c.run(ctx, health)
	}))
	return c, nil
}
