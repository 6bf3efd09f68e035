// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"testing"

	"github.com/l4xds/l4xds/test/netns"
)

// As root, the schedules run in network, mount and PID namespaces of their
// own: the servers' fixed ports are theirs alone, and nothing they start
// outlives them.
func TestMain(m *testing.M) { netns.Main(m) }
