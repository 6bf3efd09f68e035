// SPDX-License-Identifier: Apache-2.0

// Package netns builds the network-namespace topology of the privileged
// end-to-end tests: a client, a load balancer and backends, each in its own
// network namespace.
//
//	client (10.0.0.2, fd00::2) ── eth0 ═ c0 ── LB (10.0.0.1, fd00::1)
//	                                           br0 (192.168.1.1, fd01::1)
//	backend i (192.168.1.1i, fd01::1i) ── eth0 ═ bi ─┘
//
// The client and the backends route everything through the LB, which
// forwards (rp_filter off) and is where the datapath attaches: a packet from
// the client to a VIP enters the LB on c0, a backend's reply enters it on
// bi and then br0. Interfaces are created inside the namespaces, so their
// names never collide with the host's or another topology's; namespaces
// carry a per-topology prefix.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Interfaces of the LB namespace.
const (
	// ClientDevice faces the client.
	ClientDevice = "c0"
	// BridgeDevice joins the backends' veths.
	BridgeDevice = "br0"
)

// Addresses of the client and the LB.
var (
	ClientIPv4  = netip.MustParseAddr("10.0.0.2")
	ClientIPv6  = netip.MustParseAddr("fd00::2")
	LBIPv4      = netip.MustParseAddr("10.0.0.1")
	LBIPv6      = netip.MustParseAddr("fd00::1")
	BridgeIPv4  = netip.MustParseAddr("192.168.1.1")
	BridgeIPv6  = netip.MustParseAddr("fd01::1")
	maxBackends = 90 // 192.168.1.10 .. 192.168.1.99
)

// Backend is one backend namespace.
type Backend struct {
	NS string
	// Device is the backend's veth end in the LB namespace (a bridge port).
	Device     string
	IPv4, IPv6 netip.Addr
}

// Topology is a set of namespaces made by New; Delete removes them.
type Topology struct {
	Prefix   string
	Client   string
	LB       string
	Backends []Backend
}

// BackendIPv4 is the IPv4 address of backend i (192.168.1.1i).
func BackendIPv4(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 1, byte(10 + i)}) }

// BackendIPv6 is the IPv6 address of backend i (fd01::1i, the same digits).
func BackendIPv6(i int) netip.Addr {
	return netip.MustParseAddr("fd01::" + strconv.Itoa(10+i))
}

// UniquePrefix names a topology: "l4x" and 6 random hex digits, so that
// parallel and leftover runs never share a namespace.
func UniquePrefix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return "l4x" + hex.EncodeToString(b)
}

// New creates the topology with the given number of backends. On error,
// what was created is deleted again.
func New(prefix string, backends int) (*Topology, error) {
	if backends < 1 || backends > maxBackends {
		return nil, fmt.Errorf("netns: %d backends: want 1..%d", backends, maxBackends)
	}
	t := &Topology{Prefix: prefix, Client: prefix + "-client", LB: prefix + "-lb"}
	for i := range backends {
		t.Backends = append(t.Backends, Backend{
			NS:     fmt.Sprintf("%s-b%d", prefix, i),
			Device: fmt.Sprintf("b%d", i),
			IPv4:   BackendIPv4(i),
			IPv6:   BackendIPv6(i),
		})
	}
	if err := t.create(); err != nil {
		return nil, errors.Join(err, t.Delete())
	}
	return t, nil
}

// Namespaces lists every namespace of the topology.
func (t *Topology) Namespaces() []string {
	ns := []string{t.Client, t.LB}
	for _, b := range t.Backends {
		ns = append(ns, b.NS)
	}
	return ns
}

func (t *Topology) create() error {
	for _, ns := range t.Namespaces() {
		if err := ip("netns", "add", ns); err != nil {
			return err
		}
		// No duplicate address detection: addresses are usable at once.
		if err := sysctl(ns, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"); err != nil {
			return err
		}
		if err := ip("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	lb := t.LB
	// The LB forwards; rp_filter off because replies and DNATed packets
	// cross interfaces a strict reverse-path check would not expect.
	if err := sysctl(lb,
		"net.ipv4.ip_forward=1",
		"net.ipv6.conf.all.forwarding=1",
		"net.ipv4.conf.all.rp_filter=0",
		"net.ipv4.conf.default.rp_filter=0"); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", lb, "link", "add", ClientDevice, "type", "veth", "peer", "name", "eth0", "netns", t.Client},
		{"-n", lb, "addr", "add", LBIPv4.String() + "/24", "dev", ClientDevice},
		{"-n", lb, "addr", "add", LBIPv6.String() + "/64", "dev", ClientDevice, "nodad"},
		{"-n", lb, "link", "set", ClientDevice, "up"},
		{"-n", lb, "link", "add", BridgeDevice, "type", "bridge"},
		{"-n", lb, "addr", "add", BridgeIPv4.String() + "/24", "dev", BridgeDevice},
		{"-n", lb, "addr", "add", BridgeIPv6.String() + "/64", "dev", BridgeDevice, "nodad"},
		{"-n", lb, "link", "set", BridgeDevice, "up"},

		{"-n", t.Client, "addr", "add", ClientIPv4.String() + "/24", "dev", "eth0"},
		{"-n", t.Client, "addr", "add", ClientIPv6.String() + "/64", "dev", "eth0", "nodad"},
		{"-n", t.Client, "link", "set", "eth0", "up"},
		{"-n", t.Client, "route", "add", "default", "via", LBIPv4.String()},
		{"-n", t.Client, "-6", "route", "add", "default", "via", LBIPv6.String()},
	}
	for _, b := range t.Backends {
		steps = append(steps,
			[]string{"-n", lb, "link", "add", b.Device, "type", "veth", "peer", "name", "eth0", "netns", b.NS},
			[]string{"-n", lb, "link", "set", b.Device, "master", BridgeDevice},
			[]string{"-n", lb, "link", "set", b.Device, "up"},
			[]string{"-n", b.NS, "addr", "add", b.IPv4.String() + "/24", "dev", "eth0"},
			[]string{"-n", b.NS, "addr", "add", b.IPv6.String() + "/64", "dev", "eth0", "nodad"},
			[]string{"-n", b.NS, "link", "set", "eth0", "up"},
			[]string{"-n", b.NS, "route", "add", "default", "via", BridgeIPv4.String()},
			[]string{"-n", b.NS, "-6", "route", "add", "default", "via", BridgeIPv6.String()},
		)
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	// Devices created above inherited rp_filter from "default" already;
	// setting them explicitly keeps the LB loose whatever the host's
	// defaults were when the namespace was made.
	devs := []string{ClientDevice, BridgeDevice}
	for _, b := range t.Backends {
		devs = append(devs, b.Device)
	}
	var kv []string
	for _, d := range devs {
		kv = append(kv, "net.ipv4.conf."+d+".rp_filter=0")
	}
	return sysctl(lb, kv...)
}

// Delete ends the processes left in the topology's namespaces (all of them
// were started in them, by their pid) and deletes the namespaces, which
// removes their interfaces. Namespaces already gone are not an error.
func (t *Topology) Delete() error {
	var errs []error
	for _, ns := range t.Namespaces() {
		if _, err := os.Stat("/run/netns/" + ns); err != nil {
			continue
		}
		killPIDs(ns)
		if err := ip("netns", "delete", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killPIDs kills what still runs in namespace ns and waits briefly for it to
// go: a namespace with a live process outlives `ip netns delete`.
func killPIDs(ns string) {
	for range 50 {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command runs name with args in namespace ns (`ip netns exec`, which execs
// in place: the command's pid is the process's).
func Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

func ip(args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// sysctl writes key=value settings under /proc/sys from inside ns (a
// shell, not sysctl(8), which minimal systems lack).
func sysctl(ns string, settings ...string) error {
	var script []string
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		script = append(script, fmt.Sprintf("echo %s > /proc/sys/%s", v, strings.ReplaceAll(k, ".", "/")))
	}
	out, err := Command(context.Background(), ns, "sh", "-ec", strings.Join(script, "\n")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w: %s", strings.Join(settings, " "), ns, err, bytes.TrimSpace(out))
	}
	return nil
}
