// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// A stream held for the first state ends when the server stops: Stop
// returns, and the client sees its stream end.
func TestServerStopEndsHeldStreams(t *testing.T) {
	env := startServer(t)
	c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	env.waitForLogs(t, "xDS stream waits for the first state", 1)
	env.srv.Stop()
	if _, err := c.stream.Recv(); err == nil {
		t.Fatal("a held stream got a response after Stop, want its end")
	}
}
