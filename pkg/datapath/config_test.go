// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidateNamesTheFlag(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{DefaultConfig, ""},
		{withMaglev("bpf", 16381), ""},
		{withMaglev("xdp", 1021), `--datapath: "xdp" is not bpf or none`},
		{withMaglev("none", 1000), "--lb-maglev-table-size: 1000 is not a prime"},
		{withMaglev("none", 1), "--lb-maglev-table-size: 1 is not a prime"},
		{withMaglev("none", 131071), ""},
		{withMaglev("none", 131101), "--lb-maglev-table-size: 131101 is larger than 131071"},
		{withMaglev("none", 1<<40), "--lb-maglev-table-size: 1099511627776 is larger than 131071"}, // checked before primality
		{withMaps(0, 1<<20), "--lb-service-map-max: 0 is not in 1..65536"},
		{withMaps(1<<16+1, 1<<20), "--lb-service-map-max: 65537 is not in 1..65536"},
		{withMaps(1, 1), ""},
		{withMaps(1<<16, 0), "--lb-backend-map-max: 0 is not in 1..16777216"},
		{withMaps(1<<16, 1<<24+1), "--lb-backend-map-max: 16777217 is not in 1..16777216"},
		{withMaps(1<<16, 1<<24), ""},
		{withFlowMaps(1<<10, 1<<10, 1<<10), ""},
		{withFlowMaps(1<<24, 1<<24, 1<<24), ""},
		{withFlowMaps(1000, 1<<18, 1<<16), "--lb-conntrack-max: 1000 is not in 1024..16777216"},
		{withFlowMaps(1<<24+1, 1<<18, 1<<16), "--lb-conntrack-max: 16777217 is not in 1024..16777216"},
		{withFlowMaps(1<<20, 0, 1<<16), "--lb-conntrack-new-max: 0 is not in 1024..16777216"},
		{withFlowMaps(1<<20, 1<<18, 1<<25), "--lb-affinity-max: 33554432 is not in 1024..16777216"},
		{withGrace(-time.Second), "--lb-removed-vip-grace: -1s is negative"},
		{withGrace(0), ""},
		{withAttach("tc"), ""},
		{withAttach("tcx"), ""},
		{withAttach("auto"), ""},
		{withReject(0, 1), ""},
		{withReject(0, 0), "--lb-reject-burst: 0 is not in 1..1000000"},
		{withReject(1000000, 1000000), ""},
		{withReject(1000001, 50), "--lb-reject-rate: 1000001 is not in 0..1000000"},
		{withReject(1000, 1000001), "--lb-reject-burst: 1000001 is not in 1..1000000"},
		{withAttach("xdp"), `--datapath-attach: "xdp" is not auto, tcx or tc`},
		{withAttach(""), `--datapath-attach: "" is not auto, tcx or tc`},
	} {
		err := c.cfg.Validate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
	}
}

func withReject(rate, burst uint) Config {
	c := DefaultConfig
	c.LBRejectRate, c.LBRejectBurst = rate, burst
	return c
}

func withAttach(mode string) Config {
	c := DefaultConfig
	c.DatapathAttach = mode
	return c
}

func withGrace(d time.Duration) Config {
	c := DefaultConfig
	c.LBRemovedVIPGrace = d
	return c
}

func withMaglev(datapath string, size uint) Config {
	c := DefaultConfig
	c.Datapath, c.LBMaglevTableSize = datapath, size
	return c
}

func withFlowMaps(ct, ctNew, affinity uint) Config {
	c := DefaultConfig
	c.LBConntrackMax, c.LBConntrackNewMax, c.LBAffinityMax = ct, ctNew, affinity
	return c
}

func withMaps(services, backends uint) Config {
	c := DefaultConfig
	c.LBServiceMapMax, c.LBBackendMapMax = services, backends
	return c
}

// The capacity at the largest service map leaves out service ID 65536,
// which the stats array has no slot for.
func TestConfigCapacity(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want capacity
	}{
		{DefaultConfig, capacity{services: 65535, backends: 1 << 20, maglevSize: 1021, sourceRanges: 65536}},
		{withMaps(2, 3), capacity{services: 2, backends: 3, maglevSize: 1021, sourceRanges: 65536}},
	} {
		if got := c.cfg.capacity(); got != c.want {
			t.Errorf("%+v: capacity %+v, want %+v", c.cfg, got, c.want)
		}
	}
}

func TestConfigDefaultsToTheBPFDatapath(t *testing.T) {
	if DefaultConfig.Datapath != "bpf" || DefaultConfig.BPFRoot != "/sys/fs/bpf" || DefaultConfig.LBMaglevTableSize != 1021 ||
		DefaultConfig.LBServiceMapMax != 65536 || DefaultConfig.LBBackendMapMax != 1<<20 || DefaultConfig.LBRemovedVIPGrace != 5*time.Minute ||
		DefaultConfig.LBConntrackMax != 1<<20 || DefaultConfig.LBAffinityMax != 1<<16 || DefaultConfig.DatapathAttach != AttachAuto {
		t.Errorf("defaults %+v, want --datapath=bpf --bpf-root=/sys/fs/bpf --lb-maglev-table-size=1021 --lb-service-map-max=65536 --lb-backend-map-max=1048576 --lb-conntrack-max=1048576 --lb-affinity-max=65536 --datapath-attach=auto (the sizes of the maps before these flags)", DefaultConfig)
	}
}
