// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// explicitWildcard in a request's names subscribes to every resource.
const explicitWildcard = "*"

// sotwStreamServer is what every SotW stream is, ADS or per type.
type sotwStreamServer = grpc.BidiStreamingServer[discovery.DiscoveryRequest, discovery.DiscoveryResponse]

// xdsServices are go-control-plane's xDS services, their SotW streams
// served by sotwServer instead.
type xdsServices struct {
	xdsserver.Server
	sotw *sotwServer
}

func (x xdsServices) StreamAggregatedResources(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return x.sotw.serve(st, resource.AnyType)
}

func (x xdsServices) StreamClusters(st clusterservice.ClusterDiscoveryService_StreamClustersServer) error {
	return x.sotw.serve(st, resource.ClusterType)
}

func (x xdsServices) StreamEndpoints(st endpointservice.EndpointDiscoveryService_StreamEndpointsServer) error {
	return x.sotw.serve(st, resource.EndpointType)
}

func (x xdsServices) StreamListeners(st listenerservice.ListenerDiscoveryService_StreamListenersServer) error {
	return x.sotw.serve(st, resource.ListenerType)
}

func (x xdsServices) StreamRoutes(st routeservice.RouteDiscoveryService_StreamRoutesServer) error {
	return x.sotw.serve(st, resource.RouteType)
}

// sotwServer serves SotW streams from the sotwCaches. It follows the
// protocol of go-control-plane's SotW server (its unordered mode, which
// the server used): the same responses to the same requests, a request
// with a stale nonce ignored, a response not yet sent dropped when a
// request of its type comes, the same callbacks but OnStreamOpen and
// OnStreamResponse, which ours do not use. It parts from it where that
// broke clients: a NACK of a stream's first response is not answered with
// the same response again (see sotwSub.replyEvenIfEmpty), a new stream of
// a full-state type is answered even if empty, and a type it cannot serve
// is ignored rather than failing the stream. What it saves, per stream,
// for a fleet:
//
//   - a goroutine: the stream's handler receives, and a goroutine sends
//     only while responses wait (go-control-plane keeps one receiving and
//     the handler waiting on both);
//   - its own maps of what it subscribes to and holds, per type: sotwSub
//     shares them with every stream in the same state, and the requests
//     are not kept.
type sotwServer struct {
	caches *typeCaches
	cb     *callbacks
	log    *slog.Logger
	ids    atomic.Int64
}

// sotwStream is one stream.
type sotwStream struct {
	srv  *sotwServer
	st   sotwStreamServer
	id   int64
	node *corev3.Node

	// turn is held while a request is handled and while a response is
	// sent, so that they happen one at a time, as in one goroutine. The
	// fields after it are the turn's.
	turn    sync.Mutex
	subs    []*sotwSub // one per type
	nonce   int64
	sendErr error
	// unserved: a request for a type not served was logged.
	unserved bool

	mu      sync.Mutex
	pending []*sotwResponse // answered watches, to send in order
	sending bool            // a goroutine sends them
	closed  bool
}

func (s *sotwServer) serve(st sotwStreamServer, defaultTypeURL string) error {
	// go-control-plane's Delta server numbers its streams from 1 for the
	// same callbacks, which know a stream (and count a node's) by its ID:
	// SotW streams count down from -1.
	ss := &sotwStream{srv: s, st: st, id: -s.ids.Add(1), node: &corev3.Node{}}
	defer ss.close()
	for {
		req, err := st.Recv()
		if err != nil {
			// The client went, or the stream broke: a failed send
			// says more.
			return ss.failed()
		}
		if err := ss.handle(req, defaultTypeURL); err != nil {
			return err
		}
	}
}

func (ss *sotwStream) failed() error {
	ss.turn.Lock()
	defer ss.turn.Unlock()
	return ss.sendErr
}

// handle opens the watch req asks for, in place of its type's last one.
func (ss *sotwStream) handle(req *discovery.DiscoveryRequest, defaultTypeURL string) error {
	ss.turn.Lock()
	defer ss.turn.Unlock()
	if ss.sendErr != nil {
		return ss.sendErr
	}
	// Only the first request need name the node.
	if req.GetNode() != nil {
		ss.node = req.GetNode()
	} else {
		req.Node = ss.node
	}
	switch {
	case defaultTypeURL == resource.AnyType && req.GetTypeUrl() == "":
		return status.Errorf(codes.InvalidArgument, "type URL is required for ADS")
	case req.GetTypeUrl() == "":
		req.TypeUrl = defaultTypeURL
	}
	if err := ss.srv.cb.OnStreamRequest(ss.id, req); err != nil {
		return err
	}
	typeURL := req.GetTypeUrl()
	sub := ss.sub(typeURL)
	if sub == nil {
		c, err := ss.srv.caches.get(typeURL)
		if err != nil {
			// Not answered, as a name the server does not have: failing
			// the stream would fail the client's reconnects alike and
			// leave it without the types it could have.
			if !ss.unserved {
				ss.unserved = true
				ss.srv.log.Warn("xDS request for a type that is not served ignored", "node", ss.node.GetId(), "error", err, "stream", ss.id)
			}
			return nil
		}
		sub = newSotwSub(c.sotw, req.GetResourceNames())
		ss.subs = append(ss.subs, sub)
	} else {
		// A request that does not answer the last response is ignored
		// (the xDS protocol's resource updates), as go-control-plane does.
		if sub.nonce != "" && req.GetResponseNonce() != sub.nonce {
			ss.srv.log.Debug("xDS request with a stale nonce ignored", "type", typeURL, "nonce", req.GetResponseNonce(), "stream", ss.id)
			return nil
		}
		sub.cache.cancel(sub.watch)
		ss.drop(typeURL)
		sub.setNames(req.GetResourceNames())
	}
	sub.watch = &sotwWatch{sub: sub, deliver: ss.deliver}
	sub.cache.open(sub.watch, sub.replyEvenIfEmpty(req.GetVersionInfo()))
	return nil
}

func (ss *sotwStream) sub(typeURL string) *sotwSub {
	for _, s := range ss.subs {
		if s.cache.typeURL == typeURL {
			return s
		}
	}
	return nil
}

// deliver queues an answered watch's response; the cache calls it under
// its lock.
func (ss *sotwStream) deliver(r *sotwResponse) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return
	}
	ss.pending = append(ss.pending, r)
	if !ss.sending {
		ss.sending = true
		go ss.flush()
	}
}

// drop forgets a queued response of typeURL: its watch was cancelled.
func (ss *sotwStream) drop(typeURL string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.pending = slices.DeleteFunc(ss.pending, func(r *sotwResponse) bool { return r.typeURL == typeURL })
}

// flush sends the queued responses, and ends when there are none.
func (ss *sotwStream) flush() {
	for {
		ss.turn.Lock()
		ss.mu.Lock()
		if ss.closed || ss.sendErr != nil || len(ss.pending) == 0 {
			ss.pending, ss.sending = nil, false
			ss.mu.Unlock()
			ss.turn.Unlock()
			return
		}
		r := ss.pending[0]
		ss.pending = slices.Delete(ss.pending, 0, 1)
		ss.mu.Unlock()
		ss.sendErr = ss.send(r)
		ss.turn.Unlock()
	}
}

func (ss *sotwStream) send(r *sotwResponse) error {
	sub := ss.sub(r.typeURL)
	ss.nonce++
	sub.nonce = strconv.FormatInt(ss.nonce, 10)
	sub.known = r.known
	return ss.st.Send(&discovery.DiscoveryResponse{VersionInfo: r.version, Resources: r.set.anys, TypeUrl: r.typeURL, Nonce: sub.nonce})
}

// close ends the stream's watches once no response is being sent: none is
// sent after the handler returns.
func (ss *sotwStream) close() {
	ss.mu.Lock()
	ss.closed, ss.pending = true, nil
	ss.mu.Unlock()
	ss.turn.Lock()
	for _, sub := range ss.subs {
		sub.close()
	}
	ss.subs = nil
	ss.turn.Unlock()
	ss.srv.cb.OnStreamClosed(ss.id, ss.node)
}

// sotwSub is what a stream subscribes to and holds of a type: go-control-
// plane's stream.Subscription (for SotW, with the legacy wildcard), its
// state shared with every stream in the same state. It is its stream's
// turn's; the cache reads it under its lock while its watch is open.
type sotwSub struct {
	cache *sotwCache
	watch *sotwWatch // open, or answered
	nonce string     // of the last response sent

	// legacyWildcard: the stream has named nothing yet, which subscribes
	// to every resource (the xDS protocol's legacy wildcard).
	legacyWildcard bool
	wildcard       bool
	names          *nameSet // nil: none
	known          *knownSet
}

var _ cache.Subscription = (*sotwSub)(nil)

func newSotwSub(c *sotwCache, names []string) *sotwSub {
	s := &sotwSub{cache: c, legacyWildcard: true, wildcard: len(names) == 0}
	s.setNames(names)
	return s
}

// setNames subscribes to the names of a request, as
// stream.Subscription.SetResourceSubscription does.
func (s *sotwSub) setNames(list []string) {
	if s.legacyWildcard {
		if len(list) == 0 {
			return
		}
		s.legacyWildcard = false
	}
	if s.names == nil || !slices.Equal(s.names.list, list) {
		if s.names != nil {
			s.cache.releaseNames(s.names)
		}
		s.names = s.cache.internNames(list)
	}
	s.wildcard = s.names.wildcard
	if !s.wildcard {
		// A name no longer subscribed is forgotten, so that subscribing
		// to it again sends it again.
		s.known = s.known.only(s.names.names)
	}
}

// replyEvenIfEmpty tells whether a request that names version is answered
// even if the client lacks nothing the stream knows of. Until the stream
// sends a response of the type, it is for a client without a version (or
// with another process's), and for a full-state type always: the version
// a client names on a new stream may be one whose resources went since,
// and only a response, even an empty one, removes them. Once it sent one,
// what the client holds is known, whatever version it names: a NACK of
// the first response names none (or another process's), and answering it
// anyway would send the rejected response again, and again.
func (s *sotwSub) replyEvenIfEmpty(version string) bool {
	return s.nonce == "" && (s.cache.fullState || s.cache.replyEvenIfEmpty(version))
}

func (s *sotwSub) close() {
	if s.watch != nil {
		s.cache.cancel(s.watch)
	}
	if s.names != nil {
		s.cache.releaseNames(s.names)
	}
}

func (s *sotwSub) ReturnedResources() map[string]string { return s.known.get() }
func (s *sotwSub) IsWildcard() bool                     { return s.wildcard }

func (s *sotwSub) SubscribedResources() map[string]struct{} {
	if s.names == nil {
		return nil
	}
	return s.names.names
}

// only is k without the resources not in names: k itself when it has
// none.
func (k *knownSet) only(names map[string]struct{}) *knownSet {
	if k == nil {
		return nil
	}
	all := true
	for name := range k.versions {
		if _, ok := names[name]; !ok {
			all = false
			break
		}
	}
	if all {
		return k
	}
	kept := make(map[string]string, len(k.versions))
	for name, v := range k.versions {
		if _, ok := names[name]; ok {
			kept[name] = v
		}
	}
	if len(kept) == 0 {
		return nil
	}
	return &knownSet{kept}
}
