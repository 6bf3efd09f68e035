// SPDX-License-Identifier: Apache-2.0

// Package throughput compares l4xds with netfilter DNAT on the network
// namespace topology of the end-to-end tests (test/netns): the same
// client, VIP and backends, balanced either by the agent's datapath or by
// nftables DNAT rules in the LB namespace, never both at once.
package throughput

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// metric is one figure of a run: what l4xds-traffic load is asked for and
// which of its rates is the figure.
type metric struct {
	proto, name string
	size        int // bytes per datagram or line, 0 where it means nothing
	args        []string
	value       func(loadReport) float64
	// count is what the datapath must have forwarded at least as many
	// packets as, on the l4xds side.
	count func(loadReport) int64
}

var metrics = []metric{
	{
		// Small datagrams, a request and its answer through the LB each.
		proto: "udp", name: "pps", size: 64,
		args:  []string{"--proto", "udp", "--mode", "rr", "--conns", "8", "--window", "16", "--size", "64"},
		value: func(r loadReport) float64 { return r.PacketsPerSec },
		count: func(r loadReport) int64 { return 2 * r.Answered },
	},
	{
		// A new connection each time: connect, greeting, reset.
		proto: "tcp", name: "cps",
		args:  []string{"--proto", "tcp", "--mode", "connect", "--conns", "8"},
		value: func(r loadReport) float64 { return r.ConnsPerSec },
		count: func(r loadReport) int64 { return 3 * r.Connections },
	},
	{
		// Bulk: 64 KiB lines echoed over long connections.
		proto: "tcp", name: "gbps", size: 64 << 10,
		args:  []string{"--proto", "tcp", "--mode", "stream", "--conns", "4", "--size", "65536"},
		value: func(r loadReport) float64 { return r.BitsPerSec / 1e9 },
		count: func(r loadReport) int64 { return r.Connections },
	},
}

// settle is the pause between switching a side on and loading it.
const settle = 2 * time.Second

// side is one way of balancing the VIP.
type side struct {
	name    string
	on, off func()
}

// BenchmarkThroughput alternates the two sides for L4XDS_BENCH_ROUNDS
// rounds (default 5) of every metric, L4XDS_BENCH_DURATION each (default
// 3s), and prints the medians and their ratio, l4xds / netfilter.
func BenchmarkThroughput(b *testing.B) {
	if why := prerequisites(); why != "" {
		fmt.Printf("BENCH throughput skipped reason=%q\n", why)
		b.Skip(why)
	}
	rounds := envInt(b, "L4XDS_BENCH_ROUNDS", 5)
	duration := envDuration(b, "L4XDS_BENCH_DURATION", 3*time.Second)
	// One iteration: the rounds take far longer than -benchtime, so
	// b.Loop asks for no second one.
	for b.Loop() {
		e := newEnv(b)
		sides := []side{
			{"l4xds", e.l4xdsOn, e.l4xdsOff},
			{"iptables", e.netfilterOn, e.netfilterOff},
		}
		results := map[string]map[string][]float64{} // metric key -> side -> per round
		for r := range rounds {
			order := sides
			if r%2 == 1 {
				order = []side{sides[1], sides[0]}
			}
			for _, s := range order {
				s.on()
				// The agent has just started: let its start-up work
				// (restore, first reconciliation, GC) end before the
				// load, on both sides alike.
				time.Sleep(settle)
				for _, m := range metrics {
					v := measure(b, e, s.name, m, duration)
					key := m.proto + "/" + m.name
					if results[key] == nil {
						results[key] = map[string][]float64{}
					}
					results[key][s.name] = append(results[key][s.name], v)
				}
				s.off()
			}
		}
		report(b, results, rounds, duration)
	}
}

// measure runs one metric on one side and checks that the traffic went
// the way the side claims: answered by every backend, and forwarded by
// the datapath on the l4xds side and not at all on the other.
func measure(b *testing.B, e *env, sideName string, m metric, duration time.Duration) float64 {
	b.Helper()
	before, stackBefore := e.forwarded(), e.stackForwarded()
	to := fmt.Sprintf("%s:%d", vip, udpPort)
	if m.proto == "tcp" {
		to = fmt.Sprintf("%s:%d", vip, tcpPort)
	}
	r, err := e.load(append([]string{"--to", to, "--duration", duration.String(), "--timeout", "1s"}, m.args...)...)
	if err != nil {
		b.Fatalf("%s %s %s: %v", sideName, m.proto, m.name, err)
	}
	v := m.value(r)
	what := fmt.Sprintf("%s %s %s: %.4g (%d answered, %d connections, %d bytes, %d lost, errors %v %v, backends %v, forwarded by the datapath %d, by the stack %d)",
		sideName, m.proto, m.name, v, r.Answered, r.Connections, r.Bytes, r.Lost, r.Errors, r.Examples, r.Backends,
		e.forwarded()-before, e.stackForwarded()-stackBefore)
	fmt.Println("#", what)
	// A handful of flows need not reach every backend: the split itself
	// is the end-to-end tests' concern. The answers must come from them.
	failed := 0
	for _, n := range r.Errors {
		failed += n
	}
	if v <= 0 || int64(failed)*100 > m.count(r) {
		b.Fatalf("%s: want traffic, and errors in at most 1%% of it", what)
	}
	for name := range r.Backends {
		if !slices.Contains(backendNames(), name) {
			b.Fatalf("%s: answered by %q, which is none of the backends", what, name)
		}
	}
	forwarded := e.forwarded() - before
	switch {
	case sideName == "l4xds" && forwarded < uint64(m.count(r)):
		b.Fatalf("%s: the datapath forwarded %d packets, fewer than the traffic had (%d)", what, forwarded, m.count(r))
	case sideName != "l4xds" && forwarded != 0:
		b.Fatalf("%s: the l4xds datapath forwarded %d packets while it should be detached", what, forwarded)
	}
	return v
}

func report(b *testing.B, results map[string]map[string][]float64, rounds int, duration time.Duration) {
	cpus := "pinned: client cpu " + clientCPU + ", backends cpu " + backendCPU
	fmt.Printf("# throughput through %s on %s, %d backends, %d rounds of %s per side and metric (%s), median:\n",
		vip, netns.ClientDevice+"/"+netns.BridgeDevice, backends, rounds, duration, cpus)
	fmt.Printf("# %-5s %-5s %8s %12s %12s %7s\n", "proto", "metric", "size", "l4xds", "iptables", "ratio")
	for _, m := range metrics {
		key := m.proto + "/" + m.name
		l4, nf := median(results[key]["l4xds"]), median(results[key]["iptables"])
		ratio := l4 / nf
		fmt.Printf("# %-5s %-5s %8d %12.4g %12.4g %7.2f\n", m.proto, m.name, m.size, l4, nf, ratio)
		size := ""
		if m.size > 0 {
			size = fmt.Sprintf(" size=%d", m.size)
		}
		fmt.Printf("BENCH throughput proto=%s metric=%s%s l4xds=%s iptables=%s ratio=%.2f runs=%d\n",
			m.proto, m.name, size, num(l4), num(nf), ratio, rounds)
		b.ReportMetric(ratio, m.proto+"-"+m.name+"-ratio")
	}
}

// num prints a rate as an integer, a Gbit/s figure with three decimals.
func num(v float64) string {
	if v < 1000 {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration", name, s)
	}
	return d
}
