// SPDX-License-Identifier: Apache-2.0

// cilium-agent is Cilium's agent with the l4xds cell: xDS-defined services
// written into Cilium's load-balancing tables and served by its datapath.
package main

import (
	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"

	"github.com/l4xds/l4xds/cilium/l4xds"
)

func main() {
	cmd.Execute(cmd.NewAgentCmd(func() *hive.Hive {
		return hive.New(cmd.Agent, l4xds.Cell)
	}))
}
