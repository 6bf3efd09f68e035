// SPDX-License-Identifier: Apache-2.0

// Package datapath programs the frontends table into the eBPF datapath.
// This release carries its configuration only: --datapath=none runs the
// control-plane half alone (tables, xDS, API), and --datapath=bpf is refused
// with an explanation until the BPF programs are part of the build.
package datapath

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
)

// Config of the datapath.
type Config struct {
	Datapath          string
	Devices           []string
	BPFRoot           string
	LBMaglevTableSize uint
}

var DefaultConfig = Config{
	Datapath:          "none",
	BPFRoot:           "/sys/fs/bpf",
	LBMaglevTableSize: 1021,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("datapath", def.Datapath, "Datapath that forwards the frontends: bpf or none (tables only)")
	flags.StringSlice("devices", def.Devices, "Interfaces the datapath attaches to")
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

// Cell checks the datapath configuration.
var Cell = cell.Module(
	"datapath",
	"eBPF service datapath",

	cell.Config(DefaultConfig),
	cell.Invoke(func(cfg Config, log *slog.Logger) error {
		if err := cfg.Validate(); err != nil {
			return err
		}
		if cfg.Datapath == "bpf" {
			return errors.New("--datapath=bpf: the BPF datapath is not part of this build; run with --datapath=none")
		}
		log.Info("Datapath disabled (--datapath=none): the tables are kept but no traffic is forwarded")
		return nil
	}),
)
