// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"
)

// TestFlagsDoNotCollide registers the flags of Cilium's whole agent plus
// this cell, as cmd/cilium-agent does: the hive refuses a flag defined
// twice, so a Cilium upgrade that adds one of our names fails here.
// (Cilium's unused experimental xDS client, pkg/xds/experimental/client,
// defines --xds-server-address and --xds-node-id too: it must stay out of
// the agent this module builds.)
func TestFlagsDoNotCollide(t *testing.T) {
	flags := pflag.NewFlagSet("cilium-agent", pflag.ContinueOnError)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("registering the flags of Cilium's agent and the l4xds cell: %v", r)
			}
		}()
		hive.New(cmd.Agent, Cell).RegisterFlags(flags)
	}()
	for _, name := range []string{"enable-xds-control-plane", "xds-server-address", "xds-client-cert-path", "xds-control-plane", "xds-metadata-key", "xds-namespace", "xds-cluster", "bpf-lb-algorithm-annotation", "enable-k8s"} {
		if flags.Lookup(name) == nil {
			t.Errorf("--%s is missing", name)
		}
	}
}
