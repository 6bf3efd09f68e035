// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// flowMaps are the maps of flows (conntrack and affinity), sized by
// --lb-conntrack-max, --lb-conntrack-new-max and --lb-affinity-max.
var flowMaps = []string{bpf.L4xdsMapL4xdsCt, bpf.L4xdsMapL4xdsCtNew, bpf.L4xdsMapL4xdsAffinity}

// copyFlows fills the flow maps made anew for another size with the
// entries of their pins, so that established flows keep their backend and
// their reverse NAT across the change. Not when the ID maps are made anew
// too: the entries name the old IDs. What the attached program writes
// into the old maps between this copy and Commit (right after it when
// only flow maps are new, see Load) is lost; a flow's next packet writes
// its entries again. Entries beyond a smaller map's size are
// evicted, least recently used first (see copyEntries).
func copyFlows(log *slog.Logger, objs *bpf.L4xdsMaps, staged []string, dir string) error {
	if slices.Contains(staged, bpf.L4xdsMapL4xdsServices) || slices.Contains(staged, bpf.L4xdsMapL4xdsBackends) {
		return nil
	}
	for _, name := range flowMaps {
		if !slices.Contains(staged, name) {
			continue
		}
		to, err := mapByName(objs, name)
		if err != nil {
			return err
		}
		from, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", name, err)
		}
		n, err := copyEntries(from, to)
		from.Close()
		if err != nil {
			return fmt.Errorf("copy the entries of %s into its new map: %w", name, err)
		}
		if n >= 0 {
			log.Info("Entries copied into the map made anew", "map", name, "entries", n,
				"from_size", from.MaxEntries(), "to_size", to.MaxEntries())
		}
	}
	return nil
}

// onlyFlowMaps reports whether the maps made anew are flow maps only.
func onlyFlowMaps(staged []string) bool {
	for _, name := range staged {
		if !slices.Contains(flowMaps, name) {
			return false
		}
	}
	return true
}

// copyEntries copies every entry of from into to, if their keys and
// values have the same sizes (-1 if not). Into a smaller map, the entries
// go in the order of their last use, the flows seen last last: the LRU
// evicts those put first, and the old map's own order (its hash order)
// would have it evict live flows and keep idle ones.
func copyEntries(from, to *ebpf.Map) (int, error) {
	if from.KeySize() != to.KeySize() || from.ValueSize() != to.ValueSize() {
		return -1, nil
	}
	if from.MaxEntries() > to.MaxEntries() {
		return copyByLastUse(from, to)
	}
	k, v := make([]byte, from.KeySize()), make([]byte, from.ValueSize())
	n := 0
	it := from.Iterate()
	for it.Next(k, v) {
		if err := to.Put(k, v); err != nil {
			return n, err
		}
		n++
	}
	return n, it.Err()
}

// copyByLastUse copies the entries of a flow map in the order of their
// last use: the values of the flow maps start with its time
// (lb_ct_entry.last_seen, lb_affinity.last_used).
func copyByLastUse(from, to *ebpf.Map) (int, error) {
	type entry struct {
		lastUse uint64
		k, v    []byte
	}
	var entries []entry
	k, v := make([]byte, from.KeySize()), make([]byte, from.ValueSize())
	it := from.Iterate()
	for it.Next(k, v) {
		entries = append(entries, entry{binary.NativeEndian.Uint64(v), slices.Clone(k), slices.Clone(v)})
	}
	if err := it.Err(); err != nil {
		return 0, err
	}
	slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.lastUse, b.lastUse) })
	for i, e := range entries {
		if err := to.Put(e.k, e.v); err != nil {
			return i, err
		}
	}
	return len(entries), nil
}
