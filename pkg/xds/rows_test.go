// SPDX-License-Identifier: Apache-2.0

package xds_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"weak"

	"github.com/cilium/statedb"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/l4xds/l4xds/pkg/xds"
)

// TestReplacedRowsLetGo: once a large write to xds-resources is done, the
// rows it replaced or deleted are garbage. statedb (v0.8) keeps a table's
// last write transaction for the next write, with the tree that write
// started from: a first response of many ClusterLoadAssignments would keep
// every "requested" row it replaced on the heap, and a smaller subscription
// every row it deleted, until the table's next write.
func TestReplacedRowsLetGo(t *testing.T) {
	const n = 200 // a write large enough to be let go of at once
	db, _, c := newDrivenClient(t, xds.ProtocolSotW)
	c.Watch(xds.EndpointType, false, xds.HandlerFunc(func(context.Context, xds.Update) map[string]error { return nil }))
	names := make([]string, n)
	clas := make([]*anypb.Any, n)
	for i := range names {
		names[i] = fmt.Sprintf("cla-%d", i)
		clas[i] = anyOf(t, fuzzEndpoints(names[i], 0))
	}
	c.SetNames(xds.EndpointType, names)
	d, err := xds.NewDriver(c)
	if err != nil {
		t.Fatal(err)
	}

	requested := weakRows(t, db, c, xds.StateRequested, n)
	if nack, err := d.Respond(xds.EndpointType, "1", nil, clas, nil); err != nil || nack != "" {
		t.Fatalf("response: %q, %v", nack, err)
	}
	acked := weakRows(t, db, c, xds.StateAcked, n)
	if kept := alive(requested); kept > 0 {
		t.Errorf("%d of the %d requested rows the response replaced are still on the heap", kept, n)
	}

	// All but the first name are no longer asked for: their rows go.
	c.SetNames(xds.EndpointType, names[:1])
	if err := d.ApplyWatches(); err != nil {
		t.Fatal(err)
	}
	weakRows(t, db, c, xds.StateAcked, 1)
	// Not none: statedb's transaction also keeps the parents of its last
	// deletion's path (a few rows); without the write after, all of them.
	if kept := alive(acked[1:]); kept > (n-1)/10 {
		t.Errorf("%d of the %d rows no longer asked for are still on the heap", kept, n-1)
	}
	runtime.KeepAlive(c) // the table, whose rows are the question
}

// alive collects, and counts the rows still on the heap.
func alive(rows []weak.Pointer[xds.ResourceStatus]) int {
	runtime.GC()
	n := 0
	for _, w := range rows {
		if w.Value() != nil {
			n++
		}
	}
	return n
}

// weakRows checks that the client's EDS rows are n, all in state, and
// returns weak pointers to them in name order (in a function of its own, so
// that no strong pointer stays on the test's stack).
//
//go:noinline
func weakRows(t *testing.T, db *statedb.DB, c *xds.Client, state xds.ResourceState, n int) []weak.Pointer[xds.ResourceStatus] {
	t.Helper()
	var rows []weak.Pointer[xds.ResourceStatus]
	for r := range c.Resources().Prefix(db.ReadTxn(), xds.ResourcesByType(xds.EndpointType)) {
		if r.State != state {
			t.Fatalf("row %s is %s, want %s", r.Name, r.State, state)
		}
		rows = append(rows, weak.Make(r))
	}
	if len(rows) != n {
		t.Fatalf("%d rows, want %d", len(rows), n)
	}
	return rows
}
