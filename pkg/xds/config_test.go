// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig
	valid.EnableXDSControlPlane = true
	valid.XDSServerAddress = "xds.example.internal:9000"
	valid.XDSClientCertPath, valid.XDSClientKeyPath, valid.XDSCACertPath = "c.crt", "c.key", "ca.crt"

	tests := []struct {
		name   string
		modify func(*Config)
		want   []string // substrings of the error; none if valid
	}{
		{"valid", func(*Config) {}, nil},
		{"disabled needs nothing", func(c *Config) { *c = DefaultConfig }, nil},
		{"disabled still checks its flags", func(c *Config) { *c = DefaultConfig; c.XDSProtocol = "grpc" },
			[]string{`--xds-protocol: "grpc" is not sotw or delta`}},
		{"insecure needs no certificates", func(c *Config) {
			c.XDSInsecure = true
			c.XDSClientCertPath, c.XDSClientKeyPath, c.XDSCACertPath = "", "", ""
		}, nil},
		{"no address", func(c *Config) { c.XDSServerAddress = "" },
			[]string{"--xds-server-address: must be set when --enable-xds-control-plane is true"}},
		{"address without port", func(c *Config) { c.XDSServerAddress = "xds" },
			[]string{`--xds-server-address: "xds" is not host:port`}},
		{"second address without port", func(c *Config) { c.XDSServerAddress = "a:9000,b" },
			[]string{`--xds-server-address: "b" is not host:port`}},
		{"empty server in the list", func(c *Config) { c.XDSServerAddress = "a:9000,,b:9000" },
			[]string{`--xds-server-address: server 2 of "a:9000,,b:9000" is empty`}},
		{"server listed twice", func(c *Config) { c.XDSServerAddress = "a:9000,b:9000,a:9000" },
			[]string{`--xds-server-address: "a:9000" is listed twice (servers 1 and 3)`}},
		{"names not aligned with the servers", func(c *Config) {
			c.XDSServerAddress, c.XDSServerName = "a:9000,b:9000,c:9000", "x,y"
		}, []string{"--xds-server-name: 2 names for 3 servers in --xds-server-address: " +
			"give one name for every server, or one per server in the same order"}},
		{"no certificates", func(c *Config) { c.XDSClientCertPath, c.XDSCACertPath = "", "" },
			[]string{"--xds-client-cert-path: must be set unless --xds-insecure is true",
				"--xds-ca-cert-path: must be set unless --xds-insecure is true"}},
		{"protocol", func(c *Config) { c.XDSProtocol = "grpc" },
			[]string{`--xds-protocol: "grpc" is not sotw or delta`}},
		{"receive size", func(c *Config) { c.XDSMaxRecvMsgSize = 0 },
			[]string{"--xds-max-recv-msg-size: 0 is not a positive number of bytes"}},
		{"timeout", func(c *Config) { c.XDSResourceDoesNotExistTimeout = -time.Second },
			[]string{"--xds-resource-does-not-exist-timeout: -1s is not positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.modify(&cfg)
			err := cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %s", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigServers(t *testing.T) {
	tests := []struct {
		name, addresses, names string
		want                   []serverConfig
	}{
		{"one, its host", "xds.example.internal:9000", "",
			[]serverConfig{{address: "xds.example.internal:9000", name: "xds.example.internal"}}},
		{"one, named", "10.0.0.1:9000", "xds.example.internal",
			[]serverConfig{{address: "10.0.0.1:9000", name: "xds.example.internal"}}},
		{"two, their hosts, in order", "a.example:9000, b.example:9001", "",
			[]serverConfig{{address: "a.example:9000", name: "a.example"}, {address: "b.example:9001", name: "b.example"}}},
		{"two, one name for both", "10.0.0.1:9000,10.0.0.2:9000", "xds.example.internal",
			[]serverConfig{{address: "10.0.0.1:9000", name: "xds.example.internal"}, {address: "10.0.0.2:9000", name: "xds.example.internal"}}},
		{"two, one name each", "10.0.0.1:9000,10.0.0.2:9000", "cp-a.example,cp-b.example",
			[]serverConfig{{address: "10.0.0.1:9000", name: "cp-a.example"}, {address: "10.0.0.2:9000", name: "cp-b.example"}}},
		{"an empty name is the host", "a.example:9000,10.0.0.2:9000", ",cp-b.example",
			[]serverConfig{{address: "a.example:9000", name: "a.example"}, {address: "10.0.0.2:9000", name: "cp-b.example"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Config{XDSServerAddress: tt.addresses, XDSServerName: tt.names}.servers()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("servers = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg := Config{XDSServerAddress: "xds.example.internal:9000"}
	t.Setenv("NODE_NAME", "node-from-env")
	if got := cfg.nodeID(); got != "node-from-env" {
		t.Errorf("node id = %q, want $NODE_NAME", got)
	}
	cfg.XDSNodeID = "explicit"
	if got := cfg.nodeID(); got != "explicit" {
		t.Errorf("node id = %q, want the configured one", got)
	}
}

func newTestHive(invoke any) *hive.Hive {
	return hive.New(statedb.Cell, job.Cell, cell.SimpleHealthCell, Cell, cell.Invoke(invoke))
}

func TestCellDisabled(t *testing.T) {
	log := hivetest.Logger(t)
	var client *Client
	h := newTestHive(func(c *Client, _ statedb.Table[*ResourceStatus], _ statedb.Table[*TypeStatus]) {
		client = c
		c.Watch(ClusterType, true, HandlerFunc(func(context.Context, Update) map[string]error { return nil }))
		c.SetNames(EndpointType, []string{"x"})
	})
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	defer h.Stop(log, context.Background())
	select {
	case <-client.Synced(ClusterType):
	default:
		t.Error("Synced of a disabled client is not closed")
	}
	if n := client.Status().NumObjects(client.db.ReadTxn()); n != 0 {
		t.Errorf("%d status rows on a disabled client", n)
	}
	if client.Attempts() != 0 {
		t.Errorf("a disabled client connected")
	}
}

func TestCellFlags(t *testing.T) {
	h := newTestHive(func(*Client) {})
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	err := flags.Parse([]string{
		"--enable-xds-control-plane", "--xds-server-address=xds:9000", "--xds-insecure", "--xds-protocol=grpc",
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), `--xds-protocol: "grpc" is not sotw or delta`) {
		t.Errorf("Populate error = %v, want the --xds-protocol error", err)
	}
}

func TestNackMessage(t *testing.T) {
	got := nackMessage(ClusterType, map[string]string{
		"db":  "io.cilium.l4lb.port: 70000 is out of range 1..65535",
		"api": `cluster "api": already named`,
		"#12": "cluster #12: resource has no name",
		"#3":  "cluster #3: resource has no name",
		"zz":  `VIP 10.0.0.1:80/TCP of cluster "zz" is held by cluster "api"`,
	})
	// By name, not by text; unnamed last, by index.
	want := `cluster "api": already named; cluster "db": io.cilium.l4lb.port: 70000 is out of range 1..65535; ` +
		`VIP 10.0.0.1:80/TCP of cluster "zz" is held by cluster "api"; cluster #3: resource has no name; cluster #12: resource has no name`
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := KindName(EndpointType); got != "cluster_load_assignment" {
		t.Errorf("KindName = %q", got)
	}
}

func TestCleanError(t *testing.T) {
	handshake := errors.New("tls: certificate signed by unknown authority")
	tests := []struct {
		name      string
		err       error
		handshake error
		want      string
	}{
		{"handshake error wins", status.Error(codes.Unavailable, "connection error: anything"), handshake, handshake.Error()},
		{"unwrapped", status.Error(codes.Unavailable,
			`connection error: desc = "transport: authentication handshake failed: tls: bad thing"`), nil, "tls: bad thing"},
		{"preface", status.Error(codes.Unavailable,
			`connection error: desc = "error reading server preface: remote error: tls: unknown certificate authority"`),
			nil, "remote error: tls: unknown certificate authority"},
		{"other code keeps it", status.Error(codes.PermissionDenied, "node not allowed"), nil, "PermissionDenied: node not allowed"},
		{"not a status", errors.New("plain"), nil, "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cleanError(tt.err, tt.handshake).Error(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestConfigServerFeatures(t *testing.T) {
	for _, tt := range []struct {
		name, addresses, features string
		want                      []bool
		err                       string
	}{
		{"none", "a:1,b:2", "", []bool{false, false}, ""},
		{"every server", "a:1,b:2", "ignore_resource_deletion", []bool{true, true}, ""},
		{"the first only", "a:1,b:2", "ignore_resource_deletion,", []bool{true, false}, ""},
		{"the second only, joined", "a:1,b:2", ",+ignore_resource_deletion", []bool{false, true}, ""},
		{"unknown", "a:1,b:2", "ignore_resource_deletion,federation", nil,
			`--xds-server-features: "federation" of server b:2 is not a known feature (ignore_resource_deletion)`},
		{"too many lists", "a:1,b:2", ",,", nil,
			"--xds-server-features: 3 lists for 2 servers in --xds-server-address: give one list for every server, or one per server in the same order"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Config{XDSServerAddress: tt.addresses, XDSServerFeatures: tt.features}.servers()
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error = %v, want %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range got {
				if s.ignoreResourceDeletion != tt.want[i] {
					t.Errorf("server %d ignore_resource_deletion = %t, want %t", i+1, s.ignoreResourceDeletion, tt.want[i])
				}
			}
		})
	}
}
