// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/xds"
)

func TestApplyBlock(t *testing.T) {
	withFlags := func(f func(*xds.Config)) xds.Config {
		c := xds.DefaultConfig
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name  string
		flags xds.Config
		block string
		want  xds.Config
		err   string
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
			got, err := applyBlock(tc.flags, block{XDSControlPlane: tc.block})
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
		})
	}
}
