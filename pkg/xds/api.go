// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"

	"google.golang.org/protobuf/proto"
)

// Well-known type URLs.
const (
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// Resource is one decoded resource of a response.
type Resource struct {
	Name string
	// Version is the resource's version: the response's version_info in
	// SotW, the resource's own version in Delta.
	Version string
	Message proto.Message
}

// Update is what one response changed for one type, after the client
// dropped the resources that did not change since the version it holds.
type Update struct {
	TypeURL string
	// Upserted are new or changed resources, then, sorted by name, the
	// resources the handler rejected earlier, offered again (see Handler).
	// A name appears at most once.
	Upserted []Resource
	// Removed are names that no longer exist: absent from a SotW response of
	// a wildcard type, in a Delta removed_resources, swept after a reconnect
	// because the new server's first full state did not have them, or whose
	// does-not-exist timer fired.
	Removed []string
}

// Handler consumes the updates of one type. It is called from the client's
// goroutine, one update at a time, in the order the server sent them.
//
// It returns the resources it rejected, by name. The client NACKs the
// response with an error_detail naming each of them, keeps their previous
// accepted version (state nacked-but-cached, or nacked if there is none),
// and keeps the good resources of the same response.
//
// A resource may be valid or not depending on others (two clusters that
// want one VIP), and a Delta server never sends a rejected resource again.
// So the last rejected version of each resource is offered again with every
// later update of its type, until it is accepted (it then becomes the
// accepted version), changed or removed. Rejecting it again NACKs only a
// response that carries it (SotW resends every resource of a wildcard
// type). Removals cannot be rejected.
type Handler interface {
	HandleUpdate(ctx context.Context, u Update) (rejected map[string]error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, u Update) map[string]error

func (f HandlerFunc) HandleUpdate(ctx context.Context, u Update) map[string]error { return f(ctx, u) }

// InSlices marks h as a handler whose resources are each valid or not on
// their own, whatever else the response carries (EDS: a
// ClusterLoadAssignment is one service's backends). The client then decodes
// and delivers a large response a slice at a time (resources in the
// response's order up to the one that reaches sliceBytes of encoded
// resources) instead of decoding it whole: the decoded messages of a
// million endpoints would otherwise all be on the heap at once. Each slice
// is one call of h; every resource is still in exactly one call, whole.
// Removals and the offers of earlier rejected resources come with the last
// slice, and the response is ACKed or NACKed once, after it.
func InSlices(h Handler) Handler { return slicedHandler{Handler: h} }

// InGrowingSlices is InSlices with slices that start small: the first of a
// response is firstSliceBytes, each next one twice the last, up to
// grownSliceBytes. A consumer whose own consumer works through what it
// writes at a pace of its own (Cilium's reconciler) starts it on the first
// few hundred resources at once, and the decoded messages of a slice, the
// transient heap, stay few.
func InGrowingSlices(h Handler) Handler { return slicedHandler{Handler: h, growing: true} }

type slicedHandler struct {
	Handler
	growing bool
}

// sliceBytes bounds a slice of InSlices: about ten times that once
// decoded, a few thousand ClusterLoadAssignments. firstSliceBytes and
// grownSliceBytes are those of InGrowingSlices. (Variables for the tests,
// which slice small responses.)
var sliceBytes, firstSliceBytes, grownSliceBytes = 256 << 10, 16 << 10, 64 << 10
