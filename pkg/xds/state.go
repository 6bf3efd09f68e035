// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// typeState is the run loop's view of one watched type: the subscription,
// the cache, and the stream's protocol state.
type typeState struct {
	url      string
	wildcard bool
	handler  Handler
	gen      uint64

	// names requested (non-wildcard types), and as a sorted list (the
	// consumer's, never mutated) for SotW requests.
	names    map[string]struct{}
	nameList []string
	// entries is the cache: every resource received or requested.
	entries map[string]*entry
	// offering is false when no entry holds an offer (entry.offer).
	offering bool
	// deadlines of the does-not-exist timers that run; nil when none
	// runs (see stopDeadline).
	deadlines map[string]time.Time
	// version is the last accepted version_info.
	version string

	// Per stream.
	nonce      string
	responded  bool                // a response arrived on this stream
	sent       bool                // a request was sent on this stream
	dirty      bool                // names changed since the last request
	sweep      bool                // next response is a full state to sweep against (Delta)
	subscribed map[string]struct{} // names subscribed on this stream (Delta)
	lastNack   string              // version and error of the last NACK
	// nackRepeats counts the NACKs in a row identical to lastNack.
	nackRepeats int
	// pendingNack is a NACK held back until nackAt: a server that answers
	// a NACK with the same response at once is paced without stopping the
	// other types, nor SetNames.
	pendingNack *rpcStatus
	nackAt      time.Time
}

func newTypeState(url string, w *watchSpec) *typeState {
	return &typeState{
		url:        url,
		wildcard:   w.wildcard,
		handler:    w.handler,
		names:      map[string]struct{}{},
		entries:    map[string]*entry{},
		subscribed: map[string]struct{}{},
	}
}

// fingerprint identifies a resource's encoding: the cache compares what
// arrives with what it has without holding a copy of every resource (the
// handler keeps what it needs of the decoded one). The zero value is none.
type fingerprint [sha256.Size]byte

func fingerprintOf(value []byte) fingerprint { return sha256.Sum256(value) }

// valid is false for the zero value, which no SHA-256 sum is in practice.
func (f *fingerprint) valid() bool { return *f != fingerprint{} }

// entry is one cached resource.
type entry struct {
	// accepted and version are those of the accepted resource; accepted
	// is zero if there is none.
	accepted fingerprint
	version  string
	state    ResourceState
	// err and rejected are why and what was last rejected, so that a
	// server resending the same bad resource does not bother the handler
	// unless something else changed.
	err      string
	rejected fingerprint
	// offer is the decoded rejected resource when the handler rejected it
	// (rather than the decoding), so that it is offered again with the
	// next update of the type: its validity may depend on other resources
	// (a VIP another cluster holds), and a Delta server never resends it.
	offer   *Resource
	updated time.Time
}

func (e *entry) row(typeURL, name string) *ResourceStatus {
	return &ResourceStatus{
		TypeURL: typeURL,
		Name:    name,
		Version: e.version,
		State:   e.state,
		Error:   e.err,
		Updated: e.updated,
	}
}

// handleResponse applies one response to the cache, calls the handler with
// what changed, and ACKs or NACKs it.
func (c *Client) handleResponse(ctx context.Context, st adsStream, resp *response) error {
	ts, ok := c.types[resp.typeURL]
	if !ok {
		c.log.Debug("Ignoring xDS response of a type not watched", "type", resp.typeURL)
		return nil
	}
	now := time.Now()
	delta := c.cfg.XDSProtocol == ProtocolDelta
	ts.nonce = resp.nonce
	// This response is answered instead of the one a NACK was held for.
	ts.pendingNack = nil

	var (
		upserted []Resource
		// again are resources the handler rejected before, unchanged:
		// offered again only along with an update.
		again     []Resource
		removed   []string
		touched   []string
		changed   = map[string]fingerprint{} // given to the handler
		rejected  = map[string]string{}      // name, or "#index" when unnamed
		badSums   = map[string]fingerprint{}
		offers    = map[string]*Resource{} // rejected by the handler
		present   = make(map[string]struct{}, len(resp.resources))
		sweepSafe = true
		notAsked  int
	)

	for i, raw := range resp.resources {
		name, msg, err := decodeResource(resp.typeURL, raw)
		if name == "" {
			// Which cached resource this is cannot be known, so a sweep
			// could delete a resource that the server still has.
			sweepSafe = false
			rejected["#"+strconv.Itoa(i)] = fmt.Sprintf("%s #%d: %s", KindName(ts.url), i, err)
			continue
		}
		present[name] = struct{}{}
		if !ts.wildcard {
			if _, ok := ts.names[name]; !ok {
				notAsked++
				continue // not asked for
			}
		}
		value := fingerprintOf(raw.any.GetValue())
		if err != nil {
			rejected[name] = err.Error()
			badSums[name] = value
			continue
		}
		e := ts.entries[name]
		r := Resource{Name: name, Version: raw.version, Message: msg}
		switch {
		case e != nil && e.accepted.valid() && e.accepted == value:
			// Unchanged. If it was nacked, the server is back to the
			// version in use.
			if e.state != StateAcked || (delta && e.version != raw.version) {
				if delta {
					e.version = raw.version
				}
				e.state, e.err, e.rejected, e.offer, e.updated = StateAcked, "", fingerprint{}, nil, now
				touched = append(touched, name)
			}
		case e != nil && e.rejected.valid() && e.rejected == value:
			changed[name] = value
			again = append(again, r)
		default:
			changed[name] = value
			upserted = append(upserted, r)
		}
	}

	// Every SotW response of a wildcard type is a full state; in Delta only
	// the first of a stream is.
	fullState := ts.wildcard && (!delta || ts.sweep)
	ts.sweep = false
	if fullState && sweepSafe {
		// What the cache has and the full state lacks is gone.
		for name, e := range ts.entries {
			if _, ok := present[name]; ok {
				continue
			}
			if e.accepted.valid() {
				removed = append(removed, name)
			}
			delete(ts.entries, name)
			touched = append(touched, name)
		}
	}
	for _, name := range resp.removed {
		e, ok := ts.entries[name]
		if !ok {
			continue
		}
		touched = append(touched, name)
		if ts.wildcard {
			if e.accepted.valid() {
				removed = append(removed, name)
			}
			delete(ts.entries, name)
			continue
		}
		// A requested resource the server says does not exist.
		ts.stopDeadline(name)
		if e.accepted.valid() || e.state != StateDoesNotExist {
			removed = append(removed, name)
		}
		*e = entry{state: StateDoesNotExist, updated: now}
	}

	if len(upserted) > 0 || len(removed) > 0 {
		upserted = append(upserted, again...)
		rej, offered := c.deliver(ctx, ts, upserted, removed, now)
		touched = append(touched, offered...)
		for _, r := range upserted {
			err := rej[r.Name]
			if err == nil {
				continue // only an upserted resource can be rejected
			}
			rejected[r.Name] = err.Error()
			badSums[r.Name] = changed[r.Name]
			offers[r.Name] = &r
			delete(changed, r.Name)
		}
	} else {
		// Nothing changed that could make them valid now.
		for _, r := range again {
			rejected[r.Name] = ts.entries[r.Name].err
			badSums[r.Name] = changed[r.Name]
			offers[r.Name] = &r
			delete(changed, r.Name)
		}
	}
	for _, r := range upserted {
		value, ok := changed[r.Name]
		if !ok {
			continue
		}
		e := ts.entry(r.Name)
		*e = entry{accepted: value, version: r.Version, state: StateAcked, updated: now}
		ts.stopDeadline(r.Name)
		touched = append(touched, r.Name)
	}
	for name, msg := range rejected {
		if strings.HasPrefix(name, "#") {
			continue
		}
		e := ts.entry(name)
		e.err, e.rejected, e.offer, e.updated = msg, badSums[name], offers[name], now
		ts.offering = ts.offering || e.offer != nil
		e.state = StateNacked
		if e.accepted.valid() {
			e.state = StateNackedButCached
		}
		// The server has it, even if it is bad: it exists.
		ts.stopDeadline(name)
		touched = append(touched, name)
	}
	c.writeResources(ts, touched)
	// A78 counts every resource received, changed or not; rejected holds
	// only resources of this response.
	c.metrics.updates(ts.url, len(resp.resources)-notAsked-len(rejected), len(rejected))

	if !ts.responded {
		ts.responded = true
		c.markSynced(ts.url)
		// The names the handler just set are owed a response too: health
		// must not turn OK before they are asked for.
		c.applyWatches()
		c.reportHealth()
	}

	var detail *rpcStatus
	if len(rejected) == 0 {
		ts.version = resp.version
		ts.lastNack, ts.nackRepeats = "", 0
	} else {
		msg := nackMessage(ts.url, rejected)
		detail = &rpcStatus{Code: int32(codes.InvalidArgument), Message: msg}
		key := resp.version + "\x00" + msg
		if key == ts.lastNack {
			ts.nackRepeats++
		} else {
			ts.lastNack, ts.nackRepeats = key, 0
			c.log.Warn("Rejected xDS resources",
				"type", ShortTypeName(ts.url), "version", resp.version, "nonce", resp.nonce, "error", msg)
		}
		if ts.nackRepeats > 0 {
			// A server may answer a NACK with the same response at once
			// (go-control-plane does in SotW while no version was
			// accepted): hold the NACK back so that the two never spin.
			// The run loop sends it when due, or sooner with new names.
			ts.pendingNack, ts.nackAt = detail, now.Add(c.nackPace(ts.nackRepeats))
			c.writeStatus(ts)
			return nil
		}
	}
	c.writeStatus(ts)
	return c.sendRequest(st, ts, true, detail)
}

// maxNackPace caps the wait before a repeated NACK: the server cannot send
// a fixed version of the type before it has the NACK.
const maxNackPace = 30 * time.Second

// nackPace is the wait before the repeats-th identical NACK in a row: the
// reconnect backoff's progression, capped by maxNackPace.
func (c *Client) nackPace(repeats int) time.Duration {
	limit := min(c.backoff.Max, maxNackPace)
	d := c.backoff.Initial
	for i := 1; i < repeats && d < limit; i++ {
		d = time.Duration(float64(d) * c.backoff.Multiplier)
	}
	return max(min(d, limit), time.Millisecond)
}

// deliver calls the handler with an update, adding to it the last rejected
// version of every resource of the type that the handler rejected and that
// the update does not name: whether a resource is valid may depend on others
// (a VIP held by another cluster), and a Delta server never resends a
// resource it sent. The outcome of these offers is applied to the cache here,
// and their names returned; the handler's verdict on the update's own
// resources is returned for the caller to apply.
func (c *Client) deliver(ctx context.Context, ts *typeState, upserted []Resource, removed []string, now time.Time) (map[string]error, []string) {
	in := make(map[string]struct{}, len(upserted)+len(removed))
	for _, r := range upserted {
		in[r.Name] = struct{}{}
	}
	for _, n := range removed {
		in[n] = struct{}{}
	}
	var offered []Resource
	if ts.offering {
		// Walked only while some entry may hold an offer: an update of one
		// resource among thousands must not walk them all.
		ts.offering = false
		for name, e := range ts.entries {
			if e.offer == nil {
				continue
			}
			ts.offering = true
			if _, ok := in[name]; !ok {
				offered = append(offered, *e.offer)
			}
		}
	}
	slices.SortFunc(offered, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(removed)
	removed = slices.Compact(removed)

	all := append(slices.Clip(upserted), offered...)
	rej := ts.handler.HandleUpdate(ctx, Update{TypeURL: ts.url, Upserted: all, Removed: removed})

	var touched []string
	for _, r := range offered {
		e := ts.entries[r.Name]
		if err := rej[r.Name]; err != nil {
			delete(rej, r.Name)
			if msg := err.Error(); msg != e.err {
				e.err, e.updated = msg, now
				touched = append(touched, r.Name)
			}
			continue
		}
		c.log.Info("Rejected xDS resource accepted on a later update",
			"type", ShortTypeName(ts.url), "name", r.Name, "version", r.Version)
		*e = entry{accepted: e.rejected, version: r.Version, state: StateAcked, updated: now}
		ts.stopDeadline(r.Name)
		touched = append(touched, r.Name)
	}
	return rej, touched
}

// stopDeadline stops the does-not-exist timer of name. A map never shrinks:
// the last timer stopped drops it, or the timers of a first request of
// thousands of names would hold their room for the client's lifetime.
func (ts *typeState) stopDeadline(name string) {
	delete(ts.deadlines, name)
	if len(ts.deadlines) == 0 {
		ts.deadlines = nil
	}
}

func (ts *typeState) entry(name string) *entry {
	e, ok := ts.entries[name]
	if !ok {
		e = &entry{}
		ts.entries[name] = e
	}
	return e
}

// nackMessage lists each rejected resource's error, sorted by name, each
// naming the resource: `cluster "db": io.cilium.l4lb.port: 70000 is out of
// range`.
func nackMessage(typeURL string, rejected map[string]string) string {
	kind := KindName(typeURL)
	lines := make([]string, 0, len(rejected))
	names := slices.Collect(maps.Keys(rejected))
	slices.SortFunc(names, compareRejected)
	for _, name := range names {
		msg := rejected[name]
		if !strings.HasPrefix(name, "#") && !strings.Contains(msg, strconv.Quote(name)) {
			msg = kind + " " + strconv.Quote(name) + ": " + msg
		}
		lines = append(lines, msg)
	}
	return strings.Join(lines, "; ")
}

// compareRejected orders names, then unnamed resources ("#index") by index.
func compareRejected(a, b string) int {
	ia, unnamedA := strings.CutPrefix(a, "#")
	ib, unnamedB := strings.CutPrefix(b, "#")
	switch {
	case unnamedA && unnamedB:
		x, _ := strconv.Atoi(ia)
		y, _ := strconv.Atoi(ib)
		return x - y
	case unnamedA:
		return 1
	case unnamedB:
		return -1
	}
	return strings.Compare(a, b)
}

// decodeResource decodes one resource and finds its name. The name is
// returned whenever it can be known, even with an error.
func decodeResource(typeURL string, raw rawResource) (string, proto.Message, error) {
	name := raw.name
	if raw.any == nil {
		return name, nil, errors.New("resource has no body")
	}
	msg, err := raw.any.UnmarshalNew()
	if err != nil {
		return name, nil, fmt.Errorf("cannot decode %s: %w", raw.any.GetTypeUrl(), err)
	}
	if name == "" {
		name = resourceName(msg)
	}
	if raw.any.GetTypeUrl() != typeURL {
		return name, nil, fmt.Errorf("resource of type %s in a response of type %s", raw.any.GetTypeUrl(), typeURL)
	}
	if name == "" {
		return "", nil, errors.New("resource has no name")
	}
	return name, msg, nil
}

// resourceName is the name xDS gives a resource: its name field, or the
// cluster_name of a ClusterLoadAssignment.
func resourceName(msg proto.Message) string {
	switch m := msg.(type) {
	case interface{ GetName() string }:
		return m.GetName()
	case interface{ GetClusterName() string }:
		return m.GetClusterName()
	}
	return ""
}
