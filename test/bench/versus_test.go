// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/bench/versus"
)

// versusRounds: each side runs this many times, alternately.
const versusRounds = 3

// BenchmarkVersusCilium runs Cilium's load-balancer benchmark (built by
// make bench-cilium) and this package's 50000x1 convergence over SotW and
// Delta alternately, each run a fresh process, and prints a BENCH
// versus-cilium line per protocol with the medians. Both sides write real
// BPF maps as root, fake ones otherwise.
func BenchmarkVersusCilium(b *testing.B) {
	command, err := versus.CommandPath()
	if err != nil {
		fmt.Printf("BENCH versus-cilium skipped reason=%q\n", err.Error())
		b.Skip(err)
	}
	if useBPF() {
		versus.MountBPFFS(b)
	}
	n, err := versus.Services()
	if err != nil {
		b.Fatal(err)
	}
	// The shape of Cilium's load-balancer benchmark: services of one
	// backend each.
	versusShape := shape{n, 1}
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		cilium := func(ctx context.Context) (versus.Figures, error) {
			f, err := versus.RunCilium(ctx, command, versusShape.N, useBPF())
			if err == nil {
				fmt.Println(f.Line("shape="+versusShape.String(), "maps="+mapsKind()))
			}
			return f, err
		}
		sides := []versus.Side{cilium}
		for _, p := range protocols {
			sides = append(sides, func(ctx context.Context) (versus.Figures, error) {
				return l4xdsConvergence(ctx, versusShape, p)
			})
		}
		runs, err := versus.Alternate(ctx, versusRounds, sides...)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		for i, p := range protocols {
			fmt.Println(versus.Line(runs[i+1], runs[0],
				"shape="+versusShape.String(), "protocol="+p, "maps="+mapsKind()))
		}
	}
}

// l4xdsConvergence runs BenchmarkConvergence of one shape and protocol in
// a fresh process and reads its BENCH line.
func l4xdsConvergence(ctx context.Context, s shape, protocol string) (versus.Figures, error) {
	line, err := versus.RunSelf(ctx, fmt.Sprintf("^BenchmarkConvergence$/^%s$/^%s$", s, protocol), "BENCH convergence ", shapesEnv+"="+s.String())
	if err != nil {
		return versus.Figures{}, err
	}
	rate, err := versus.Field(line, "services_per_s")
	if err != nil {
		return versus.Figures{}, err
	}
	heap, err := versus.Field(line, "heap_inuse_bytes_per_service")
	if err != nil {
		return versus.Figures{}, err
	}
	fmt.Println(line)
	return versus.Figures{ServicesPerS: rate, HeapBytesPerService: heap}, nil
}
