// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// Cell loads the BPF datapath when the agent starts (--datapath=bpf, the
// default) and reconciles the frontends table into its maps; on stop it
// closes its handles and leaves the programs attached, so that traffic
// flows while the agent is down. With --datapath=none it does nothing.
// It needs statedb.RWTable[*loadbalancer.Frontend] (loadbalancer.Cell).
var Cell = cell.Module(
	"datapath",
	"eBPF service datapath",

	cell.Config(DefaultConfig),
	cell.Invoke(func(p params) error {
		_, err := register(p)
		return err
	}),
)

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	DB        *statedb.DB
	Frontends statedb.RWTable[*lb.Frontend]
	Jobs      job.Registry
	Health    cell.Health
	ModuleID  cell.FullModuleID
	Hooks     Hooks `optional:"true"`
	// Metrics is the agent's registry (metrics.Cell), when it has one.
	Metrics prometheus.Registerer `optional:"true"`
	// Ready is the agent's readiness (health.Cell), when it has one.
	Ready *health.Readiness `optional:"true"`
}

// ReadinessCondition is the datapath's condition of the agent's readiness.
const ReadinessCondition = "datapath: the first complete state is served"

// register validates the configuration and, for the BPF datapath, appends
// the loader to the lifecycle and registers the reconciler, whose jobs start
// after the loader. It returns nil with --datapath=none.
func register(p params) (reconciler.Reconciler[*lb.Frontend], error) {
	if err := p.Config.Validate(); err != nil {
		return nil, err
	}
	// Ready once the first complete state (the xDS client's, or none with
	// the client disabled: the tables' initializers) is served, and from
	// then on whatever happens to the xDS side (health.Readiness).
	var met func()
	if p.Ready != nil {
		met = p.Ready.Add(ReadinessCondition)
	}
	if p.Config.Datapath == "none" {
		p.Log.Info("Datapath disabled (--datapath=none): the tables are kept but no traffic is forwarded")
		if met != nil {
			p.Jobs.NewGroup(p.Health).Add(job.OneShot("readiness", func(ctx context.Context, _ cell.Health) error {
				if waitInitialized(ctx, p) {
					met()
				}
				return nil
			}))
		}
		return nil, nil
	}

	ops := newOps(p.Log, p.DB, p.Frontends, p.Config.capacity())
	ops.written = p.Hooks.Written
	var dp *Datapath
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if p.Hooks.FakeMaps != nil {
				ops.useFake(p.Hooks.FakeMaps)
				return nil
			}
			var err error
			if dp, err = Load(p.Log, p.Config); err != nil {
				return fmt.Errorf("BPF datapath (--datapath=bpf needs root; --datapath=none runs without it): %w", err)
			}
			ops.capacity = dp.capacity(ops.capacity.maglevSize)
			if err := ops.restore(dp.Maps); err != nil {
				dp.Close()
				return err
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			// The pins stay: the programs keep forwarding with the maps as
			// they are until the next agent takes over.
			if dp == nil {
				return nil
			}
			return dp.Close()
		},
	})
	m, err := registerMetrics(p, ops)
	if err != nil {
		return nil, fmt.Errorf("datapath metrics: %w", err)
	}
	jobs := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	r, err := reconciler.Register(
		reconciler.Params{
			Log:      p.Log,
			DB:       p.DB,
			JobGroup: jobs,
			ModuleID: p.ModuleID,
		},
		p.Frontends,
		(*lb.Frontend).Clone,
		(*lb.Frontend).SetStatus,
		(*lb.Frontend).GetStatus,
		ops,
		ops, // a round's new Maglev tables are inserted together
		reconciler.WithMetrics(m),
	)
	if err != nil {
		return nil, err
	}
	if met != nil {
		jobs.Add(job.OneShot("readiness", func(ctx context.Context, _ cell.Health) error {
			if !waitInitialized(ctx, p) {
				return nil
			}
			if _, _, err := r.WaitUntilReconciled(ctx, p.Frontends.Revision(p.DB.ReadTxn())); err != nil {
				return nil // stopping
			}
			met()
			return nil
		}))
	}
	jobs.Add(job.OneShot("commit-new-maps", func(ctx context.Context, _ cell.Health) error {
		if dp == nil || !dp.Staged() {
			return nil
		}
		return commitWhenFilled(ctx, p, r, dp)
	}, job.WithRetry(10, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})))
	return r, nil
}

// waitInitialized waits until the frontends table is initialized: its
// sources have written their first complete state. False: stopping.
func waitInitialized(ctx context.Context, p params) bool {
	if initialized, watch := p.Frontends.Initialized(p.DB.ReadTxn()); !initialized {
		select {
		case <-ctx.Done():
			return false
		case <-watch:
		}
	}
	return true
}

// commitWhenFilled switches to the staged datapath (Datapath.Commit) once
// its new maps hold the control plane's first full state: the frontends
// table is initialized and the reconciler has written every frontend of it
// once. Until then, however long the control plane takes, the previous
// program forwards with the pinned maps.
func commitWhenFilled(ctx context.Context, p params, r reconciler.Reconciler[*lb.Frontend], dp *Datapath) error {
	if !waitInitialized(ctx, p) {
		return nil
	}
	if _, _, err := r.WaitUntilReconciled(ctx, p.Frontends.Revision(p.DB.ReadTxn())); err != nil {
		return nil // stopping
	}
	return dp.Commit(p.Log)
}
