// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Keepalive: the server pings idle connections to find dead clients, and
// tolerates client pings down to KeepaliveMinTime. Clients are expected to
// ping no more often than every 30 s (go-control-plane's example server
// enforces 30 s); enforcing a lower bound leaves room for timer jitter, so a
// client pinging at exactly 30 s never collects "too_many_pings" strikes.
const (
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 5 * time.Second
	KeepaliveMinTime = 10 * time.Second
)

// readBufferSize is each plaintext connection's read buffer: a request is
// a few hundred bytes, a NACK's message a few KiB. gRPC takes it from a
// pool while a read is ready. A TLS connection has none: TLS holds a
// whole record already, and gRPC would keep the buffer per connection.
func readBufferSize(tls bool) int {
	if tls {
		return 0
	}
	return 4 << 10
}

// maxConnectionAgeGrace lets a stream whose connection reached its age end
// (a response being sent completes); none without an age.
func maxConnectionAgeGrace(age time.Duration) time.Duration {
	if age == 0 {
		return 0
	}
	return 10 * time.Second
}

// Options of NewServer.
type Options struct {
	// TLS is the server's TLS configuration (see ServerTLSConfig). Nil serves
	// plaintext.
	TLS *tls.Config
	// MaxConnectionAge ends a client's connection after about this long
	// (gRPC adds ±10 % jitter), so that after a rollout or a scale-up
	// clients spread over the replicas again; zero keeps connections for
	// ever. A client reconnects at once and keeps what it has meanwhile.
	MaxConnectionAge time.Duration
	// Logger receives stream, ACK/NACK and update logs. slog.Default() when nil.
	Logger *slog.Logger
	// GRPCOptions are appended to the server's own options.
	GRPCOptions []grpc.ServerOption
	// Registerer, when set, receives the metrics of the clients: how many
	// are connected, each node's ACKs, NACKs and ACKed version per type.
	Registerer prometheus.Registerer
}

// Server serves a set of resources over xDS: ADS and the per-type CDS, EDS,
// LDS and RDS services, each with SotW and Delta streams.
type Server struct {
	log    *slog.Logger
	caches *typeCaches
	grpc   *grpc.Server
	health *health.Server
	cb     *callbacks
	cancel context.CancelFunc

	// serving is closed by the first Set. Until then xDS streams wait: the
	// caches would answer a request at once, with nothing, and a client
	// takes the first response of a stream as the complete state.
	serving chan struct{}
	stopped chan struct{}

	mu      sync.Mutex // serialises Set
	current Resources

	stopOnce sync.Once
}

// NewServer returns a server with no resources. Clients may connect before
// the first Set; their streams get no response until then, and the gRPC
// health service says NOT_SERVING.
func NewServer(opts Options) *Server {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	// A restarted server must not reuse versions its clients already hold
	// for different contents, hence a per-process version prefix.
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	caches := newTypeCaches(prefix, logger)

	ctx, cancel := context.WithCancel(context.Background())
	cb := newCallbacks(logger)
	if opts.Registerer != nil {
		cb.metrics = newServerMetrics(opts.Registerer, cb)
	}
	// go-control-plane serves Delta streams; SotW ones are ours.
	xs := xdsServices{xdsserver.NewServer(ctx, caches, cb), &sotwServer{caches: caches, cb: cb, log: logger}}

	gopts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout,
			MaxConnectionAge: opts.MaxConnectionAge, MaxConnectionAgeGrace: maxConnectionAgeGrace(opts.MaxConnectionAge)}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		// A node's stream idles between responses and sends small
		// requests: the write buffer is taken from a pool for each flush
		// rather than kept per connection, and the read buffer is sized
		// for ACKs (32 KiB each by default).
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(readBufferSize(opts.TLS != nil)),
		// SotW responses share their resources' encoding (see codec).
		grpc.ForceServerCodecV2(newCodec()),
	}
	if opts.TLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	s := &Server{
		log:     logger,
		caches:  caches,
		cb:      cb,
		cancel:  cancel,
		current: Resources{},
		serving: make(chan struct{}),
		stopped: make(chan struct{}),
	}
	gopts = append(gopts, grpc.ChainStreamInterceptor(s.waitForFirstState))
	gs := grpc.NewServer(append(gopts, opts.GRPCOptions...)...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xs)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, xs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(gs, xs)
	listenerservice.RegisterListenerDiscoveryServiceServer(gs, xs)
	routeservice.RegisterRouteDiscoveryServiceServer(gs, xs)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	s.grpc, s.health = gs, hs
	return s
}

// waitForFirstState holds every xDS stream until the server has its first
// state. The health service's Watch says NOT_SERVING meanwhile.
func (s *Server) waitForFirstState(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") {
		return handler(srv, ss)
	}
	if !s.Serving() {
		s.log.Debug("xDS stream waits for the first state", "method", info.FullMethod)
	}
	select {
	case <-s.serving:
		return handler(srv, ss)
	case <-ss.Context().Done():
		return ss.Context().Err()
	case <-s.stopped:
		return errors.New("server stopped")
	}
}

// Serving reports whether the server has its first state and answers xDS
// requests.
func (s *Server) Serving() bool {
	select {
	case <-s.serving:
		return true
	default:
		return false
	}
}

// Serve accepts xDS clients on lis until Stop.
func (s *Server) Serve(lis net.Listener) error {
	s.log.Info("Serving xDS", "address", lis.Addr().String())
	return s.grpc.Serve(lis)
}

// Run serves the resources of path to the clients of lis until ctx is done,
// following the file's edits (see ServeFile). A file that is invalid at the
// start fails Run at once. Run stops the server and closes lis before it
// returns; it returns nil when ctx ended it.
func (s *Server) Run(ctx context.Context, lis net.Listener, path string, opts ...ParseOption) error {
	defer s.Stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := s.ServeFile(ctx, path, opts...); err != nil {
		lis.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	select {
	case <-ctx.Done():
		s.Stop()
		<-served
		s.log.Info("Stopped")
		return nil
	case err := <-served:
		return err
	}
}

// Stop closes the listeners and all streams. Clients reconnect elsewhere or
// later and keep what they have meanwhile.
func (s *Server) Stop() {
	s.stopOnce.Do(func() { close(s.stopped) })
	s.cancel()
	s.grpc.Stop()
}

// Resources returns the set currently served. It must not be modified.
func (s *Server) Resources() Resources {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// Set replaces the served resources with res. Only what differs from the
// current set (by proto.Equal) is updated or deleted, so unchanged resources
// keep their versions and are not sent again. Set takes ownership of the
// messages in res.
//
// The first Set must be the complete state: clients are answered from then
// on (see NewServer).
//
// A type that is not a registered message type fails Set before anything
// changes. An error from a cache (a resource that cannot be marshalled for a
// client) leaves res served nonetheless, so that the next Set starts from
// what the caches hold.
func (s *Server) Set(res Resources) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	typeURLs := slices.Sorted(maps.Keys(unionKeys(s.current, res)))
	caches := make(map[string]*typeCache, len(typeURLs))
	for _, typeURL := range typeURLs {
		c, err := s.caches.get(typeURL)
		if err != nil {
			return err
		}
		caches[typeURL] = c
	}

	next := make(Resources, len(res))
	var updated, deleted int
	var errs []error
	for _, typeURL := range typeURLs {
		old, cur := s.current[typeURL], res[typeURL]
		toUpdate := map[string]types.Resource{}
		var toDelete []string
		for name, msg := range cur {
			if prev, ok := old[name]; !ok || !proto.Equal(prev, msg) {
				toUpdate[name] = msg
			}
		}
		for name := range old {
			if _, ok := cur[name]; !ok {
				toDelete = append(toDelete, name)
			}
		}
		if len(cur) > 0 {
			next[typeURL] = maps.Clone(cur)
		}
		if len(toUpdate) == 0 && len(toDelete) == 0 {
			continue
		}
		// Noted before the cache answers its watches: an ACK may come
		// back before the update returns.
		s.cb.published.publish(typeURL, s.caches.updated(typeURL), time.Now())
		if err := caches[typeURL].update(toUpdate, toDelete); err != nil {
			// The cache holds the new state; only marshalling some
			// resources or notifying some watches failed.
			errs = append(errs, fmt.Errorf("updating %s: %w", typeURL, err))
		}
		updated += len(toUpdate)
		deleted += len(toDelete)
	}
	s.current = next
	s.log.Info("Resources applied", "total", next.Len(), "updated", updated, "deleted", deleted)
	if !s.Serving() {
		close(s.serving)
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		s.log.Info("Serving xDS clients: the first state is applied")
	}
	return errors.Join(errs...)
}

func unionKeys(a, b Resources) map[string]struct{} {
	out := map[string]struct{}{}
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

// typeCaches is a cache.Cache holding the caches of each type URL, made on
// first use. Unlike cache.MuxCache, a request for a type the file does not
// (yet) have gets an empty cache and so an open watch, not a failed stream.
type typeCaches struct {
	prefix string
	log    *cacheLogger

	mu     sync.Mutex
	byType map[string]*typeCache
	// updates counts each type's updates: its caches' version is the
	// prefix and this count.
	updates map[string]uint64
}

// typeCache holds one type's resources twice: a sotwCache answers SotW
// streams, a LinearCache Delta ones.
type typeCache struct {
	sotw  *sotwCache
	delta *cache.LinearCache
}

// update sets and deletes resources in both caches.
func (c *typeCache) update(toUpdate map[string]types.Resource, toDelete []string) error {
	return errors.Join(c.sotw.update(toUpdate, toDelete), c.delta.UpdateResources(toUpdate, toDelete))
}

var _ cache.Cache = (*typeCaches)(nil)

func newTypeCaches(prefix string, logger *slog.Logger) *typeCaches {
	return &typeCaches{prefix: prefix, log: &cacheLogger{logger}, byType: map[string]*typeCache{}, updates: map[string]uint64{}}
}

// updated counts an update of typeURL's caches, about to be made, and
// returns the version they give it (both count their updates from 1 after
// the prefix).
func (t *typeCaches) updated(typeURL string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.updates[typeURL]++
	return t.prefix + strconv.FormatUint(t.updates[typeURL], 10)
}

// get returns the cache of typeURL, made on first use. Caches are made only
// for registered message types, so that clients cannot grow the server by
// asking for made-up type URLs.
func (t *typeCaches) get(typeURL string) (*typeCache, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.byType[typeURL]; ok {
		return c, nil
	}
	if _, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL); err != nil {
		return nil, fmt.Errorf("type %q is not served", typeURL)
	}
	c := &typeCache{
		sotw:  newSotwCache(typeURL, t.prefix),
		delta: cache.NewLinearCache(typeURL, cache.WithVersionPrefix(t.prefix), cache.WithLogger(t.log)),
	}
	t.byType[typeURL] = c
	return c, nil
}

func (t *typeCaches) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	c, err := t.get(req.GetTypeUrl())
	if err != nil {
		return nil, err
	}
	return c.sotw.CreateWatch(req, sub, ch)
}

func (t *typeCaches) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	c, err := t.get(req.GetTypeUrl())
	if err != nil {
		return nil, err
	}
	return c.delta.CreateDeltaWatch(req, sub, ch)
}

func (t *typeCaches) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("fetch is not implemented")
}

// cacheLogger adapts go-control-plane's logger to slog. Its Info messages
// are per-watch chatter, hence Debug. A message is formatted only when its
// level is enabled: the caches log every watch with the names it
// subscribes to, a sorted map of every resource, under their lock.
type cacheLogger struct{ l *slog.Logger }

func (c *cacheLogger) Debugf(f string, args ...any) { c.log(slog.LevelDebug, f, args) }
func (c *cacheLogger) Infof(f string, args ...any)  { c.log(slog.LevelDebug, f, args) }
func (c *cacheLogger) Warnf(f string, args ...any)  { c.log(slog.LevelWarn, f, args) }
func (c *cacheLogger) Errorf(f string, args ...any) { c.log(slog.LevelError, f, args) }

func (c *cacheLogger) log(level slog.Level, f string, args []any) {
	if !c.l.Enabled(context.Background(), level) {
		return
	}
	c.l.Log(context.Background(), level, fmt.Sprintf(f, args...))
}

// callbacks log stream life and every ACK and NACK, and count them when
// metrics is set. Clients send their node only in the first request of a
// stream, so it is remembered per stream.
type callbacks struct {
	xdsserver.CallbackFuncs
	log     *slog.Logger
	metrics *serverMetrics // nil: none

	mu      sync.Mutex
	nodes   map[int64]*corev3.Node
	streams map[string]int                    // open streams by node ID
	sent    map[int64]map[string]sentResponse // last response by stream and type (Delta)
	acked   map[[2]string]string              // version label by node and type
	// opened is when each stream sent its first request, and
	// streamAcked the version each stream last ACKed per type: what the
	// ACK latency is measured against.
	opened      map[int64]time.Time
	streamAcked map[int64]map[string]string
	published   publishedVersions
}

// sentResponse is the nonce and version of a response: a Delta ACK names
// only the nonce.
type sentResponse struct{ nonce, version string }

func newCallbacks(logger *slog.Logger) *callbacks {
	c := &callbacks{log: logger, nodes: map[int64]*corev3.Node{}, streams: map[string]int{},
		sent: map[int64]map[string]sentResponse{}, acked: map[[2]string]string{},
		opened: map[int64]time.Time{}, streamAcked: map[int64]map[string]string{}}
	c.StreamClosedFunc = c.closed
	c.DeltaStreamClosedFunc = c.closed
	c.StreamRequestFunc = func(id int64, req *discovery.DiscoveryRequest) error {
		node := c.node(id, req.GetNode())
		c.request(id, node, req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
		return nil
	}
	c.StreamDeltaRequestFunc = func(id int64, req *discovery.DeltaDiscoveryRequest) error {
		node := c.node(id, req.GetNode())
		version := ""
		c.mu.Lock()
		if s := c.sent[id][req.GetTypeUrl()]; s.nonce != "" && s.nonce == req.GetResponseNonce() {
			version = s.version
		}
		c.mu.Unlock()
		c.request(id, node, req.GetTypeUrl(), req.GetResponseNonce(), version, req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
		return nil
	}
	c.StreamDeltaResponseFunc = func(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.sent[id] == nil {
			c.sent[id] = map[string]sentResponse{}
		}
		c.sent[id][resp.GetTypeUrl()] = sentResponse{resp.GetNonce(), resp.GetSystemVersionInfo()}
	}
	return c
}

func (c *callbacks) node(id int64, n *corev3.Node) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n != nil {
		if _, known := c.nodes[id]; !known {
			c.log.Info("xDS client connected", "node", n.GetId(), "cluster", n.GetCluster(), "stream", id)
			c.streams[n.GetId()]++
			c.opened[id] = time.Now()
		} else if old := c.nodes[id].GetId(); old != n.GetId() {
			c.streams[old]--
			c.streams[n.GetId()]++
		}
		c.nodes[id] = n
	}
	return c.nodes[id].GetId()
}

func (c *callbacks) closed(id int64, _ *corev3.Node) {
	c.mu.Lock()
	n, known := c.nodes[id]
	delete(c.nodes, id)
	delete(c.sent, id)
	delete(c.opened, id)
	delete(c.streamAcked, id)
	last := false
	if known {
		c.streams[n.GetId()]--
		if last = c.streams[n.GetId()] <= 0; last {
			delete(c.streams, n.GetId())
			for k := range c.acked {
				if k[0] == n.GetId() {
					delete(c.acked, k)
				}
			}
		}
	}
	c.mu.Unlock()
	if !known {
		return
	}
	c.log.Info("xDS client disconnected", "node", n.GetId(), "stream", id)
	if last && c.metrics != nil {
		gone := prometheus.Labels{"node": n.GetId()}
		c.metrics.acks.DeletePartialMatch(gone)
		c.metrics.nacks.DeletePartialMatch(gone)
		c.metrics.version.DeletePartialMatch(gone)
	}
}

func (c *callbacks) request(id int64, node, typeURL, nonce, version, detail string, nack bool) {
	switch {
	case nack:
		c.log.Warn("xDS client rejected a response (NACK)",
			"node", node, "type", typeURL, "nonce", nonce, "version", version, "error", detail, "stream", id)
		if c.metrics != nil {
			c.metrics.nacks.WithLabelValues(node, typeURL).Inc()
		}
	case nonce != "":
		c.log.Debug("xDS client accepted a response (ACK)",
			"node", node, "type", typeURL, "nonce", nonce, "version", version, "stream", id)
		if c.metrics != nil {
			c.metrics.acks.WithLabelValues(node, typeURL).Inc()
			c.ackedVersion(node, typeURL, version)
			c.ackLatency(id, typeURL, version)
		}
	default:
		c.log.Debug("xDS client subscribed", "node", node, "type", typeURL, "stream", id)
	}
}

// ackedVersion keeps one version series per node and type.
func (c *callbacks) ackedVersion(node, typeURL, version string) {
	if version == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [2]string{node, typeURL}
	if old, ok := c.acked[k]; ok {
		if old == version {
			return
		}
		c.metrics.version.DeleteLabelValues(node, typeURL, old)
	}
	c.acked[k] = version
	c.metrics.version.WithLabelValues(node, typeURL, version).Set(1)
}

// ackLatency observes the time from version's publication to its first
// ACK on stream id. A stream opened after the publication is not measured:
// its first response is the node's sync, not the change reaching it.
func (c *callbacks) ackLatency(id int64, typeURL, version string) {
	if version == "" {
		return
	}
	now := time.Now()
	c.mu.Lock()
	opened, open := c.opened[id]
	if c.streamAcked[id][typeURL] == version || !open {
		c.mu.Unlock()
		return
	}
	if c.streamAcked[id] == nil {
		c.streamAcked[id] = map[string]string{}
	}
	c.streamAcked[id][typeURL] = version
	c.mu.Unlock()
	at, ok := c.published.at(typeURL, version)
	if !ok || opened.After(at) {
		return
	}
	c.metrics.ackLatency.WithLabelValues(typeURL).Observe(now.Sub(at).Seconds())
}
