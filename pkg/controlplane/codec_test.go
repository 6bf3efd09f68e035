// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The codec writes every field of DiscoveryResponse but the resources
// itself: a field it does not know would be lost.
func TestCodecKnowsEveryDiscoveryResponseField(t *testing.T) {
	known := []string{"version_info", "resources", "canary", "type_url", "nonce", "control_plane", "resource_errors"}
	fields := (&discovery.DiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if name := string(fields.Get(i).Name()); !slices.Contains(known, name) {
			t.Errorf("DiscoveryResponse has a field %q that the codec does not copy", name)
		}
	}
}

// A response of a shared set decodes as the same message as gRPC's own
// encoding of it; the set's encoding is shared, not copied.
func TestCodecSendsTheSharedEncoding(t *testing.T) {
	c := newSotwCache(resource.EndpointType, "p-")
	upd := map[string]types.Resource{}
	for name, m := range fleetResources(t, 3, 0)[resource.EndpointType] {
		upd[name] = m
	}
	if err := c.update(upd, nil); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	set := c.setLocked(slices.Collect(func(yield func(*sotwResource) bool) {
		for _, r := range c.resources {
			yield(r)
		}
	}))
	c.mu.Unlock()

	resp := &discovery.DiscoveryResponse{
		VersionInfo: "p-1", Resources: set.anys, Canary: true, TypeUrl: resource.EndpointType, Nonce: "7",
		ControlPlane:   &corev3.ControlPlane{Identifier: "cp"},
		ResourceErrors: []*discovery.ResourceError{{ErrorDetail: &status.Status{Message: "x"}}},
	}
	data, err := newCodec().Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 2 || &data[1].ReadOnlyData()[0] != &set.encoded[0] {
		t.Errorf("encoded as %d buffers, not the set's encoding after a header", len(data))
	}
	var got discovery.DiscoveryResponse
	if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, resp) {
		t.Errorf("decoded %v, want %v", &got, resp)
	}

	// Part of a set, or any other slice, is encoded as usual.
	for _, anys := range [][]*anypb.Any{set.anys[:2], slices.Clone(set.anys)} {
		resp := &discovery.DiscoveryResponse{VersionInfo: "p-1", Resources: anys, Nonce: "8"}
		data, err := newCodec().Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) == 2 && &data[1].ReadOnlyData()[0] == &set.encoded[0] {
			t.Errorf("%d resources sent as the set of %d", len(anys), len(set.anys))
		}
		var got discovery.DiscoveryResponse
		if err := proto.Unmarshal(data.Materialize(), &got); err != nil || !proto.Equal(&got, resp) {
			t.Errorf("decoded %v (%v), want %v", &got, err, resp)
		}
	}

	// A change retires the sets of the version before.
	if err := c.update(map[string]types.Resource{"svc-0": fleetResources(t, 3, 1)[resource.EndpointType]["svc-0"]}, nil); err != nil {
		t.Fatal(err)
	}
	if encodedResources(set.anys) != nil {
		t.Errorf("a set of the version before a change is still registered")
	}
}
