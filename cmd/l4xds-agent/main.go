// SPDX-License-Identifier: Apache-2.0

// l4xds-agent runs on every node: it subscribes to an xDS management server
// and programs the clusters that carry io.cilium.l4lb metadata as L4 load
// balancers.
package main

import (
	"fmt"
	"os"

	"github.com/cilium/hive"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/health"
	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/metrics"
	"github.com/l4xds/l4xds/pkg/option"
	"github.com/l4xds/l4xds/pkg/version"
	"github.com/l4xds/l4xds/pkg/xds"
)

func main() {
	h := hive.New(
		job.Cell,
		statedb.Cell,
		health.Cell,
		api.Cell,
		metrics.Cell,
		loadbalancer.Cell,
		xds.Cell,
		l4lb.Cell,
		l4lb.TablesCell,
		datapath.Cell,
	)
	cmd := option.AgentCommand("l4xds-agent", "xDS-controlled eBPF L4 load balancer agent", h)
	version.AddFlag(cmd)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "l4xds-agent:", err)
		os.Exit(1)
	}
}
