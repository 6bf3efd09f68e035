// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// encodedSets maps the first element of each shared []*anypb.Any (see
// sharedSet) to its set, whose encoding the codec sends instead of
// encoding the resources again for every stream. An entry holds its slice,
// so that no other slice can have that address while the entry exists.
var encodedSets sync.Map // **anypb.Any → *sharedSet

func registerSet(s *sharedSet) {
	if len(s.anys) > 0 && len(s.encoded) > 0 {
		encodedSets.Store(&s.anys[0], s)
	}
}

func unregisterSet(s *sharedSet) {
	if len(s.anys) > 0 {
		encodedSets.CompareAndDelete(&s.anys[0], s)
	}
}

// encodedResources is the encoding of a response's resources as field 2
// of a DiscoveryResponse, when they are a registered set; nil otherwise.
func encodedResources(resources []*anypb.Any) []byte {
	if len(resources) == 0 {
		return nil
	}
	v, ok := encodedSets.Load(&resources[0])
	if !ok {
		return nil
	}
	s := v.(*sharedSet)
	if len(s.anys) != len(resources) {
		return nil
	}
	return s.encoded
}

// codec is gRPC's proto codec, except that a DiscoveryResponse whose
// resources are a shared set is sent as its own fields followed by the
// set's encoding, which all the streams' messages share: protobuf allows
// fields in any order, and a repeated field's elements to come in pieces.
// A fleet's change then costs a header per stream rather than an encoding
// of every resource, and no buffer of the resources' size per stream
// while its connection drains.
type codec struct{ base encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(grpcproto.Name)} }

func (codec) Name() string { return grpcproto.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*discovery.DiscoveryResponse)
	if !ok {
		return c.base.Marshal(v)
	}
	enc := encodedResources(resp.GetResources())
	if enc == nil {
		return c.base.Marshal(v)
	}
	head, err := proto.Marshal(&discovery.DiscoveryResponse{
		VersionInfo:    resp.GetVersionInfo(),
		Canary:         resp.GetCanary(),
		TypeUrl:        resp.GetTypeUrl(),
		Nonce:          resp.GetNonce(),
		ControlPlane:   resp.GetControlPlane(),
		ResourceErrors: resp.GetResourceErrors(),
	})
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(enc)}, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }
