// SPDX-License-Identifier: Apache-2.0

package health

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/hive/cell"
)

func TestRegistryReportsEveryScope(t *testing.T) {
	r := NewRegistry()
	root := r.Root()
	xds := root.NewScope("xds")
	stream := xds.NewScope("stream")

	xds.OK("connected to xds:9000")
	stream.Degraded("disconnected from xds:9000", errors.New("connection refused"))
	if got := r.Degraded(); len(got) != 1 || got[0].String() != "xds.stream: Degraded: disconnected from xds:9000: connection refused" {
		t.Fatalf("degraded = %v", got)
	}

	stream.OK("reconnected")
	if got := r.Degraded(); len(got) != 0 {
		t.Fatalf("degraded after recovery = %v", got)
	}
	all := r.All()
	if len(all) != 2 || all[0].Scope != "xds" || all[1].Scope != "xds.stream" || all[1].Level != cell.StatusOK {
		t.Fatalf("all = %v", all)
	}

	// An unchanged report keeps its Since: operators see how long a state lasts.
	since := all[1].Since
	stream.OK("reconnected")
	if r.All()[1].Since != since {
		t.Error("a repeated report reset Since")
	}

	stream.Close()
	if got := r.All(); len(got) != 1 {
		t.Errorf("after Close: %v", got)
	}
}

// Ready once every condition is met, and for good.
func TestReadiness(t *testing.T) {
	r := NewReadiness()
	if w := r.Waiting(); len(w) != 0 {
		t.Fatalf("waiting for %v with no condition", w)
	}
	datapath := r.Add("datapath")
	tables := r.Add("tables")
	if w := r.Waiting(); !slices.Equal(w, []string{"datapath", "tables"}) {
		t.Errorf("waiting for %v", w)
	}
	tables()
	datapath()
	datapath()
	if w := r.Waiting(); len(w) != 0 {
		t.Errorf("waiting for %v once all are met", w)
	}
}
