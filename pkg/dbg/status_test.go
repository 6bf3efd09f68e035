// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb/reconciler"

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
	"github.com/l4xds/l4xds/pkg/xds"
)

var now = time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)

func connected(typeURL, version string) xdsTypeStatus {
	return xdsTypeStatus{TypeURL: typeURL, Server: "xds.example:9000", Protocol: "sotw", State: "connected",
		Attempts: 1, Version: version, Synced: true, Since: now.Add(-5 * time.Minute)}
}

// onFallback is an xDS client served by the second of two servers, the
// first refusing connections (gRFC A71).
func onFallback() xdsView {
	st := connected(xds.ClusterType, "v3")
	st.Server, st.Attempts = "xds-b.example:9000", 4
	return xdsView{
		Enabled: true,
		Types:   []xdsTypeStatus{st},
		Servers: []xdsServer{
			{Priority: 1, Address: "xds.example:9000", Name: "xds.example", State: "backoff", Attempts: 3, Failures: 3,
				Error: "Error while dialing: dial tcp 10.0.0.1:9000: connect: connection refused", Since: now.Add(-3 * time.Second)},
			{Priority: 2, Address: "xds-b.example:9000", Name: "xds-b.example", InUse: true, State: "connected",
				Attempts: 1, Since: now.Add(-5 * time.Minute)},
		},
		Resources: []xdsResource{{TypeURL: xds.ClusterType, Name: "db", Version: "v3", State: stateAcked, Updated: now}},
	}
}

func frontend(addr, svc string, status reconciler.Status) *lb.Frontend {
	a, err := lb.ParseL3n4Addr(addr)
	if err != nil {
		panic(err)
	}
	return &lb.Frontend{FrontendParams: lb.FrontendParams{Address: a, ServiceName: lb.ServiceName(svc)}, Status: status}
}

func backends(states ...lb.BackendState) []*lb.Backend {
	var out []*lb.Backend
	for _, s := range states {
		out = append(out, &lb.Backend{BackendParams: lb.BackendParams{State: s}})
	}
	return out
}

func TestStatusSummarizesOnOneScreen(t *testing.T) {
	healthy := statusView{
		Health: api.HealthReport{OK: true, Ready: true, Statuses: []health.Status{
			{Scope: "job-reconcile", Level: cell.StatusOK, Message: "OK, 1 object(s)"},
			{Scope: "job-xds-client", Level: cell.StatusOK, Message: "connected"},
		}},
		XDS: xdsView{
			Enabled: true,
			Types:   []xdsTypeStatus{connected(xds.ClusterType, "v7"), connected(xds.EndpointType, "v7")},
			Resources: []xdsResource{
				{TypeURL: xds.ClusterType, Name: "db", Version: "v7", State: stateAcked},
				{TypeURL: xds.ClusterType, Name: "web", Version: "v6", State: stateNackedButCached,
					Error: `cluster "web": io.cilium.l4lb.port: 70000 is out of range 1..65535`},
				{TypeURL: xds.EndpointType, Name: "db", Version: "v7", State: stateAcked},
				{TypeURL: xds.EndpointType, Name: "gone", State: stateDoesNotExist},
			},
		},
		Services: []*lb.Service{{Name: "db"}, {Name: "web"}},
		Frontends: []*lb.Frontend{
			frontend("10.1.2.3:3306/TCP", "db", reconciler.StatusDone()),
			frontend("10.1.2.4:80/TCP", "web", reconciler.StatusError(errString("write l4xds_backends: no space left on device"))),
		},
		Backends: backends(lb.BackendStateActive, lb.BackendStateActive, lb.BackendStateTerminating),
		Datapath: datapathStatus{Mode: "bpf", Devices: []string{"eth0", "eth1"}, PinDir: "/sys/fs/bpf/l4xds", Services: 2, Backends: 3},
	}

	degraded := statusView{
		Health: api.HealthReport{OK: false, Waiting: []string{datapath.ReadinessCondition}, Statuses: []health.Status{
			{Scope: "job-reconcile", Level: cell.StatusOK, Message: "OK"},
			{Scope: "job-xds-client", Level: cell.StatusDegraded, Message: "disconnected from xds.example:9000",
				Error: "connection refused", Since: now.Add(-42 * time.Second)},
		}},
		XDS: xdsView{Enabled: true, Types: []xdsTypeStatus{{
			TypeURL: xds.ClusterType, Server: "xds.example:9000", Protocol: "delta", State: "backoff",
			Attempts: 4, Error: "xDS server xds.example:9000: connection refused", Since: now.Add(-2 * time.Second),
		}}},
		Frontends: []*lb.Frontend{frontend("10.1.2.3:3306/TCP", "db", reconciler.StatusPending())},
		Datapath:  datapathStatus{Mode: "none"},
	}

	// Disconnected after the first state: degraded, and ready.
	lost := degraded
	lost.Health.Ready, lost.Health.Waiting = true, nil
	lost.Frontends = []*lb.Frontend{frontend("10.1.2.3:3306/TCP", "db", reconciler.StatusDone())}

	for _, c := range []struct {
		name     string
		v        statusView
		want     string
		err      string
		notReady string
	}{
		{
			name: "healthy, with a NACKed cluster and a frontend the datapath refused",
			v:    healthy,
			want: `
Health:       OK (2 components)
xDS server:   xds.example:9000 (sotw)
xDS state:    connected for 5m0s, 1 connection attempt
              Cluster: version v7, synced
              ClusterLoadAssignment: version v7, synced
Resources:    2 acked, 1 nacked-but-cached, 1 does-not-exist
              nacked-but-cached Cluster web: cluster "web": io.cilium.l4lb.port: 70000 is out of range 1..65535
Services:     2
Frontends:    2 (1 Done, 1 Error)
              Error 10.1.2.4:80/TCP (web): write l4xds_backends: no space left on device
Backends:     3 (2 active, 1 terminating)
Datapath:     bpf on eth0, eth1; maps at /sys/fs/bpf/l4xds: 2 services, 3 backends
`,
		},
		{
			name: "degraded before the first sync, no datapath",
			v:    degraded,
			want: `
Health:       Degraded
              job-xds-client (for 42s): disconnected from xds.example:9000: connection refused
Readiness:    not ready: waiting for datapath: the first complete state is served
xDS server:   xds.example:9000 (delta)
xDS state:    backoff for 2s, 4 connection attempts
              last error: xDS server xds.example:9000: connection refused
              Cluster: version -, not synced
Resources:    none
Services:     0
Frontends:    1 (1 Pending); Pending stays: no datapath reconciles them (--datapath=none)
Backends:     0
Datapath:     none: no forwarding, tables only
`,
			err:      "degraded: job-xds-client: disconnected from xds.example:9000: connection refused",
			notReady: "not ready: waiting for datapath: the first complete state is served",
		},
		{
			name: "disconnected after the first state: degraded, still ready",
			v:    lost,
			want: `
Health:       Degraded
              job-xds-client (for 42s): disconnected from xds.example:9000: connection refused
Readiness:    ready: serving the last complete state
xDS server:   xds.example:9000 (delta)
xDS state:    backoff for 2s, 4 connection attempts
              last error: xDS server xds.example:9000: connection refused
              Cluster: version -, not synced
Resources:    none
Services:     0
Frontends:    1 (1 Done)
Backends:     0
Datapath:     none: no forwarding, tables only
`,
			err: "degraded: job-xds-client: disconnected from xds.example:9000: connection refused",
		},
		{
			name: "served by the second server, the first refusing connections",
			v: statusView{
				Health: api.HealthReport{OK: true, Ready: true, Statuses: []health.Status{
					{Scope: "job-xds-client", Level: cell.StatusOK, Message: "connected to xds-b.example:9000, 1 types synced"},
				}},
				XDS:      onFallback(),
				Datapath: datapathStatus{Mode: "none"},
			},
			want: `
Health:        OK (1 component)
xDS server:    xds-b.example:9000 (sotw), server 2 of 2
xDS state:     connected for 5m0s, 4 connection attempts
               Cluster: version v3, synced
xDS servers:   1. xds.example:9000: backoff for 3s, 3 attempts, 3 failures: Error while dialing: dial tcp 10.0.0.1:9000: connect: connection refused
               2. xds-b.example:9000: connected for 5m0s, 1 attempt, 0 failures, in use
Resources:     1 acked
Services:      0
Frontends:     0
Backends:      0
Datapath:      none: no forwarding, tables only
`,
		},
		{
			name: "xDS disabled, maps not readable",
			v: statusView{
				Health:   api.HealthReport{OK: true, Ready: true},
				Datapath: datapathStatus{Mode: "bpf", PinDir: "/sys/fs/bpf/l4xds", Error: "open pinned map l4xds_services: no such file or directory"},
			},
			want: `
Health:      OK (0 components)
xDS state:   xDS control plane disabled (--enable-xds-control-plane)
Services:    0
Frontends:   0
Backends:    0
Datapath:    bpf on no devices; maps at /sys/fs/bpf/l4xds: not readable: open pinned map l4xds_services: no such file or directory
`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printStatus(&out, c.v, now); err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimPrefix(c.want, "\n"); out.String() != want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
			}
			err := c.v.degraded()
			if c.err == "" && err != nil || c.err != "" && (err == nil || err.Error() != c.err) {
				t.Errorf("exit error %v, want %q", err, c.err)
			}
			err = c.v.notReady()
			if c.notReady == "" && err != nil || c.notReady != "" && (err == nil || err.Error() != c.notReady) {
				t.Errorf("--readiness exit error %v, want %q", err, c.notReady)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestXDSStatusShowsEveryResource(t *testing.T) {
	for _, c := range []struct {
		name string
		v    xdsView
		want string
	}{
		{
			name: "disabled",
			v:    xdsView{},
			want: "xDS control plane disabled (--enable-xds-control-plane)\n",
		},
		{
			name: "starting",
			v:    xdsView{Enabled: true},
			want: `
State:   starting: no stream yet

No resources requested or received yet
`,
		},
		{
			name: "connected, a NACKed resource",
			v: xdsView{
				Enabled: true,
				Types:   []xdsTypeStatus{connected(xds.ClusterType, "v7"), connected(xds.EndpointType, "v7")},
				Resources: []xdsResource{
					{TypeURL: xds.ClusterType, Name: "db", Version: "v7", State: stateAcked, Updated: now},
					{TypeURL: xds.ClusterType, Name: "web", State: stateNacked, Updated: now,
						Error: "cluster \"web\": io.cilium.l4lb.vip: \"x\" is not an IP address\nsecond line"},
					{TypeURL: xds.EndpointType, Name: "db", State: stateRequested, Updated: now},
				},
			},
			want: `
Server:   xds.example:9000 (sotw)
State:    connected for 5m0s, 1 connection attempt

Type                    Version   Synced
Cluster                 v7        yes
ClusterLoadAssignment   v7        yes

Type                    Name   Version   State       Updated                Error
Cluster                 db     v7        acked       2026-01-02T10:00:00Z   -
Cluster                 web    -         nacked      2026-01-02T10:00:00Z   cluster "web": io.cilium.l4lb.vip: "x" is not an IP address; second line
ClusterLoadAssignment   db     -         requested   2026-01-02T10:00:00Z   -
`,
		},
		{
			name: "served by the second server, the first refusing connections",
			v:    onFallback(),
			want: `
Server:   xds-b.example:9000 (sotw), server 2 of 2
State:    connected for 5m0s, 4 connection attempts

Priority   Server               Name            In use   State                Attempts   Failures   Last error
1          xds.example:9000     xds.example     no       backoff for 3s       3          3          Error while dialing: dial tcp 10.0.0.1:9000: connect: connection refused
2          xds-b.example:9000   xds-b.example   yes      connected for 5m0s   1          0          -

Type      Version   Synced
Cluster   v3        yes

Type      Name   Version   State   Updated                Error
Cluster   db     v3        acked   2026-01-02T10:00:00Z   -
`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printXDS(&out, c.v, now); err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimPrefix(c.want, "\n"); out.String() != want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
			}
		})
	}
}

// The mirrors of the xDS tables' rows decode every field the agent
// encodes, and their names and states are pkg/xds's.
func TestXDSMirrorsMatchPkgXDS(t *testing.T) {
	if xdsStatusTable != xds.StatusTableName || xdsResourcesTable != xds.ResourcesTableName {
		t.Errorf("table names %q %q, want %q %q", xdsStatusTable, xdsResourcesTable, xds.StatusTableName, xds.ResourcesTableName)
	}
	for got, want := range map[string]xds.ResourceState{
		stateAcked: xds.StateAcked, stateNacked: xds.StateNacked, stateNackedButCached: xds.StateNackedButCached,
		stateDoesNotExist: xds.StateDoesNotExist, stateRequested: xds.StateRequested,
	} {
		if got != string(want) {
			t.Errorf("state %q, want %q", got, want)
		}
	}
	if got := shortTypeName(xds.EndpointType); got != xds.ShortTypeName(xds.EndpointType) {
		t.Errorf("shortTypeName = %q", got)
	}
	sameFields(t, &xds.TypeStatus{}, &xdsTypeStatus{})
	sameFields(t, &xds.ResourceStatus{}, &xdsResource{})
	sameFields(t, &xds.ServerStatus{}, &xdsServer{})
	if xdsServersTable != xds.ServersTableName {
		t.Errorf("table name %q, want %q", xdsServersTable, xds.ServersTableName)
	}
}

// sameFields fills every field of orig, encodes it as the agent does and
// checks that the mirror decodes it back to the same JSON.
func sameFields(t *testing.T, orig, mirror any) {
	t.Helper()
	v := reflect.ValueOf(orig).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x" + v.Type().Field(i).Name)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Uint64:
			f.SetUint(uint64(i + 1))
		case reflect.Int:
			f.SetInt(int64(i + 1))
		case reflect.Struct:
			f.Set(reflect.ValueOf(now.Add(time.Duration(i) * time.Second)))
		default:
			t.Fatalf("%T.%s: kind %s not filled by the test", orig, v.Type().Field(i).Name, f.Kind())
		}
	}
	b, err := json.Marshal(orig)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(mirror); err != nil {
		t.Fatalf("%T into %T: %v", orig, mirror, err)
	}
	back, _ := json.Marshal(mirror)
	if string(back) != string(b) {
		t.Errorf("%T through %T:\n%s\nwant\n%s", orig, mirror, back, b)
	}
}

func TestSettingsFromFlagsAndConfigDir(t *testing.T) {
	var s api.Settings
	if err := json.Unmarshal([]byte(`{"devices":["eth0","eth1"],"enable-xds-control-plane":true,"dir-devices":"eth0,eth1","dir-bool":"true","empty":"[]"}`), &s); err != nil {
		t.Fatal(err)
	}
	if got := settingStrings(s, "devices"); !reflect.DeepEqual(got, []string{"eth0", "eth1"}) {
		t.Errorf("devices %q", got)
	}
	if got := settingStrings(s, "dir-devices"); !reflect.DeepEqual(got, []string{"eth0", "eth1"}) {
		t.Errorf("devices from the config dir %q", got)
	}
	if got := settingStrings(s, "empty"); got != nil {
		t.Errorf("empty list %q", got)
	}
	if !settingBool(s, "enable-xds-control-plane") || !settingBool(s, "dir-bool") || settingBool(s, "missing") {
		t.Error("booleans misread")
	}
}
