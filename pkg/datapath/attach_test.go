// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/test/netns"
)

// attachment is what holds a program at a device's ingress: the tcx
// programs and the tc filters of its clsact qdisc.
type attachment struct {
	tcx []ebpf.ProgramID
	tc  []*netlink.BpfFilter
}

func (a attachment) String() string {
	var tc []string
	for _, f := range a.tc {
		tc = append(tc, fmt.Sprintf("{%s prio %d handle %#x program %d direct-action %v}", f.Name, f.Priority, f.Handle, f.Id, f.DirectAction))
	}
	return fmt.Sprintf("tcx programs %v, tc filters [%s]", a.tcx, strings.Join(tc, " "))
}

// attachedAt lists what is attached at the ingress of dev, either way.
func attachedAt(t *testing.T, dev string) attachment {
	t.Helper()
	var a attachment
	for _, p := range tcxIngress(t, dev) {
		a.tcx = append(a.tcx, p.ID)
	}
	a.tc = tcIngress(t, dev)
	return a
}

// tcIngress lists the BPF filters at the clsact ingress of dev.
func tcIngress(t *testing.T, dev string) []*netlink.BpfFilter {
	t.Helper()
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatalf("tc filters at the ingress of %s: %v", dev, err)
	}
	var out []*netlink.BpfFilter
	for _, f := range filters {
		if b, ok := f.(*netlink.BpfFilter); ok {
			out = append(out, b)
		}
	}
	return out
}

// only returns the one program attached at dev, failing unless there is
// exactly one, attached the way mode says.
func only(t *testing.T, dev, mode string) ebpf.ProgramID {
	t.Helper()
	a := attachedAt(t, dev)
	switch {
	case mode == AttachTCX && len(a.tcx) == 1 && len(a.tc) == 0:
		return a.tcx[0]
	case mode == AttachTC && len(a.tcx) == 0 && len(a.tc) == 1:
		f := a.tc[0]
		if f.Priority != tcPriority || f.Handle != tcHandle || !f.DirectAction || f.Name != tcFilterName {
			t.Fatalf("%s: %s; want the filter %s at priority %d, handle %#x, direct-action", dev, a, tcFilterName, tcPriority, tcHandle)
		}
		return ebpf.ProgramID(f.Id)
	}
	t.Fatalf("%s: %s; want one program, attached with %s", dev, a, mode)
	return 0
}

// loadMode loads the datapath on root and devices, attached with mode.
func loadMode(t *testing.T, mode, root string, devices ...string) (*Datapath, *logBuffer) {
	t.Helper()
	cfg := testConfig(root, devices...)
	cfg.DatapathAttach = mode
	log, logs := testLogger(t)
	dp, err := Load(log, cfg)
	if err != nil {
		t.Fatalf("load with --datapath-attach=%s: %v", mode, err)
	}
	return dp, logs
}

// needTCX skips a test of the tcx attachment on a kernel without tcx
// (older than 6.6), where only tc can be tested.
func needTCX(t *testing.T) {
	t.Helper()
	ok, err := haveTCX()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skip("the kernel has no tcx (Linux 6.6 or newer)")
	}
}

// With tc, the program is held by a filter on the device's clsact qdisc,
// not by a link: it stays when the agent stops, and the next agent replaces
// the program of the same filter (priority and handle), not adding one. A
// device leaving --devices loses the filter; the qdisc, which others may
// use, stays.
func TestPrivilegedTCAttachReplacesTheFilterInPlace(t *testing.T) {
	needRoot(t)
	root, dev := bpffs(t), testDevice(t)

	dp, logs := loadMode(t, AttachTC, root, dev)
	first := only(t, dev, AttachTC)
	if !strings.Contains(logs.String(), `hook="tc ingress"`) {
		t.Errorf("the attachment is not logged with its hook:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(root, PinDir, TCDir, dev)); err != nil {
		t.Errorf("the record of the tc filter: %v", err)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	// The agent is down: the program stays attached.
	if id := only(t, dev, AttachTC); id != first {
		t.Fatalf("after close: program %d attached, want %d", id, first)
	}

	dp, logs = loadMode(t, AttachTC, root, dev)
	dp.Close()
	if id := only(t, dev, AttachTC); id == first {
		t.Errorf("after reload: still program %d, want the new one", first)
	}
	if !strings.Contains(logs.String(), "Datapath program replaced on the tc filter") {
		t.Errorf("the replacement is not logged:\n%s", logs)
	}

	// The device leaves --devices.
	dp, _ = loadMode(t, AttachTC, root)
	dp.Close()
	if a := attachedAt(t, dev); len(a.tcx)+len(a.tc) != 0 {
		t.Errorf("device no longer in --devices: %s", a)
	}
	if _, err := os.Stat(filepath.Join(root, PinDir, TCDir, dev)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record of a removed device's filter: %v", err)
	}
	if !hasClsact(t, dev) {
		t.Errorf("the clsact qdisc of %s was removed with the filter", dev)
	}
}

func hasClsact(t *testing.T, dev string) bool {
	t.Helper()
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			return true
		}
	}
	return false
}

// Each switch of --datapath-attach leaves one program at the device: the
// new attachment is made before the other is removed.
func TestPrivilegedSwitchingAttachModesLeavesOneAttachment(t *testing.T) {
	needRoot(t)
	needTCX(t)
	root, dev := bpffs(t), testDevice(t)
	for _, mode := range []string{AttachTC, AttachTCX, AttachTC, AttachAuto, AttachTC, AttachTC, AttachTCX, AttachTCX} {
		dp, _ := loadMode(t, mode, root, dev)
		dp.Close()
		want := mode
		if mode == AttachAuto {
			want = AttachTCX // the kernel has tcx
		}
		only(t, dev, want)
		_, linkErr := os.Stat(filepath.Join(root, PinDir, LinksDir, dev))
		_, tcErr := os.Stat(filepath.Join(root, PinDir, TCDir, dev))
		if (linkErr == nil) != (want == AttachTCX) || (tcErr == nil) != (want == AttachTC) {
			t.Errorf("after --datapath-attach=%s: link pin %v, tc record %v", mode, linkErr, tcErr)
		}
	}
}

// A filter of a previous agent found on a device without its record (the
// bpffs was cleared): the tcx agent removes it all the same.
func TestPrivilegedTCXRemovesAnUnrecordedFilter(t *testing.T) {
	needRoot(t)
	needTCX(t)
	dev := testDevice(t)
	dp, _ := loadMode(t, AttachTC, bpffs(t), dev)
	dp.Close()
	dp, _ = loadMode(t, AttachTCX, bpffs(t), dev)
	dp.Close()
	only(t, dev, AttachTCX)
}

// A device with an ingress qdisc (not clsact) is someone else's
// configuration: tc mode names it rather than replacing it.
func TestPrivilegedTCRefusesAnIngressQdisc(t *testing.T) {
	needRoot(t)
	dev := testDevice(t)
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscAdd(ingress); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(bpffs(t), dev)
	cfg.DatapathAttach = AttachTC
	log, _ := testLogger(t)
	_, err = Load(log, cfg)
	want := fmt.Sprintf("--devices: %s: the device has an ingress qdisc, not clsact", dev)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("load: %v, want %q", err, want)
	}
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, q := range qdiscs {
		kinds = append(kinds, q.Type())
	}
	if !strings.Contains(strings.Join(kinds, " "), "ingress") {
		t.Errorf("qdiscs of %s after the refused load: %v, want the ingress qdisc kept", dev, kinds)
	}
}

// Real packets into a device while the agent restarts, attached with tc:
// every packet is processed by a program, the old one or the new one (each
// counts it in the pinned stats), none goes to the stack unprocessed, and
// the device ends with one filter.
func TestPrivilegedTCRestartsUnderTraffic(t *testing.T) {
	needRoot(t)
	mode := AttachTC
	if m := netns.DatapathAttach(); m != AttachAuto {
		mode = m
	}
	root, dev := bpffs(t), testDevice(t)
	// The peer sends to the VIP through the device: a route and a
	// neighbor entry for it, so no ARP is waited for.
	devIface, err := net.InterfaceByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	netns.IP(t, "addr", "add", "10.0.0.2/24", "dev", dev+"p")
	netns.IP(t, "link", "set", dev+"p", "up")
	netns.IP(t, "route", "add", "10.1.2.3/32", "dev", dev+"p")
	netns.IP(t, "neigh", "add", "10.1.2.3", "lladdr", devIface.HardwareAddr.String(), "dev", dev+"p", "nud", "permanent")

	dp, _ := loadMode(t, mode, root, dev)
	o, db := restoredOps(t, dp)
	// Port 9 of the VIP is no frontend's: each packet is dropped and
	// counted as an unknown port, charged to no frontend.
	f := &lb.Frontend{FrontendParams: lb.FrontendParams{Address: fe("10.1.2.3:7777/UDP")}, Backends: []*lb.Backend{be("192.168.1.10:7777")}}
	if err := o.Update(context.Background(), db.ReadTxn(), 1, f); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2)}, &net.UDPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var sent atomic.Uint64
	stop, done := make(chan struct{}), make(chan error)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := conn.Write([]byte("l4xds")); err != nil {
				done <- err
				return
			}
			sent.Add(1)
		}
	}()
	const restarts = 5
	for range restarts {
		// Some packets for each program.
		for n := sent.Load(); sent.Load() < n+100; {
			time.Sleep(time.Millisecond)
		}
		dp, _ := loadMode(t, mode, root, dev)
		dp.Close()
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("sending: %v", err)
	}
	only(t, dev, mode)

	maps, err := OpenPinnedMaps(root)
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	var counted uint64
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := maps.ServiceStats(0)
		if err != nil {
			t.Fatal(err)
		}
		if counted = s.Drops[DropUnknownPort]; counted >= sent.Load() || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if counted != sent.Load() {
		t.Fatalf("%d packets sent across %d restarts, %d processed by the program (%d not)", sent.Load(), restarts, counted, sent.Load()-counted)
	}
	t.Logf("%d packets across %d restarts with --datapath-attach=%s, all processed", sent.Load(), restarts, mode)
}
