// SPDX-License-Identifier: Apache-2.0

package throughput

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/test/netns"
)

// The service both sides balance: one VIP, a UDP and a TCP port, served by
// every backend on the same ports.
const (
	vip      = "10.96.0.10"
	udpPort  = 7777
	tcpPort  = 8080
	backends = 3

	// The control plane listens inside the LB namespace, new for every run.
	controlPlaneAddr = "127.0.0.1:18000"
	// nftTable holds the netfilter side's DNAT rules.
	nftTable = "l4xds_bench"
)

// CPUs of the two ends: the client and its half of the softirq work on
// one, the backends and theirs on the other (the machine the figures are
// taken on has two). The LB's work runs in softirq on whichever CPU sent
// the packet.
const (
	clientCPU  = "0"
	backendCPU = "1"
)

// env is the topology with servers on the backends and the control plane
// in the LB namespace; the agent runs only while the l4xds side is on.
type env struct {
	b       *testing.B
	bin     string
	topo    *netns.Topology
	dir     string
	bpfRoot string
	pin     bool // taskset is there
	agent   *netns.Proc
}

// prerequisites returns why the benchmark cannot run here, or "".
func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root: creates network namespaces, loads eBPF programs and netfilter rules"
	}
	bin := os.Getenv("L4XDS_BIN")
	if bin == "" {
		return "needs L4XDS_BIN, the directory of the built binaries (make bench sets it)"
	}
	for _, b := range []string{"l4xds-agent", "l4xds-control-plane", "l4xds-traffic"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Sprintf("%s is not built in L4XDS_BIN %s (run make build)", b, bin)
		}
	}
	for tool, pkg := range map[string]string{"ip": "iproute2", "nft": "nftables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("needs %s for the netfilter DNAT side: apt-get install %s", tool, pkg)
		}
	}
	return ""
}

func newEnv(b *testing.B) *env {
	b.Helper()
	e := &env{b: b, bin: os.Getenv("L4XDS_BIN"), dir: b.TempDir()}
	_, err := exec.LookPath("taskset")
	e.pin = err == nil
	if !e.pin {
		fmt.Println("# taskset (util-linux) is missing: client and backends run on any CPU")
	}
	topo, err := netns.New(netns.UniquePrefix(), backends)
	if err != nil {
		b.Fatal(err)
	}
	e.topo = topo
	b.Cleanup(func() {
		if err := topo.Delete(); err != nil {
			b.Errorf("deleting the topology: %v", err)
		}
	})
	e.bpfRoot = netns.MountBPFFS(b)

	for i, be := range topo.Backends {
		p := e.start(be.NS, backendCPU, "l4xds-traffic", "serve", "--name", backendName(i),
			"--udp", fmt.Sprintf(":%d", udpPort), "--tcp", fmt.Sprintf(":%d", tcpPort))
		p.WaitOutput(b, "ready", 10*time.Second)
	}

	if out, err := exec.Command(filepath.Join(e.bin, "l4xds-control-plane"), "certs", "--out", e.path("certs")).CombinedOutput(); err != nil {
		b.Fatalf("l4xds-control-plane certs: %v\n%s", err, out)
	}
	if err := os.WriteFile(e.path("resources.yaml"), []byte(resources()), 0o644); err != nil {
		b.Fatal(err)
	}
	e.start(topo.LB, "", "l4xds-control-plane", "serve",
		"--resources", e.path("resources.yaml"), "--listen", controlPlaneAddr,
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt"))
	return e
}

func (e *env) path(name string) string { return filepath.Join(e.dir, name) }

func backendName(i int) string { return fmt.Sprintf("b%d", i) }

func backendNames() []string {
	var names []string
	for i := range backends {
		names = append(names, backendName(i))
	}
	return names
}

// resources is the control plane's file: one cluster per port, every
// backend in each.
func resources() string {
	var b strings.Builder
	for _, s := range []struct {
		proto string
		port  int
	}{{"UDP", udpPort}, {"TCP", tcpPort}} {
		name := "bench-" + strings.ToLower(s.proto)
		fmt.Fprintf(&b, `---
resource:
  '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: %s
  metadata:
    filter_metadata:
      io.cilium.l4lb: { vip: %q, port: %d, protocol: %s }
  type: EDS
---
resource:
  '@type': type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: %s
  endpoints:
  - lb_endpoints:
`, name, vip, s.port, s.proto, name)
		for i := range backends {
			fmt.Fprintf(&b, "    - endpoint: { address: { socket_address: { address: %q, port_value: %d } } }\n", netns.BackendIPv4(i), s.port)
		}
	}
	return b.String()
}

// l4xdsOn starts the agent with its datapath on the LB's devices and waits
// until both services are in its maps and the program is attached to both
// devices.
func (e *env) l4xdsOn() {
	b := e.b
	b.Helper()
	e.agent = e.start(e.topo.LB, "", "l4xds-agent",
		"--enable-xds-control-plane", "--xds-server-address", controlPlaneAddr,
		"--xds-server-name", "localhost", "--xds-node-id", "bench-lb",
		"--xds-client-cert-path", e.path("certs/client.crt"),
		"--xds-client-key-path", e.path("certs/client.key"),
		"--xds-ca-cert-path", e.path("certs/ca.crt"),
		"--api-socket", e.path("agent.sock"),
		"--datapath", "bpf", "--devices", netns.ClientDevice+","+netns.BridgeDevice,
		"--bpf-root", e.bpfRoot)
	deadline := time.Now().Add(45 * time.Second)
	for {
		n, err := e.servicesReady()
		if err == nil && n == 2 && e.attached() == 2 {
			return
		}
		if e.agent.Exited() {
			b.Fatalf("l4xds-agent exited (%v):\n%s", e.agent.Cmd.ProcessState, e.agent.Output())
		}
		if time.Now().After(deadline) {
			b.Fatalf("the agent never had both services with %d backends and the program on %s and %s (%d ready, %v):\n%s",
				backends, netns.ClientDevice, netns.BridgeDevice, n, err, e.agent.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// l4xdsOff stops the agent and unpins its links, which detaches the
// program: the pins are all that holds them once the agent is gone. The
// kernel lets go of an unpinned link after an RCU grace period: wait for
// the devices to have no program left.
func (e *env) l4xdsOff() {
	b := e.b
	b.Helper()
	e.agent.Stop()
	dir := filepath.Join(e.bpfRoot, datapath.PinDir, datapath.LinksDir)
	pins, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range pins {
		if err := os.Remove(filepath.Join(dir, p.Name())); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.attached() > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("a tcx ingress program is still on %s or %s 10 s after unpinning the links", netns.ClientDevice, netns.BridgeDevice)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attached counts the LB's devices that have a tcx ingress program.
func (e *env) attached() int {
	n := 0
	for _, dev := range []string{netns.ClientDevice, netns.BridgeDevice} {
		progs, err := tcxIngress(e.topo.LB, dev)
		if err != nil {
			e.b.Fatal(err)
		}
		if progs > 0 {
			n++
		}
	}
	return n
}

// tcxIngress counts the tcx ingress programs of device dev in namespace
// ns. Interface indexes are per namespace: the query runs on a thread that
// enters ns, and that thread ends with the goroutine.
func tcxIngress(ns, dev string) (int, error) {
	type result struct {
		n   int
		err error
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		n, err := func() (int, error) {
			f, err := os.Open(filepath.Join("/run/netns", ns))
			if err != nil {
				return 0, err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return 0, fmt.Errorf("enter %s: %w", ns, err)
			}
			iface, err := net.InterfaceByName(dev)
			if err != nil {
				return 0, fmt.Errorf("%s in %s: %w", dev, ns, err)
			}
			res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return 0, fmt.Errorf("tcx ingress programs of %s in %s: %w", dev, ns, err)
			}
			return len(res.Programs), nil
		}()
		done <- result{n, err}
	}()
	r := <-done
	return r.n, r.err
}

// servicesReady counts the services in the pinned maps that have all the
// backends.
func (e *env) servicesReady() (int, error) {
	m, err := datapath.OpenPinnedMaps(e.bpfRoot)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	n := 0
	for s, err := range m.Services() {
		if err != nil {
			return n, err
		}
		if s.Count == backends {
			n++
		}
	}
	return n, nil
}

// forwarded is the number of packets the datapath forwarded for the
// services, both directions (0 before the agent first ran).
func (e *env) forwarded() uint64 {
	m, err := datapath.OpenPinnedMaps(e.bpfRoot)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		e.b.Fatal(err)
	}
	defer m.Close()
	var n uint64
	for s, err := range m.Services() {
		if err != nil {
			e.b.Fatal(err)
		}
		st, err := m.ServiceStats(s.ID)
		if err != nil {
			e.b.Fatal(err)
		}
		n += st.Packets
	}
	return n
}

// stackForwarded is the number of IPv4 packets the LB namespace's stack
// forwarded (ForwDatagrams of /proc/net/snmp): the l4xds side hands
// balanced packets to their next hop itself, the netfilter side leaves
// them all to the stack.
func (e *env) stackForwarded() uint64 {
	out, err := netns.Command(context.Background(), e.topo.LB, "cat", "/proc/net/snmp").Output()
	if err != nil {
		e.b.Fatalf("/proc/net/snmp in %s: %v", e.topo.LB, err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, name := range names {
			if name == "ForwDatagrams" && i < len(fields) {
				n, err := strconv.ParseUint(fields[i], 10, 64)
				if err != nil {
					e.b.Fatalf("ForwDatagrams %q: %v", fields[i], err)
				}
				return n
			}
		}
	}
	e.b.Fatalf("no Ip: ForwDatagrams in /proc/net/snmp of %s:\n%s", e.topo.LB, out)
	return 0
}

// netfilterOn installs DNAT rules for the same VIP and ports to the same
// backends, split at random as kube-proxy's rules do (numgen random in
// nftables; iptables-nft programs the same from -m statistic).
func (e *env) netfilterOn() {
	var dests []string
	for i := range backends {
		dests = append(dests, fmt.Sprintf("%d : %s", i, netns.BackendIPv4(i)))
	}
	m := strings.Join(dests, ", ")
	rules := fmt.Sprintf(`table ip %s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s udp dport %d dnat to numgen random mod %d map { %s }
		ip daddr %s tcp dport %d dnat to numgen random mod %d map { %s }
	}
}
`, nftTable, vip, udpPort, backends, m, vip, tcpPort, backends, m)
	e.nft(rules, "-f", "-")
}

// netfilterOff deletes the table: with no NAT rule left, the namespace
// unregisters its conntrack hooks, and the l4xds side runs without them.
func (e *env) netfilterOff() {
	e.nft("", "delete", "table", "ip", nftTable)
}

func (e *env) nft(stdin string, args ...string) {
	e.b.Helper()
	cmd := netns.Command(context.Background(), e.topo.LB, "nft", args...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		e.b.Fatalf("nft %s in %s: %v\n%s\n%s", strings.Join(args, " "), e.topo.LB, err, out, stdin)
	}
}

// loadReport is what `l4xds-traffic load -o json` prints.
type loadReport struct {
	Proto         string            `json:"proto"`
	Mode          string            `json:"mode"`
	Seconds       float64           `json:"seconds"`
	Answered      int64             `json:"answered"`
	Connections   int64             `json:"connections"`
	Bytes         int64             `json:"bytes"`
	Lost          int64             `json:"lost"`
	PacketsPerSec float64           `json:"packets_per_sec"`
	ConnsPerSec   float64           `json:"conns_per_sec"`
	BitsPerSec    float64           `json:"bits_per_sec"`
	Backends      map[string]int64  `json:"backends"`
	Errors        map[string]int    `json:"errors"`
	Examples      map[string]string `json:"examples"`
}

// load runs l4xds-traffic load in the client namespace on the client's
// CPU and returns its report.
func (e *env) load(args ...string) (loadReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"load", "-o", "json"}, args...)
	cmd := e.command(ctx, e.topo.Client, clientCPU, "l4xds-traffic", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var r loadReport
	if err != nil {
		return r, fmt.Errorf("l4xds-traffic %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("l4xds-traffic %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return r, nil
}

// command runs one of the binaries in namespace ns, on cpu unless it is ""
// or taskset is missing, with one Go thread running at a time so that
// pinned processes stay on their CPU's share.
func (e *env) command(ctx context.Context, ns, cpu, name string, args ...string) *exec.Cmd {
	bin := filepath.Join(e.bin, name)
	var cmd *exec.Cmd
	if cpu != "" && e.pin {
		cmd = exec.CommandContext(ctx, "taskset", append([]string{"-c", cpu, "ip", "netns", "exec", ns, bin}, args...)...)
	} else {
		cmd = netns.Command(ctx, ns, bin, args...)
	}
	if cpu != "" {
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	}
	return cmd
}

func (e *env) start(ns, cpu, name string, args ...string) *netns.Proc {
	b := e.b
	b.Helper()
	p, err := netns.StartProc(name+" in "+ns, e.command(context.Background(), ns, cpu, name, args...))
	if err != nil {
		b.Fatalf("%s in %s: %v", name, ns, err)
	}
	b.Cleanup(p.Stop)
	return p
}
