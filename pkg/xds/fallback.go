// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// Fallback to another management server, after gRFC A71. The rules, each
// in one place:
//
//   - The servers are tried in the order of --xds-server-address; a round
//     of attempts starts at the first: nextServer.
//   - A server that fails before any response (connection refused, TLS,
//     a stream broken before its first response: A57's server failure)
//     hands over to the next one at once: nextServer.
//   - A stream that had a response and ends is no failure (A57): the next
//     round starts after the backoff's first step, at the first server
//     again. So does a round in which every server failed, after the
//     backoff: nextServer.
//   - While a lower server is in use, the higher ones are tried at the
//     backoff's pace; the first that answers a request is switched back
//     to at once: returnToHigher.
//   - The cache is kept across a switch, as across any reconnect; the new
//     server's first full state is what the cache is swept against
//     (startStream, sweep): a resource is not deleted because the new
//     server has not sent it yet.
//
// A71 falls back only while some watched resource is not cached. We fall
// back on reachability alone, as A95's option does: the endpoints of an L4
// load balancer change with its backends, and a wildcard CDS watch can
// never tell that nothing is missing (architecture.md).

// managementServer is one server of the list and what the client knows of
// it. The fields after tls are guarded by Client.srvMu: the run loop and
// returnToHigher both write them.
type managementServer struct {
	serverConfig
	// index is the place in the list, from 0 (the highest priority).
	index int
	tls   *tlsFiles

	inUse    bool
	state    ConnState
	attempts uint64
	failures uint64
	err      error
	since    time.Time
}

// switchServer ends a session whose server is no longer the one to use.
type switchServer struct{ to *managementServer }

func (s *switchServer) Error() string {
	return fmt.Sprintf("switching back to %s, which has a higher priority and delivers again", s.to.address)
}

// nextServer is the server to try after a session on servers[i] ended, and
// whether to wait the backoff first. responded: the stream had a response.
func nextServer(i, n int, responded bool, err error) (next int, backoff bool) {
	var sw *switchServer
	switch {
	case errors.As(err, &sw):
		// A higher server delivers again (returnToHigher): at once.
		return sw.to.index, false
	case responded:
		// A working stream ended: no server failure (A57). The first
		// server that delivers wins, so the next round starts at the top.
		return 0, true
	case i+1 < n:
		// Unreachable, or a stream broken before any response: the next
		// server at once, without waiting.
		return i + 1, false
	default:
		// Every server failed this round.
		return 0, true
	}
}

// returnToHigher tries the servers of higher priority than the one in use,
// at the backoff's pace, and sends on found the first that answers a
// request. It returns when ctx ends (the session ends) or once one was
// found. reqs are the requests of the session's subscription: the server
// must answer what the client asks, not merely accept a connection.
func (c *Client) returnToHigher(ctx context.Context, inUse *managementServer, reqs []*request, found chan<- *managementServer) {
	b := c.backoff
	b.Reset()
	for {
		t := time.NewTimer(b.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		for _, srv := range c.servers[:inUse.index] {
			if c.probe(ctx, srv, reqs) {
				select {
				case found <- srv:
				case <-ctx.Done():
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// probe makes one attempt on srv: a connection, a stream, the requests, and
// the first response. It reports whether the server answered; a failure is
// recorded on the server as any attempt's is.
func (c *Client) probe(ctx context.Context, srv *managementServer, reqs []*request) bool {
	c.attempts.Add(1)
	c.metrics.attempt(srv.address)
	prev := c.updateServer(srv, func(s *managementServer) {
		s.attempts++
		s.setState(ConnConnecting)
	})
	err := c.probeOnce(ctx, srv, reqs)
	switch {
	case err == nil:
		c.updateServer(srv, func(s *managementServer) { s.err = nil })
		return true
	case ctx.Err() != nil:
		// Cut short by the session's end: not the server's failure.
		c.updateServer(srv, func(s *managementServer) { s.setState(prev.state) })
		return false
	}
	c.metrics.serverFailed(srv.address)
	c.updateServer(srv, func(s *managementServer) {
		s.failures++
		s.err = err
		s.setState(ConnBackoff)
	})
	c.log.Debug("xDS server of higher priority still fails", "server", srv.address, "error", err)
	return false
}

func (c *Client) probeOnce(ctx context.Context, srv *managementServer, reqs []*request) error {
	srv.tls.takeErr()
	conn, err := grpc.NewClient(srv.address, c.dialOptions(srv)...)
	if err != nil {
		return err
	}
	defer conn.Close()
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Bounded as a session's first response is: a server that accepts and
	// never answers must not hold the return for ever.
	noResponse := newAttemptTimer(c.cfg.XDSConnectTimeout, cancel)
	defer noResponse.stop()
	st, err := openStream(pctx, conn, c.cfg.XDSProtocol)
	if err != nil {
		return noResponse.explain(streamError(srv, err))
	}
	for _, r := range reqs {
		if st.send(r) != nil {
			break // the receive side says why
		}
	}
	if _, err := st.recv(); err != nil {
		return noResponse.explain(streamError(srv, err))
	}
	return nil
}

// probeRequests are the first requests of a stream with the current
// subscription, for returnToHigher. Built by the run loop, which owns the
// types.
func (c *Client) probeRequests() []*request {
	delta := c.cfg.XDSProtocol == ProtocolDelta
	var reqs []*request
	for _, url := range c.typeOrder {
		ts := c.types[url]
		req := &request{typeURL: url}
		switch {
		case ts.wildcard && delta:
			req.subscribe = []string{"*"}
		case ts.wildcard:
			// The legacy wildcard, as sendRequest sends it.
		case len(ts.nameList) == 0:
			continue
		case delta:
			req.subscribe = ts.nameList
		default:
			req.names = ts.nameList
		}
		if len(reqs) == 0 {
			req.node = c.node
		}
		reqs = append(reqs, req)
	}
	return reqs
}

func (s *managementServer) setState(state ConnState) {
	if s.state != state {
		s.since = time.Now()
	}
	s.state = state
}

// updateServer changes srv under srvMu and writes its row; it returns the
// server as it was.
func (c *Client) updateServer(srv *managementServer, change func(*managementServer)) managementServer {
	c.srvMu.Lock()
	defer c.srvMu.Unlock()
	prev := *srv
	change(srv)
	txn := c.db.WriteTxn(c.serverRows)
	c.serverRows.Insert(txn, srv.row())
	txn.Commit()
	return prev
}

// use makes srv the server in use; the others are not. The servers below it
// are not needed (standby), whether they failed last or not; the ones above
// it keep their state: they failed, and are tried again.
func (c *Client) use(srv *managementServer) {
	c.current = srv
	c.metrics.use(srv.address)
	for _, s := range c.servers {
		c.updateServer(s, func(s *managementServer) {
			s.inUse = s == srv
			if s.index > srv.index {
				s.setState(ConnStandby)
			}
		})
	}
}

func (s *managementServer) row() *ServerStatus {
	r := &ServerStatus{
		Priority: s.index + 1,
		Address:  s.address,
		InUse:    s.inUse,
		State:    s.state,
		Attempts: s.attempts,
		Failures: s.failures,
		Since:    s.since,
	}
	if s.tls != nil {
		r.Name = s.name
	}
	if s.err != nil {
		r.Error = s.err.Error()
	}
	return r
}

// serverErrors lists "address: error" of each of the first upTo servers
// whose last attempt failed, also while it is tried again or on standby, in
// order of priority: what health says when no server, or only a lower one,
// is in use.
func (c *Client) serverErrors(upTo int) string {
	c.srvMu.Lock()
	defer c.srvMu.Unlock()
	var errs []string
	for _, s := range c.servers[:upTo] {
		if s.err != nil && s.state != ConnConnected {
			errs = append(errs, fmt.Sprintf("%s: %s", s.address, s.err))
		}
	}
	return strings.Join(errs, "; ")
}
