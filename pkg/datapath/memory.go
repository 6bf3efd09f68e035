// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// MapNames are the short names of the datapath's maps by pin name: the
// values of the map label of l4xds_datapath_map_capacity and
// l4xds_datapath_map_pressure, and the names l4xds-dbg status prints. In
// the order they are printed.
var MapNames = []struct{ Pin, Name string }{
	{bpf.L4xdsMapL4xdsServices, "services"},
	{bpf.L4xdsMapL4xdsBackends, "backends"},
	{bpf.L4xdsMapL4xdsMaglev, "maglev"},
	{bpf.L4xdsMapL4xdsVips, "vips"},
	{bpf.L4xdsMapL4xdsOldVips, "old_vips"},
	{bpf.L4xdsMapL4xdsSrcrange, "source_ranges"},
	{bpf.L4xdsMapL4xdsCt, "conntrack"},
	{bpf.L4xdsMapL4xdsCtNew, "conntrack_new"},
	{bpf.L4xdsMapL4xdsAffinity, "affinity"},
	{bpf.L4xdsMapL4xdsFrags, "fragments"},
	{bpf.L4xdsMapL4xdsStats, "stats"},
}

// MapUsage is what one of the datapath's maps can hold, holds, and takes
// of kernel memory.
type MapUsage struct {
	// Name is the short name (MapNames), Pin the map's name in the
	// BPF filesystem.
	Name string `json:"name"`
	Pin  string `json:"pin"`
	Type string `json:"type"`
	// Capacity is the map's max_entries.
	Capacity uint32 `json:"capacity"`
	// Entries is how many it holds; -1 when not counted, and for arrays,
	// whose slots all exist (the stats map has a slot per service ID).
	Entries int `json:"entries"`
	// Bytes is the kernel memory the map takes when full (see mapBytes);
	// Preallocated says the kernel allocates all of it when the map is
	// made, whatever the map holds.
	Bytes        uint64 `json:"bytes"`
	Preallocated bool   `json:"preallocated"`
	// Counted is when Entries were counted; zero when they were not.
	Counted time.Time `json:"counted,omitzero"`
}

// MapsTableName is the table of the datapath's maps (--datapath=bpf): one
// row per map, its usage as last counted.
const MapsTableName = "bpf-maps"

// MapByName is the primary index of MapsTableName: the short name.
var MapByName = statedb.Index[*MapUsage, string]{
	Name: "name",
	FromObject: func(u *MapUsage) index.KeySet {
		return index.NewKeySet(index.String(u.Name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewMapsTable registers MapsTableName in db.
func NewMapsTable(db *statedb.DB) (statedb.RWTable[*MapUsage], error) {
	return statedb.NewTable(db, MapsTableName, MapByName)
}

func (u *MapUsage) TableHeader() []string {
	return []string{"Name", "Pin", "Type", "Entries", "Capacity", "Pressure", "Bytes", "Preallocated", "Counted"}
}

func (u *MapUsage) TableRow() []string {
	entries, pressure, counted := "-", "-", "-"
	if p := u.Pressure(); p >= 0 {
		entries, pressure = strconv.Itoa(u.Entries), fmt.Sprintf("%.1f%%", 100*p)
	}
	if !u.Counted.IsZero() {
		counted = u.Counted.UTC().Format(time.RFC3339)
	}
	return []string{u.Name, u.Pin, u.Type, entries, strconv.FormatUint(uint64(u.Capacity), 10), pressure,
		FormatBytes(u.Bytes), strconv.FormatBool(u.Preallocated), counted}
}

// Pressure is Entries/Capacity, or -1 when the entries are not counted.
func (u MapUsage) Pressure() float64 {
	if u.Entries < 0 || u.Capacity == 0 {
		return -1
	}
	return float64(u.Entries) / float64(u.Capacity)
}

// Counted reports whether the map's entries are counted: not for arrays.
func counted(t ebpf.MapType) bool {
	return t != ebpf.Array && t != ebpf.PerCPUArray
}

// The layout constants of the kernel's maps (64-bit, Linux 6.x) that the
// estimate uses, from kernel/bpf/hashtab.c, arraymap.c and lpm_trie.c.
const (
	kernelPage = 4096
	// sizeof(struct htab_elem) up to its key: a hlist_nulls_node, the
	// LRU node or per-CPU pointer, the hash.
	htabElemHeader = 48
	// sizeof(struct bucket): the list head and its spinlock.
	htabBucket = 16
	// HASHTAB_MAP_LOCK_COUNT ints per possible CPU.
	htabLocksPerCPU = 8 * 4
	// A map's own struct (struct bpf_htab, bpf_array): about 1 KiB.
	mapHeader = 1024
	// A freed element of a map without preallocation is kept on a
	// list by the BPF memory allocator.
	llistNode = 8
	// sizeof(struct lpm_trie_node) up to its data.
	lpmNodeHeader = 40
)

// mapBytes estimates the kernel memory of a map when full, after the
// kernel's own accounting (map_mem_usage, which bpftool shows as memlock
// on Linux 6.4 and later):
//
//   - hash and LRU hash: a bucket (16 B) per entry rounded up to a power
//     of two, and an element per entry of 48 B + key + value, each rounded
//     up to 8 B; the LRU hash and the hash without BPF_F_NO_PREALLOC
//     allocate every element when made, the others as they fill (8 B more
//     each). A per-CPU value is a pointer in the element and value × CPUs;
//   - array: value × entries, page aligned when BPF_F_MMAPABLE; per-CPU:
//     value × entries × possible CPUs, plus a pointer per entry;
//   - LPM trie: a node of 40 B + key + value per entry, and as many
//     intermediate nodes at worst;
//   - hash of maps: the outer hash (a pointer per value) and innerBytes
//     per entry, the inner maps it holds when full.
//
// cpus is the number of possible CPUs. Values of a map are rounded up to
// 8 B, as the kernel does.
func mapBytes(t ebpf.MapType, keySize, valueSize, maxEntries uint32, flags uint32, cpus int, innerBytes uint64) (bytes uint64, prealloc bool) {
	key, value, n, c := round8(keySize), round8(valueSize), uint64(maxEntries), uint64(cpus)
	noPrealloc := flags&noPreallocFlag != 0
	switch t {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.HashOfMaps:
		percpu := t == ebpf.PerCPUHash || t == ebpf.LRUCPUHash
		elem := htabElemHeader + key
		switch {
		case percpu:
			elem += 8
		case t == ebpf.HashOfMaps:
			elem += 8 // the inner map's pointer
		default:
			elem += value
		}
		b := uint64(mapHeader) + htabBucket*roundPow2(n) + htabLocksPerCPU*c
		// A map of maps is mostly its inner maps, made as it fills.
		prealloc = (!noPrealloc || t == ebpf.LRUHash || t == ebpf.LRUCPUHash) && t != ebpf.HashOfMaps
		if !prealloc {
			elem += llistNode
		}
		b += elem * n
		if percpu {
			b += value * c * n
		}
		if t == ebpf.HashOfMaps {
			b += innerBytes * n
		}
		return b, prealloc
	case ebpf.Array:
		if flags&mmapableFlag != 0 {
			return pageAlign(mapHeader) + pageAlign(value*n), true
		}
		return mapHeader + value*n, true
	case ebpf.PerCPUArray:
		return mapHeader + 8*n + value*n*c, true
	case ebpf.LPMTrie:
		// The key's first 4 bytes are the prefix length, not stored.
		data := uint64(keySize) - 4
		return mapHeader + (lpmNodeHeader+data+uint64(valueSize))*n + (lpmNodeHeader+data)*n, false
	}
	return mapHeader + (key+value)*n, true
}

// BPF_F_NO_PREALLOC and BPF_F_MMAPABLE.
const (
	noPreallocFlag = 1 << 0
	mmapableFlag   = 1 << 10
)

func round8(v uint32) uint64 { return (uint64(v) + 7) &^ 7 }

func pageAlign(v uint64) uint64 { return (v + kernelPage - 1) &^ (kernelPage - 1) }

func roundPow2(v uint64) uint64 {
	p := uint64(1)
	for p < v {
		p <<= 1
	}
	return p
}

// usageOf is the usage of map m named pin, not counted yet. innerBytes is
// what one Maglev table takes.
func usageOf(pin, name string, m *ebpf.Map, cpus int, innerBytes uint64) MapUsage {
	u := MapUsage{Name: name, Pin: pin, Type: m.Type().String(), Capacity: m.MaxEntries(), Entries: -1}
	u.Bytes, u.Preallocated = mapBytes(m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), m.Flags(), cpus, innerBytes)
	return u
}

// maglevTableBytes is the memory of one Maglev table of size slots (an
// mmapable array of u32).
func maglevTableBytes(size uint32) uint64 {
	b, _ := mapBytes(ebpf.Array, 4, 4, size, mmapableFlag, 1, 0)
	return b
}

// MapUsages is the usage of every map in MapNames order.
type MapUsages []MapUsage

// Total is the kernel memory of all maps when full, and the part of it
// allocated whatever they hold.
func (us MapUsages) Total() (bytes, preallocated uint64) {
	for _, u := range us {
		bytes += u.Bytes
		if u.Preallocated {
			preallocated += u.Bytes
		}
	}
	return bytes, preallocated
}

// Counted is when the entries were last counted: the oldest count.
func (us MapUsages) Counted() time.Time {
	var t time.Time
	for _, u := range us {
		if !u.Counted.IsZero() && (t.IsZero() || u.Counted.Before(t)) {
			t = u.Counted
		}
	}
	return t
}

// SortUsages orders us as MapNames.
func SortUsages(us MapUsages) {
	idx := func(name string) int {
		return slices.IndexFunc(MapNames, func(n struct{ Pin, Name string }) bool { return n.Name == name })
	}
	slices.SortFunc(us, func(a, b MapUsage) int { return idx(a.Name) - idx(b.Name) })
}

// LogAttrs are the attributes of the log line of the maps' memory: the
// totals, then each map's bytes under its short name.
func (us MapUsages) LogAttrs(cpus int) []any {
	total, prealloc := us.Total()
	attrs := []any{"total", FormatBytes(total), "total_bytes", total, "preallocated_bytes", prealloc, "possible_cpus", cpus}
	for _, u := range us {
		attrs = append(attrs, u.Name, u.Bytes)
	}
	return attrs
}

// FormatBytes prints a size in binary units: "1.5 GiB", "512 KiB", "96 B".
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}

// usages is the usage of each map of objs, not counted.
func usages(objs *bpf.L4xdsMaps, cpus int, maglevSize uint32) (MapUsages, error) {
	inner := maglevTableBytes(maglevSize)
	var us MapUsages
	for _, n := range MapNames {
		m, err := mapByName(objs, n.Pin)
		if err != nil {
			return nil, err
		}
		us = append(us, usageOf(n.Pin, n.Name, m, cpus, inner))
	}
	return us, nil
}

// PinnedMapUsages opens the maps pinned under <bpfRoot>/l4xds read-only
// and returns their usage with their entries counted (CountEntries).
// maglevSize is the agent's --lb-maglev-table-size. A map not pinned is
// left out.
func PinnedMapUsages(bpfRoot string, maglevSize uint32) (MapUsages, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	inner := maglevTableBytes(maglevSize)
	dir := filepath.Join(bpfRoot, PinDir)
	var us MapUsages
	for _, n := range MapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, n.Pin), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", n.Pin, err)
		}
		u := usageOf(n.Pin, n.Name, m, cpus, inner)
		if counted(m.Type()) {
			u.Entries, err = CountEntries(m)
			u.Counted = time.Now()
		}
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("count the entries of %s: %w", n.Pin, err)
		}
		us = append(us, u)
	}
	return us, nil
}

// countBatch is the number of entries a batch lookup reads at once.
const countBatch = 4096

// CountEntries counts the entries of a hash-like map. A hash or LRU hash
// is read in batches of countBatch entries (BPF_MAP_LOOKUP_BATCH: one
// syscall per batch, which holds each bucket's lock only while it copies
// that bucket, so the datapath's writers wait for a bucket at most);
// other maps (the LPM trie and the map of maps, which the datapath's
// packets never write) by walking their keys, one syscall per entry.
// Entries written or evicted while it counts may or may not be counted.
func CountEntries(m *ebpf.Map) (int, error) {
	if m.Type() == ebpf.Hash || m.Type() == ebpf.LRUHash {
		n, err := countBatched(m)
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, ebpf.ErrNotSupported) {
			return n, err
		}
		// A kernel without batch lookups for this map type.
	}
	return countKeys(m)
}

func countBatched(m *ebpf.Map) (int, error) {
	for size := countBatch; ; size *= 4 {
		n, err := countBatchedSize(m, size)
		if errors.Is(err, unix.ENOSPC) && size < int(m.MaxEntries()) {
			// A bucket holds more entries than a batch: retry larger.
			continue
		}
		return n, err
	}
}

func countBatchedSize(m *ebpf.Map, size int) (int, error) {
	keys, values := byteArrays(m.KeySize(), size), byteArrays(m.ValueSize(), size)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// byteArrays is a slice of n zeroed [size]byte, the buffer of a batch.
func byteArrays(size uint32, n int) any {
	t := reflect.ArrayOf(int(size), reflect.TypeFor[byte]())
	return reflect.MakeSlice(reflect.SliceOf(t), n, n).Interface()
}

// countKeys walks the keys of m. A key deleted under the walk restarts it
// from the first key (the kernel's BPF_MAP_GET_NEXT_KEY): the count stops
// at the map's capacity.
func countKeys(m *ebpf.Map) (int, error) {
	key, next := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	var k any // nil: the first key
	n := 0
	for n < int(m.MaxEntries()) {
		if err := m.NextKey(k, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, nil
			}
			return n, err
		}
		n++
		copy(key, next)
		k = key
	}
	return n, nil
}
