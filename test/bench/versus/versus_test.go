// SPDX-License-Identifier: Apache-2.0

package versus

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// ciliumOutput is what Cilium's benchmark command prints for one
// iteration (its format strings, the figures invented).
const ciliumOutput = `Iteration 0: upsert wait delete wait ok.

Memory statistics from N=1 iterations:
Min: Allocated 1200000kB in total, 3650000 objects / 224609kB still reachable (per service:  73 objs, 24576B alloc,  4600B in-use)
Avg: Allocated 1200000kB in total, 3650000 objects / 224609kB still reachable (per service:  73 objs, 24576B alloc,  4601B in-use)
Max: Allocated 1200000kB in total, 3650000 objects / 224609kB still reachable (per service:  73 objs, 24576B alloc,  4602B in-use)

Insert statistics from N=1 iterations:
Min: Reconciled 50000 objects in 2.702s      (54µs      per service /  18518 services per second)
Avg: Reconciled 50000 objects in 2.702s      (54µs      per service /  18519 services per second)
Max: Reconciled 50000 objects in 2.702s      (54µs      per service /  18520 services per second)

Delete statistics from N=1 iterations:
Min: Reconciled 50000 objects in 1.1s        (22µs      per service /  45454 services per second)
Avg: Reconciled 50000 objects in 1.1s        (22µs      per service /  45455 services per second)
Max: Reconciled 50000 objects in 1.1s        (22µs      per service /  45456 services per second)
`

func TestParseCilium(t *testing.T) {
	f, err := ParseCilium([]byte(ciliumOutput))
	if err != nil {
		t.Fatal(err)
	}
	// The Avg lines; the insert's rate, not the delete's.
	if want := (Figures{ServicesPerS: 18519, HeapBytesPerService: 4601}); f != want {
		t.Errorf("got %+v, want %+v", f, want)
	}
	if _, err := ParseCilium([]byte("Iteration 0: upsert wait\npanic: Timeout waiting for reconciliation.\n")); err == nil {
		t.Error("a run without statistics parsed")
	}
}

func TestField(t *testing.T) {
	line := "BENCH convergence shape=50000x1 protocol=sotw maps=bpf seconds=7.354 services_per_s=6799 heap_inuse_bytes_per_service=6082"
	for key, want := range map[string]float64{"services_per_s": 6799, "heap_inuse_bytes_per_service": 6082, "seconds": 7.354} {
		if got, err := Field(line, key); err != nil || got != want {
			t.Errorf("%s: got %v, %v; want %v", key, got, err, want)
		}
	}
	if _, err := Field(line, "per_s"); err == nil {
		t.Error("a key matched the end of another")
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(tc.xs); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

// Each round starts with the next side, and each side's figures stay its
// own.
func TestAlternate(t *testing.T) {
	var order []string
	side := func(name string, rate float64) Side {
		return func(context.Context) (Figures, error) {
			order = append(order, name)
			return Figures{ServicesPerS: rate}, nil
		}
	}
	runs, err := Alternate(context.Background(), 3, side("a", 1), side("b", 2), side("c", 3))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ""), "abcbcacab"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	for i, fs := range runs {
		if len(fs) != 3 || fs[0].ServicesPerS != float64(i+1) || fs[2] != fs[0] {
			t.Errorf("side %d: %+v", i, fs)
		}
	}

	failing := func(context.Context) (Figures, error) { return Figures{}, errors.New("no maps") }
	if _, err := Alternate(context.Background(), 3, side("a", 1), failing); err == nil || err.Error() != "no maps" {
		t.Errorf("a failing side: %v", err)
	}
}

func TestLine(t *testing.T) {
	l4xds := []Figures{{30000, 3000}, {20000, 2000}, {40000, 4000}}
	cilium := []Figures{{18000, 4600}, {20000, 4500}, {19000, 4700}}
	got := Line(l4xds, cilium, "shape=50000x1", "protocol=sotw", "maps=bpf")
	want := "BENCH versus-cilium shape=50000x1 protocol=sotw maps=bpf runs=3 l4xds_services_per_s=30000 cilium_services_per_s=19000 ratio=1.58 " +
		"l4xds_heap_bytes_per_service=3000 cilium_heap_bytes_per_service=4600 heap_ratio=0.65"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
