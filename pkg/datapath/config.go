// SPDX-License-Identifier: Apache-2.0

// Package datapath programs the frontends table into the eBPF datapath:
// it loads the programs of bpf/ with their maps pinned under
// <bpf-root>/l4xds, attaches them to --devices with pinned tcx links, and
// reconciles the frontends into the maps (service and backend IDs, weighted
// Maglev tables, source ranges). --datapath=none runs the control-plane
// half alone (tables, xDS, API).
package datapath

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Config of the datapath.
type Config struct {
	Datapath          string
	Devices           []string
	BPFRoot           string
	LBMaglevTableSize uint
}

// MaxMaglevTableSize bounds --lb-maglev-table-size: every service holds a
// table of that many backend IDs in kernel memory (512 KiB each at this size).
const MaxMaglevTableSize = 131071

var DefaultConfig = Config{
	Datapath:          "bpf",
	BPFRoot:           "/sys/fs/bpf",
	LBMaglevTableSize: 1021,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("datapath", def.Datapath, "Datapath that forwards the frontends: bpf or none (tables only)")
	flags.StringSlice("devices", def.Devices, "Interfaces the datapath attaches to; auto: those up with a global unicast address at start (the uplink and a CNI bridge)")
	flags.String("bpf-root", def.BPFRoot, "Mount point of the BPF filesystem; maps are pinned under <bpf-root>/l4xds")
	flags.Uint("lb-maglev-table-size", def.LBMaglevTableSize, "Size of each service's Maglev lookup table (a prime)")
}

// Validate reports the first bad setting, naming its flag.
func (c Config) Validate() error {
	switch c.Datapath {
	case "none", "bpf":
	default:
		return fmt.Errorf("--datapath: %q is not bpf or none", c.Datapath)
	}
	// The bound first: trial division of a huge value takes seconds.
	if c.LBMaglevTableSize > MaxMaglevTableSize {
		return fmt.Errorf("--lb-maglev-table-size: %d is larger than %d", c.LBMaglevTableSize, MaxMaglevTableSize)
	}
	if !isPrime(c.LBMaglevTableSize) {
		return fmt.Errorf("--lb-maglev-table-size: %d is not a prime", c.LBMaglevTableSize)
	}
	return nil
}

func isPrime(n uint) bool {
	if n < 2 {
		return false
	}
	for d := uint(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}
