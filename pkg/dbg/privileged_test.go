// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/datapath/bpf"
	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
)

// agent is the agent's cells minus the xDS translation, with a BPF
// datapath on a private bpffs, the API on a socket in a temp dir, and the
// tables written by the test.
type agent struct {
	root, socket string
	db           *statedb.DB
	w            *lb.Writer
}

func startAgent(t *testing.T) *agent {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a BPF filesystem and loads the datapath")
	}
	a := &agent{root: netns.MountBPFFS(t), socket: filepath.Join(t.TempDir(), "agent.sock")}

	var done func(lb.WriteTxn)
	h := hive.New(
		job.Cell, statedb.Cell, health.Cell, api.Cell, lb.Cell, xds.Cell, datapath.Cell,
		cell.Invoke(func(db *statedb.DB, w *lb.Writer) {
			a.db, a.w = db, w
			done = w.RegisterInitializer("test")
		}),
	)
	// As flags would: the API's /config shows them too.
	h.Viper().Set("bpf-root", a.root)
	h.Viper().Set("datapath-attach", netns.DatapathAttach())
	h.Viper().Set("api-socket", a.socket)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		h.Stop(log, context.Background())
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	a.write(t, func(txn lb.WriteTxn) error { done(txn); return nil })
	return a
}

func (a *agent) write(t *testing.T, f func(lb.WriteTxn) error) {
	t.Helper()
	txn := a.w.WriteTxn()
	if err := f(txn); err != nil {
		txn.Abort()
		t.Fatal(err)
	}
	txn.Commit()
}

func (a *agent) serve(t *testing.T, svc *lb.Service, frontends []string, backends ...lb.BackendParams) {
	t.Helper()
	a.write(t, func(txn lb.WriteTxn) error {
		var fes []lb.FrontendParams
		for _, s := range frontends {
			addr, err := lb.ParseL3n4Addr(s)
			if err != nil {
				return err
			}
			fes = append(fes, lb.FrontendParams{Address: addr, ServiceName: svc.Name})
		}
		if err := a.w.UpsertServiceAndFrontends(txn, svc, fes...); err != nil {
			return err
		}
		return a.w.SetBackends(txn, svc.Name, lb.SourceXDS, backends...)
	})
}

// reconciled waits until every frontend is in the maps.
func (a *agent) reconciled(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pending := 0
		for fe := range a.w.Frontends().All(a.db.ReadTxn()) {
			if fe.Status.Kind != reconciler.StatusKindDone {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d frontends never reconciled", pending)
		}
	}
}

// dbg runs l4xds-dbg in process.
func dbg(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func backend(addr string, weight uint16, state lb.BackendState) lb.BackendParams {
	a, err := lb.ParseL3n4Addr(addr)
	if err != nil {
		panic(err)
	}
	return lb.BackendParams{Address: a, Weight: weight, State: state}
}

func TestPrivilegedLBListShowsWhatTheReconcilerWrote(t *testing.T) {
	a := startAgent(t)
	a.serve(t, &lb.Service{
		Name: "db", Source: lb.SourceXDS,
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
		SessionAffinity: true, SessionAffinityTimeout: 3 * time.Hour,
	}, []string{"10.1.2.3:3306/TCP", "[2001:db8::1]:3306/TCP"},
		backend("192.168.1.10:3306", 70, lb.BackendStateActive),
		backend("192.168.1.11:3306", 30, lb.BackendStateActive),
		backend("192.168.1.12:3306", 10, lb.BackendStateTerminating),
		backend("[2001:db8::10]:3306", 1, lb.BackendStateActive))
	a.serve(t, &lb.Service{Name: "sick", Source: lb.SourceXDS}, []string{"10.1.2.9:53/UDP"},
		backend("192.168.1.10:53", 1, lb.BackendStateQuarantined))
	a.reconciled(t)

	out, err := dbg(t, "bpf", "lb", "list", "--bpf-root", a.root)
	if err != nil {
		t.Fatalf("bpf lb list: %v\n%s", err, out)
	}
	t.Logf("l4xds-dbg bpf lb list:\n%s", out)
	lines := strings.Split(out, "\n")
	// One frontend per service line, sorted: IPv4 first, the IPv6 last.
	var order []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && strings.Contains(f[0], "/") {
			order = append(order, f[0])
		}
	}
	if strings.Join(order, " ") != "10.1.2.3:3306/TCP 10.1.2.9:53/UDP [2001:db8::1]:3306/TCP" {
		t.Errorf("frontends in the order %v", order)
	}
	for _, want := range []string{
		"source ranges: 10.0.0.0/8, 2001:db8::/32",
		"session affinity: 3h0m0s",
		"! no backend takes new flows",
		"3 services, 5 backends",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}

	out, err = dbg(t, "bpf", "lb", "list", "--bpf-root", a.root, "-o", "json")
	if err != nil {
		t.Fatalf("bpf lb list -o json: %v\n%s", err, out)
	}
	var list lbList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]lbService{}
	for _, s := range list.Services {
		got[s.Frontend] = s
	}
	db := got["10.1.2.3:3306/TCP"]
	shares := map[string]lbBackend{}
	for _, b := range db.Backends {
		shares[b.Address] = b
	}
	for addr, want := range map[string]struct {
		state string
		share float64
	}{
		"192.168.1.10:3306": {"active", 70},
		"192.168.1.11:3306": {"active", 30},
		"192.168.1.12:3306": {"terminating", 0},
	} {
		b := shares[addr]
		if b.State != want.state || b.Share < want.share-1 || b.Share > want.share+1 || b.ID == 0 {
			t.Errorf("%s: %+v, want %s with %.0f%% ± 1 of the slots", addr, b, want.state, want.share)
		}
	}
	if len(db.Backends) != 3 || db.MaglevSlots != 1021 || !db.TakesNewFlows || db.AffinityTimeout != "3h0m0s" {
		t.Errorf("10.1.2.3:3306/TCP: %+v", db)
	}
	// One backend: no Maglev table, the service entry names it.
	if v6 := got["[2001:db8::1]:3306/TCP"]; len(v6.Backends) != 1 || v6.Backends[0].Share != 100 || v6.MaglevSlots != 0 || !v6.TakesNewFlows || len(v6.Problems) > 0 {
		t.Errorf("[2001:db8::1]:3306/TCP: %+v, want its IPv6 backend alone with all new flows, and no table", v6)
	}
	if len(list.OrphanBackends)+len(list.OrphanMaglevTables) > 0 {
		t.Errorf("orphans in maps the reconciler alone wrote: backends %+v, Maglev tables of services %v", list.OrphanBackends, list.OrphanMaglevTables)
	}
	if sick := got["10.1.2.9:53/UDP"]; sick.TakesNewFlows || len(sick.Backends) != 1 || sick.Backends[0].State != "quarantined" {
		t.Errorf("10.1.2.9:53/UDP: %+v, want its quarantined backend and no new flows", sick)
	}

	// status reads the datapath's place from the agent and counts the maps.
	out, err = dbg(t, "--socket", a.socket, "status")
	t.Logf("l4xds-dbg status:\n%s", out)
	if err != nil {
		t.Fatalf("status of a healthy agent: %v", err)
	}
	for _, want := range []string{
		"Health:      OK",
		"xDS control plane disabled",
		"Frontends:   3 (3 Done)",
		"Backends:    5 (3 active, 1 terminating, 1 quarantined)",
		"Datapath:    bpf on no devices; maps at " + filepath.Join(a.root, "l4xds") + ": 3 services, 5 backends",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	// The agent's table of its maps, which status reads.
	table, err := dbg(t, "--socket", a.socket, "statedb", "bpf-maps")
	t.Logf("l4xds-dbg statedb bpf-maps:\n%s", table)
	if err != nil || !regexp.MustCompile(`(?m)^conntrack +l4xds_ct +LRUHash +0 +1048576 +0\.0% +144\.0 MiB +true +\S+`).MatchString(table) {
		t.Errorf("statedb bpf-maps (%v) lacks conntrack's row", err)
	}
	// The maps as the agent last counted them (at its start, and every
	// 30 s): the capacities, the entries of that count.
	for _, want := range []string{
		`(?m)^BPF maps: +[0-9.]+ MiB when full, [0-9.]+ MiB of it allocated whatever they hold; entries counted [0-9.]+m?s ago$`,
		`(?m)^ +services +[0-3]/4096 \([0-9.]+%\) +[0-9.]+ KiB$`,
		`(?m)^ +backends +[0-5]/1048576 \(0\.0%\) +104\.0 MiB$`,
		`(?m)^ +conntrack +0/1048576 \(0\.0%\) +144\.0 MiB, allocated$`,
		`(?m)^ +stats +-/4097 +[0-9.]+ KiB, allocated$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("status does not match %s", want)
		}
	}
}

// Entries written behind the program's back, as the program lays them out:
// the reader and the listing agree with bpf/l4xds.h.
func TestPrivilegedCTListNamesClientFrontendAndBackend(t *testing.T) {
	a := startAgent(t)
	a.serve(t, &lb.Service{Name: "db", Source: lb.SourceXDS}, []string{"10.1.2.3:3306/TCP"},
		backend("192.168.1.10:3306", 1, lb.BackendStateActive))
	a.reconciled(t)
	out, err := dbg(t, "bpf", "lb", "list", "--bpf-root", a.root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list lbList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Services) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	svc := list.Services[0]
	writeCT(t, a.root, svc.ID, svc.Backends[0].ID)

	out, err = dbg(t, "bpf", "ct", "list", "--bpf-root", a.root)
	t.Logf("l4xds-dbg bpf ct list:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	be := fmt.Sprintf("192.168.1.10:3306 (id %d) %d", svc.Backends[0].ID, svc.ID)
	for _, want := range []string{
		"Proto Client Frontend Backend Service Dir Flags Expires",
		"TCP 10.0.0.2:40000 10.1.2.3:3306 " + be + " forward - in 5h58m",
		"TCP 10.0.0.2:40000 10.1.2.3:3306 " + be + " reply - in 5h58m",
		"2 entries: 1 forward, 1 reply, 0 expired",
	} {
		if !slices.Contains(rows, want) {
			t.Errorf("output lacks the row %q", want)
		}
	}
}

// writeCT writes the two entries of a TCP flow 10.0.0.2:40000 ->
// 10.1.2.3:3306 -> 192.168.1.10:3306, last seen 100 s ago.
func writeCT(t *testing.T, root string, svcID, backendID uint32) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, datapath.PinDir, bpf.L4xdsMapL4xdsCt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	now, err := datapath.Ktime()
	if err != nil {
		t.Fatal(err)
	}
	client, vip, be := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.1.2.3:3306"), netip.MustParseAddrPort("192.168.1.10:3306")
	key := func(src, dst netip.AddrPort, dir uint8) bpf.L4xdsLbCtKey {
		return bpf.L4xdsLbCtKey{Saddr: addr(src.Addr()), Daddr: addr(dst.Addr()), Sport: port(src.Port()), Dport: port(dst.Port()), Proto: 6, Dir: dir}
	}
	seen := uint64(now - 100*time.Second)
	for _, e := range []struct {
		k bpf.L4xdsLbCtKey
		v bpf.L4xdsLbCtEntry
	}{
		{key(client, vip, 0), bpf.L4xdsLbCtEntry{LastSeen: seen, BackendId: backendID, SvcId: svcID}},
		{key(be, client, 1), bpf.L4xdsLbCtEntry{LastSeen: seen, BackendId: backendID, SvcId: svcID, Vip: addr(vip.Addr()), VipPort: port(vip.Port())}},
	} {
		if err := m.Put(&e.k, &e.v); err != nil {
			t.Fatalf("write %s: %v", bpf.L4xdsMapL4xdsCt, err)
		}
	}
}

// addr and port encode as bpf/l4xds.h says: 16 bytes in network order
// (IPv4-mapped), ports in network order.
func addr(a netip.Addr) (out [4]uint32) {
	b := a.As16()
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

func port(p uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p))
}
