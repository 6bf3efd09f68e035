// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

type rpcStatus = rpcstatus.Status

// resourceWrapperType is the type URL of a resource wrapped in a
// discovery Resource, which SotW servers may send to carry a name.
const resourceWrapperType = "type.googleapis.com/envoy.service.discovery.v3.Resource"

// request is a DiscoveryRequest or a DeltaDiscoveryRequest, whichever the
// stream speaks.
type request struct {
	typeURL     string
	node        *corev3.Node
	version     string   // SotW
	names       []string // SotW
	subscribe   []string // Delta
	unsubscribe []string // Delta
	// initialVersions is initial_resource_versions (Delta).
	initialVersions map[string]string
	nonce           string
	errorDetail     *rpcStatus
}

// response is a DiscoveryResponse or a DeltaDiscoveryResponse.
type response struct {
	typeURL   string
	version   string // version_info; system_version_info in Delta
	nonce     string
	resources []rawResource
	removed   []string // Delta
}

// rawResource is one resource before decoding. The name is known up front
// in Delta only.
type rawResource struct {
	name    string
	version string
	any     *anypb.Any
}

type adsStream interface {
	send(*request) error
	recv() (*response, error)
}

func openStream(ctx context.Context, conn *grpc.ClientConn, protocol string) (adsStream, error) {
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	if protocol == ProtocolDelta {
		s, err := ads.DeltaAggregatedResources(ctx)
		return deltaStream{s}, err
	}
	s, err := ads.StreamAggregatedResources(ctx)
	return sotwStream{s}, err
}

type sotwStream struct {
	s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func (s sotwStream) send(r *request) error {
	return s.s.Send(&discoveryv3.DiscoveryRequest{
		VersionInfo:   r.version,
		Node:          r.node,
		ResourceNames: r.names,
		TypeUrl:       r.typeURL,
		ResponseNonce: r.nonce,
		ErrorDetail:   r.errorDetail,
	})
}

func (s sotwStream) recv() (*response, error) {
	m, err := s.s.Recv()
	if err != nil {
		return nil, err
	}
	resp := &response{
		typeURL:   m.GetTypeUrl(),
		version:   m.GetVersionInfo(),
		nonce:     m.GetNonce(),
		resources: make([]rawResource, 0, len(m.GetResources())),
	}
	for _, a := range m.GetResources() {
		r := rawResource{version: m.GetVersionInfo(), any: a}
		if a.GetTypeUrl() == resourceWrapperType {
			var w discoveryv3.Resource
			if err := a.UnmarshalTo(&w); err == nil {
				r.name, r.any = w.GetName(), w.GetResource()
			}
		}
		resp.resources = append(resp.resources, r)
	}
	return resp, nil
}

type deltaStream struct {
	s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func (s deltaStream) send(r *request) error {
	return s.s.Send(&discoveryv3.DeltaDiscoveryRequest{
		Node:                     r.node,
		TypeUrl:                  r.typeURL,
		ResourceNamesSubscribe:   r.subscribe,
		ResourceNamesUnsubscribe: r.unsubscribe,
		InitialResourceVersions:  r.initialVersions,
		ResponseNonce:            r.nonce,
		ErrorDetail:              r.errorDetail,
	})
}

func (s deltaStream) recv() (*response, error) {
	m, err := s.s.Recv()
	if err != nil {
		return nil, err
	}
	resp := &response{
		typeURL: m.GetTypeUrl(),
		// Shown in the status table only; Delta requests carry no version.
		version:   m.GetSystemVersionInfo(),
		nonce:     m.GetNonce(),
		resources: make([]rawResource, 0, len(m.GetResources())),
		removed:   m.GetRemovedResources(),
	}
	for _, r := range m.GetResources() {
		resp.resources = append(resp.resources, rawResource{name: r.GetName(), version: r.GetVersion(), any: r.GetResource()})
	}
	return resp, nil
}
