// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/l4xds/l4xds/pkg/health"
)

type row struct{ Name, Value string }

func (r row) TableHeader() []string { return []string{"Name", "Value"} }
func (r row) TableRow() []string    { return []string{r.Name, r.Value} }

var rowByName = statedb.Index[row, string]{
	Name:       "name",
	FromObject: func(r row) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

type fixture struct {
	client *Client
	socket string
	health *health.Registry
	ready  *health.Readiness
}

// serve runs the API on a socket in a temp dir, as the agent does, over a
// table holding rows a=1 and b=2.
func serve(t *testing.T) fixture {
	t.Helper()
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "rows", rowByName)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	tbl.Insert(txn, row{"a", "1"})
	tbl.Insert(txn, row{"b", "2"})
	txn.Commit()

	reg, ready := health.NewRegistry(), health.NewReadiness()
	cmds := map[string]script.Cmd{}
	for _, c := range statedb.ScriptCommands(db).ScriptCmds {
		cmds[c.Name] = c.Cmd
	}
	socket := filepath.Join(t.TempDir(), "run", "agent.sock")
	// A stale socket file of a previous run must not stop the agent.
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(socket, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lis, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: NewHandler(db, reg, ready, cmds, Settings{"datapath": "none"})}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return fixture{client: NewClient(socket), socket: socket, health: reg, ready: ready}
}

func TestSocketIsRootsOnly(t *testing.T) {
	f := serve(t)
	fi, err := os.Stat(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want a socket with 0600", fi.Mode())
	}
}

func TestRemoteTableReadsRows(t *testing.T) {
	f := serve(t)
	objs, errs := RemoteTable[row](f.client, "rows").Get(context.Background(), rowByName.Query("b"))
	var got []row
	for obj := range objs {
		got = append(got, obj)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (row{"b", "2"}) {
		t.Errorf("remote get b = %v, want [{b 2}]", got)
	}
}

func TestShellRunsCommands(t *testing.T) {
	f := serve(t)
	var out bytes.Buffer
	if err := f.client.Shell(context.Background(), "db/show --format=table rows", &out); err != nil {
		t.Fatal(err)
	}
	want := "Name   Value\na      1\nb      2\n"
	if out.String() != want {
		t.Errorf("db/show rows printed %q, want %q", out.String(), want)
	}

	out.Reset()
	err := f.client.Shell(context.Background(), "db/show nosuchtable", &out)
	if err == nil || !strings.Contains(err.Error(), "nosuchtable") {
		t.Errorf("db/show of a missing table: error %v, want one naming the table", err)
	}
	err = f.client.Shell(context.Background(), "no/such/command", &out)
	if err == nil || !strings.Contains(err.Error(), "no/such/command") {
		t.Errorf("unknown command: error %v, want one naming it", err)
	}
}

func TestHealthzIsUnavailableWhileDegraded(t *testing.T) {
	f := serve(t)
	xds := f.health.Root().NewScope("xds")
	xds.OK("connected to xds:9000")
	rep, err := f.client.Health(context.Background())
	if err != nil || !rep.OK || len(rep.Statuses) != 1 {
		t.Fatalf("health = %+v, %v; want OK with one status", rep, err)
	}

	xds.Degraded("disconnected from xds:9000", os.ErrDeadlineExceeded)
	resp, err := (&http.Client{Transport: f.client.transport}).Get("http://agent/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/healthz status %d while degraded, want 503", resp.StatusCode)
	}
	rep, err = f.client.Health(context.Background())
	if err != nil || rep.OK || !strings.Contains(rep.Statuses[0].String(), "xds: Degraded: disconnected from xds:9000") {
		t.Errorf("health = %+v, %v; want degraded with the reason", rep, err)
	}
}

// Readiness is its own: not ready until every condition is met, then ready
// whatever the health, degraded included; /healthz carries both.
func TestReadyzFollowsReadinessNotHealth(t *testing.T) {
	f := serve(t)
	readyz := func() int {
		t.Helper()
		resp, err := (&http.Client{Transport: f.client.transport}).Get("http://agent/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	met := f.ready.Add("datapath: the first complete state in the maps")
	xds := f.health.Root().NewScope("xds")
	xds.OK("connected to xds:9000")
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d before the first state, want 503", code)
	}
	rep, err := f.client.Health(context.Background())
	if err != nil || rep.Ready || !slices.Equal(rep.Waiting, []string{"datapath: the first complete state in the maps"}) {
		t.Errorf("health = %+v, %v; want not ready, waiting for the datapath", rep, err)
	}

	met()
	xds.Degraded("disconnected from xds:9000", os.ErrDeadlineExceeded)
	if code := readyz(); code != http.StatusOK {
		t.Errorf("/readyz %d once the state is served, degraded, want 200", code)
	}
	rep, err = f.client.Health(context.Background())
	if err != nil || !rep.Ready || rep.OK || len(rep.Waiting) != 0 {
		t.Errorf("health = %+v, %v; want ready and degraded", rep, err)
	}
}

func TestClientNamesTheSocketWhenTheAgentIsNotRunning(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	_, err := c.Health(context.Background())
	if err == nil || !strings.Contains(err.Error(), "none.sock") || !strings.Contains(err.Error(), "is l4xds-agent running") {
		t.Errorf("error %v, want one naming the socket and the likely cause", err)
	}
}

func TestTableAndConfigDecodeForTheClient(t *testing.T) {
	f := serve(t)
	var rows []row
	if err := f.client.Table(context.Background(), "rows", &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0] != (row{"a", "1"}) || rows[1] != (row{"b", "2"}) {
		t.Errorf("rows = %v, want [{a 1} {b 2}]", rows)
	}
	err := f.client.Table(context.Background(), "nosuchtable", &rows)
	if err == nil || !strings.Contains(err.Error(), `no table "nosuchtable"`) {
		t.Errorf("missing table: error %v, want one naming it", err)
	}

	settings, err := f.client.Config(context.Background())
	if err != nil || settings["datapath"] != "none" {
		t.Errorf("config = %v, %v; want datapath none", settings, err)
	}
}

func TestCPUProfileThroughTheSocket(t *testing.T) {
	f := serve(t)
	var buf bytes.Buffer
	if err := f.client.CPUProfile(context.Background(), time.Second, &buf); err != nil {
		t.Fatal(err)
	}
	// A profile is gzipped protobuf (what go tool pprof reads).
	if b := buf.Bytes(); len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile of %d bytes does not start as gzip: % x", len(b), b[:min(len(b), 8)])
	}
}
