// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/job"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// The per-CPU counters have a slot per service ID the service map can
// hold, and slot 0: --lb-service-map-max sizes them, not the largest
// possible ID.
func TestPrivilegedStatsMapFollowsTheServiceMap(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBServiceMapMax = 100
	dp := load(t, cfg)
	if got := dp.objs.L4xdsStats.MaxEntries(); got != 101 {
		t.Errorf("%s: %d entries at --lb-service-map-max=100, want 101", bpf.L4xdsMapL4xdsStats, got)
	}
	dp.Close()

	// At the largest service map, every service ID 1..65535 and slot 0.
	root = bpffs(t)
	cfg = testConfig(root)
	cfg.LBServiceMapMax = MaxServiceMapMax
	dp = load(t, cfg)
	if got := dp.objs.L4xdsStats.MaxEntries(); got != MaxServiceID+1 {
		t.Errorf("%s: %d entries at --lb-service-map-max=%d, want %d", bpf.L4xdsMapL4xdsStats, got, MaxServiceMapMax, MaxServiceID+1)
	}
	dp.Close()
}

// A stats map pinned at another size (an agent that sized it for every
// possible service ID) is made anew at the size of the service map, with
// the counters of the services it has.
func TestPrivilegedStatsMapMadeAnewKeepsTheCounters(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBServiceMapMax = 100
	load(t, cfg).Close()

	// The pin of an earlier agent: 65536 slots, service 7 has counted.
	pin := filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsStats)
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	spec, err := bpf.LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	oldSpec := spec.Maps[bpf.L4xdsMapL4xdsStats].Copy()
	oldSpec.Pinning = ebpf.PinNone
	old, err := ebpf.NewMap(oldSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if old.MaxEntries() != 65536 {
		t.Fatalf("old stats map: %d entries", old.MaxEntries())
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]bpf.L4xdsLbStats, cpus)
	counts[0].Packets, counts[0].Drops[DropNoBackend] = 5, 2
	if err := old.Put(uint32(7), counts); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(pin); err != nil {
		t.Fatal(err)
	}

	dp := load(t, cfg)
	defer dp.Close()
	if !dp.Staged() {
		t.Fatal("the stats map of another size is not made anew")
	}
	if got := dp.objs.L4xdsStats.MaxEntries(); got != 101 {
		t.Errorf("new stats map: %d entries, want 101", got)
	}
	s, err := dp.Maps.ServiceStats(7)
	if err != nil {
		t.Fatal(err)
	}
	if s.Packets != 5 || s.Drops[DropNoBackend] != 2 {
		t.Errorf("service 7's counters in the new map: %+v, want 5 packets and 2 no-backend drops", s)
	}
}

// The estimate of a map's memory is the kernel's own accounting
// (map_mem_usage, memlock in the map's info since Linux 6.4) for the maps
// allocated whole when made; the others are estimated at capacity, which
// the kernel reports only once they are full.
func TestPrivilegedMapBytesAreTheKernels(t *testing.T) {
	needRoot(t)
	if ok, err := kernelAtLeast(6, 4); err != nil || !ok {
		t.Skipf("the kernel's memlock is its map_mem_usage from Linux 6.4 (%v)", err)
	}
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBServiceMapMax, cfg.LBConntrackMax, cfg.LBConntrackNewMax, cfg.LBAffinityMax = 1000, 1<<16, 1<<14, 5000
	dp := load(t, cfg)
	defer dp.Close()
	checked := 0
	for _, u := range dp.usages {
		m, err := mapByName(&dp.objs.L4xdsMaps, u.Pin)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		memlock, _ := info.Memlock()
		t.Logf("%-14s %-14s estimate %10d kernel %10d preallocated %v", u.Name, u.Type, u.Bytes, memlock, u.Preallocated)
		if !u.Preallocated {
			// The kernel counts what they hold.
			continue
		}
		checked++
		if diff := float64(u.Bytes) - float64(memlock); diff > 0.05*float64(memlock) || -diff > 0.05*float64(memlock) {
			t.Errorf("%s: estimate %d bytes, the kernel accounts %d", u.Pin, u.Bytes, memlock)
		}
	}
	if checked < 5 {
		t.Errorf("%d preallocated maps compared, want the 5 LRU maps and the stats array", checked)
	}
}

// One Maglev table is what the kernel accounts for one.
func TestPrivilegedMaglevTableBytesAreTheKernels(t *testing.T) {
	needRoot(t)
	if ok, err := kernelAtLeast(6, 4); err != nil || !ok {
		t.Skipf("the kernel's memlock is its map_mem_usage from Linux 6.4 (%v)", err)
	}
	spec, err := bpf.LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	inner := spec.Maps[bpf.L4xdsMapL4xdsMaglev].InnerMap.Copy()
	for _, size := range []uint32{1021, 16381} {
		inner.MaxEntries = size
		m, err := ebpf.NewMap(inner)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if memlock, _ := info.Memlock(); memlock != maglevTableBytes(size) {
			t.Errorf("Maglev table of %d slots: estimate %d bytes, the kernel accounts %d", size, maglevTableBytes(size), memlock)
		}
	}
}

// The figures of the documentation: the stats map at 65536 service IDs on
// 128 CPUs, and at the default.
func TestMapBytesOfThePerCPUCounters(t *testing.T) {
	const value = 96 // sizeof(struct lb_stats)
	for _, c := range []struct {
		entries uint32
		cpus    int
		want    uint64
	}{
		{65536, 128, 1024 + 8*65536 + value*65536*128},
		{4097, 128, 1024 + 8*4097 + value*4097*128},
	} {
		got, prealloc := mapBytes(ebpf.PerCPUArray, 4, value, c.entries, 0, c.cpus, 0)
		if got != c.want || !prealloc {
			t.Errorf("per-CPU array of %d × %d B on %d CPUs: %d bytes (preallocated %v), want %d", c.entries, value, c.cpus, got, prealloc, c.want)
		}
	}
	if got := FormatBytes(1024 + 8*65536 + value*65536*128); got != "768.5 MiB" {
		t.Errorf("FormatBytes = %q", got)
	}
}

func TestFormatBytes(t *testing.T) {
	for b, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 3 << 30: "3.0 GiB"} {
		if got := FormatBytes(b); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", b, got, want)
		}
	}
}

// The agent logs its maps' memory at start, in one line.
func TestPrivilegedLoadLogsTheMapsMemory(t *testing.T) {
	needRoot(t)
	log, logs := testLogger(t)
	dp, err := Load(log, testConfig(bpffs(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "Datapath maps memory") {
			if line != "" {
				t.Fatalf("two lines of the maps' memory:\n%s\n%s", line, l)
			}
			line = l
		}
	}
	if line == "" {
		t.Fatal("no line of the maps' memory")
	}
	for _, n := range MapNames {
		if !strings.Contains(line, " "+n.Name+"=") {
			t.Errorf("the line does not name %s: %s", n.Name, line)
		}
	}
	for _, attr := range []string{"total=", "total_bytes=", "preallocated_bytes=", "possible_cpus="} {
		if !strings.Contains(line, attr) {
			t.Errorf("the line has no %s: %s", attr, line)
		}
	}
}

// Entries are counted in batches (hash and LRU hash), across batches and
// the buckets' boundaries, and by walking the keys (LPM trie, map of maps).
func TestPrivilegedCountEntries(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBConntrackMax = 1 << 15
	dp := load(t, cfg)
	defer dp.Close()
	ct := dp.objs.L4xdsCt
	const flows = 3*countBatch + 17
	for i := range flows {
		k := bpf.L4xdsLbCtKey{Sport: uint16(i), Dport: uint16(i >> 16), Proto: 6}
		if err := ct.Put(k, bpf.L4xdsLbCtEntry{BackendId: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := CountEntries(ct); err != nil || n != flows {
		t.Errorf("conntrack: %d entries (%v), want %d", n, err, flows)
	}
	for i := range 3 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16)
		if err := dp.Maps.putSourceRange(1, p); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := CountEntries(dp.objs.L4xdsSrcrange); err != nil || n != 3 {
		t.Errorf("source ranges: %d entries (%v), want 3", n, err)
	}
	if err := dp.Maps.newMaglev(1, make([]uint32, cfg.LBMaglevTableSize)); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.insertMaglevs(); err != nil {
		t.Fatal(err)
	}
	if n, err := CountEntries(dp.objs.L4xdsMaglev); err != nil || n != 1 {
		t.Errorf("maglev: %d entries (%v), want 1", n, err)
	}
	if n, err := CountEntries(dp.objs.L4xdsAffinity); err != nil || n != 0 {
		t.Errorf("affinity: %d entries (%v), want 0", n, err)
	}
}

// l4xds_datapath_map_capacity and l4xds_datapath_map_pressure, by the
// maps' short names; pressure once counted.
func TestPrivilegedMetricsOfTheMapsPressure(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	// Small maps: a count waits 100 times the last one's duration.
	cfg.LBServiceMapMax, cfg.LBConntrackNewMax = 10, 1024
	cfg.LBBackendMapMax, cfg.LBConntrackMax, cfg.LBAffinityMax = 1024, 4096, 1024
	count := job.NewTrigger()
	a, reg := startAgentWithRegistry(t, cfg, Hooks{CountMaps: count})
	a.upsert(t, dbService, "10.1.2.3:3306/TCP")
	a.setBackends(t, "db", "192.168.1.10:3306")
	a.initialize(t)
	a.reconciled(t)
	for i := range 256 {
		k := bpf.L4xdsLbCtKey{Sport: uint16(i), Proto: 17}
		writeEntry(t, root, bpf.L4xdsMapL4xdsCtNew, k, bpf.L4xdsLbCtEntry{BackendId: 1})
	}
	count.Trigger()
	// A count that began after the reconciliation (services first) and
	// reached conntrack_new after the writes; the one at start may still
	// run.
	eventually(t, "a count of the services and conntrack_new", func() bool {
		return testutil.ToFloat64(gaugeOf(t, reg, "l4xds_datapath_map_pressure", "services")) == 0.1 &&
			testutil.ToFloat64(gaugeOf(t, reg, "l4xds_datapath_map_pressure", "conntrack_new")) == 0.25
	})
	want := `
# HELP l4xds_datapath_map_capacity Entries a BPF map of the datapath holds at most (max_entries)
# TYPE l4xds_datapath_map_capacity gauge
l4xds_datapath_map_capacity{map="affinity"} 1024
l4xds_datapath_map_capacity{map="backends"} 1024
l4xds_datapath_map_capacity{map="conntrack"} 4096
l4xds_datapath_map_capacity{map="conntrack_new"} 1024
l4xds_datapath_map_capacity{map="fragments"} 8192
l4xds_datapath_map_capacity{map="maglev"} 10
l4xds_datapath_map_capacity{map="old_vips"} 4096
l4xds_datapath_map_capacity{map="services"} 10
l4xds_datapath_map_capacity{map="source_ranges"} 65536
l4xds_datapath_map_capacity{map="stats"} 11
l4xds_datapath_map_capacity{map="vips"} 10
# HELP l4xds_datapath_map_pressure Fill of a BPF map of the datapath: entries / capacity (0..1), counted periodically
# TYPE l4xds_datapath_map_pressure gauge
l4xds_datapath_map_pressure{map="affinity"} 0
l4xds_datapath_map_pressure{map="backends"} 0.0009765625
l4xds_datapath_map_pressure{map="conntrack"} 0
l4xds_datapath_map_pressure{map="conntrack_new"} 0.25
l4xds_datapath_map_pressure{map="fragments"} 0
l4xds_datapath_map_pressure{map="maglev"} 0
l4xds_datapath_map_pressure{map="old_vips"} 0
l4xds_datapath_map_pressure{map="services"} 0.1
l4xds_datapath_map_pressure{map="source_ranges"} 3.0517578125e-05
l4xds_datapath_map_pressure{map="vips"} 0.1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"l4xds_datapath_map_capacity", "l4xds_datapath_map_pressure"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "l4xds_datapath_map_memory_bytes"); n != len(MapNames) {
		t.Errorf("%d series of l4xds_datapath_map_memory_bytes, want %d", n, len(MapNames))
	}
}

// gaugeOf is the gauge series of name with map="mapName", as a collector
// (0 until it exists).
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, mapName string) prometheus.Collector {
	t.Helper()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "value"})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "map" && l.GetValue() == mapName {
					g.Set(m.GetGauge().GetValue())
				}
			}
		}
	}
	return g
}

// kernelAtLeast reports whether the running kernel is major.minor or newer.
func kernelAtLeast(major, minor int) (bool, error) {
	release, err := kernelRelease()
	if err != nil {
		return false, err
	}
	v, ok := parseKernelRelease(release)
	if !ok {
		return false, fmt.Errorf("kernel release %q", release)
	}
	return !v.less(KernelVersion{major, minor}), nil
}
