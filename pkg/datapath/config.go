// SPDX-License-Identifier: Apache-2.0

// Package datapath programs the frontends table into the eBPF datapath:
// it loads the programs of bpf/ with their maps pinned under
// <bpf-root>/l4xds, attaches them to --devices (with pinned tcx links, or
// tc filters on kernels older than 6.6: --datapath-attach), and
// reconciles the frontends into the maps (service and backend IDs, weighted
// Maglev tables, source ranges). --datapath=none runs the control-plane
// half alone (tables, xDS, API).
package datapath

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config of the datapath.
type Config struct {
	Datapath string
	// DatapathAttach is how the program is attached to the devices: tcx
	// (Linux 6.6+), tc (a clsact filter, any supported kernel), or auto.
	DatapathAttach    string
	Devices           []string
	BPFRoot           string
	LBMaglevTableSize uint
	// LBServiceMapMax and LBBackendMapMax size the service map (and those
	// keyed by service: Maglev tables, VIPs) and the backend map.
	LBServiceMapMax uint
	LBBackendMapMax uint
	// LBConntrackMax sizes the conntrack map of established flows,
	// LBConntrackNewMax that of flows not established yet, which floods of
	// new flows churn apart from the established ones, and LBAffinityMax
	// the client affinity map. All three are LRU maps.
	LBConntrackMax    uint
	LBConntrackNewMax uint
	LBAffinityMax     uint
	// LBRemovedVIPGrace is how long the packets to a VIP are still dropped
	// once its last frontend is removed, rather than passed to the stack,
	// which would route them back out (l4xds_old_vips).
	LBRemovedVIPGrace time.Duration
	// LBRejectRate is how many rejects (TCP RST, ICMP port unreachable
	// to the new flows a service refuses) the node sends a second at
	// most, in bursts of up to LBRejectBurst; beyond, refused packets
	// are dropped (counted as reject limit). 0: none are sent.
	LBRejectRate  uint
	LBRejectBurst uint
	// DatapathServiceMetrics exports the counters of every frontend: 13
	// series per frontend on every node, which a large fleet may not want.
	DatapathServiceMetrics bool
}

// The bounds of --lb-reject-rate and --lb-reject-burst: beyond a million
// rejects a second a node is a reflector whatever the limit.
const (
	MaxRejectRate  = 1000000
	MaxRejectBurst = 1000000
)

// MaxMaglevTableSize bounds --lb-maglev-table-size: every service holds a
// table of that many backend IDs in kernel memory (512 KiB each at this size).
const MaxMaglevTableSize = 131071

// The bounds of --lb-service-map-max and --lb-backend-map-max: a service ID
// indexes the stats array (65536 slots, 0 reserved); 2^24 backends take
// over a GiB of kernel memory.
const (
	MaxServiceMapMax = 1 << 16
	MaxBackendMapMax = 1 << 24
)

// The bounds of --lb-conntrack-max, --lb-conntrack-new-max and
// --lb-affinity-max (those of Cilium's CT maps): LRU maps are preallocated,
// about 150 bytes per conntrack entry.
const (
	MinFlowMapMax = 1 << 10
	MaxFlowMapMax = 1 << 24
)

var DefaultConfig = Config{
	Datapath:          "bpf",
	DatapathAttach:    AttachAuto,
	BPFRoot:           "/sys/fs/bpf",
	LBMaglevTableSize: 1021,
	LBServiceMapMax:   1 << 16,
	LBBackendMapMax:   1 << 20,
	// Half a million established flows (two entries each); a quarter
	// as many new ones: under a flood of R new flows a second, a
	// handshake completes if it takes less than LBConntrackNewMax/(2R).
	LBConntrackMax:    1 << 20,
	LBConntrackNewMax: 1 << 18,
	LBAffinityMax:     1 << 16,
	// Longer than a client's SYN retries (about 2 minutes on Linux) and
	// than the withdrawal of the VIP's route is expected to take.
	LBRemovedVIPGrace: 5 * time.Minute,
	// Linux's limit of the ICMP errors a node sends (icmp_msgs_per_sec,
	// icmp_msgs_burst).
	LBRejectRate:           1000,
	LBRejectBurst:          50,
	DatapathServiceMetrics: true,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("datapath", def.Datapath, "Datapath that forwards the frontends: bpf or none (tables only)")
	flags.String("datapath-attach", def.DatapathAttach, "How the program is attached to --devices: tcx (Linux 6.6 or newer, pinned links), tc (a filter on the clsact qdisc, Linux 5.10 or newer) or auto (tcx where the kernel has it, else tc)")
	flags.StringSlice("devices", def.Devices, "Interfaces the datapath attaches to; auto: those up with a global unicast address at start (the uplink and a CNI bridge)")
	flags.String("bpf-root", def.BPFRoot, "Mount point of the BPF filesystem; maps are pinned under <bpf-root>/l4xds")
	flags.Uint("lb-maglev-table-size", def.LBMaglevTableSize, "Size of each service's Maglev lookup table (a prime); a service's usable backends must fit in it")
	flags.Uint("lb-service-map-max", def.LBServiceMapMax, "Entries of the service map: the most frontends (VIP, port, protocol) the datapath serves")
	flags.Uint("lb-backend-map-max", def.LBBackendMapMax, "Entries of the backend map: the most backends the datapath holds, counted per frontend")
	flags.Uint("lb-conntrack-max", def.LBConntrackMax, "Entries of the conntrack map of established flows, two per flow (forward and reply); a changed size makes the map anew at start, with the entries of the old one")
	flags.Uint("lb-conntrack-new-max", def.LBConntrackNewMax, "Entries of the conntrack map of flows not established yet (TCP before the client's ACK of the backend's SYN-ACK, UDP before the backend's first answer), two per flow; floods of new flows churn this map only")
	flags.Uint("lb-affinity-max", def.LBAffinityMax, "Entries of the client affinity map: clients of services with session affinity (one per client and service), written once a flow is established")
	flags.Bool("datapath-service-metrics", def.DatapathServiceMetrics, "Export the packet, byte and drop counters of every frontend (l4xds_datapath_service_*): 13 series per frontend; the drops no frontend is charged with are exported either way")
	flags.Duration("lb-removed-vip-grace", def.LBRemovedVIPGrace, "How long packets to a VIP whose last frontend was removed are still dropped (counted as removed vip) rather than passed to the node's stack, which may route them back; 0: not at all")
	flags.Uint("lb-reject-rate", def.LBRejectRate, "Rejects (TCP RST, ICMP port unreachable to the new flows a frontend refuses) the node sends a second at most, each CPU its share; beyond, refused packets are dropped (counted as reject limit); 0: none are sent")
	flags.Uint("lb-reject-burst", def.LBRejectBurst, "The most rejects the node sends at once, the bucket that --lb-reject-rate refills, each CPU its share (at least one)")
}

// Validate reports the first bad setting, naming its flag.
func (c Config) Validate() error {
	switch c.Datapath {
	case "none", "bpf":
	default:
		return fmt.Errorf("--datapath: %q is not bpf or none", c.Datapath)
	}
	switch c.DatapathAttach {
	case AttachAuto, AttachTCX, AttachTC:
	default:
		return fmt.Errorf("--datapath-attach: %q is not auto, tcx or tc", c.DatapathAttach)
	}
	// The bound first: trial division of a huge value takes seconds.
	if c.LBMaglevTableSize > MaxMaglevTableSize {
		return fmt.Errorf("--lb-maglev-table-size: %d is larger than %d", c.LBMaglevTableSize, MaxMaglevTableSize)
	}
	if !isPrime(c.LBMaglevTableSize) {
		return fmt.Errorf("--lb-maglev-table-size: %d is not a prime", c.LBMaglevTableSize)
	}
	if c.LBServiceMapMax < 1 || c.LBServiceMapMax > MaxServiceMapMax {
		return fmt.Errorf("--lb-service-map-max: %d is not in 1..%d", c.LBServiceMapMax, MaxServiceMapMax)
	}
	if c.LBRemovedVIPGrace < 0 {
		return fmt.Errorf("--lb-removed-vip-grace: %s is negative", c.LBRemovedVIPGrace)
	}
	if c.LBRejectRate > MaxRejectRate {
		return fmt.Errorf("--lb-reject-rate: %d is not in 0..%d", c.LBRejectRate, MaxRejectRate)
	}
	if c.LBRejectBurst < 1 || c.LBRejectBurst > MaxRejectBurst {
		return fmt.Errorf("--lb-reject-burst: %d is not in 1..%d", c.LBRejectBurst, MaxRejectBurst)
	}
	if c.LBBackendMapMax < 1 || c.LBBackendMapMax > MaxBackendMapMax {
		return fmt.Errorf("--lb-backend-map-max: %d is not in 1..%d", c.LBBackendMapMax, MaxBackendMapMax)
	}
	for _, f := range []struct {
		flag string
		v    uint
	}{
		{"--lb-conntrack-max", c.LBConntrackMax},
		{"--lb-conntrack-new-max", c.LBConntrackNewMax},
		{"--lb-affinity-max", c.LBAffinityMax},
	} {
		if f.v < MinFlowMapMax || f.v > MaxFlowMapMax {
			return fmt.Errorf("%s: %d is not in %d..%d", f.flag, f.v, MinFlowMapMax, MaxFlowMapMax)
		}
	}
	return nil
}

// capacity is what the maps hold, as configured: the reconciler refuses a
// frontend that does not fit, with an error naming the flag, rather than
// leaving it half written.
type capacity struct {
	// services and backends are the numbers of IDs: service IDs are
	// 1..services, backend IDs 1..backends.
	services, backends uint32
	maglevSize         uint32
	// sourceRanges is the size of the source-range map (not a flag).
	sourceRanges uint32
}

func (c Config) capacity() capacity {
	return capacity{
		services:   uint32(min(c.LBServiceMapMax, MaxServiceID)),
		backends:   uint32(c.LBBackendMapMax),
		maglevSize: uint32(c.LBMaglevTableSize),
		// The source-range map is not sized by a flag.
		sourceRanges: sourceRangeMapMax,
	}
}

// sourceRangeMapMax is the size of l4xds_srcrange (LB_SOURCE_RANGES_MAX).
const sourceRangeMapMax = 65536

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
