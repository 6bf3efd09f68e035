// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/datapath"
)

// bpfCommand reads the pinned maps directly, as `cilium-dbg bpf` does: no
// agent needed, so it also tells what the datapath forwards while the
// agent is down or restarting.
func bpfCommand() *cobra.Command {
	bpfRoot := datapath.DefaultConfig.BPFRoot
	cmd := &cobra.Command{
		Use:   "bpf",
		Short: "Read the datapath's pinned BPF maps directly (works while the agent is down)",
		Long: "Read the datapath's pinned BPF maps under <bpf-root>/" + datapath.PinDir + " directly, " +
			"without the agent: what they show is what the programs forward, also while the agent is down or restarting. Needs root.",
	}
	cmd.PersistentFlags().StringVar(&bpfRoot, "bpf-root", bpfRoot, "BPF filesystem the agent pins its maps under (its --bpf-root)")

	lb := &cobra.Command{Use: "lb", Short: "Load-balancing maps: services, backends, Maglev tables, counters"}
	lb.AddCommand(lbListCommand(&bpfRoot))
	ct := &cobra.Command{Use: "ct", Short: "Connection tracking: the flows and their backends"}
	ct.AddCommand(ctListCommand(&bpfRoot))
	affinity := &cobra.Command{Use: "affinity", Short: "Session affinity: the backend each client sticks to"}
	affinity.AddCommand(affinityListCommand(&bpfRoot))
	cmd.AddCommand(lb, ct, affinity)
	return cmd
}

// openMaps opens the pinned maps, with a hint when there are none.
func openMaps(bpfRoot string) (*datapath.Maps, error) {
	m, err := datapath.OpenPinnedMaps(bpfRoot)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (is --bpf-root the agent's? does the agent run with --datapath=bpf?)",
			filepath.Join(bpfRoot, datapath.PinDir), err)
	}
	return m, nil
}
