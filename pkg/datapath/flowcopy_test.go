// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// A conntrack map made smaller than the flows it holds keeps the flows
// that were seen last: those are the live ones. The old map's iteration
// order (its hash order) says nothing of that, and filling the new map in
// it would evict live flows and keep idle ones.
func TestPrivilegedShrunkConntrackKeepsTheRecentFlows(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBConntrackMax = 8192
	dp := load(t, cfg)
	now, err := Ktime()
	if err != nil {
		t.Fatal(err)
	}
	const idle, live = 4096, 1024
	key := func(i int) bpf.L4xdsLbCtKey {
		return bpf.L4xdsLbCtKey{Saddr: addrToBPF(netip.MustParseAddr("10.0.0.2")), Daddr: addrToBPF(netip.MustParseAddr("10.1.2.3")),
			Sport: portToBPF(uint16(10000 + i)), Dport: portToBPF(3306), Proto: ipprotoTCP, Dir: ctForward}
	}
	// The idle flows were last seen just after boot, not "an hour ago":
	// on a machine up for less than that, now-1h wraps around to the
	// far future, and the idle flows would be the newest.
	for i := range idle + live {
		v := bpf.L4xdsLbCtEntry{LastSeen: uint64(1 + i), BackendId: 3, SvcId: 2}
		if i >= idle {
			v.LastSeen = uint64(now) + uint64(i)
		}
		if err := dp.objs.L4xdsCt.Put(key(i), &v); err != nil {
			t.Fatal(err)
		}
	}
	dp.Close()

	cfg.LBConntrackMax = 4096
	log, _ := testLogger(t)
	dp, err = Load(log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsCt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	lost := 0
	for i := idle; i < idle+live; i++ {
		var v bpf.L4xdsLbCtEntry
		if err := m.Lookup(key(i), &v); errors.Is(err, ebpf.ErrKeyNotExist) {
			lost++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if lost > 0 {
		t.Errorf("%d of the %d flows seen last lost in the map made smaller (%d entries for %d flows)", lost, live, m.MaxEntries(), idle+live)
	}
}

// copyByLastUse reads the time of last use from the first 8 bytes of the
// flow maps' values.
func TestFlowMapValuesStartWithTheirLastUse(t *testing.T) {
	if off := unsafe.Offsetof(bpf.L4xdsLbCtEntry{}.LastSeen); off != 0 {
		t.Errorf("lb_ct_entry.last_seen at offset %d, want 0", off)
	}
	if off := unsafe.Offsetof(bpf.L4xdsLbAffinity{}.LastUsed); off != 0 {
		t.Errorf("lb_affinity.last_used at offset %d, want 0", off)
	}
}

// Flow maps made anew for new sizes are used at once, not once the
// control plane's first full state is in (which may be long): the ID maps
// are the pinned ones, which need nothing from it, and every flow
// established by the previous program after the copy would be lost at the
// switch (a backend's reply without its entry passes untranslated, and the
// client resets the connection).
func TestPrivilegedResizedFlowMapsAreUsedAtOnce(t *testing.T) {
	needRoot(t)
	root := bpffs(t)
	cfg := testConfig(root)
	cfg.LBConntrackMax = 8192
	load(t, cfg).Close()

	cfg.LBConntrackMax = 4096
	log, _ := testLogger(t)
	dp, err := Load(log, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if dp.Staged() {
		t.Errorf("flow maps of new sizes wait for the control plane before they are used")
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, PinDir, bpf.L4xdsMapL4xdsCt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.MaxEntries() != 4096 {
		t.Errorf("pinned %s of %d entries once loaded, want the new map's 4096", bpf.L4xdsMapL4xdsCt, m.MaxEntries())
	}
}
