// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/test/netns"
)

// testConfig is the datapath on root and devices, attached as
// $L4XDS_DATAPATH_ATTACH says (auto when unset).
func testConfig(root string, devices ...string) Config {
	c := DefaultConfig
	c.BPFRoot, c.Devices = root, devices
	c.DatapathAttach = netns.DatapathAttach()
	return c
}

func load(t *testing.T, cfg Config) *Datapath {
	t.Helper()
	log, _ := testLogger(t)
	dp, err := Load(log, cfg)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return dp
}

// The tcx links (tc: TestPrivilegedTCAttachReplacesTheFilterInPlace).
func TestPrivilegedLoadAttachesOnceAndReloadsInPlace(t *testing.T) {
	needRoot(t)
	needTCX(t)
	root, dev := bpffs(t), testDevice(t)
	cfg := testConfig(root, dev)
	cfg.DatapathAttach = AttachTCX

	dp := load(t, cfg)
	progs := tcxIngress(t, dev)
	if len(progs) != 1 {
		t.Fatalf("%d programs at the tcx ingress of %s, want 1", len(progs), dev)
	}
	linkID, ok := progs[0].LinkID()
	if !ok {
		t.Fatal("the program is not attached through a link")
	}
	firstProg := progs[0].ID
	if _, err := os.Stat(filepath.Join(root, PinDir, LinksDir, dev)); err != nil {
		t.Errorf("link pin: %v", err)
	}
	for _, name := range []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsBackends, bpf.L4xdsMapL4xdsMaglev, bpf.L4xdsMapL4xdsCt} {
		if _, err := os.Stat(filepath.Join(root, PinDir, name)); err != nil {
			t.Errorf("map pin: %v", err)
		}
	}
	entry := backendToBPF(5, netip.MustParseAddrPort("192.168.1.10:3306"), lb.BackendStateActive)
	if err := dp.Maps.putBackend(42, entry); err != nil {
		t.Fatal(err)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}

	// The agent is down: the program stays attached.
	if progs := tcxIngress(t, dev); len(progs) != 1 || progs[0].ID != firstProg {
		t.Fatalf("after close: programs %+v, want only program %d", progs, firstProg)
	}

	// A second start updates the same link and reuses the maps.
	dp = load(t, cfg)
	progs = tcxIngress(t, dev)
	if len(progs) != 1 {
		t.Fatalf("after reload: %d programs at the tcx ingress, want 1", len(progs))
	}
	if id, _ := progs[0].LinkID(); id != linkID {
		t.Errorf("after reload: link %d, want the pinned link %d updated", id, linkID)
	}
	if progs[0].ID == firstProg {
		t.Errorf("after reload: still program %d, want the new one", firstProg)
	}
	var got bpf.L4xdsLbBackend
	if err := dp.Maps.backends.Lookup(uint32(42), &got); err != nil || got != entry {
		t.Errorf("backend written before the reload: %+v, %v", got, err)
	}
	dp.Close()

	// The device leaves --devices: its link is detached and unpinned.
	cfg.Devices = nil
	dp = load(t, cfg)
	dp.Close()
	if progs := tcxIngress(t, dev); len(progs) != 0 {
		t.Errorf("device no longer in --devices: %d programs still attached", len(progs))
	}
	if _, err := os.Stat(filepath.Join(root, PinDir, LinksDir, dev)); !os.IsNotExist(err) {
		t.Errorf("link pin of a removed device: %v", err)
	}
}

func TestPrivilegedLoadReattachesToARecreatedDevice(t *testing.T) {
	needRoot(t)
	for _, mode := range []string{AttachTCX, AttachTC} {
		t.Run(mode, func(t *testing.T) {
			if mode == AttachTCX {
				needTCX(t)
			}
			root, dev := bpffs(t), testDevice(t)
			dp, _ := loadMode(t, mode, root, dev)
			dp.Close()
			// Deleting the device detaches the program; a device of the
			// same name comes back with another index.
			for _, args := range [][]string{{"link", "del", dev}, {"link", "add", dev, "type", "veth", "peer", "name", dev + "p"}} {
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
			dp, logs := loadMode(t, mode, root, dev)
			dp.Close()
			only(t, dev, mode)
			if mode == AttachTCX && !strings.Contains(logs.String(), "Pinned link is not attached to the device any more") {
				t.Error("the stale link of the deleted device was not replaced")
			}
		})
	}
}

func TestPrivilegedLoadNamesAMissingDevice(t *testing.T) {
	needRoot(t)
	log, _ := testLogger(t)
	_, err := Load(log, testConfig(bpffs(t), "l4xt-missing"))
	if err == nil || !strings.Contains(err.Error(), "--devices: l4xt-missing") {
		t.Errorf("missing device: %v", err)
	}
}

func TestPrivilegedLoadMountsABPFFilesystem(t *testing.T) {
	needRoot(t)
	root := filepath.Join(t.TempDir(), "bpf")
	log, logs := testLogger(t)
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	dp, err := Load(log, testConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil || uint32(st.Type) != bpfFSMagic {
		t.Errorf("%s is not a BPF filesystem after load (%v)", root, err)
	}
	if !strings.Contains(logs.String(), "Mounted a BPF filesystem") {
		t.Errorf("the mount is not logged")
	}
}

func TestPrivilegedIncompatibleMaglevSizeRecreatesTheMap(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	dp := load(t, testConfig(root))
	if err := dp.Maps.newMaglev(7, BuildMaglev(backendsWithWeights(1, 1), 1021)); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.insertMaglevs(); err != nil {
		t.Fatal(err)
	}
	kept := backendToBPF(7, netip.MustParseAddrPort("192.168.1.10:80"), lb.BackendStateActive)
	if err := dp.Maps.putBackend(1, kept); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	cfg := testConfig(root)
	cfg.LBMaglevTableSize = 2039
	log, logs := testLogger(t)
	dp, err := Load(log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "incompatible") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "map="+bpf.L4xdsMapL4xdsMaglev) || !strings.Contains(warned[0], "MaxEntries is not 2039") {
		t.Errorf("want one warning naming %s and why, got %q", bpf.L4xdsMapL4xdsMaglev, warned)
	}
	if _, ok, err := dp.Maps.MaglevTable(7); ok || err != nil {
		t.Errorf("the old table survived the size change (%v)", err)
	}
	// Until Commit, the pin is the old map: the attached program forwards
	// with it while the reconciler fills the new one.
	pinnedSlots := func() int {
		t.Helper()
		pinned, err := OpenPinnedMaps(root)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Close()
		table, _, err := pinned.MaglevTable(7)
		if err != nil {
			t.Fatal(err)
		}
		return len(table)
	}
	if !dp.Staged() {
		t.Fatal("a datapath with a new Maglev map is not staged")
	}
	if n := pinnedSlots(); n != 1021 {
		t.Errorf("before Commit the pinned table has %d slots, want the old 1021", n)
	}
	if err := dp.Maps.newMaglev(7, BuildMaglev(backendsWithWeights(1, 1), 2039)); err != nil {
		t.Fatalf("a table of the new size: %v", err)
	}
	if err := dp.Maps.insertMaglevs(); err != nil {
		t.Fatalf("a table of the new size: %v", err)
	}
	if table, _, err := dp.Maps.MaglevTable(7); err != nil || len(table) != 2039 {
		t.Errorf("table of %d slots (%v), want 2039", len(table), err)
	}
	if err := dp.Commit(log); err != nil {
		t.Fatal(err)
	}
	if n := pinnedSlots(); n != 2039 || dp.Staged() {
		t.Errorf("after Commit the pinned table has %d slots (staged %v), want the new 2039", n, dp.Staged())
	}
	var got bpf.L4xdsLbBackend
	if err := dp.Maps.backends.Lookup(uint32(1), &got); err != nil || got != kept {
		t.Errorf("a compatible map lost its entries: %+v, %v", got, err)
	}
}

func TestPrivilegedPinnedMaglevOfUnmappableTablesIsRecreated(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	spec, err := bpf.LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	// l4xds_maglev as an agent pinned it before the tables were mappable.
	old := spec.Maps[bpf.L4xdsMapL4xdsMaglev].Copy()
	if old.InnerMap.Flags&unix.BPF_F_MMAPABLE == 0 {
		t.Fatalf("the inner map template has flags %#x, want BPF_F_MMAPABLE", old.InnerMap.Flags)
	}
	old.InnerMap.Flags &^= unix.BPF_F_MMAPABLE
	dir := filepath.Join(root, PinDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	outer, err := ebpf.NewMapWithOptions(old, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := ebpf.NewMap(old.InnerMap)
	if err != nil {
		t.Fatal(err)
	}
	if err := outer.Put(uint32(7), inner); err != nil {
		t.Fatal(err)
	}
	inner.Close()
	outer.Close()

	log, logs := testLogger(t)
	dp, err := Load(log, testConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "incompatible") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "map="+bpf.L4xdsMapL4xdsMaglev) || !strings.Contains(warned[0], "Flags is not 0x400") {
		t.Errorf("want one warning naming %s and why, got %q", bpf.L4xdsMapL4xdsMaglev, warned)
	}

	// The new map takes mappable tables, written and rewritten through the
	// mapping, and read back through the pins.
	table := BuildMaglev(backendsWithWeights(1, 1), 1021)
	if err := dp.Maps.newMaglev(7, table); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.insertMaglevs(); err != nil {
		t.Fatal(err)
	}
	if err := dp.Commit(log); err != nil {
		t.Fatal(err)
	}
	pinned, err := OpenPinnedMaps(root)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if got, ok, err := pinned.MaglevTable(7); err != nil || !ok || !slices.Equal(got, table) {
		t.Errorf("new table read back: found %v, %v, equal %v", ok, err, slices.Equal(got, table))
	}
	table = BuildMaglev(backendsWithWeights(1, 1, 1), 1021)
	if found, err := dp.Maps.rewriteMaglev(7, table); err != nil || !found {
		t.Fatalf("rewrite: found %v, %v", found, err)
	}
	if got, _, err := pinned.MaglevTable(7); err != nil || !slices.Equal(got, table) {
		t.Errorf("rewritten table read back: %v, equal %v", err, slices.Equal(got, table))
	}
	var tables *ebpf.Map
	if err := pinned.maglev.Lookup(uint32(7), &tables); err != nil {
		t.Fatal(err)
	}
	defer tables.Close()
	if tables.Flags()&unix.BPF_F_MMAPABLE == 0 {
		t.Errorf("table flags %#x, want BPF_F_MMAPABLE", tables.Flags())
	}

	// Once recreated, the map is compatible.
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	log, logs = testLogger(t)
	again, err := Load(log, testConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	if strings.Contains(logs.String(), "incompatible") {
		t.Errorf("a second load recreated a map:\n%s", logs.String())
	}
}

// A services map of another layout (an upgrade): the new agent assigns new
// IDs, so every map that holds or names IDs is made anew, and what it
// writes reaches the pins only at Commit.
func TestPrivilegedNewServicesLayoutStagesTheIDMaps(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	dp := load(t, testConfig(root))
	kept := backendToBPF(7, netip.MustParseAddrPort("192.168.1.10:80"), lb.BackendStateActive)
	if err := dp.Maps.putBackend(1, kept); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	// The services map as an agent with a shorter value pinned it.
	spec, err := bpf.LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	old := spec.Maps[bpf.L4xdsMapL4xdsServices].Copy()
	old.ValueSize -= 4
	old.Value = nil
	path := filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsServices)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMapWithOptions(old, ebpf.MapOptions{PinPath: filepath.Join(root, PinDir)})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	log, _ := testLogger(t)
	dp, err = Load(log, testConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	for _, name := range stagedTogether {
		if !slices.Contains(dp.staged, name) {
			t.Errorf("%s is not made anew with the services map (staged %v)", name, dp.staged)
		}
	}
	moved := backendToBPF(9, netip.MustParseAddrPort("192.168.1.11:80"), lb.BackendStateActive)
	if err := dp.Maps.putBackend(1, moved); err != nil {
		t.Fatal(err)
	}
	pinnedBackend := func() bpf.L4xdsLbBackend {
		t.Helper()
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsBackends), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Close()
		var be bpf.L4xdsLbBackend
		if err := pinned.Lookup(uint32(1), &be); err != nil {
			t.Fatal(err)
		}
		return be
	}
	if got := pinnedBackend(); got != kept {
		t.Errorf("before Commit the attached program's backend 1 changed: %+v", got)
	}
	if err := dp.Commit(log); err != nil {
		t.Fatal(err)
	}
	if got := pinnedBackend(); got != moved {
		t.Errorf("after Commit the pinned backend 1 is %+v, want the new agent's", got)
	}
}

// A new size of a flow map makes it anew, with the entries of the pinned
// one: established flows keep their conntrack and clients their affinity.
func TestPrivilegedFlowMapSizeChangeKeepsTheFlows(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBConntrackMax, cfg.LBConntrackNewMax, cfg.LBAffinityMax = 1024, 1024, 1024
	dp := load(t, cfg)
	ctKey := bpf.L4xdsLbCtKey{Saddr: addrToBPF(netip.MustParseAddr("10.0.0.2")), Daddr: addrToBPF(netip.MustParseAddr("10.1.2.3")),
		Sport: portToBPF(40000), Dport: portToBPF(3306), Proto: ipprotoTCP, Dir: ctForward}
	ctVal := bpf.L4xdsLbCtEntry{LastSeen: 7e9, BackendId: 3, SvcId: 2}
	newKey := ctKey
	newKey.Sport = portToBPF(40001)
	newVal := ctVal
	newVal.Flags = ctFlagNew
	affKey := bpf.L4xdsLbAffinityKey{Client: ctKey.Saddr, SvcId: 2}
	affVal := bpf.L4xdsLbAffinity{LastUsed: 7e9, BackendId: 3}
	for _, w := range []struct {
		m    *ebpf.Map
		k, v any
	}{{dp.objs.L4xdsCt, &ctKey, &ctVal}, {dp.objs.L4xdsCtNew, &newKey, &newVal}, {dp.objs.L4xdsAffinity, &affKey, &affVal}} {
		if err := w.m.Put(w.k, w.v); err != nil {
			t.Fatal(err)
		}
	}
	dp.Close()

	cfg.LBConntrackMax, cfg.LBConntrackNewMax, cfg.LBAffinityMax = 4096, 2048, 2048
	log, logs := testLogger(t)
	dp, err := Load(log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if dp.Staged() {
		t.Fatal("flow maps of new sizes wait to be used (see TestPrivilegedResizedFlowMapsAreUsedAtOnce)")
	}
	for _, c := range []struct {
		name string
		size uint32
		k    any
		got  any
		want any
	}{
		{bpf.L4xdsMapL4xdsCt, 4096, &ctKey, new(bpf.L4xdsLbCtEntry), &ctVal},
		{bpf.L4xdsMapL4xdsCtNew, 2048, &newKey, new(bpf.L4xdsLbCtEntry), &newVal},
		{bpf.L4xdsMapL4xdsAffinity, 2048, &affKey, new(bpf.L4xdsLbAffinity), &affVal},
	} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, c.name), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = m.Lookup(c.k, c.got)
		size := m.MaxEntries()
		m.Close()
		if size != c.size {
			t.Errorf("pinned %s of %d entries, want %d", c.name, size, c.size)
		}
		if err != nil || fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s after the size change: %+v, %v; want the entry of the old map %+v", c.name, c.got, err, c.want)
		}
	}
	if !strings.Contains(logs.String(), "Entries copied into the map made anew") {
		t.Errorf("no log of the copy:\n%s", logs.String())
	}
}
