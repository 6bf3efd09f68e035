// SPDX-License-Identifier: Apache-2.0

// Package l4xds is the l4xds cell for cilium-agent: our xDS client and
// l4lb translation, writing Cilium's load-balancing tables so that Cilium's
// BPF reconciler and datapath serve the xDS services. Its flags are the
// standalone agent's xDS flags, plus --xds-control-plane for the CFP's
// configuration block.
package l4xds

import (
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/cilium/cilium/pkg/loadbalancer"

	"github.com/l4xds/l4xds/cilium/sink"
	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/version"
	"github.com/l4xds/l4xds/pkg/xds"
)

// Cell is added to Cilium's agent hive (cmd/cilium-agent).
var Cell = cell.Module(
	"l4xds",
	"xDS-controlled L4 load balancing into Cilium tables",

	cell.Config(defaultBlock),
	cell.Decorate(
		applyBlock,
		xds.Cell,
		cell.Provide(func() l4lb.NewClusterWait { return l4lb.NewClusterWait(NewClusterWait) }),
		l4lb.Cell,
		cell.Invoke(warnUnweighted),
	),
	cell.Invoke(logVersion),
	cell.Provide(sink.New),
)

// NewClusterWait bounds how long a new cluster's service waits for its
// endpoints. Cilium's reconciler programs a frontend once per change, and
// each Maglev table it writes waits for an RCU grace period: a service
// written on CDS and again on EDS would be programmed twice when the
// reconciler reaches it in between. Its endpoints nearly always follow the
// cluster within a second, but a first state of 100000 endpoints takes
// a few seconds to decode and write; a cluster without them is written
// without backends after this.
const NewClusterWait = 5 * time.Second

// warnUnweighted says once at start-up when Cilium would ignore the xDS
// weights: they take effect only with Maglev, which the sink asks for per
// service through the lb-algorithm annotation.
func warnUnweighted(cfg xds.Config, lbcfg loadbalancer.Config, log *slog.Logger) {
	if !cfg.EnableXDSControlPlane || lbcfg.LBAlgorithm == loadbalancer.LBAlgorithmMaglev || lbcfg.AlgorithmAnnotation {
		return
	}
	log.Warn("xDS endpoint weights are ignored: Cilium weighs backends only with Maglev; set bpf-lb-algorithm-annotation=true (or bpf-lb-algorithm=maglev)",
		"bpf-lb-algorithm", lbcfg.LBAlgorithm)
}

// logVersion says which build of the cell the agent carries: cilium-agent's
// --version is Cilium's.
func logVersion(log *slog.Logger) {
	v := version.Get()
	log.Info("l4xds cell", "version", v.Version, "commit", v.Commit)
}
