// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

// LinksDir holds a pinned tcx link per device, named after the device,
// under <bpf-root>/l4xds (--datapath-attach=tcx).
const LinksDir = "links"

// bpfFSMagic is BPF_FS_MAGIC, the statfs type of a BPF filesystem.
const bpfFSMagic = 0xcafe4a11

// Datapath is the loaded programs and maps and their attachments to the
// devices. Everything is pinned or held by the kernel: closing it (the agent
// stopping or crashing) leaves the programs attached and forwarding with
// the maps as they are. A tcx link is pinned; a tc filter is no link, and
// the device itself holds it until the next agent replaces its program.
type Datapath struct {
	Maps *Maps

	dir   string
	objs  bpf.L4xdsObjects
	links []link.Link
	// mode is how the program is attached: AttachTCX or AttachTC.
	mode string

	// staged names the maps made anew because the pinned ones are
	// incompatible (--lb-maglev-table-size changed, a new layout). Until
	// Commit, they are unpinned and the program is not attached: the
	// previous program keeps forwarding with the pinned maps while the
	// reconciler fills the new ones.
	staged  []string
	devices []string
}

// Load loads the datapath with the maps pinned under <cfg.BPFRoot>/l4xds,
// reusing the maps already pinned there, and attaches the program to
// cfg.Devices, replacing the program of links or filters already there (no
// gap). Devices no longer in cfg.Devices are detached, and so is an
// attachment of the other kind (--datapath-attach changed). When a pinned
// map is incompatible, the program is not attached yet: see Staged.
func Load(log *slog.Logger, cfg Config) (_ *Datapath, err error) {
	release, err := kernelRelease()
	if err != nil {
		return nil, err
	}
	if err := checkKernel(release); err != nil {
		return nil, err
	}
	// Name missing capabilities before the memlock probe blames the rlimit.
	eff, err := effectiveCapabilities()
	if err != nil {
		return nil, fmt.Errorf("read the effective capabilities: %w", err)
	}
	capWarning, capErr := capabilityProblems(eff)
	if capErr != nil {
		return nil, capErr
	}
	if capWarning != "" {
		log.Warn(capWarning)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raise the memlock limit: %w", err)
	}
	if err := ensureBPFFS(log, cfg.BPFRoot); err != nil {
		return nil, err
	}
	mode, err := attachMode(cfg.DatapathAttach)
	if err != nil {
		return nil, err
	}
	log.Info("Datapath attachment", "mode", mode, "datapath-attach", cfg.DatapathAttach, "kernel", release)
	dir := filepath.Join(cfg.BPFRoot, PinDir)
	for _, sub := range []string{LinksDir, TCDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}

	spec, err := bpf.LoadL4xds()
	if err != nil {
		return nil, fmt.Errorf("read the datapath objects: %w", err)
	}
	size := uint32(cfg.LBMaglevTableSize)
	if err := spec.Variables[bpf.L4xdsVarMaglevSize].Set(size); err != nil {
		return nil, fmt.Errorf("set %s: %w", bpf.L4xdsVarMaglevSize, err)
	}
	cpus, err := onlineCPUs()
	if err != nil {
		return nil, fmt.Errorf("--lb-reject-rate: the CPUs that share it: %w", err)
	}
	interval, burst := rejectLimit(cfg.LBRejectRate, cfg.LBRejectBurst, cpus)
	log.Info("Reject limit", "lb-reject-rate", cfg.LBRejectRate, "lb-reject-burst", cfg.LBRejectBurst,
		"cpus", cpus, "per-cpu-interval", time.Duration(interval), "per-cpu-burst", time.Duration(burst))
	if err := spec.Variables[bpf.L4xdsVarRejectIntervalNs].Set(interval); err != nil {
		return nil, fmt.Errorf("set %s: %w", bpf.L4xdsVarRejectIntervalNs, err)
	}
	if err := spec.Variables[bpf.L4xdsVarRejectBurstNs].Set(burst); err != nil {
		return nil, fmt.Errorf("set %s: %w", bpf.L4xdsVarRejectBurstNs, err)
	}
	inner := spec.Maps[bpf.L4xdsMapL4xdsMaglev].InnerMap
	inner.MaxEntries = size
	// The maps keyed by service (or by VIP, of which there are no more
	// than services) hold --lb-service-map-max entries.
	for _, name := range []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsMaglev, bpf.L4xdsMapL4xdsVips} {
		spec.Maps[name].MaxEntries = uint32(cfg.LBServiceMapMax)
	}
	spec.Maps[bpf.L4xdsMapL4xdsBackends].MaxEntries = uint32(cfg.LBBackendMapMax)
	spec.Maps[bpf.L4xdsMapL4xdsCt].MaxEntries = uint32(cfg.LBConntrackMax)
	spec.Maps[bpf.L4xdsMapL4xdsCtNew].MaxEntries = uint32(cfg.LBConntrackNewMax)
	spec.Maps[bpf.L4xdsMapL4xdsAffinity].MaxEntries = uint32(cfg.LBAffinityMax)
	if mode == AttachTC {
		// The program's section names tcx; a tc filter takes any
		// SchedCLS program, and a kernel before tcx knows no such
		// expected attach type.
		spec.Programs[bpf.L4xdsProgL4xdsIngress].AttachType = ebpf.AttachNone
	}
	if err := keepPinnedSizes(log, spec, dir); err != nil {
		return nil, err
	}
	d := &Datapath{dir: dir, mode: mode}
	if d.staged, err = incompatiblePins(log, spec, dir); err != nil {
		return nil, err
	}
	d.staged = withIDMaps(d.staged)
	for _, name := range d.staged {
		spec.Maps[name].Pinning = ebpf.PinNone
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		return nil, fmt.Errorf("load the datapath: %w", err)
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if d.Maps, err = newMaps(&d.objs.L4xdsMaps, inner.Copy()); err != nil {
		return nil, err
	}
	d.Maps.removedVIPGrace = cfg.LBRemovedVIPGrace
	if err = copyFlows(log, &d.objs.L4xdsMaps, d.staged, dir); err != nil {
		return nil, err
	}
	devices, err := resolveDevices(cfg.Devices)
	if err != nil {
		return nil, fmt.Errorf("--devices: detect: %w", err)
	}
	if slices.Contains(cfg.Devices, AutoDevices) {
		log.Info("Devices detected", "devices", devices)
	}
	d.devices = devices
	if len(d.staged) > 0 && !onlyFlowMaps(d.staged) {
		log.Info("The attached program keeps forwarding with the pinned maps until the new maps are filled", "new", d.staged)
		return d, nil
	}
	if len(d.staged) > 0 {
		// Only flow maps, filled by copyFlows: the ID maps are the
		// pinned ones, which need nothing from the control plane.
		// Used at once, so that the flows the previous program
		// establishes after the copy are not lost.
		log.Info("The flow maps made anew are used at once", "new", d.staged)
		if err := d.Commit(log); err != nil {
			return nil, err
		}
		return d, nil
	}
	if err := d.attach(log, devices); err != nil {
		return nil, err
	}
	return d, nil
}

// Staged reports whether Commit must follow: maps were made anew, and the
// program that uses them is not attached yet.
func (d *Datapath) Staged() bool { return len(d.staged) > 0 }

// Commit attaches the program, whose new maps the reconciler has filled,
// in place of the previous one (an atomic replacement on each pinned link),
// then pins the new maps in place of the incompatible ones, which go with
// the previous program. An agent that dies before the pins are replaced
// finds the old ones incompatible again and stages anew.
func (d *Datapath) Commit(log *slog.Logger) error {
	if err := d.attach(log, d.devices); err != nil {
		return err
	}
	for len(d.staged) > 0 {
		name := d.staged[0]
		m, err := mapByName(&d.objs.L4xdsMaps, name)
		if err != nil {
			return err
		}
		path := filepath.Join(d.dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin the incompatible map %s: %w", path, err)
		}
		if err := m.Pin(path); err != nil {
			return fmt.Errorf("pin the new map %s: %w", path, err)
		}
		log.Info("New map pinned in place of the incompatible one", "map", name)
		d.staged = d.staged[1:]
	}
	return nil
}

// Close closes the handles; the pins, and with them the links and maps,
// stay.
func (d *Datapath) Close() error {
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}

// ensureBPFFS mounts a BPF filesystem at root unless there is one, as
// Cilium does: the pins live there.
func ensureBPFFS(log *slog.Logger, root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("--bpf-root: %w", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		return fmt.Errorf("--bpf-root: statfs %s: %w", root, err)
	}
	if uint32(st.Type) == bpfFSMagic {
		return nil
	}
	if err := syscall.Mount("bpffs", root, "bpf", 0, ""); err != nil {
		return fmt.Errorf("--bpf-root: %s is not a BPF filesystem, and mounting one failed: %w", root, err)
	}
	log.Info("Mounted a BPF filesystem at --bpf-root", "path", root)
	return nil
}

// idMaps are the maps that hold or are keyed by service and backend IDs.
var idMaps = []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsMaglev, bpf.L4xdsMapL4xdsVips, bpf.L4xdsMapL4xdsBackends}

// keepPinnedSizes gives the maps that hold IDs the size of their pins: a
// map made anew at another size would be filled with new IDs while the
// conntrack entries of established flows name the old ones. A changed
// --lb-service-map-max or --lb-backend-map-max takes effect once these
// pins are gone (the agent stopped and <bpf-root>/l4xds removed).
func keepPinnedSizes(log *slog.Logger, spec *ebpf.CollectionSpec, dir string) error {
	for _, name := range idMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", name, err)
		}
		pinned, want := m.MaxEntries(), spec.Maps[name].MaxEntries
		m.Close()
		if pinned != want {
			log.Warn("A pinned map keeps its size; the new size takes effect once the pinned maps are removed",
				"map", name, "entries", pinned, "configured", want)
			spec.Maps[name].MaxEntries = pinned
		}
	}
	return nil
}

// capacity is what the loaded maps hold: the configured sizes, or those of
// the pinned maps that kept theirs.
func (d *Datapath) capacity(maglevSize uint32) capacity {
	return capacity{
		services:     min(d.Maps.services.MaxEntries(), MaxServiceID),
		backends:     d.Maps.backends.MaxEntries(),
		maglevSize:   maglevSize,
		sourceRanges: d.Maps.srcRange.MaxEntries(),
	}
}

// stagedTogether are the maps that hold or name service and backend IDs,
// which are restored from the services and backends maps. When either is
// made anew, the new agent assigns new IDs, which must not be written into
// maps the attached program reads: all of them are made anew together, and
// the previous program keeps a consistent set until Commit.
var stagedTogether = []string{bpf.L4xdsMapL4xdsServices, bpf.L4xdsMapL4xdsBackends, bpf.L4xdsMapL4xdsMaglev,
	bpf.L4xdsMapL4xdsSrcrange, bpf.L4xdsMapL4xdsCt, bpf.L4xdsMapL4xdsCtNew, bpf.L4xdsMapL4xdsAffinity}

// withIDMaps adds the other ID maps to staged when it holds the services
// or backends map.
func withIDMaps(staged []string) []string {
	if !slices.Contains(staged, bpf.L4xdsMapL4xdsServices) && !slices.Contains(staged, bpf.L4xdsMapL4xdsBackends) {
		return staged
	}
	for _, name := range stagedTogether {
		if !slices.Contains(staged, name) {
			staged = append(staged, name)
		}
	}
	return staged
}

// mapByName is the field of objs that bpf2go tagged with name.
func mapByName(objs *bpf.L4xdsMaps, name string) (*ebpf.Map, error) {
	v := reflect.ValueOf(objs).Elem()
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("ebpf") == name {
			return v.Field(i).Interface().(*ebpf.Map), nil
		}
	}
	return nil, fmt.Errorf("no map %s in the datapath objects", name)
}

// incompatiblePins names the pinned maps whose layout differs from spec (a
// new agent version, or --lb-maglev-table-size, --lb-service-map-max or
// --lb-backend-map-max changed): the load makes
// them anew, and the reconciler writes their entries again.
func incompatiblePins(log *slog.Logger, spec *ebpf.CollectionSpec, dir string) ([]string, error) {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		ms := spec.Maps[name]
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", path, err)
		}
		why := ms.Compatible(m)
		if why == nil && ms.InnerMap != nil {
			why = innerCompatible(m, ms.InnerMap)
		}
		m.Close()
		if why == nil {
			continue
		}
		if !errors.Is(why, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("pinned map %s: %w", path, why)
		}
		log.Warn("Pinned map is incompatible with this agent's; recreating it", "map", name, "reason", why)
		names = append(names, name)
	}
	return names, nil
}

// innerCompatible reports whether outer takes inner maps of spec: the
// kernel compares an inner array's size and flags (BPF_F_MMAPABLE) with
// those of the one the outer map was created with, which the map's info
// does not show. It tries with the reserved service ID 0, which the
// programs never look up.
func innerCompatible(outer *ebpf.Map, spec *ebpf.MapSpec) error {
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("create an inner map: %w", err)
	}
	defer inner.Close()
	const probe = uint32(0)
	if err := outer.Put(probe, inner); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("inner map: MaxEntries is not %d, or Flags is not %#x: %w", spec.MaxEntries, spec.Flags, ebpf.ErrMapIncompatible)
		}
		return fmt.Errorf("probe the inner map: %w", err)
	}
	if err := outer.Delete(probe); err != nil {
		return fmt.Errorf("remove the probe inner map: %w", err)
	}
	return nil
}

// attach attaches the program to every device, in d.mode, then detaches
// what else is attached: the devices that are no longer listed, and the
// attachments of the other mode (--datapath-attach changed; made before
// the other is removed, so that packets meet a program throughout).
func (d *Datapath) attach(log *slog.Logger, devices []string) error {
	linksDir, tcDir := filepath.Join(d.dir, LinksDir), filepath.Join(d.dir, TCDir)
	for _, dev := range devices {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return fmt.Errorf("--devices: %s: %w", dev, err)
		}
		if d.mode == AttachTC {
			if err := attachTC(log, d.objs.L4xdsIngress, iface, filepath.Join(tcDir, dev)); err != nil {
				return fmt.Errorf("--devices: %s: %w", dev, err)
			}
			continue
		}
		l, err := attachDevice(log, d.objs.L4xdsIngress, iface, filepath.Join(linksDir, dev))
		if err != nil {
			return fmt.Errorf("--devices: %s: %w", dev, err)
		}
		d.links = append(d.links, l)
	}
	if len(devices) == 0 {
		log.Warn("No --devices: the datapath is loaded but attached to no interface")
	}

	pins, err := os.ReadDir(linksDir)
	if err != nil {
		return err
	}
	for _, pin := range pins {
		if d.mode == AttachTCX && slices.Contains(devices, pin.Name()) {
			continue
		}
		if err := unpinLink(filepath.Join(linksDir, pin.Name())); err != nil {
			return fmt.Errorf("detach the tcx link of %s: %w", pin.Name(), err)
		}
		log.Info("Detached the tcx link", "device", pin.Name(), "reason", detachReason(d.mode, devices, pin.Name()))
	}
	recorded, err := tcRecords(tcDir)
	if err != nil {
		return err
	}
	if d.mode == AttachTCX {
		// Also a filter whose record is gone (the bpffs was cleared).
		for _, dev := range devices {
			if !slices.Contains(recorded, dev) {
				recorded = append(recorded, dev)
			}
		}
	}
	for _, dev := range recorded {
		if d.mode == AttachTC && slices.Contains(devices, dev) {
			continue
		}
		removed, err := detachTC(dev, filepath.Join(tcDir, dev))
		if err != nil {
			return fmt.Errorf("detach the tc filter of %s: %w", dev, err)
		}
		if removed {
			log.Info("Detached the tc filter", "device", dev, "reason", detachReason(d.mode, devices, dev))
		}
	}
	return nil
}

// detachReason says why an attachment to dev goes.
func detachReason(mode string, devices []string, dev string) string {
	if !slices.Contains(devices, dev) {
		return "no longer in --devices"
	}
	return fmt.Sprintf("attached with %s now (--datapath-attach)", mode)
}

// attachDevice updates the program of the device's pinned link, or
// attaches it with a new pinned link.
func attachDevice(log *slog.Logger, prog *ebpf.Program, iface *net.Interface, pin string) (link.Link, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if linkedTo(l, iface) {
			if err := l.Update(prog); err != nil {
				l.Close()
				return nil, fmt.Errorf("update the program of pinned link %s: %w", pin, err)
			}
			log.Info("Datapath program replaced on the pinned link", "device", iface.Name)
			return l, nil
		}
		// The device was deleted and created again: the link is defunct.
		log.Info("Pinned link is not attached to the device any more; attaching anew", "device", iface.Name)
		unpinErr := l.Unpin()
		l.Close()
		if unpinErr != nil {
			return nil, fmt.Errorf("unpin stale link %s: %w", pin, unpinErr)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("load pinned link %s: %w", pin, err)
	}

	l, err = link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return nil, fmt.Errorf("attach tcx ingress: %w", err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin link at %s: %w", pin, err)
	}
	log.Info("Datapath program attached", "device", iface.Name, "hook", "tcx ingress")
	return l, nil
}

// linkedTo reports whether l is a tcx ingress link of iface.
func linkedTo(l link.Link, iface *net.Interface) bool {
	info, err := l.Info()
	if err != nil || info.TCX() == nil {
		return false
	}
	tcx := info.TCX()
	return int(tcx.Ifindex) == iface.Index && ebpf.AttachType(tcx.AttachType) == ebpf.AttachTCXIngress
}

// unpinLink removes a pinned link, which detaches its program unless
// someone else holds the link open.
func unpinLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		// Not a link (or already gone): the pin alone is in the way.
		if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return errors.Join(err, rmErr)
		}
		return nil
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, syscall.ENOLINK) {
		return err
	}
	return l.Unpin()
}
