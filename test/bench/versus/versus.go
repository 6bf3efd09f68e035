// SPDX-License-Identifier: Apache-2.0

// Package versus runs Cilium's load-balancer benchmark
// (pkg/loadbalancer/benchmark of github.com/cilium/cilium, Kubernetes
// Service and EndpointSlice objects written to Cilium's tables and LB maps)
// and an l4xds convergence benchmark alternately, each run a fresh process,
// and prints the medians side by side:
//
//	BENCH versus-cilium [path=cilium-module] shape=50000x1 protocol=… maps=… runs=3
//	  l4xds_services_per_s=… cilium_services_per_s=… ratio=…
//	  l4xds_heap_bytes_per_service=… cilium_heap_bytes_per_service=… heap_ratio=…
//
// Cilium's command is built outside the repository by
// test/bench/build-cilium-bench.sh (make bench-cilium); the Cilium
// dependency stays in the cilium/ module.
package versus

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Env names Cilium's benchmark command; without it, CommandPath looks for
// cilium-lb-bench in $L4XDS_BIN.
const Env = "L4XDS_CILIUM_BENCH"

// ServicesEnv sets the number of services of both sides (50000 unless
// set: the shape of Cilium's benchmark), for a quick check of the
// comparison itself.
const ServicesEnv = "L4XDS_BENCH_VERSUS_SERVICES"

// Services is the number of services both sides run.
func Services() (int, error) {
	v := os.Getenv(ServicesEnv)
	if v == "" {
		return 50000, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("$%s: %q is not a positive number of services", ServicesEnv, v)
	}
	return n, nil
}

// CommandPath is the built Cilium benchmark command, or why there is none.
func CommandPath() (string, error) {
	path := os.Getenv(Env)
	if path == "" {
		bin := os.Getenv("L4XDS_BIN")
		if bin == "" {
			return "", fmt.Errorf("neither $%s nor $L4XDS_BIN is set (make bench-cilium builds and sets it)", Env)
		}
		path = filepath.Join(bin, "cilium-lb-bench")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("Cilium's benchmark command: %w (make bench-cilium builds it)", err)
	}
	return path, nil
}

// Figures are one run's: services per second of the insertion, and the
// live heap it left per service.
type Figures struct {
	ServicesPerS        float64
	HeapBytesPerService float64
}

// Line is the BENCH cilium-lb line of one run of Cilium's benchmark.
func (f Figures) Line(labels ...string) string {
	return fmt.Sprintf("BENCH cilium-lb %s services_per_s=%.0f heap_inuse_bytes_per_service=%.0f",
		strings.Join(labels, " "), f.ServicesPerS, f.HeapBytesPerService)
}

// MountBPFFS mounts the bpffs Cilium's benchmark requires at /sys/fs/bpf,
// with the directory of its maps: call it as root, in the private mount
// namespace of netns.Main, where it hides nothing of the host's. Unmounted
// when tb ends.
func MountBPFFS(tb testing.TB) {
	tb.Helper()
	if err := syscall.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
		tb.Fatalf("mount -t bpf bpf /sys/fs/bpf: %v", err)
	}
	tb.Cleanup(func() { syscall.Unmount("/sys/fs/bpf", syscall.MNT_DETACH) })
	if err := os.MkdirAll("/sys/fs/bpf/tc/globals", 0o755); err != nil {
		tb.Fatal(err)
	}
}

// RunCilium runs Cilium's benchmark once in a fresh process: one iteration
// of services objects (each a Service with one EndpointSlice of one
// endpoint). privileged makes it write real BPF maps (Cilium's benchmark
// asks PRIVILEGED_TESTS), else Cilium's fake maps.
func RunCilium(ctx context.Context, command string, services int, privileged bool) (Figures, error) {
	cmd := exec.CommandContext(ctx, command, "-services", strconv.Itoa(services), "-iterations", "1")
	cmd.Env = os.Environ()
	if privileged {
		cmd.Env = append(cmd.Env, "PRIVILEGED_TESTS=1")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return Figures{}, fmt.Errorf("%s: %w\n%s", command, err, out)
	}
	f, err := ParseCilium(out)
	if err != nil {
		return Figures{}, fmt.Errorf("%s: %w\n%s", command, err, out)
	}
	return f, nil
}

var (
	ciliumMemory = regexp.MustCompile(`(?m)^Avg: Allocated .*per service: +\d+ objs, +\d+B alloc, +(\d+)B in-use\)`)
	ciliumInsert = regexp.MustCompile(`(?m)^Avg: Reconciled \d+ objects in .*/ +([0-9.]+) services per second\)`)
)

// ParseCilium reads the Avg lines of Cilium's benchmark output: the memory
// statistics' in-use bytes per service (the live heap after a collection,
// less the one before the objects were fed), the first of the insert and
// delete statistics' services per second (the insert's).
func ParseCilium(out []byte) (Figures, error) {
	mem := ciliumMemory.FindSubmatch(out)
	ins := ciliumInsert.FindSubmatch(out)
	if mem == nil || ins == nil {
		return Figures{}, fmt.Errorf("no Avg memory and insert statistics in Cilium's benchmark output")
	}
	heap, err := strconv.ParseFloat(string(mem[1]), 64)
	if err != nil {
		return Figures{}, err
	}
	rate, err := strconv.ParseFloat(string(ins[1]), 64)
	if err != nil {
		return Figures{}, err
	}
	return Figures{ServicesPerS: rate, HeapBytesPerService: heap}, nil
}

// RunSelf runs one benchmark of this test binary in a fresh process (the
// binary sets up its own namespaces as root), with env added to its
// environment, and returns the first line of its output starting with
// prefix ("BENCH convergence ").
func RunSelf(ctx context.Context, benchmark, prefix string, env ...string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$", "-test.bench="+benchmark,
		"-test.benchtime=1x", "-test.count=1", "-test.timeout=30m")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("-test.bench=%s: %w\n%s%s", benchmark, err, out, stderr.Bytes())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			return line, nil
		}
	}
	return "", fmt.Errorf("-test.bench=%s printed no %q line:\n%s%s", benchmark, prefix, out, stderr.Bytes())
}

// Field is the value of key in a `BENCH name key=value ...` line.
func Field(line, key string) (float64, error) {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s in %q", key, line)
}

// Median of xs (the mean of the middle two of an even count).
func Median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Line is the BENCH versus-cilium line of the runs' medians. labels go
// first ("path=cilium-module", "shape=50000x1", ...).
func Line(l4xds, cilium []Figures, labels ...string) string {
	med := func(fs []Figures, get func(Figures) float64) float64 {
		xs := make([]float64, len(fs))
		for i, f := range fs {
			xs[i] = get(f)
		}
		return Median(xs)
	}
	rate := func(f Figures) float64 { return f.ServicesPerS }
	heap := func(f Figures) float64 { return f.HeapBytesPerService }
	l, c := med(l4xds, rate), med(cilium, rate)
	lh, ch := med(l4xds, heap), med(cilium, heap)
	return fmt.Sprintf("BENCH versus-cilium %s runs=%d l4xds_services_per_s=%.0f cilium_services_per_s=%.0f ratio=%.2f "+
		"l4xds_heap_bytes_per_service=%.0f cilium_heap_bytes_per_service=%.0f heap_ratio=%.2f",
		strings.Join(labels, " "), min(len(l4xds), len(cilium)), l, c, ratio(l, c), lh, ch, ratio(lh, ch))
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Side is one benchmark run in a fresh process.
type Side func(context.Context) (Figures, error)

// Alternate runs every side rounds times, round i starting with side i
// (mod their number) so that none always follows the same one, and returns
// each side's figures.
func Alternate(ctx context.Context, rounds int, sides ...Side) ([][]Figures, error) {
	figures := make([][]Figures, len(sides))
	for i := range rounds {
		for k := range sides {
			j := (i + k) % len(sides)
			f, err := sides[j](ctx)
			if err != nil {
				return figures, err
			}
			figures[j] = append(figures[j], f)
		}
	}
	return figures, nil
}
