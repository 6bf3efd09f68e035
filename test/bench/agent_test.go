// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/health"
	"github.com/l4xds/l4xds/pkg/l4lb"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
)

// agent is the agent's hive (xDS client, l4lb, loadbalancer, datapath)
// connected to a server. As root it writes real BPF maps pinned in a BPF
// filesystem of its own (no device attached); otherwise fake maps.
type agent struct {
	h         *hive.Hive
	log       *slog.Logger
	db        *statedb.DB
	frontends statedb.Table[*lb.Frontend]
	resources statedb.Table[*xds.ResourceStatus]
	fake      *datapath.FakeMaps
	bpfRoot   string

	// watched is the frontend whose writes are sent to writes.
	watched atomic.Pointer[lb.L3n4Addr]
	writes  chan time.Time
}

// useBPF: real maps as root, unless L4XDS_BENCH_MAPS=fake asks for the
// fake ones (to tell the agent's costs from the kernel's).
func useBPF() bool { return os.Geteuid() == 0 && os.Getenv("L4XDS_BENCH_MAPS") != "fake" }

// mapsKind is what the BENCH lines say: bpf or fake.
func mapsKind() string {
	if useBPF() {
		return "bpf"
	}
	return "fake"
}

func startAgent(tb testing.TB, srv *server, protocol string) *agent {
	tb.Helper()
	a := &agent{
		log:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		writes: make(chan time.Time, 1),
	}
	hooks := datapath.Hooks{Written: a.written}
	dpConfig := datapath.DefaultConfig
	// The largest shapes have more frontends than the default.
	dpConfig.LBServiceMapMax = datapath.MaxServiceMapMax
	if useBPF() {
		a.bpfRoot = netns.MountBPFFS(tb)
		dpConfig.BPFRoot = a.bpfRoot
		dpConfig.DatapathAttach = netns.DatapathAttach()
	} else {
		a.fake = datapath.NewFakeMaps()
		hooks.FakeMaps = a.fake
	}

	a.h = hive.New(
		job.Cell,
		statedb.Cell,
		health.Cell,
		lb.Cell,
		xds.Cell,
		l4lb.Cell,
		l4lb.TablesCell,
		datapath.Cell,
		cell.Provide(func() datapath.Hooks { return hooks }),
		cell.Invoke(func(db *statedb.DB, fes statedb.Table[*lb.Frontend], res statedb.Table[*xds.ResourceStatus]) {
			a.db, a.frontends, a.resources = db, fes, res
		}),
	)
	hive.AddConfigOverride(a.h, func(c *xds.Config) {
		c.EnableXDSControlPlane = true
		c.XDSServerAddress = srv.addr
		c.XDSServerName = "localhost"
		c.XDSCACertPath = filepath.Join(srv.certs, devcerts.CACert)
		c.XDSClientCertPath = filepath.Join(srv.certs, devcerts.ClientCert)
		c.XDSClientKeyPath = filepath.Join(srv.certs, devcerts.ClientKey)
		c.XDSNodeID = "bench-node"
		c.XDSProtocol = protocol
	})
	hive.AddConfigOverride(a.h, func(c *datapath.Config) { *c = dpConfig })
	if err := a.h.Start(a.log, context.Background()); err != nil {
		tb.Fatalf("start the agent: %v", err)
	}
	tb.Cleanup(a.stop)
	return a
}

// stop stops the hive; the agent's memory is garbage once its holder
// drops it.
func (a *agent) stop() {
	if a.h != nil {
		a.h.Stop(a.log, context.Background())
	}
	a.h, a.db, a.frontends, a.resources, a.fake = nil, nil, nil, nil, nil
}

func (a *agent) written(fe lb.L3n4Addr) {
	if w := a.watched.Load(); w != nil && *w == fe {
		select {
		case a.writes <- time.Now():
		default:
		}
	}
}

// handled is when the xDS client took in the response that changed the
// ClusterLoadAssignment name after since: the time its xds-resources row
// says it was updated. It waits for the row, which the client writes once
// the handler has returned.
func (a *agent) handled(ctx context.Context, name string, since time.Time) (time.Time, error) {
	for {
		r, _, watch, found := a.resources.GetWatch(a.db.ReadTxn(), xds.ResourceByName(xds.EndpointType, name))
		if found && r.Updated.After(since) {
			return r.Updated, nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("ClusterLoadAssignment %q: no update after %s: %w", name, since.Format(time.RFC3339Nano), ctx.Err())
		}
	}
}

// initialized waits for the tables to be initialized: the agent has the
// server's first (here empty) state.
func (a *agent) initialized(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, watch := a.frontends.Initialized(a.db.ReadTxn())
	select {
	case <-watch:
	case <-ctx.Done():
		tb.Fatal("the agent did not get the server's first state in a minute")
	}
}

// converged waits until the frontends table holds want frontends, each
// reconciled (Done) with m backends, and returns the latest time at which
// one of them became Done. It follows the table's changes by revision, so
// each wait costs what changed since the last one.
func (a *agent) converged(ctx context.Context, want, m int) (time.Time, error) {
	pending := map[lb.L3n4Addr]struct{}{}
	var (
		next statedb.Revision
		last time.Time
	)
	for {
		txn := a.db.ReadTxn()
		changed, watch := a.frontends.LowerBoundWatch(txn, statedb.ByRevision[*lb.Frontend](next))
		for fe, rev := range changed {
			next = rev + 1
			if fe.Status.Kind == reconciler.StatusKindDone && len(fe.Backends) == m {
				delete(pending, fe.Address)
				if fe.Status.UpdatedAt.After(last) {
					last = fe.Status.UpdatedAt
				}
			} else {
				pending[fe.Address] = struct{}{}
			}
		}
		if n := a.frontends.NumObjects(txn); n == want && len(pending) == 0 {
			return last, nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return last, fmt.Errorf("%d frontends, %d of them not reconciled with %d backends: %w",
				a.frontends.NumObjects(txn), len(pending), m, ctx.Err())
		}
	}
}

// checkMaps checks that the maps hold a service per frontend and a backend
// per endpoint.
func (a *agent) checkMaps(s shape) error {
	var services, backends int
	if a.fake != nil {
		c := a.fake.Counts()
		services, backends = c.Services, c.Backends
	} else {
		m, err := datapath.OpenPinnedMaps(a.bpfRoot)
		if err != nil {
			return err
		}
		defer m.Close()
		for _, err := range m.Services() {
			if err != nil {
				return err
			}
			services++
		}
		for _, err := range m.Backends() {
			if err != nil {
				return err
			}
			backends++
		}
	}
	if services != s.N || backends != s.N*s.M {
		return fmt.Errorf("%s maps: %d services and %d backends, want %d and %d", mapsKind(), services, backends, s.N, s.N*s.M)
	}
	return nil
}
