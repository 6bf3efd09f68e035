// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// As root, the tests run in network, mount and PID namespaces of their own:
// nothing of the host's network decides a result, nothing they make
// outlives them.
func TestMain(m *testing.M) { netns.Main(m) }
