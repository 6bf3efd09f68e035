// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	// The well-known types of api.go decode without help from the consumer.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/l4xds/l4xds/pkg/tlsmetrics"
)

// userAgent is the node's user_agent_name.
const userAgent = "l4xds"

// Keepalive is how the client probes its connection: every Time when idle
// (go-control-plane servers refuse pings more frequent than 30s,
// too_many_pings), closing it after Timeout without an answer. It is how a
// client learns that a server died whose reset was lost.
var Keepalive = keepalive.ClientParameters{Time: 60 * time.Second, Timeout: 20 * time.Second}

// Client is an xDS client: one ADS stream to one server at a time, the
// first of the list that delivers (fallback.go), reconnected for ever with
// backoff, and a cache of every accepted resource that outlives streams and
// servers (last-known-good).
//
// Consumers call Watch for each type before Run, and SetNames for the
// non-wildcard ones whenever the names they need change. Run does the work
// until its context ends. A Client made from a disabled Config accepts Watch
// and SetNames and does nothing.
type Client struct {
	cfg       Config
	log       *slog.Logger
	db        *statedb.DB
	resources statedb.RWTable[*ResourceStatus]
	status    statedb.RWTable[*TypeStatus]
	// serverRows is xds-servers.
	serverRows statedb.RWTable[*ServerStatus]
	backoff    Backoff
	node       *corev3.Node
	health     cell.Health
	metrics    *clientMetrics
	disabled   bool

	attempts atomic.Uint64

	// servers in order of priority; srvMu guards their state.
	servers []*managementServer
	srvMu   sync.Mutex

	// mu guards what Watch, SetNames and Synced share with the run loop.
	mu         sync.Mutex
	watches    map[string]*watchSpec
	order      []string
	running    bool
	synced     map[string]chan struct{}
	syncedDone map[string]bool
	// wake tells the run loop that watches or names changed.
	wake chan struct{}

	// Owned by the run loop.
	types     map[string]*typeState
	typeOrder []string
	conn      connInfo
	nodeSent  bool
	// current is the server in use or being tried.
	current *managementServer

	// watch is what the run loop is busy with (watchdog.go).
	watch      loopWatch
	stallAfter time.Duration

	// dialExtra are tests' interceptors.
	dialExtra []grpc.DialOption
}

// watchSpec is what consumers asked for one type.
type watchSpec struct {
	wildcard bool
	handler  Handler
	names    []string // sorted, no duplicates; replaced, never mutated
	gen      uint64
}

type connInfo struct {
	state ConnState
	err   error
	since time.Time
}

// Option customises a Client.
type Option func(*Client)

// WithBackoff replaces DefaultBackoff.
func WithBackoff(b Backoff) Option { return func(c *Client) { c.backoff = b } }

// WithHealth makes Run report to h. The hive cell passes the job's health.
func WithHealth(h cell.Health) Option { return func(c *Client) { c.health = h } }

// NewClient makes a client and registers its tables in db. It fails on an
// invalid configuration. With cfg.EnableXDSControlPlane false the client is
// inert.
func NewClient(cfg Config, log *slog.Logger, db *statedb.DB, opts ...Option) (*Client, error) {
	resources, err := NewResourcesTable(db)
	if err != nil {
		return nil, err
	}
	status, err := NewStatusTable(db)
	if err != nil {
		return nil, err
	}
	serverRows, err := NewServersTable(db)
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:        cfg,
		log:        log,
		db:         db,
		resources:  resources,
		status:     status,
		serverRows: serverRows,
		backoff:    DefaultBackoff,
		disabled:   !cfg.EnableXDSControlPlane,
		watches:    map[string]*watchSpec{},
		synced:     map[string]chan struct{}{},
		syncedDone: map[string]bool{},
		wake:       make(chan struct{}, 1),
		types:      map[string]*typeState{},
		stallAfter: defaultStallAfter,
	}
	c.metrics = newClientMetrics(db, resources, status)
	for _, o := range opts {
		o(c)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if c.disabled {
		log.Info("xDS control plane disabled")
		return c, nil
	}
	servers, _ := cfg.servers() // valid: Validate said so
	addrs := make([]string, len(servers))
	for i, sc := range servers {
		srv := &managementServer{serverConfig: sc, index: i, state: ConnStandby, since: time.Now()}
		if !cfg.XDSInsecure {
			// One per server: each has its own name, and the handshake
			// errors of one must not show as another's.
			srv.tls = &tlsFiles{
				certPath:   cfg.XDSClientCertPath,
				keyPath:    cfg.XDSClientKeyPath,
				caPath:     cfg.XDSCACertPath,
				serverName: sc.name,
			}
		}
		c.servers = append(c.servers, srv)
		addrs[i] = sc.address
		c.updateServer(srv, func(*managementServer) {})
	}
	if !cfg.XDSInsecure {
		c.metrics.certs = tlsmetrics.New(
			tlsmetrics.File{Role: "xds-client", Path: cfg.XDSClientCertPath},
			tlsmetrics.File{Role: "xds-ca", Path: cfg.XDSCACertPath, Bundle: true},
		)
	}
	c.current = c.servers[0]
	c.metrics.setServers(addrs)
	c.node = &corev3.Node{
		Id:            cfg.nodeID(),
		Cluster:       cfg.XDSNodeCluster,
		UserAgentName: userAgent,
	}
	if cfg.XDSNodeRegion != "" || cfg.XDSNodeZone != "" || cfg.XDSNodeSubZone != "" {
		c.node.Locality = &corev3.Locality{Region: cfg.XDSNodeRegion, Zone: cfg.XDSNodeZone, SubZone: cfg.XDSNodeSubZone}
	}
	return c, nil
}

// Resources is the xds-resources table.
func (c *Client) Resources() statedb.Table[*ResourceStatus] { return c.resources }

// Status is the xds-status table.
func (c *Client) Status() statedb.Table[*TypeStatus] { return c.status }

// Servers is the xds-servers table.
func (c *Client) Servers() statedb.Table[*ServerStatus] { return c.serverRows }

// Attempts is the number of connection attempts since Run started, to every
// server, including the checks whether a higher server delivers again.
func (c *Client) Attempts() uint64 { return c.attempts.Load() }

// Watch subscribes to a type and sends its updates to h. A wildcard watch
// subscribes to every resource of the type (in SotW the legacy empty name
// list, in Delta an explicit "*": see sendRequest); otherwise
// the client asks for the names given to SetNames. Call it before Run;
// later calls work too, and subscribe on the current stream.
func (c *Client) Watch(typeURL string, wildcard bool, h Handler) {
	if c.disabled {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.watches[typeURL]; ok {
		c.log.Error("xDS type is already watched; keeping the first handler", "type", typeURL)
		return
	}
	c.watches[typeURL] = &watchSpec{wildcard: wildcard, handler: h, gen: 1}
	c.order = append(c.order, typeURL)
	c.metrics.watched(typeURL)
	c.signal()
}

// SetNames replaces the names requested for a non-wildcard type. It never
// blocks, so a Handler may call it; the run loop sends the new request. A
// name dropped from the set is forgotten: no Removed is delivered for it.
func (c *Client) SetNames(typeURL string, names []string) {
	if c.disabled {
		return
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)

	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.watches[typeURL]
	switch {
	case !ok:
		c.log.Error("SetNames on an xDS type that is not watched", "type", typeURL)
		return
	case w.wildcard:
		c.log.Error("SetNames on a wildcard xDS watch", "type", typeURL)
		return
	case slices.Equal(w.names, sorted):
		return
	}
	w.names = sorted
	w.gen++
	c.signal()
}

// Synced returns a channel closed once the first response of the type has
// been handled. It is closed at once on a disabled client.
func (c *Client) Synced(typeURL string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.synced[typeURL]
	if !ok {
		ch = make(chan struct{})
		c.synced[typeURL] = ch
		if c.disabled {
			close(ch)
			c.syncedDone[typeURL] = true
		}
	}
	return ch
}

func (c *Client) markSynced(typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.syncedDone[typeURL] {
		return
	}
	ch, ok := c.synced[typeURL]
	if !ok {
		ch = make(chan struct{})
		c.synced[typeURL] = ch
	}
	close(ch)
	c.syncedDone[typeURL] = true
}

// signal wakes the run loop without blocking. Called with mu held.
func (c *Client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run connects and keeps connecting to the server until ctx ends. It
// returns nil when ctx ends, and an error only if it is called twice.
func (c *Client) Run(ctx context.Context) error {
	return c.run(ctx, c.health)
}

func (c *Client) run(ctx context.Context, health cell.Health) error {
	if c.disabled {
		return nil
	}
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("xds: Client.Run called twice")
	}
	c.running = true
	c.mu.Unlock()

	if health == nil {
		health = nopHealth{}
	}
	c.health = health
	if c.cfg.XDSInsecure {
		c.log.Warn("xDS connection is not encrypted nor authenticated (--xds-insecure)", "server", c.cfg.XDSServerAddress)
	}

	// The watchdog lives as long as the loop it watches; it is stopped
	// after the loop returns, here only.
	wctx, stopWatchdog := context.WithCancel(ctx)
	var watchdog sync.WaitGroup
	watchdog.Go(func() { c.watchdog(wctx, c.stallAfter/4) })
	defer func() {
		stopWatchdog()
		watchdog.Wait()
	}()

	c.applyWatches()
	c.writeBehind()
	b := c.backoff
	srv := c.servers[0]
	for {
		c.connect(srv)
		err := c.session(ctx, srv, &b)
		c.writeBehind()
		c.idle()
		if ctx.Err() != nil {
			return nil
		}
		responded := c.streamEnded(srv, err)
		next, backoff := nextServer(srv.index, len(c.servers), responded, err)
		srv = c.servers[next]
		if !backoff {
			c.log.Warn("Switching xDS server", "from", c.current.address, "to", srv.address, "reason", c.serverError(err))
			continue
		}
		wait := b.Next()
		c.waitRetry(err, wait)
		if !c.sleep(ctx, wait) {
			return nil
		}
	}
}

// connect starts an attempt on srv.
func (c *Client) connect(srv *managementServer) {
	c.attempts.Add(1)
	c.metrics.attempt(srv.address)
	c.use(srv)
	c.updateServer(srv, func(s *managementServer) {
		s.attempts++
		s.setState(ConnConnecting)
	})
	c.setConn(ConnConnecting, c.conn.err)
}

// sleep waits before the next attempt, still taking SetNames changes in so
// that dropped names are forgotten at once. False when ctx ended.
func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-c.wake:
			c.applyWatches()
			c.writeBehind()
		}
	}
}

// streamEnded closes the books of a session on srv: what was per stream,
// the server's row and metrics. It reports whether the stream had a
// response.
func (c *Client) streamEnded(srv *managementServer, err error) bool {
	responded := false
	for _, ts := range c.types {
		responded = responded || ts.responded
		// Does-not-exist timers are paused: a server we cannot reach says
		// nothing about whether a resource exists.
		ts.deadlines = nil
		ts.responded = false
	}
	var sw *switchServer
	switched := errors.As(err, &sw)
	// Leaving a server for a higher one is no failure of it.
	c.metrics.streamEnded(srv.address, responded || switched)
	c.updateServer(srv, func(s *managementServer) {
		switch {
		case switched:
			s.err = nil
			s.setState(ConnStandby)
		default:
			if !responded {
				s.failures++
			}
			s.err = err
			s.setState(ConnBackoff)
		}
	})
	return responded
}

// waitRetry reports the wait before the next round of attempts.
func (c *Client) waitRetry(err error, wait time.Duration) {
	c.setConn(ConnBackoff, err)
	c.log.Warn("xDS stream failed; retrying",
		"error", c.serverError(err),
		"attempt", c.attempts.Load(),
		"retry-in", wait.Round(time.Millisecond))
}

// serverError is the one line that says what is wrong with the server in
// use.
func (c *Client) serverError(err error) error {
	return fmt.Errorf("xDS server %s: %w", c.current.address, err)
}

func (c *Client) dialOptions(srv *managementServer) []grpc.DialOption {
	var creds credentials.TransportCredentials
	if srv.tls != nil {
		creds = verdictCreds{credentials.NewTLS(srv.tls.config()), srv.tls}
	} else {
		creds = insecure.NewCredentials()
	}
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.XDSMaxRecvMsgSize)),
		grpc.WithKeepaliveParams(Keepalive),
		grpc.WithUserAgent(userAgent),
	}, c.dialExtra...)
}

type recvResult struct {
	resp *response
	err  error
}

// session runs one connection and one stream to srv until either fails, or
// until a server of higher priority delivers again (switchServer).
func (c *Client) session(ctx context.Context, srv *managementServer, b *Backoff) error {
	srv.tls.takeErr() // forget handshake errors of earlier attempts

	// A new connection per attempt rather than one ClientConn for ever: each
	// attempt then makes a fresh handshake with the files as they are now,
	// and the only backoff is ours.
	conn, err := grpc.NewClient(srv.address, c.dialOptions(srv)...)
	if err != nil {
		return err
	}
	defer conn.Close()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Until the first response, the attempt is bounded: a server that
	// accepts and never answers (a hung process, a handshake that never
	// ends, a server waiting for its own state) is a failed server, and
	// the next one is tried.
	noResponse := newAttemptTimer(c.cfg.XDSConnectTimeout, cancel)
	defer noResponse.stop()
	st, err := openStream(sctx, conn, c.cfg.XDSProtocol)
	if err != nil {
		return noResponse.explain(streamError(srv, err))
	}

	c.startStream()
	c.updateServer(srv, func(s *managementServer) {
		s.err = nil
		s.setState(ConnConnected)
	})
	c.setConn(ConnConnected, nil)
	c.metrics.streamOpened(srv.address)
	c.log.Info("Connected to xDS server", "server", srv.address, "priority", srv.index+1, "protocol", c.cfg.XDSProtocol)

	// On a lower server, the higher ones are tried until one delivers.
	var higher chan *managementServer
	if srv.index > 0 {
		higher = make(chan *managementServer)
		probing := make(chan struct{})
		reqs := c.probeRequests() // here: the run loop owns the types
		go func() {
			defer close(probing)
			c.returnToHigher(sctx, srv, reqs, higher)
		}()
		// The prober ends with the session, whatever ends it; waiting for
		// it keeps its writes to the servers' rows before the next
		// session's.
		defer func() {
			cancel()
			<-probing
		}()
	}

	respCh := make(chan recvResult)
	go func() {
		for {
			resp, err := st.recv()
			if err == nil {
				noResponse.answer()
			}
			select {
			case respCh <- recvResult{resp, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	c.busy("sending the first requests to " + srv.address)
	if err := c.sendAll(st); err != nil {
		return noResponse.explain(sendFailed(sctx, srv, respCh, err))
	}
	if !c.owed() {
		// Nothing asked, or nothing owed: a Delta type of names presumed
		// current gets no answer if nothing changed.
		noResponse.stop()
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// Runs first: what follows a return (the prober's end, the
	// connection's close) is watched too.
	defer c.busy("closing the stream to " + srv.address)
	for {
		// The names a handler asked for are requested before their rows
		// are written: the response is on the way to the tables, the
		// rows only on the way to the operator. (A response's own rows
		// are written before its ACK, which a stalled stream may block.)
		select {
		case <-c.wake:
			if err := c.requestWatches(st); err != nil {
				return sendFailed(sctx, srv, respCh, err)
			}
		default:
		}
		c.writeBehind()
		var expiry <-chan time.Time
		if next, ok := c.nextDeadline(); ok {
			timer.Reset(time.Until(next))
			expiry = timer.C
		}
		c.idle()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sctx.Done():
			// The attempt timer ended the stream; the receive side may
			// have gone without a word.
			return noResponse.explain(sctx.Err())
		case to := <-higher:
			return &switchServer{to: to}
		case r := <-respCh:
			if r.err != nil {
				return noResponse.explain(streamError(srv, r.err))
			}
			b.Reset()
			c.busy("handling a " + ShortTypeName(r.resp.typeURL) + " response of " + srv.address)
			if err := c.handleResponse(ctx, st, r.resp); err != nil {
				return sendFailed(sctx, srv, respCh, err)
			}
		case <-c.wake:
			if err := c.requestWatches(st); err != nil {
				return sendFailed(sctx, srv, respCh, err)
			}
		case <-expiry:
			c.busy("expiring resources")
			now := time.Now()
			c.expire(ctx, now)
			if err := c.sendDueNacks(st, now); err != nil {
				return sendFailed(sctx, srv, respCh, err)
			}
		}
	}
}

// requestWatches applies what SetNames changed and sends the requests.
func (c *Client) requestWatches(st adsStream) error {
	c.busy("sending requests to " + c.current.address)
	c.applyWatches()
	return c.sendAll(st)
}

// owed reports whether the stream owes a response: a type whose request
// was sent and that waits for one.
func (c *Client) owed() bool {
	for _, ts := range c.types {
		if ts.sent && ts.waiting() {
			return true
		}
	}
	return false
}

// attemptTimer ends an attempt (cancels its context) that had no response
// within its bound.
type attemptTimer struct {
	d        time.Duration
	t        *time.Timer
	answered atomic.Bool
	expired  atomic.Bool
}

func newAttemptTimer(d time.Duration, cancel context.CancelFunc) *attemptTimer {
	a := &attemptTimer{d: d}
	a.t = time.AfterFunc(d, func() {
		// A response received and not yet taken by the loop counts.
		if a.answered.Load() {
			return
		}
		a.expired.Store(true)
		cancel()
	})
	return a
}

// answer records a response, as soon as it is received.
func (a *attemptTimer) answer() {
	a.answered.Store(true)
	a.t.Stop()
}

func (a *attemptTimer) stop() { a.t.Stop() }

// explain replaces the error of an attempt the timer ended (a cancelled
// context says nothing) by the reason.
func (a *attemptTimer) explain(err error) error {
	if a.expired.Load() {
		return fmt.Errorf("no response within %s (--xds-connect-timeout)", a.d)
	}
	return err
}

// streamError turns the error of a failed stream to srv into one line.
func streamError(srv *managementServer, err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("stream closed by the server")
	}
	return cleanError(err, srv.tls.takeErr())
}

// sendFailed waits for the receive side to report why the stream broke: a
// failed Send only says io.EOF.
func sendFailed(ctx context.Context, srv *managementServer, respCh <-chan recvResult, err error) error {
	if !errors.Is(err, io.EOF) {
		return streamError(srv, err)
	}
	for {
		select {
		case r := <-respCh:
			if r.err != nil {
				return streamError(srv, r.err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// applyWatches takes in the types and names consumers set since last time.
func (c *Client) applyWatches() {
	type change struct {
		ts    *typeState
		names []string
	}
	var changes []change
	var added []*typeState
	c.mu.Lock()
	for _, url := range c.order {
		w := c.watches[url]
		ts, ok := c.types[url]
		if !ok {
			ts = newTypeState(url, w)
			c.types[url] = ts
			c.typeOrder = append(c.typeOrder, url)
			added = append(added, ts)
		}
		if ts.gen != w.gen {
			ts.gen = w.gen
			changes = append(changes, change{ts, w.names})
		}
	}
	c.mu.Unlock()

	for _, ts := range added {
		c.writeStatus(ts)
	}
	now := time.Now()
	for _, ch := range changes {
		c.setNames(ch.ts, ch.names, now)
	}
	if len(changes) > 0 {
		c.reportHealth()
	}
}

// setNames makes names the requested set of a non-wildcard type.
func (c *Client) setNames(ts *typeState, names []string, now time.Time) {
	want := make(map[string]struct{}, len(names))
	for _, n := range names {
		want[n] = struct{}{}
	}
	var touched []string
	for n := range ts.names {
		if _, ok := want[n]; !ok {
			if e := ts.entries[n]; e != nil && e.state == StateDeletionIgnored {
				c.log.Info("xDS resource whose deletion was ignored is no longer asked for",
					"type", ShortTypeName(ts.url), "name", n)
			}
			// The consumer stopped asking: forget, without a Removed.
			delete(ts.entries, n)
			ts.stopDeadline(n)
			touched = append(touched, n)
		}
	}
	for n := range want {
		if _, ok := ts.entries[n]; !ok {
			ts.entries[n] = &entry{state: StateRequested, updated: now}
			touched = append(touched, n)
		}
	}
	ts.names, ts.nameList = want, names
	ts.dirty = true
	ts.behind = append(ts.behind, touched...)
}

// startStream resets what is per stream. The cache stays.
func (c *Client) startStream() {
	c.nodeSent = false
	for _, ts := range c.types {
		ts.nonce = ""
		ts.responded = false
		ts.sent = false
		ts.lastNack, ts.nackRepeats, ts.pendingNack = "", 0, nil
		clear(ts.subscribed)
		clear(ts.presumed)
	}
}

// initialVersions is the initial_resource_versions of a Delta type's first
// request on a stream: every accepted resource it subscribes to, with the
// version the server gave. The server then sends what changed and removes
// what it no longer has, also a resource asked by name (which SotW cannot
// say: there, the cached version stays).
//
// A version means nothing to another server (after a fallback or a
// return), and a resource kept after a deletion (A53) must be sent again to
// lose its mark: such a resource of a wildcard type goes with an empty
// version, which no resource has (the server sends it if it has it and
// removes it if not: SotW's sweep); one asked by name is not listed (what
// the server lacks stays cached, as in SotW).
//
// The names listed with this server's version are presumed current: the
// server sends nothing for them if nothing changed.
func (c *Client) initialVersions(ts *typeState) map[string]string {
	versions := map[string]string{}
	for name, e := range ts.entries {
		if !e.accepted.valid() {
			continue
		}
		if _, asked := ts.names[name]; !ts.wildcard && !asked {
			continue
		}
		switch {
		case e.server == c.current.address && e.state != StateDeletionIgnored:
			versions[name] = e.version
			if !ts.wildcard {
				ts.presumed[name] = struct{}{}
			}
		case ts.wildcard:
			versions[name] = ""
		}
	}
	if len(versions) == 0 {
		return nil
	}
	return versions
}

// sendAll sends the requests the stream lacks: each type's first, and the
// ones whose names changed.
func (c *Client) sendAll(st adsStream) error {
	for _, url := range c.typeOrder {
		ts := c.types[url]
		if ts.sent && !ts.dirty {
			continue
		}
		if err := c.sendRequest(st, ts, false, nil); err != nil {
			return err
		}
	}
	return nil
}

// sendRequest sends the type's current subscription; with ack it
// acknowledges (errorDetail nil) or rejects the last response.
func (c *Client) sendRequest(st adsStream, ts *typeState, ack bool, errorDetail *rpcStatus) error {
	if ts.pendingNack != nil {
		// Whatever this request is for, it answers the response whose
		// NACK was held back.
		ack, errorDetail = true, ts.pendingNack
		ts.pendingNack = nil
	}
	desired := ts.names
	if ts.wildcard {
		desired = wildcardNames
	}
	if !ts.sent && len(desired) == 0 {
		// An empty first request would be a legacy wildcard subscription
		// to every resource of the type.
		return nil
	}
	req := &request{typeURL: ts.url, errorDetail: errorDetail}
	if !c.nodeSent {
		req.node = c.node
	}
	delta := c.cfg.XDSProtocol == ProtocolDelta
	// The stream's subscription is the names of the last request unless
	// they changed since: an ACK of a type with thousands of names must
	// not walk them.
	namesChanged := !ts.sent || ts.dirty
	if delta && !ts.sent {
		// A new stream says what the cache holds, and the server answers
		// with what differs and removes what it no longer has: nothing
		// is swept on the client, and the server may send its state in
		// as many responses as it likes.
		req.initialVersions = c.initialVersions(ts)
	}
	if delta && namesChanged {
		for n := range desired {
			if _, ok := ts.subscribed[n]; !ok {
				req.subscribe = append(req.subscribe, n)
			}
		}
		for n := range ts.subscribed {
			if _, ok := desired[n]; !ok {
				req.unsubscribe = append(req.unsubscribe, n)
			}
		}
		slices.Sort(req.subscribe)
		slices.Sort(req.unsubscribe)
	}
	if delta {
		if ack {
			req.nonce = ts.nonce
		} else if ts.sent && len(req.subscribe)+len(req.unsubscribe) == 0 {
			ts.dirty = false
			return nil
		}
	} else {
		req.names = ts.nameList
		if ts.wildcard {
			// The legacy wildcard, an empty resource_names, as Envoy
			// sends it: go-control-plane's SnapshotCache treats an
			// explicit "*" as the name of a resource, and in ADS mode
			// answers nothing to names that do not cover every resource.
			req.names = nil
		}
		// The server ignores a request without the nonce of its last
		// response, even one that only changes names.
		req.nonce = ts.nonce
		// The first request of a stream has no version: the server then
		// answers with everything, the full state a reconnect needs.
		if ts.responded {
			req.version = ts.version
		}
	}
	if c.current != nil {
		// A send waits while the server reads no requests (gRPC's flow
		// control): the watchdog then names it.
		c.busy("sending a " + ShortTypeName(ts.url) + " request to " + c.current.address)
	}
	if err := st.send(req); err != nil {
		return err
	}
	c.nodeSent = true
	if namesChanged {
		// Only new names and a new stream start timers.
		c.startDeadlines(ts, time.Now(), !ts.sent)
		if delta {
			ts.subscribed = maps.Clone(desired)
		}
	}
	ts.sent = true
	ts.dirty = false
	return nil
}

// sendDueNacks sends the NACKs held back whose time has come.
func (c *Client) sendDueNacks(st adsStream, now time.Time) error {
	for _, url := range c.typeOrder {
		ts := c.types[url]
		if ts.pendingNack == nil || ts.nackAt.After(now) {
			continue
		}
		if err := c.sendRequest(st, ts, true, nil); err != nil {
			return err
		}
	}
	return nil
}

// wildcardNames is the subscription of a wildcard type in Delta, where an
// explicit "*" is how a client subscribes to everything.
var wildcardNames = map[string]struct{}{"*": {}}

// startDeadlines starts the does-not-exist timer of every requested name
// that has neither a cached resource nor a running timer, and of which
// nothing was received: a resource the handler rejected exists. On a new
// stream (first) the timer also starts for names whose only version was
// rejected, since the new stream must show they still exist.
func (c *Client) startDeadlines(ts *typeState, now time.Time, first bool) {
	if ts.wildcard {
		return
	}
	for n := range ts.names {
		e := ts.entries[n]
		if e == nil || e.accepted.valid() {
			continue
		}
		if e.state != StateRequested && (e.state != StateNacked || !first) {
			continue
		}
		if _, ok := ts.deadlines[n]; !ok {
			if ts.deadlines == nil {
				ts.deadlines = map[string]time.Time{}
			}
			ts.deadlines[n] = now.Add(c.cfg.XDSResourceDoesNotExistTimeout)
		}
	}
}

func (c *Client) nextDeadline() (time.Time, bool) {
	var next time.Time
	for _, ts := range c.types {
		for _, d := range ts.deadlines {
			if next.IsZero() || d.Before(next) {
				next = d
			}
		}
		if ts.pendingNack != nil && (next.IsZero() || ts.nackAt.Before(next)) {
			next = ts.nackAt
		}
	}
	return next, !next.IsZero()
}

// expire delivers Removed for the names whose does-not-exist timer fired.
func (c *Client) expire(ctx context.Context, now time.Time) {
	for _, url := range c.typeOrder {
		ts := c.types[url]
		var removed []string
		for n, d := range ts.deadlines {
			if d.After(now) {
				continue
			}
			ts.stopDeadline(n)
			e := ts.entries[n]
			if e == nil || e.accepted.valid() || e.state == StateDoesNotExist {
				continue
			}
			*e = entry{state: StateDoesNotExist, updated: now}
			removed = append(removed, n)
		}
		if len(removed) == 0 {
			continue
		}
		slices.Sort(removed)
		c.log.Info("xDS resources do not exist", "type", ShortTypeName(url), "names", removed,
			"timeout", c.cfg.XDSResourceDoesNotExistTimeout)
		// A removal cannot be refused; the offers' outcome is applied.
		_, offered := c.deliver(ctx, ts, nil, nil, removed, now)
		c.writeResources(ts, append(removed, offered...))
		c.reportHealth()
	}
}

func (c *Client) setConn(state ConnState, err error) {
	if c.conn.state != state {
		c.conn.since = time.Now()
	}
	c.conn.state = state
	c.conn.err = err
	c.writeAllStatus()
	c.reportHealth()
}

// reportHealth is OK only once connected and synced: every watched type
// that asks for something has had its first response on this stream.
// Until then the tables may hold a previous server's state, or none.
func (c *Client) reportHealth() {
	addr := c.current.address
	// Why the servers above the one in use are not used.
	var why string
	if errs := c.serverErrors(c.current.index); errs != "" {
		why = " (" + errs + ")"
	}
	switch {
	case c.conn.state == ConnConnected:
		synced := 0
		var waiting []string
		for _, url := range c.typeOrder {
			ts := c.types[url]
			switch {
			case ts.responded:
				synced++
			case ts.waiting():
				waiting = append(waiting, ShortTypeName(url))
			}
		}
		if len(waiting) > 0 {
			c.degraded(fmt.Sprintf("connected to %s, waiting for the first %s response%s",
				addr, strings.Join(waiting, " and "), why))
			return
		}
		c.health.OK(fmt.Sprintf("connected to %s, %d types synced%s", addr, synced, why))
	default:
		// Every server that failed, this one included: "disconnected
		// from a:1: connection refused; b:2: connection refused".
		if errs := c.serverErrors(len(c.servers)); errs != "" {
			c.degraded("disconnected from " + errs)
			return
		}
		c.degraded(fmt.Sprintf("connecting to %s%s", addr, why))
	}
}

// degraded reports a reason that has no error of its own. Cilium's health
// reporter requires an error, so the reason is its own error (l4xds's
// registry prints it once).
func (c *Client) degraded(reason string) { c.health.Degraded(reason, errors.New(reason)) }

// waiting reports whether a type without a response on this stream is
// owed one: a wildcard type always is; a type of names is while one of
// them may exist (the does-not-exist timer has not settled it).
func (ts *typeState) waiting() bool {
	if ts.responded {
		return false
	}
	if ts.wildcard {
		return true
	}
	for n := range ts.names {
		e := ts.entries[n]
		switch {
		case e == nil:
			return true
		case isPresumed(ts, n) && e.accepted.valid():
			// Sent with this server's version: no answer means current.
		case e.state != StateDoesNotExist:
			return true
		}
	}
	return false
}

func isPresumed(ts *typeState, name string) bool {
	_, ok := ts.presumed[name]
	return ok
}

func (c *Client) statusRow(ts *typeState) *TypeStatus {
	s := &TypeStatus{
		TypeURL:  ts.url,
		Wildcard: ts.wildcard,
		Server:   c.current.address,
		Protocol: c.cfg.XDSProtocol,
		State:    c.conn.state,
		Attempts: c.attempts.Load(),
		Version:  ts.version,
		Nonce:    ts.nonce,
		Synced:   ts.responded,
		Since:    c.conn.since,
	}
	if c.conn.err != nil {
		s.Error = c.serverError(c.conn.err).Error()
	}
	return s
}

func (c *Client) writeStatus(ts *typeState) {
	txn := c.db.WriteTxn(c.status)
	c.status.Insert(txn, c.statusRow(ts))
	txn.Commit()
}

func (c *Client) writeAllStatus() {
	txn := c.db.WriteTxn(c.status)
	for _, ts := range c.types {
		c.status.Insert(txn, c.statusRow(ts))
	}
	txn.Commit()
}

// writeBehind writes the rows of the names SetNames changed
// (typeState.behind), a step of its own for the watchdog.
func (c *Client) writeBehind() {
	for _, url := range c.typeOrder {
		if ts := c.types[url]; len(ts.behind) > 0 {
			c.busy("writing the xds-resources rows of " + ShortTypeName(url) + " names")
			c.writeResources(ts, ts.behind)
			ts.behind = nil
			c.idle()
		}
	}
}

// writeResources brings the rows of names in line with the cache.
func (c *Client) writeResources(ts *typeState, names []string) {
	if len(names) == 0 {
		return
	}
	txn := c.db.WriteTxn(c.resources)
	for _, n := range names {
		if e, ok := ts.entries[n]; ok {
			c.resources.Insert(txn, e.row(ts.url, n))
		} else {
			c.resources.Delete(txn, &ResourceStatus{TypeURL: ts.url, Name: n})
		}
	}
	txn.Commit()
	if len(names) >= releaseRows {
		c.releaseReplaced()
	}
}

// releaseRows is the size of a write to xds-resources after which the rows
// it replaced or deleted are let go at once.
const releaseRows = 64

// releaseReplaced lets go of the rows the last write to xds-resources
// replaced or deleted. statedb (v0.8) keeps a table's last write
// transaction for the next write, with the tree that write started from:
// a first response replaces as many "requested" rows, a sweep deletes as
// many, and they would stay on the heap until the table's next write. That
// write is made now: a row no resource has (no type URL is empty), written
// and deleted, so that no reader ever sees it (a Changes iterator would see
// it deleted; the table has none).
func (c *Client) releaseReplaced() {
	none := &ResourceStatus{}
	txn := c.db.WriteTxn(c.resources)
	c.resources.Insert(txn, none)
	c.resources.Delete(txn, none)
	txn.Commit()
}

type nopHealth struct{}

func (nopHealth) OK(string)                     {}
func (nopHealth) Stopped(string)                {}
func (nopHealth) Degraded(string, error)        {}
func (h nopHealth) NewScope(string) cell.Health { return h }
func (nopHealth) Close()                        {}
