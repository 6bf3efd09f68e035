// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/bench/versus"
)

// BenchmarkVersusCilium is test/bench's BenchmarkVersusCilium for the agent
// inside Cilium: Cilium's own load-balancer benchmark (built by make
// bench-cilium) and this package's 50000x1 convergence over SotW run
// alternately, three times each, each a fresh process, and a BENCH
// versus-cilium path=cilium-module line gives the medians.
func BenchmarkVersusCilium(b *testing.B) {
	const services, rounds = 50000, 3
	command, err := versus.CommandPath()
	if err != nil {
		fmt.Printf("BENCH versus-cilium path=cilium-module skipped reason=%q\n", err.Error())
		b.Skip(err)
	}
	maps := "fake"
	if os.Getuid() == 0 {
		maps = "bpf"
	}
	// Cilium's benchmark, too, requires a bpffs at /sys/fs/bpf.
	mountBPFFS(b)
	shape := fmt.Sprintf("%dx1", services)
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		cilium := func(ctx context.Context) (versus.Figures, error) {
			f, err := versus.RunCilium(ctx, command, services, maps == "bpf")
			if err == nil {
				fmt.Println(f.Line("shape="+shape, "maps="+maps))
			}
			return f, err
		}
		l4xds := func(ctx context.Context) (versus.Figures, error) {
			line, err := versus.RunSelf(ctx, "^BenchmarkConvergence$/^"+shape+"$/^"+xds.ProtocolSotW+"$", "BENCH convergence ")
			if err != nil {
				return versus.Figures{}, err
			}
			fmt.Println(line)
			rate, err := versus.Field(line, "services_per_s")
			if err != nil {
				return versus.Figures{}, err
			}
			heap, err := versus.Field(line, "heap_inuse_bytes_per_service")
			return versus.Figures{ServicesPerS: rate, HeapBytesPerService: heap}, err
		}
		runs, err := versus.Alternate(ctx, rounds, l4xds, cilium)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		fmt.Println(versus.Line(runs[0], runs[1], "path=cilium-module", "shape="+shape, "protocol="+xds.ProtocolSotW, "maps="+maps))
	}
}
