// SPDX-License-Identifier: Apache-2.0

// Package netns builds the network-namespace topology of the privileged
// end-to-end tests: a client, a load balancer and backends, each in its own
// network namespace.
//
//	client (10.0.0.2, fd00::2) ── eth0 ═ c0 ── LB (10.0.0.1, fd00::1)
//	                                           br0 (192.168.1.1, fd01::1)
//	backend i (192.168.1.1i, fd01::1i) ── eth0 ═ bi ─┘
//
// NewRouted puts a router between the client and the LB instead, whose
// path to the client is narrower than the links (see NewRouted).
//
// The client and the backends route everything through the LB, which
// forwards (rp_filter off) and is where the datapath attaches: a packet from
// the client to a VIP enters the LB on c0, a backend's reply enters it on
// bi and then br0. Interfaces are created inside the namespaces, so their
// names never collide with the host's or another topology's; namespaces
// carry a per-topology prefix.
//
// Main runs a package's tests in namespaces of their own; Add, IP and Do
// give a test a namespace of its own shape and run code in it.
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
	ClientIPv4 = netip.MustParseAddr("10.0.0.2")
	ClientIPv6 = netip.MustParseAddr("fd00::2")
	LBIPv4     = netip.MustParseAddr("10.0.0.1")
	LBIPv6     = netip.MustParseAddr("fd00::1")
	BridgeIPv4 = netip.MustParseAddr("192.168.1.1")
	BridgeIPv6 = netip.MustParseAddr("fd01::1")
)

// maxBackends keeps backend i's address, 192.168.1.(10+i), within
// 192.168.1.10 .. 192.168.1.99.
const maxBackends = 90

// Addresses of a routed topology (NewRouted): the router takes the client's
// place on the LB's link, the client sits in a subnet of its own behind it.
var (
	RouterIPv4       = ClientIPv4
	RouterIPv6       = ClientIPv6
	RoutedClientIPv4 = netip.MustParseAddr("10.0.1.2")
	RoutedClientIPv6 = netip.MustParseAddr("fd00:1::2")
	routerInnerIPv4  = netip.MustParseAddr("10.0.1.1")
	routerInnerIPv6  = netip.MustParseAddr("fd00:1::1")
)

// Backend is one backend namespace.
type Backend struct {
	NS string
	// Device is the backend's veth end in the LB namespace (a bridge port).
	Device     string
	IPv4, IPv6 netip.Addr
}

// Topology is a set of namespaces made by New or NewRouted; Delete removes
// them.
type Topology struct {
	Prefix   string
	Client   string
	LB       string
	Backends []Backend
	// ClientIPv4 and ClientIPv6 are the client's addresses.
	ClientIPv4, ClientIPv6 netip.Addr
	// Router is the namespace between the client and the LB, "" when the
	// client is the LB's neighbour.
	Router string
	// ClientPathMTU is the MTU of the router's route to the client.
	ClientPathMTU int
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
	return newTopology(prefix, backends, 0)
}

// NewRouted creates the topology with a router namespace between the
// client and the LB:
//
//	client (10.0.1.2, fd00:1::2) ── eth0 ═ eth1 ── router ── eth0 (10.0.0.2, fd00::2) ═ c0 ── LB
//
// Every link has an MTU of 1500, but the router's route to the client's
// subnet has a locked MTU of pathMTU: the client advertises a TCP MSS for
// 1500, and the router, not the client, answers a larger packet (IPv4 with
// DF set, any IPv6 one) with ICMP "fragmentation needed" / ICMPv6 "packet
// too big", sent to the packet's source: for a backend's reply, the VIP.
func NewRouted(prefix string, backends, pathMTU int) (*Topology, error) {
	if pathMTU < 1280 || pathMTU >= 1500 {
		return nil, fmt.Errorf("netns: client path MTU %d: want 1280..1499 (IPv6 minimum to below the links' 1500)", pathMTU)
	}
	return newTopology(prefix, backends, pathMTU)
}

func newTopology(prefix string, backends, pathMTU int) (*Topology, error) {
	if backends < 1 || backends > maxBackends {
		return nil, fmt.Errorf("netns: %d backends: want 1..%d", backends, maxBackends)
	}
	t := &Topology{Prefix: prefix, Client: prefix + "-client", LB: prefix + "-lb",
		ClientIPv4: ClientIPv4, ClientIPv6: ClientIPv6}
	if pathMTU != 0 {
		t.Router, t.ClientPathMTU = prefix+"-router", pathMTU
		t.ClientIPv4, t.ClientIPv6 = RoutedClientIPv4, RoutedClientIPv6
	}
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
	if t.Router != "" {
		ns = append(ns, t.Router)
	}
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
	// The LB (and the router) forward; rp_filter off because replies and
	// DNATed packets cross interfaces a strict reverse-path check would not
	// expect. The client and the backends are hosts. All set explicitly: a
	// new namespace inherits the IPv4 settings of the host's (ip_forward is
	// on where Docker runs).
	for _, ns := range t.Namespaces() {
		forward := "0"
		if ns == lb || ns == t.Router {
			forward = "1"
		}
		if err := sysctl(ns,
			"net.ipv4.ip_forward="+forward,
			"net.ipv6.conf.all.forwarding="+forward,
			"net.ipv4.conf.all.rp_filter=0",
			"net.ipv4.conf.default.rp_filter=0"); err != nil {
			return err
		}
	}
	// Bridged frames skip iptables and nftables, as where br_netfilter is
	// not loaded (Docker loads it; its sysctls are then on in every new
	// namespace).
	if out, err := Command(context.Background(), lb, "sh", "-ec",
		"[ ! -d /proc/sys/net/bridge ] || for f in iptables ip6tables arptables; do echo 0 > /proc/sys/net/bridge/bridge-nf-call-$f; done").CombinedOutput(); err != nil {
		return fmt.Errorf("br_netfilter off in %s: %w: %s", lb, err, bytes.TrimSpace(out))
	}
	// The LB's neighbour on c0: the client, or the router.
	neighbour := t.Client
	if t.Router != "" {
		neighbour = t.Router
	}
	steps := [][]string{
		{"-n", lb, "link", "add", ClientDevice, "type", "veth", "peer", "name", "eth0", "netns", neighbour},
		{"-n", lb, "addr", "add", LBIPv4.String() + "/24", "dev", ClientDevice},
		{"-n", lb, "addr", "add", LBIPv6.String() + "/64", "dev", ClientDevice, "nodad"},
		{"-n", lb, "link", "set", ClientDevice, "up"},
		{"-n", lb, "link", "add", BridgeDevice, "type", "bridge"},
		{"-n", lb, "addr", "add", BridgeIPv4.String() + "/24", "dev", BridgeDevice},
		{"-n", lb, "addr", "add", BridgeIPv6.String() + "/64", "dev", BridgeDevice, "nodad"},
		{"-n", lb, "link", "set", BridgeDevice, "up"},

		{"-n", neighbour, "addr", "add", ClientIPv4.String() + "/24", "dev", "eth0"},
		{"-n", neighbour, "addr", "add", ClientIPv6.String() + "/64", "dev", "eth0", "nodad"},
		{"-n", neighbour, "link", "set", "eth0", "up"},
		{"-n", neighbour, "route", "add", "default", "via", LBIPv4.String()},
		{"-n", neighbour, "-6", "route", "add", "default", "via", LBIPv6.String()},
	}
	if t.Router != "" {
		r, mtu := t.Router, strconv.Itoa(t.ClientPathMTU)
		steps = append(steps,
			[]string{"-n", lb, "route", "add", subnet(RoutedClientIPv4), "via", RouterIPv4.String()},
			[]string{"-n", lb, "-6", "route", "add", subnet(RoutedClientIPv6), "via", RouterIPv6.String()},
			[]string{"-n", r, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", t.Client},
			// noprefixroute: the routes to the client's subnet are added
			// below, with the narrow path's MTU, locked so that forwarding
			// honours it for IPv6 as well.
			[]string{"-n", r, "addr", "add", routerInnerIPv4.String() + "/24", "dev", "eth1", "noprefixroute"},
			[]string{"-n", r, "addr", "add", routerInnerIPv6.String() + "/64", "dev", "eth1", "nodad", "noprefixroute"},
			[]string{"-n", r, "link", "set", "eth1", "up"},
			[]string{"-n", r, "route", "add", subnet(RoutedClientIPv4), "dev", "eth1", "src", routerInnerIPv4.String(), "mtu", "lock", mtu},
			[]string{"-n", r, "-6", "route", "add", subnet(RoutedClientIPv6), "dev", "eth1", "mtu", "lock", mtu},
			[]string{"-n", t.Client, "addr", "add", RoutedClientIPv4.String() + "/24", "dev", "eth0"},
			[]string{"-n", t.Client, "addr", "add", RoutedClientIPv6.String() + "/64", "dev", "eth0", "nodad"},
			[]string{"-n", t.Client, "link", "set", "eth0", "up"},
			[]string{"-n", t.Client, "route", "add", "default", "via", routerInnerIPv4.String()},
			[]string{"-n", t.Client, "-6", "route", "add", "default", "via", routerInnerIPv6.String()},
		)
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

// subnet is the /24 or /64 of a client address.
func subnet(a netip.Addr) string {
	bits := 24
	if a.Is6() {
		bits = 64
	}
	return netip.PrefixFrom(a, bits).Masked().String()
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
// go: a namespace with a live process outlives `ip netns delete`. The test
// itself is spared: its main thread may have entered ns (a goroutine that
// locked it and joined ns cannot end it), and `ip netns pids` then names us.
func killPIDs(ns string) {
	self := os.Getpid()
	for range 50 {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		var left int
		for _, p := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(p); err == nil && pid != self {
				syscall.Kill(pid, syscall.SIGKILL)
				left++
			}
		}
		if left == 0 {
			return
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
