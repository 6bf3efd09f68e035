// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"strings"
	"testing"
)

func TestConfigValidateNamesTheFlag(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{DefaultConfig, ""},
		{Config{Datapath: "bpf", LBMaglevTableSize: 16381}, ""},
		{Config{Datapath: "xdp", LBMaglevTableSize: 1021}, `--datapath: "xdp" is not bpf or none`},
		{Config{Datapath: "none", LBMaglevTableSize: 1000}, "--lb-maglev-table-size: 1000 is not a prime"},
		{Config{Datapath: "none", LBMaglevTableSize: 1}, "--lb-maglev-table-size: 1 is not a prime"},
		{Config{Datapath: "none", LBMaglevTableSize: 131071}, ""},
		{Config{Datapath: "none", LBMaglevTableSize: 131101}, "--lb-maglev-table-size: 131101 is larger than 131071"},
		{Config{Datapath: "none", LBMaglevTableSize: 1 << 40}, "--lb-maglev-table-size: 1099511627776 is larger than 131071"}, // checked before primality
	} {
		err := c.cfg.Validate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
	}
}

func TestConfigDefaultsToTheBPFDatapath(t *testing.T) {
	if DefaultConfig.Datapath != "bpf" || DefaultConfig.BPFRoot != "/sys/fs/bpf" || DefaultConfig.LBMaglevTableSize != 1021 {
		t.Errorf("defaults %+v, want --datapath=bpf --bpf-root=/sys/fs/bpf --lb-maglev-table-size=1021", DefaultConfig)
	}
}
