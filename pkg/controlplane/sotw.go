// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// sotwCache answers the SotW watches of one type. It follows
// cache.LinearCache's protocol (the same versions, the same responses), but
// for a fleet: thousands of streams that subscribe to the same resources.
//
//   - A resource is marshalled once, when it is set, and the responses that
//     carry the same resources at the same version share one immutable
//     []*anypb.Any; each stream gets a DiscoveryResponse of its own around
//     it, which the server stamps with the stream's nonce.
//   - Watches are kept in one set, not indexed by every name they
//     subscribe to: a stream opens a watch on every ACK, and indexing it
//     under its hundred names (and removing it again) cost more than
//     looking at every watch once per change.
//   - The streams of sotwServer share what they subscribe to and what
//     they hold (see sotwSub): the cache works out what such a stream
//     lacks once per version for all the streams in the same state.
//
// A response whose resources cannot all be marshalled is not sent: the
// watch stays open until a change makes it whole (Server.Set reports the
// resource), and the client keeps what it has meanwhile.
type sotwCache struct {
	typeURL string
	prefix  string
	// fullState: every response holds every subscribed resource (CDS, LDS),
	// not only the changed ones.
	fullState bool

	mu        sync.Mutex
	version   uint64
	resources map[string]*sotwResource
	watches   map[*sotwWatch]struct{}
	nextID    uint64
	// sets are the resource sets of responses built at the current
	// version, by fingerprint; a change starts them anew.
	sets map[uint64][]*sharedSet
	// answers are what streams of a shared state lack at the current
	// version; a change starts them anew.
	answers map[answerKey]*sotwAnswer
	// nameSets are the subscriptions of sotwServer's streams, by their
	// names.
	nameSets map[string]*nameSet
}

// maxAnswers, with two per open watch, bounds the answers kept between
// changes.
const maxAnswers = 1024

// answerKey is the state of a sotwSub: what it holds and subscribes to.
// The pointers keep what they point to, so that no other state can take
// their addresses while an answer is kept.
type answerKey struct {
	known    *knownSet
	names    *nameSet
	wildcard bool
}

// sotwAnswer is what a subscription in some state lacks.
type sotwAnswer struct {
	// changed: a resource it subscribes to changed, or (for a full-state
	// type) went.
	changed  bool
	toReturn []*sotwResource
	set      *sharedSet // of toReturn, made on first use
	// known is what it holds once answered.
	known *knownSet
}

// knownSet is what a stream holds of a type: each resource's version as
// last sent. It is never modified, and shared by the streams that hold the
// same; nil is nothing.
type knownSet struct{ versions map[string]string }

func (k *knownSet) get() map[string]string {
	if k == nil {
		return nil
	}
	return k.versions
}

// nameSet is the resource names of SotW requests, shared by the
// subscriptions whose requests name the same in the same order (see
// sotwCache.internNames).
type nameSet struct {
	list     []string // as the requests name them
	names    map[string]struct{}
	wildcard bool // "*" among them
	refs     int
	interned bool
}

// sotwResource is a resource as served: marshalled once.
type sotwResource struct {
	name string
	// version is the cache's version when the resource last changed.
	version string
	any     *anypb.Any // nil when err
	err     error
	// id identifies the resource at its version within the cache.
	id uint64
}

// sharedSet is the resources of a response, shared by every response of
// the same resources at the same version. It is never modified.
type sharedSet struct {
	members map[*sotwResource]struct{}
	anys    []*anypb.Any
	err     error
	// encoded is anys as field 2 of a DiscoveryResponse (see codec).
	encoded []byte
}

// sotwWatch is a stream's open watch: its response is sent on ch
// (cache.ConfigWatcher's watches) or given to deliver (sotwServer's).
type sotwWatch struct {
	req     *cache.Request // nil for sotwServer's
	sub     cache.Subscription
	ch      chan cache.Response
	deliver func(*sotwResponse)
}

func (w *sotwWatch) answer(r *sotwResponse) {
	if w.deliver != nil {
		w.deliver(r)
		return
	}
	w.ch <- r
}

func newSotwCache(typeURL, prefix string) *sotwCache {
	return &sotwCache{
		typeURL:   typeURL,
		prefix:    prefix,
		fullState: cache.ResourceRequiresFullStateInSotw(typeURL),
		resources: map[string]*sotwResource{},
		watches:   map[*sotwWatch]struct{}{},
		sets:      map[uint64][]*sharedSet{},
		answers:   map[answerKey]*sotwAnswer{},
		nameSets:  map[string]*nameSet{},
	}
}

func (c *sotwCache) versionLocked() string {
	return c.prefix + strconv.FormatUint(c.version, 10)
}

// update sets and deletes resources and answers the watches that see a
// change, as cache.LinearCache.UpdateResources does.
func (c *sotwCache) update(toUpdate map[string]types.Resource, toDelete []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version++
	version := c.versionLocked()
	for _, sets := range c.sets {
		for _, s := range sets {
			unregisterSet(s)
		}
	}
	clear(c.sets)
	clear(c.answers)
	// Marshalled on every core: for a large state, the time to the
	// first response.
	names := slices.Collect(maps.Keys(toUpdate))
	updated := make([]*sotwResource, len(names))
	parallel(len(names), func(i int) bool {
		r := &sotwResource{name: names[i], version: version}
		if b, err := cache.MarshalResource(toUpdate[names[i]]); err != nil {
			r.err = fmt.Errorf("marshalling %s %q: %w", c.typeURL, names[i], err)
		} else {
			r.any = &anypb.Any{TypeUrl: c.typeURL, Value: b}
		}
		updated[i] = r
		return true
	})
	var errs []error
	for _, r := range updated {
		c.nextID++
		r.id = c.nextID
		if r.err != nil {
			errs = append(errs, r.err)
		}
		c.resources[r.name] = r
	}
	for _, name := range toDelete {
		delete(c.resources, name)
	}
	for w := range c.watches {
		if !w.sub.IsWildcard() && !subscribesAny(w.sub, toUpdate, toDelete) {
			continue
		}
		if resp := c.respondLocked(w, false); resp != nil {
			delete(c.watches, w)
			w.answer(resp)
		}
	}
	return errors.Join(errs...)
}

func subscribesAny(sub cache.Subscription, toUpdate map[string]types.Resource, toDelete []string) bool {
	names := sub.SubscribedResources()
	for name := range toUpdate {
		if _, ok := names[name]; ok {
			return true
		}
	}
	for _, name := range toDelete {
		if _, ok := names[name]; ok {
			return true
		}
	}
	return false
}

// CreateWatch answers req at once when the client lacks something, or
// keeps the watch until a change, as cache.LinearCache.CreateWatch does.
func (c *sotwCache) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	if req.GetTypeUrl() != c.typeURL {
		return nil, fmt.Errorf("request type %s does not match cache type %s", req.GetTypeUrl(), c.typeURL)
	}
	w := &sotwWatch{req: req, sub: sub, ch: ch}
	c.open(w, c.replyEvenIfEmpty(req.GetVersionInfo()))
	return func() { c.cancel(w) }, nil
}

// replyEvenIfEmpty tells whether a client whose request holds version gets
// what it asks for even if that is nothing: it has no version, or one of
// another process.
func (c *sotwCache) replyEvenIfEmpty(version string) bool {
	return version == "" || !strings.HasPrefix(version, c.prefix)
}

// open answers w at once when its stream lacks something (or anything,
// with replyEvenIfEmpty), or keeps it until a change.
func (c *sotwCache) open(w *sotwWatch, replyEvenIfEmpty bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp := c.respondLocked(w, replyEvenIfEmpty); resp != nil {
		w.answer(resp)
		return
	}
	c.watches[w] = struct{}{}
}

// cancel closes w: no response comes after it returns.
func (c *sotwCache) cancel(w *sotwWatch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.watches, w)
}

// respondLocked is the response w needs, or nil.
func (c *sotwCache) respondLocked(w *sotwWatch, replyEvenIfEmpty bool) *sotwResponse {
	var a *sotwAnswer
	if sub, ok := w.sub.(*sotwSub); ok {
		key := answerKey{known: sub.known, names: sub.names, wildcard: sub.wildcard}
		if a = c.answers[key]; a == nil {
			a = c.answerLocked(sub)
			// Between changes, streams that come and go with names of
			// their own add states; forgetting them all costs only
			// the sharing of those computed again.
			if len(c.answers) >= maxAnswers+2*len(c.watches) {
				clear(c.answers)
			}
			c.answers[key] = a
		}
	} else {
		a = c.answerLocked(w.sub)
	}
	if !a.changed && !replyEvenIfEmpty {
		return nil
	}
	if a.set == nil {
		a.set = c.setLocked(a.toReturn)
	}
	if a.set.err != nil {
		return nil
	}
	return &sotwResponse{req: w.req, typeURL: c.typeURL, version: c.versionLocked(), set: a.set, known: a.known}
}

// answerLocked works out what sub lacks.
func (c *sotwCache) answerLocked(sub cache.Subscription) *sotwAnswer {
	known := sub.ReturnedResources()
	var changed []*sotwResource
	var removed []string
	if sub.IsWildcard() {
		for name, r := range c.resources {
			if v, ok := known[name]; !ok || v != r.version {
				changed = append(changed, r)
			}
		}
		for name := range known {
			if _, ok := c.resources[name]; !ok {
				removed = append(removed, name)
			}
		}
	} else {
		subscribed := sub.SubscribedResources()
		for name := range subscribed {
			r, exists := c.resources[name]
			v, isKnown := known[name]
			switch {
			case !exists:
				if isKnown {
					removed = append(removed, name)
				}
			case !isKnown || v != r.version:
				changed = append(changed, r)
			}
		}
		// A name no longer subscribed is forgotten, so that subscribing
		// to it again sends it again.
		for name := range known {
			if _, ok := subscribed[name]; !ok {
				removed = append(removed, name)
			}
		}
	}

	a := &sotwAnswer{toReturn: changed}
	switch {
	case !c.fullState:
		// Only what changed: SotW cannot say that a resource of such a
		// type is gone, so a removal alone sends nothing.
		a.changed = len(changed) > 0
	case sub.IsWildcard():
		a.changed = len(changed) > 0 || len(removed) > 0
		a.toReturn = slices.Collect(maps.Values(c.resources))
	default:
		a.changed = len(changed) > 0 || len(removed) > 0
		a.toReturn = nil
		for name := range sub.SubscribedResources() {
			if r, ok := c.resources[name]; ok {
				a.toReturn = append(a.toReturn, r)
			}
		}
	}

	returned := maps.Clone(known)
	if returned == nil {
		returned = make(map[string]string, len(a.toReturn))
	}
	for _, r := range a.toReturn {
		returned[r.name] = r.version
	}
	for _, name := range removed {
		delete(returned, name)
	}
	if len(returned) > 0 {
		a.known = &knownSet{returned}
	}
	return a
}

// internNames returns the nameSet of list, shared with the subscriptions
// that name the same; releaseNames gives it back.
func (c *sotwCache) internNames(list []string) *nameSet {
	key := strings.Join(list, "\x00")
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.nameSets[key]
	if ns != nil && slices.Equal(ns.list, list) {
		ns.refs++
		return ns
	}
	taken := ns != nil // by other names that contain the separator
	ns = &nameSet{list: slices.Clone(list), names: make(map[string]struct{}, len(list)), refs: 1, interned: !taken}
	for _, name := range list {
		if name == explicitWildcard {
			ns.wildcard = true
		} else {
			ns.names[name] = struct{}{}
		}
	}
	if ns.interned {
		c.nameSets[key] = ns
	}
	return ns
}

func (c *sotwCache) releaseNames(ns *nameSet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns.refs--; ns.refs == 0 && ns.interned {
		delete(c.nameSets, strings.Join(ns.list, "\x00"))
	}
}

// setLocked returns the shared set of rs, made on first use at this
// version.
func (c *sotwCache) setLocked(rs []*sotwResource) *sharedSet {
	var fp uint64
	for _, r := range rs {
		fp += mix64(r.id)
	}
	for _, s := range c.sets[fp] {
		if s.holds(rs) {
			return s
		}
	}
	s := &sharedSet{members: make(map[*sotwResource]struct{}, len(rs)), anys: make([]*anypb.Any, 0, len(rs))}
	sorted := slices.SortedFunc(slices.Values(rs), func(a, b *sotwResource) int { return cmp.Compare(a.name, b.name) })
	for _, r := range sorted {
		s.members[r] = struct{}{}
		if r.err != nil {
			s.err = errors.Join(s.err, r.err)
			continue
		}
		s.anys = append(s.anys, r.any)
	}
	if s.err == nil {
		// The encoding of a set is only an optimisation: without one
		// (it failed) the codec encodes each response on its own.
		if enc, err := proto.Marshal(&discovery.DiscoveryResponse{Resources: s.anys}); err == nil {
			s.encoded = enc
			registerSet(s)
		}
	}
	c.sets[fp] = append(c.sets[fp], s)
	return s
}

// holds tells whether s is exactly the resources rs (which has no
// duplicates).
func (s *sharedSet) holds(rs []*sotwResource) bool {
	if len(rs) != len(s.members) {
		return false
	}
	for _, r := range rs {
		if _, ok := s.members[r]; !ok {
			return false
		}
	}
	return true
}

// mix64 spreads an ID over 64 bits (splitmix64's finaliser), so that sums
// of different sets rarely collide.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// sotwResponse is one stream's response. Its resources are shared with
// every other response of the same set; the DiscoveryResponse around them
// is new on every call, since the server sets the stream's nonce in it.
type sotwResponse struct {
	req     *cache.Request // nil for sotwServer's streams
	typeURL string
	version string
	set     *sharedSet
	known   *knownSet // what the stream holds once it has the response
}

var _ cache.Response = (*sotwResponse)(nil)

func (r *sotwResponse) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	if r.set.err != nil {
		return nil, r.set.err
	}
	return &discovery.DiscoveryResponse{VersionInfo: r.version, Resources: r.set.anys, TypeUrl: r.typeURL}, nil
}

func (r *sotwResponse) GetRequest() *discovery.DiscoveryRequest { return r.req }
func (r *sotwResponse) GetVersion() (string, error)             { return r.version, nil }
func (r *sotwResponse) GetResponseVersion() string              { return r.version }
func (r *sotwResponse) GetReturnedResources() map[string]string { return r.known.get() }
func (r *sotwResponse) GetContext() context.Context             { return context.Background() }
