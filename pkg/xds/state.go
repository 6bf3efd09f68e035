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

	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// typeState is the run loop's view of one watched type: the subscription,
// the cache, and the stream's protocol state.
type typeState struct {
	url      string
	wildcard bool
	handler  Handler
	sliced   bool // the handler is InSlices
	growing  bool // in InGrowingSlices
	gen      uint64

	// names requested (non-wildcard types), and as a sorted list (the
	// consumer's, never mutated) for SotW requests.
	names    map[string]struct{}
	nameList []string
	// entries is the cache: every resource received or requested.
	entries map[string]*entry
	// behind are the names SetNames changed whose rows are not written
	// yet: written once their request is sent (writeBehind), a row as
	// its entry is then.
	behind []string
	// offering is false when no entry holds an offer (entry.offer).
	offering bool
	// deadlines of the does-not-exist timers that run; nil when none
	// runs (see stopDeadline).
	deadlines map[string]time.Time
	// version is the last accepted version_info.
	version string

	// Per stream.
	nonce     string
	responded bool // a response arrived on this stream
	sent      bool // a request was sent on this stream
	dirty     bool // names changed since the last request
	// presumed are the names the stream's first request gave with this
	// server's version (Delta, by name): no answer means current
	// (initialVersions).
	presumed   map[string]struct{}
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
	sh, isSliced := w.handler.(slicedHandler)
	return &typeState{
		url:        url,
		wildcard:   w.wildcard,
		handler:    w.handler,
		sliced:     isSliced,
		growing:    sh.growing,
		names:      map[string]struct{}{},
		entries:    map[string]*entry{},
		subscribed: map[string]struct{}{},
		presumed:   map[string]struct{}{},
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
	// server gave version: Delta's initial_resource_versions lists it to
	// that server only.
	server string
	state  ResourceState
	// rej is the last rejection, nil if none: apart, because nearly every
	// entry has none (112 bytes an entry instead of 208).
	rej     *rejection
	updated time.Time
}

// rejection is why and what an entry last had rejected, so that a server
// resending the same bad resource does not bother the handler unless
// something else changed.
type rejection struct {
	err string
	sum fingerprint
	// offer is the decoded rejected resource when the handler rejected it
	// (rather than the decoding), so that it is offered again with the
	// next update of the type: its validity may depend on other resources
	// (a VIP another cluster holds), and a Delta server never resends it.
	offer *Resource
}

// err is why the last version was rejected, "" if it was not.
func (e *entry) err() string {
	if e.rej == nil {
		return ""
	}
	return e.rej.err
}

// offer is the rejected resource offered again, nil if none.
func (e *entry) offer() *Resource {
	if e.rej == nil {
		return nil
	}
	return e.rej.offer
}

func (e *entry) row(typeURL, name string) *ResourceStatus {
	return &ResourceStatus{
		TypeURL: typeURL,
		Name:    name,
		Version: e.version,
		State:   e.state,
		Error:   e.err(),
		Updated: e.updated,
	}
}

// handleResponse applies one response to the cache, calls the handler with
// what changed, and ACKs or NACKs it. Each step is one function, where the
// rules it holds (conformance_test.go) can be found: decode (with
// checkDuplicate; an InSlices handler gets each slice from deliverSlice),
// sweep, removeNamed, deliverChanges, recordOutcome, markResponded,
// ackOrNack.
func (c *Client) handleResponse(ctx context.Context, st adsStream, resp *response) error {
	ts, ok := c.types[resp.typeURL]
	if !ok {
		// xds_protocol: a response of a type the client never asked for
		// is ignored (neither ACKed nor NACKed).
		c.log.Debug("Ignoring xDS response of a type not watched", "type", resp.typeURL)
		return nil
	}
	ts.nonce = resp.nonce
	// This response is answered instead of the one a NACK was held for.
	ts.pendingNack = nil

	a := newApplied(time.Now(), c.cfg.XDSProtocol == ProtocolDelta, len(resp.resources))
	size, most := sliceBytes, sliceBytes
	if ts.growing {
		size, most = min(firstSliceBytes, grownSliceBytes), grownSliceBytes
	}
	for lo := 0; lo < len(resp.resources); {
		hi := ts.sliceEnd(resp.resources, lo, size)
		size = min(2*size, most)
		c.decode(ts, resp.resources[lo:hi], lo, resp.typeURL, a)
		if hi < len(resp.resources) {
			c.deliverSlice(ctx, ts, a)
		}
		lo = hi
	}
	c.sweep(ts, a)
	c.removeNamed(ts, resp, a)
	c.deliverChanges(ctx, ts, a)
	c.recordOutcome(ts, a)
	c.writeResources(ts, a.touched)
	// A78 counts every resource received, changed or not; rejected holds
	// only resources of this response.
	invalid := len(a.rejected) - a.removedTwice
	c.metrics.updates(ts.url, len(resp.resources)-a.notAsked-invalid, invalid)
	c.markResponded(ts)
	return c.ackOrNack(st, ts, resp, a.rejected, a.now)
}

// applied is what handling one response found and did, passed from step to
// step.
type applied struct {
	now   time.Time
	delta bool

	upserted []Resource
	// delivered counts the upserted given to an InSlices handler in
	// earlier slices: the rest go with the last one.
	delivered int
	// again are resources the handler rejected before, unchanged:
	// offered again only along with an update.
	again   []Resource
	removed []string
	// touched are the names whose rows change.
	touched []string
	changed map[string]fingerprint // given to the handler
	// rejected is each rejected resource's error by name, or by "#index"
	// for an error about the response's resources[index] as a whole (no
	// name, or a duplicate), which belongs to no cached resource; a name
	// both sent and removed is "#" len(resources)+k, for removed_resources[k].
	rejected map[string]string
	badSums  map[string]fingerprint
	offers   map[string]*Resource // rejected by the handler
	// present are the names the response carries, asked for or not, and
	// the index of each one's first instance.
	present map[string]int
	// sweepSafe is false when a resource without a name makes a sweep
	// unsafe: it may be any cached resource.
	sweepSafe bool
	notAsked  int
	// removedTwice counts the rejected entries of removed_resources that
	// the response also sends: errors, but no resource of their own.
	removedTwice int
}

func newApplied(now time.Time, delta bool, n int) *applied {
	return &applied{
		now:       now,
		delta:     delta,
		changed:   map[string]fingerprint{},
		rejected:  map[string]string{},
		badSums:   map[string]fingerprint{},
		offers:    map[string]*Resource{},
		present:   make(map[string]int, n),
		sweepSafe: true,
	}
}

// sliceEnd is where the slice of resources starting at lo ends: the whole
// response, or size bytes of it for an InSlices handler.
func (ts *typeState) sliceEnd(resources []rawResource, lo, size int) int {
	if !ts.sliced {
		return len(resources)
	}
	n := 0
	for i := lo; i < len(resources); i++ {
		if n += len(resources[i].any.GetValue()); n >= size {
			return i + 1
		}
	}
	return len(resources)
}

// decode decodes each resource of a slice of the response, the first being
// resources[first], and sorts it: rejected (undecodable, of another type,
// unnamed, a duplicate), not asked for, unchanged, rejected before and
// unchanged (again), or upserted.
func (c *Client) decode(ts *typeState, slice []rawResource, first int, typeURL string, a *applied) {
	for j, raw := range slice {
		i := first + j
		name, msg, err := decodeResource(typeURL, raw)
		if name == "" {
			// Which cached resource this is cannot be known, so a sweep
			// could delete a resource that the server still has (A46).
			a.sweepSafe = false
			a.rejected["#"+strconv.Itoa(i)] = fmt.Sprintf("%s #%d: %s", KindName(ts.url), i, clip(err.Error()))
			continue
		}
		if len(name) > MaxNameLength {
			// No cached resource has such a name: the sweep stays safe.
			a.rejected["#"+strconv.Itoa(i)] = fmt.Sprintf("%s %s: resources[%d]: the name of %d bytes is longer than %d",
				KindName(ts.url), quoteName(name), i, len(name), MaxNameLength)
			continue
		}
		if dup := checkDuplicate(a.present, name, i); dup != "" {
			a.rejected["#"+strconv.Itoa(i)] = fmt.Sprintf("%s %q: %s", KindName(ts.url), name, dup)
			continue
		}
		if !ts.wildcard {
			if _, ok := ts.names[name]; !ok {
				a.notAsked++
				continue // not asked for
			}
		}
		value := fingerprintOf(raw.any.GetValue())
		if err != nil {
			a.rejected[name] = clip(err.Error())
			a.badSums[name] = value
			continue
		}
		e := ts.entries[name]
		r := Resource{Name: name, Version: raw.version, Message: msg}
		switch {
		case e != nil && e.accepted.valid() && e.accepted == value:
			// Unchanged. If it was nacked, the server is back to the
			// version in use.
			if e.state == StateDeletionIgnored {
				c.log.Info("xDS server sends a resource whose deletion was ignored again",
					"server", c.current.address, "type", ShortTypeName(ts.url), "name", name)
			}
			if e.state != StateAcked || (a.delta && e.version != raw.version) {
				if a.delta {
					e.version, e.server = raw.version, c.current.address
				}
				e.state, e.rej, e.updated = StateAcked, nil, a.now
				a.touched = append(a.touched, name)
			}
		case e != nil && e.rej != nil && e.rej.sum.valid() && e.rej.sum == value:
			a.changed[name] = value
			a.again = append(a.again, r)
		default:
			a.changed[name] = value
			a.upserted = append(a.upserted, r)
		}
	}
}

// checkDuplicate records the first instance of a name in a response and
// returns, for any later one, why it is rejected. As Envoy does ("duplicate
// cluster ... found"), the first instance is the one applied and the
// response is NACKed; the later ones are dropped before anything sees them,
// and the rest of the response is applied as with any rejected resource
// (A46). The error belongs to the response, not to the resource's cache
// entry, whose state is that of the first instance.
func checkDuplicate(first map[string]int, name string, i int) string {
	j, seen := first[name]
	if !seen {
		first[name] = i
		return ""
	}
	return fmt.Sprintf("resources[%d]: duplicate of resources[%d], the one applied", i, j)
}

// sweep deletes what the cache has and a full state lacks. Every SotW
// response of a wildcard type is a full state; no Delta response is (the
// server removes what it no longer has: initialVersions). Nothing is swept
// when a resource had no name (A46).
func (c *Client) sweep(ts *typeState, a *applied) {
	if !ts.wildcard || a.delta || !a.sweepSafe {
		return
	}
	for name, e := range ts.entries {
		if _, ok := a.present[name]; ok {
			continue
		}
		if c.keepDeleted(ts, name, e, a) {
			continue
		}
		if e.accepted.valid() {
			a.removed = append(a.removed, name)
		}
		delete(ts.entries, name)
		a.touched = append(a.touched, name)
	}
}

// keepDeleted applies gRFC A53: when the server in use has
// ignore_resource_deletion, a resource it deletes (absent from a full
// state, or in a Delta response's removed_resources) keeps its accepted
// version in use, once logged; it reports whether it did. The mark goes
// when the server sends the resource again (decode) or the consumer stops
// asking for it (setNames).
func (c *Client) keepDeleted(ts *typeState, name string, e *entry, a *applied) bool {
	if !c.current.ignoreResourceDeletion || !e.accepted.valid() {
		return false
	}
	if e.state != StateDeletionIgnored {
		c.log.Warn("xDS server deleted a resource; keeping it in use ("+FeatureIgnoreResourceDeletion+")",
			"server", c.current.address, "type", ShortTypeName(ts.url), "name", name, "version", e.version)
		// What is kept is the accepted version; a rejected one of a
		// resource the server no longer has is not offered again.
		e.state, e.updated = StateDeletionIgnored, a.now
		e.rej = nil
		a.touched = append(a.touched, name)
	}
	return true
}

// removeNamed applies a Delta response's removed_resources: a wildcard
// type's resource is gone; a requested one does not exist. A name the
// response also sends is a duplicate: the instance sent is the one applied
// (see checkDuplicate). A name removed twice is removed once.
func (c *Client) removeNamed(ts *typeState, resp *response, a *applied) {
	for k, name := range resp.removed {
		if i, sent := a.present[name]; sent {
			// Keyed after the resources, so that the NACK lists it last.
			a.rejected["#"+strconv.Itoa(len(resp.resources)+k)] = fmt.Sprintf(
				"%s %q: removed_resources[%d]: also in resources[%d], the one applied", KindName(ts.url), name, k, i)
			a.removedTwice++
			continue
		}
		e, ok := ts.entries[name]
		if !ok || c.keepDeleted(ts, name, e, a) {
			continue
		}
		a.touched = append(a.touched, name)
		if ts.wildcard {
			if e.accepted.valid() {
				a.removed = append(a.removed, name)
			}
			delete(ts.entries, name)
			continue
		}
		// A requested resource the server says does not exist.
		ts.stopDeadline(name)
		if e.accepted.valid() || e.state != StateDoesNotExist {
			a.removed = append(a.removed, name)
		}
		*e = entry{state: StateDoesNotExist, updated: a.now}
	}
}

// deliverSlice gives an InSlices handler the upserted resources of a slice
// that is not the response's last, and lets go of their decoded messages
// (a rejected one is kept in its offer).
func (c *Client) deliverSlice(ctx context.Context, ts *typeState, a *applied) {
	slice := a.upserted[a.delivered:]
	if len(slice) == 0 {
		return
	}
	rej := ts.handler.HandleUpdate(ctx, Update{TypeURL: ts.url, Upserted: slice})
	for i := range slice {
		if err := rej[slice[i].Name]; err != nil {
			a.reject(slice[i], err.Error())
		}
		slice[i].Message = nil
	}
	a.delivered = len(a.upserted)
}

// deliverChanges calls the handler when something changed, and moves what
// it rejects from changed to rejected. Resources rejected before and
// unchanged are offered again only along with a change: nothing else could
// make them valid now.
func (c *Client) deliverChanges(ctx context.Context, ts *typeState, a *applied) {
	if len(a.upserted) == 0 && len(a.removed) == 0 {
		for _, r := range a.again {
			a.reject(r, ts.entries[r.Name].err())
		}
		return
	}
	a.upserted = append(a.upserted, a.again...)
	rest := a.upserted[a.delivered:]
	rej, offered := c.deliver(ctx, ts, a.upserted[:a.delivered], rest, a.removed, a.now)
	a.touched = append(a.touched, offered...)
	for _, r := range rest {
		if err := rej[r.Name]; err != nil {
			a.reject(r, err.Error()) // only an upserted resource can be rejected
		}
	}
}

// reject records that the handler rejected r, changed or not.
func (a *applied) reject(r Resource, msg string) {
	a.rejected[r.Name] = clip(msg)
	a.badSums[r.Name] = a.changed[r.Name]
	a.offers[r.Name] = &r
	delete(a.changed, r.Name)
}

// recordOutcome writes the verdicts into the cache: an accepted resource
// replaces the cached one; a rejected one keeps it (nacked-but-cached), or
// is nacked when there is none, and exists all the same.
func (c *Client) recordOutcome(ts *typeState, a *applied) {
	for _, r := range a.upserted {
		value, ok := a.changed[r.Name]
		if !ok {
			continue
		}
		e := ts.entry(r.Name)
		*e = entry{accepted: value, version: r.Version, server: c.current.address, state: StateAcked, updated: a.now}
		ts.stopDeadline(r.Name)
		a.touched = append(a.touched, r.Name)
	}
	for name, msg := range a.rejected {
		if strings.HasPrefix(name, "#") {
			continue
		}
		e := ts.entry(name)
		e.rej, e.updated = &rejection{err: msg, sum: a.badSums[name], offer: a.offers[name]}, a.now
		ts.offering = ts.offering || e.rej.offer != nil
		e.state = StateNacked
		if e.accepted.valid() {
			e.state = StateNackedButCached
		}
		// The server has it, even if it is bad: it exists.
		ts.stopDeadline(name)
		a.touched = append(a.touched, name)
	}
}

// markResponded marks the type synced on its first response of the stream.
func (c *Client) markResponded(ts *typeState) {
	if ts.responded {
		return
	}
	ts.responded = true
	c.markSynced(ts.url)
	// The names the handler just set are owed a response too: health
	// must not turn OK before they are asked for.
	c.applyWatches()
	c.reportHealth()
}

// ackOrNack answers the response: an ACK takes its version; a NACK keeps the
// last accepted version and says what was rejected. A NACK identical to the
// previous one is held back (see nackPace).
func (c *Client) ackOrNack(st adsStream, ts *typeState, resp *response, rejected map[string]string, now time.Time) error {
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
// the response does not name (in the update, or in the earlier slices
// already delivered): whether a resource is valid may depend on others (a
// VIP held by another cluster), and a Delta server never resends a resource
// it sent. The outcome of these offers is applied to the cache here, and
// their names returned; the handler's verdict on the update's own resources
// is returned for the caller to apply.
func (c *Client) deliver(ctx context.Context, ts *typeState, earlier, upserted []Resource, removed []string, now time.Time) (map[string]error, []string) {
	in := make(map[string]struct{}, len(earlier)+len(upserted)+len(removed))
	for _, r := range earlier {
		in[r.Name] = struct{}{}
	}
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
			if e.offer() == nil {
				continue
			}
			ts.offering = true
			if _, ok := in[name]; !ok {
				offered = append(offered, *e.offer())
			}
		}
	}
	slices.SortFunc(offered, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(removed)
	removed = slices.Compact(removed)

	all := append(slices.Clip(upserted), offered...)
	if len(all) == 0 && len(removed) == 0 {
		return nil, nil // the earlier slices had it all
	}
	rej := ts.handler.HandleUpdate(ctx, Update{TypeURL: ts.url, Upserted: all, Removed: removed})

	var touched []string
	for _, r := range offered {
		e := ts.entries[r.Name]
		if err := rej[r.Name]; err != nil {
			delete(rej, r.Name)
			if msg := clip(err.Error()); msg != e.err() {
				// An offer is made of a rejection (offer): e.rej is set.
				e.rej.err, e.updated = msg, now
				touched = append(touched, r.Name)
			}
			continue
		}
		c.log.Info("Rejected xDS resource accepted on a later update",
			"type", ShortTypeName(ts.url), "name", r.Name, "version", r.Version)
		*e = entry{accepted: e.rej.sum, version: r.Version, state: StateAcked, updated: now}
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
// range`. It stops at MaxNackMessage bytes, saying how many more there are:
// a server that sends thousands of bad resources gets a NACK it can log.
func nackMessage(typeURL string, rejected map[string]string) string {
	kind := KindName(typeURL)
	var b strings.Builder
	names := slices.Collect(maps.Keys(rejected))
	slices.SortFunc(names, compareRejected)
	for i, name := range names {
		msg := rejected[name]
		if !strings.HasPrefix(name, "#") && !strings.Contains(msg, strconv.Quote(name)) {
			msg = kind + " " + quoteName(name) + ": " + msg
		}
		if i > 0 && b.Len()+len(msg) > MaxNackMessage {
			fmt.Fprintf(&b, "; and %d more rejected", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(msg)
	}
	return b.String()
}

// Bounds of what a server's resources can make the client hold or send.
const (
	// MaxNameLength bounds a resource's name: a longer one is rejected
	// (xdstp:// names stay far below it).
	MaxNameLength = 4096
	// MaxErrorLength bounds one resource's error, as kept in the
	// xds-resources table and sent in a NACK.
	MaxErrorLength = 1024
	// MaxNackMessage bounds a NACK's error_detail (but its first error).
	MaxNackMessage = 16 << 10
	// maxQuotedName bounds a name quoted in an error.
	maxQuotedName = 128
)

// clip bounds an error message to MaxErrorLength bytes, on a rune boundary.
func clip(msg string) string {
	if len(msg) <= MaxErrorLength {
		return msg
	}
	return strings.ToValidUTF8(msg[:MaxErrorLength], "") + fmt.Sprintf("... (%d bytes)", len(msg))
}

// quoteName quotes a name for an error, its start only if it is long.
func quoteName(name string) string {
	if len(name) <= maxQuotedName {
		return strconv.Quote(name)
	}
	return strconv.Quote(strings.ToValidUTF8(name[:maxQuotedName], "")) + fmt.Sprintf("... (%d bytes)", len(name))
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

// decodeOptions decode resources with the recursion limit of Envoy's
// protobuf parser (C++ protobuf's default): a resource nested deeper, in
// its metadata say, is rejected rather than decoded at any cost.
var decodeOptions = proto.UnmarshalOptions{RecursionLimit: 100}

// decodeResource decodes one resource and finds its name. The name is
// returned whenever it can be known, even with an error: for bytes that do
// not decode, it is read from the encoding if the name field is there.
func decodeResource(typeURL string, raw rawResource) (string, proto.Message, error) {
	name := raw.name
	if raw.any == nil {
		return name, nil, errors.New("resource has no body")
	}
	msg, err := anypb.UnmarshalNew(raw.any, decodeOptions)
	if err != nil {
		if name == "" {
			name = encodedName(raw.any)
		}
		return name, nil, fmt.Errorf("cannot decode %s: %w", clipTypeURL(raw.any.GetTypeUrl()), err)
	}
	if name == "" {
		name = resourceName(msg)
	}
	if raw.any.GetTypeUrl() != typeURL {
		return name, nil, fmt.Errorf("resource of type %s in a response of type %s", clipTypeURL(raw.any.GetTypeUrl()), typeURL)
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

// clipTypeURL bounds a type URL quoted in an error (a known one is short).
func clipTypeURL(u string) string {
	if len(u) <= maxQuotedName {
		return u
	}
	return quoteName(u)
}

// encodedName reads the name of a resource whose bytes do not decode from
// its encoding: the last instance of its type's name field (name, or
// cluster_name) at the top level, as a decoder would take it. It returns ""
// when the type is unknown or the field cannot be read.
func encodedName(a *anypb.Any) string {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl())
	if err != nil {
		return ""
	}
	fields := mt.Descriptor().Fields()
	fd := fields.ByName("name")
	if fd == nil {
		fd = fields.ByName("cluster_name")
	}
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return ""
	}
	var name string
	for b := a.GetValue(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == fd.Number() && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			name, b = string(v), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		b = b[n:]
	}
	if !utf8.ValidString(name) {
		return ""
	}
	return name
}
