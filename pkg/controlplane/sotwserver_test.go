// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
)

// A client that rejects the first response of a stream NACKs with the
// version it accepted before: none, or one of another server process. The
// server must not answer that with the same response again (the client
// would reject it again, in a loop), but wait for a change.
func TestSotwServerDoesNotResendARejectedFirstResponse(t *testing.T) {
	for _, tc := range []struct{ name, accepted string }{
		{"no version accepted", ""},
		{"a version of another process", "otherprocess-7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startServer(t)
			cfp := cfpResources(t)
			if err := env.srv.Set(cfp); err != nil {
				t.Fatal(err)
			}
			c := env.sotw(t, nil)
			c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: tc.accepted})
			first, err := c.stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			c.send(&discovery.DiscoveryRequest{
				TypeUrl: resource.ClusterType, VersionInfo: tc.accepted, ResponseNonce: first.GetNonce(),
				ErrorDetail: &status.Status{Code: 3, Message: "rejected"},
			})
			env.waitForLogs(t, "NACK", 1)
			if err := env.srv.Set(withVIP(t, cfp, "10.1.2.4")); err != nil {
				t.Fatal(err)
			}
			next, err := c.stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if next.GetVersionInfo() == first.GetVersionInfo() {
				t.Fatalf("the rejected version %s was sent again before any change", first.GetVersionInfo())
			}
		})
	}
}
