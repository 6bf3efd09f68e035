// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/xds"
)

func TestApplyBlock(t *testing.T) {
	withFlags := func(f func(*xds.Config)) xds.Config {
		c := xds.DefaultConfig
		f(&c)
		return c
	}
	// Inside Cilium every service has a namespace.
	inCilium := l4lb.Config{XDSMetadataKey: l4lb.MetadataKey, XDSNamespace: "xds"}
	for _, tc := range []struct {
		name      string
		flags     xds.Config
		nameFlags l4lb.Config // l4lb.DefaultConfig when zero
		block     string
		want      xds.Config
		wantNames l4lb.Config // inCilium when zero
		err       string
	}{{
		name:  "no block keeps the flags",
		flags: withFlags(func(c *xds.Config) { c.XDSServerAddress = "a:1" }),
		want:  withFlags(func(c *xds.Config) { c.XDSServerAddress = "a:1" }),
	}, {
		name:  "the CFP's block verbatim",
		flags: xds.DefaultConfig,
		block: `
# Enables the xDS client in the Cilium agent for L4 LB
enabled: true
server-address: "xds.my-company.com:9000"
client-cert-path: "/var/lib/cilium/tls/xds-client.crt"
client-key-path: "/var/lib/cilium/tls/xds-client.key"
ca-cert-path: "/var/lib/cilium/tls/xds-ca.crt"
`,
		want: withFlags(func(c *xds.Config) {
			c.EnableXDSControlPlane = true
			c.XDSServerAddress = "xds.my-company.com:9000"
			c.XDSClientCertPath = "/var/lib/cilium/tls/xds-client.crt"
			c.XDSClientKeyPath = "/var/lib/cilium/tls/xds-client.key"
			c.XDSCACertPath = "/var/lib/cilium/tls/xds-ca.crt"
		}),
	}, {
		name:  "the CFP author's prototype's block verbatim",
		flags: xds.DefaultConfig,
		block: `
enabled: true
server-address: "xds.example.net:9000"
client-cert-path: "/var/lib/cilium/tls/xds-client.crt"
client-key-path: "/var/lib/cilium/tls/xds-client.key"
ca-cert-path: "/var/lib/cilium/tls/xds-ca.crt"
metadata-key: "io.cilium.l4lb"
namespace: "platform"
cluster: "prod"
`,
		want: withFlags(func(c *xds.Config) {
			c.EnableXDSControlPlane = true
			c.XDSServerAddress = "xds.example.net:9000"
			c.XDSClientCertPath = "/var/lib/cilium/tls/xds-client.crt"
			c.XDSClientKeyPath = "/var/lib/cilium/tls/xds-client.key"
			c.XDSCACertPath = "/var/lib/cilium/tls/xds-ca.crt"
		}),
		wantNames: l4lb.Config{XDSMetadataKey: "io.cilium.l4lb", XDSNamespace: "platform", XDSCluster: "prod"},
	}, {
		name:      "metadata-key chooses the key",
		flags:     xds.DefaultConfig,
		block:     "metadata-key: custom",
		want:      xds.DefaultConfig,
		wantNames: l4lb.Config{XDSMetadataKey: "custom", XDSNamespace: "xds"},
	}, {
		name:      "an empty namespace is the default",
		flags:     xds.DefaultConfig,
		block:     `namespace: ""`,
		want:      xds.DefaultConfig,
		wantNames: inCilium,
	}, {
		name:      "the names by flags",
		flags:     xds.DefaultConfig,
		nameFlags: l4lb.Config{XDSMetadataKey: "custom", XDSNamespace: "platform", XDSCluster: "prod"},
		block:     "cluster: prod",
		want:      xds.DefaultConfig,
		wantNames: l4lb.Config{XDSMetadataKey: "custom", XDSNamespace: "platform", XDSCluster: "prod"},
	}, {
		name:      "a name both ways",
		flags:     xds.DefaultConfig,
		nameFlags: l4lb.Config{XDSMetadataKey: l4lb.MetadataKey, XDSNamespace: "platform"},
		block:     "namespace: team-a",
		err:       "xds-control-plane: namespace is team-a but --xds-namespace is platform: set it once",
	}, {
		name:  "the other settings under their flag names",
		flags: xds.DefaultConfig,
		block: "protocol: delta\nresource-does-not-exist-timeout: 30s\nnode-zone: z1\n",
		want: withFlags(func(c *xds.Config) {
			c.XDSProtocol = "delta"
			c.XDSResourceDoesNotExistTimeout = 30 * time.Second
			c.XDSNodeZone = "z1"
		}),
	}, {
		name:  "the same value both ways is fine",
		flags: withFlags(func(c *xds.Config) { c.XDSServerAddress = "a:1" }),
		block: "server-address: a:1",
		want:  withFlags(func(c *xds.Config) { c.XDSServerAddress = "a:1" }),
	}, {
		name:  "different values both ways",
		flags: withFlags(func(c *xds.Config) { c.XDSServerAddress = "a:1" }),
		block: "server-address: b:2",
		err:   "xds-control-plane: server-address is b:2 but --xds-server-address is a:1: set it once",
	}, {
		name:  "a typo names the key",
		flags: xds.DefaultConfig,
		block: "server-adress: b:2",
		err:   "xds-control-plane: yaml: unmarshal errors:\n  line 1: field server-adress not found in type l4xds.cfpBlock",
	}, {
		name:  "a wrong type names the line",
		flags: xds.DefaultConfig,
		block: "enabled: maybe",
		err:   "xds-control-plane: yaml: unmarshal errors:\n  line 1: cannot unmarshal !!str `maybe` into bool",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.nameFlags == (l4lb.Config{}) {
				tc.nameFlags = l4lb.DefaultConfig
			}
			if tc.wantNames == (l4lb.Config{}) {
				tc.wantNames = inCilium
			}
			got, gotNames, err := applyBlock(tc.flags, tc.nameFlags, block{XDSControlPlane: tc.block})
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			if gotNames != tc.wantNames {
				t.Errorf("names: got %+v, want %+v", gotNames, tc.wantNames)
			}
		})
	}
}
