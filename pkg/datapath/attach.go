// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The values of --datapath-attach.
const (
	// AttachAuto attaches with tcx where the kernel has it, else with tc.
	AttachAuto = "auto"
	// AttachTCX attaches with a tcx link per device (Linux 6.6+), pinned
	// under <bpf-root>/l4xds/links.
	AttachTCX = "tcx"
	// AttachTC attaches with a BPF filter in direct-action mode on the
	// device's clsact qdisc, at ingress: how Cilium attaches on kernels
	// without tcx.
	AttachTC = "tc"
)

// TCDir records, one empty directory per device, the devices that have a
// tc filter of the agent, under <bpf-root>/l4xds: a filter is no link and
// cannot be pinned, and a device that leaves --devices must lose its filter.
const TCDir = "tc"

// The program's tc filter: its own priority, so that it never replaces
// another's filter (Cilium's take priority 1), after them as a tcx link is
// after the links attached before it; the filter is replaced in place, at
// the same priority and handle.
const (
	tcPriority   = 0x4c34 // "L4"
	tcHandle     = 1
	tcFilterName = "l4xds_ingress"
)

// The tcx and tc verdicts are the same numbers: TCX_NEXT, TCX_PASS,
// TCX_DROP and TCX_REDIRECT are TC_ACT_UNSPEC (-1), TC_ACT_OK (0),
// TC_ACT_SHOT (2) and TC_ACT_REDIRECT (7), which a direct-action filter
// returns. TC_ACT_UNSPEC goes on to the next filter, and past the last one
// to the stack, as TCX_NEXT does. So one program serves both attachments.

// attachMode resolves --datapath-attach: auto is tcx where the kernel has
// it, else tc.
func attachMode(mode string) (string, error) { return resolveAttach(mode, haveTCX) }

// resolveAttach is attachMode with the kernel's answer from probe.
func resolveAttach(mode string, probe func() (bool, error)) (string, error) {
	if mode == AttachTC {
		return AttachTC, nil
	}
	tcx, err := probe()
	if err != nil {
		return "", err
	}
	switch {
	case tcx:
		return AttachTCX, nil
	case mode == AttachTCX:
		return "", errors.New("--datapath-attach=tcx: the kernel has no tcx (Linux 6.6 or newer); tc or auto attaches with a tc filter")
	}
	return AttachTC, nil
}

// haveTCX reports whether the kernel attaches programs with tcx links: as
// cilium/ebpf's own probe, a link to an interface index that cannot exist,
// which a kernel with tcx refuses with ENODEV.
func haveTCX() (bool, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return false, fmt.Errorf("probe for tcx: load a program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	switch {
	case err == nil:
		l.Close()
		return true, nil
	case errors.Is(err, unix.ENODEV):
		return true, nil
	case errors.Is(err, ebpf.ErrNotSupported):
		return false, nil
	}
	return false, fmt.Errorf("probe for tcx: %w", err)
}

// attachTC attaches prog to the ingress of iface with the agent's tc filter,
// adding a clsact qdisc if the device has none. The program of an existing
// filter is replaced in one step (no packet goes unprocessed).
func attachTC(log *slog.Logger, prog *ebpf.Program, iface *net.Interface, record string) error {
	l, err := netlink.LinkByIndex(iface.Index)
	if err != nil {
		return err
	}
	if err := ensureClsact(l); err != nil {
		return err
	}
	existing, err := tcFilter(l)
	if err != nil {
		return err
	}
	f := &netlink.BpfFilter{
		FilterAttrs:  tcFilterAttrs(iface.Index),
		Fd:           prog.FD(),
		Name:         tcFilterName,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("attach a tc filter (clsact ingress, priority %d, handle %#x): %w", tcPriority, tcHandle, err)
	}
	if err := os.Mkdir(record, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("record the tc filter at %s: %w", record, err)
	}
	if existing != nil {
		log.Info("Datapath program replaced on the tc filter", "device", iface.Name)
		return nil
	}
	log.Info("Datapath program attached", "device", iface.Name, "hook", "tc ingress")
	return nil
}

// ensureClsact adds a clsact qdisc to the device unless it has one. An
// ingress qdisc (the older hook, in the same place) is someone else's
// configuration: replacing it would drop their filters.
func ensureClsact(l netlink.Link) error {
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list the qdiscs: %w", err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent != netlink.HANDLE_INGRESS {
			continue
		}
		if q.Type() == "clsact" {
			return nil
		}
		return fmt.Errorf("the device has an %s qdisc, not clsact: remove it (tc qdisc del dev %s %s) or attach with --datapath-attach=tcx",
			q.Type(), l.Attrs().Name, q.Type())
	}
	clsact := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(clsact); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add a clsact qdisc: %w", err)
	}
	return nil
}

func tcFilterAttrs(ifindex int) netlink.FilterAttrs {
	return netlink.FilterAttrs{
		LinkIndex: ifindex,
		Parent:    netlink.HANDLE_MIN_INGRESS,
		Handle:    tcHandle,
		Priority:  tcPriority,
		Protocol:  unix.ETH_P_ALL,
	}
}

// tcFilter returns the agent's filter at the ingress of l, or nil.
func tcFilter(l netlink.Link) (*netlink.BpfFilter, error) {
	filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return nil, fmt.Errorf("list the tc filters at ingress: %w", err)
	}
	for _, f := range filters {
		b, ok := f.(*netlink.BpfFilter)
		if ok && b.Priority == tcPriority && b.Handle == tcHandle && b.Name == tcFilterName {
			return b, nil
		}
	}
	return nil, nil
}

// detachTC removes the agent's tc filter from the device named dev, if the
// device and the filter are there, and then its record.
func detachTC(dev, record string) (bool, error) {
	removed := false
	l, err := netlink.LinkByName(dev)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		// Gone with the device.
	case err != nil:
		return false, err
	default:
		f, err := tcFilter(l)
		if err != nil {
			return false, err
		}
		if f != nil {
			// A filter is removed by its priority and handle.
			err := netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: tcFilterAttrs(l.Attrs().Index)})
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				return false, fmt.Errorf("remove the tc filter: %w", err)
			}
			removed = true
		}
	}
	if err := os.Remove(record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return removed, fmt.Errorf("remove the record %s: %w", record, err)
	}
	return removed, nil
}

// tcRecords lists the devices recorded under dir.
func tcRecords(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, e := range entries {
		devs = append(devs, e.Name())
	}
	return devs, nil
}
