// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// Drop reasons of lb_stats.drops (bpf/l4xds.h).
const (
	dropNoBackend   = 0
	dropSourceRange = 1
)

// serviceStats reads the per-service counters of the frontend from the
// pinned maps (bpf/l4xds.h): the service id from l4xds_services, then
// l4xds_stats at that id, summed over the CPUs.
func (e *lbEnv) serviceStats(t *testing.T, f frontend) bpf.L4xdsLbStats {
	t.Helper()
	pins := filepath.Join(e.bpfRoot, "l4xds")
	services, err := ebpf.LoadPinnedMap(filepath.Join(pins, "l4xds_services"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("opening the pinned services map: %v", err)
	}
	defer services.Close()
	var svc bpf.L4xdsLbSvc
	if err := services.Lookup(svcKey(f), &svc); err != nil {
		t.Fatalf("service %s in l4xds_services: %v", f, err)
	}
	stats, err := ebpf.LoadPinnedMap(filepath.Join(pins, "l4xds_stats"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("opening the pinned stats map: %v", err)
	}
	defer stats.Close()
	var perCPU []bpf.L4xdsLbStats
	if err := stats.Lookup(svc.Id, &perCPU); err != nil {
		t.Fatalf("stats of %s (service id %d): %v", f, svc.Id, err)
	}
	var sum bpf.L4xdsLbStats
	for _, s := range perCPU {
		sum.Packets += s.Packets
		sum.Bytes += s.Bytes
		for i := range sum.Drops {
			sum.Drops[i] += s.Drops[i]
		}
	}
	return sum
}

// svcKey is the l4xds_services key of a frontend: the address IPv4-mapped
// and the port in network order, as bpf/l4xds.h lays them out.
func svcKey(f frontend) bpf.L4xdsLbSvcKey {
	a16 := netip.MustParseAddr(f.vip).As16()
	var k bpf.L4xdsLbSvcKey
	for i := range k.Addr {
		k.Addr[i] = binary.NativeEndian.Uint32(a16[4*i:])
	}
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], f.port)
	k.Port = binary.NativeEndian.Uint16(port[:])
	switch f.proto {
	case "TCP":
		k.Proto = 6
	case "UDP":
		k.Proto = 17
	default:
		panic(fmt.Sprintf("frontend %s: protocol %q", f, f.proto))
	}
	return k
}

// dropNames are the lb_stats.drops reasons (bpf/l4xds.h), for logs.
var dropNames = []string{"no backend", "source range", "unknown port", "fragment", "malformed", "backend family"}

// statsDiff says what a service's counters gained between two reads.
func statsDiff(before, after bpf.L4xdsLbStats) string {
	s := fmt.Sprintf("+%d packets, +%d bytes", after.Packets-before.Packets, after.Bytes-before.Bytes)
	for i := range after.Drops {
		if d := after.Drops[i] - before.Drops[i]; d != 0 {
			name := fmt.Sprintf("reason %d", i)
			if i < len(dropNames) {
				name = dropNames[i]
			}
			s += fmt.Sprintf(", +%d %s drops", d, name)
		}
	}
	return s
}
