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

type sotwWatch struct {
	req *cache.Request
	sub cache.Subscription
	ch  chan cache.Response
}

func newSotwCache(typeURL, prefix string) *sotwCache {
	return &sotwCache{
		typeURL:   typeURL,
		prefix:    prefix,
		fullState: cache.ResourceRequiresFullStateInSotw(typeURL),
		resources: map[string]*sotwResource{},
		watches:   map[*sotwWatch]struct{}{},
		sets:      map[uint64][]*sharedSet{},
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
	var errs []error
	for name, res := range toUpdate {
		c.nextID++
		r := &sotwResource{name: name, version: version, id: c.nextID}
		if b, err := cache.MarshalResource(res); err != nil {
			r.err = fmt.Errorf("marshalling %s %q: %w", c.typeURL, name, err)
			errs = append(errs, r.err)
		} else {
			r.any = &anypb.Any{TypeUrl: c.typeURL, Value: b}
		}
		c.resources[name] = r
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
			w.ch <- resp
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
	// A client without a version, or with one of another process, gets
	// what it asks for even if that is nothing.
	replyEvenIfEmpty := req.GetVersionInfo() == "" || !strings.HasPrefix(req.GetVersionInfo(), c.prefix)
	w := &sotwWatch{req: req, sub: sub, ch: ch}
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp := c.respondLocked(w, replyEvenIfEmpty); resp != nil {
		w.ch <- resp
		return func() {}, nil
	}
	c.watches[w] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.watches, w)
	}, nil
}

// respondLocked is the response w needs, or nil.
func (c *sotwCache) respondLocked(w *sotwWatch, replyEvenIfEmpty bool) *sotwResponse {
	known := w.sub.ReturnedResources()
	var changed []*sotwResource
	var removed []string
	if w.sub.IsWildcard() {
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
		subscribed := w.sub.SubscribedResources()
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
	if len(changed) == 0 && len(removed) == 0 && !replyEvenIfEmpty {
		return nil
	}

	toReturn := changed
	switch {
	case !c.fullState:
		// Only what changed: SotW cannot say that a resource of such a
		// type is gone, so a removal alone sends nothing.
		if !replyEvenIfEmpty && len(changed) == 0 {
			return nil
		}
	case w.sub.IsWildcard():
		toReturn = slices.Collect(maps.Values(c.resources))
	default:
		toReturn = toReturn[:0:0]
		for name := range w.sub.SubscribedResources() {
			if r, ok := c.resources[name]; ok {
				toReturn = append(toReturn, r)
			}
		}
	}

	returned := maps.Clone(known)
	if returned == nil {
		returned = make(map[string]string, len(toReturn))
	}
	for _, r := range toReturn {
		returned[r.name] = r.version
	}
	for _, name := range removed {
		delete(returned, name)
	}
	return &sotwResponse{req: w.req, version: c.versionLocked(), set: c.setLocked(toReturn), returned: returned}
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
	req      *cache.Request
	version  string
	set      *sharedSet
	returned map[string]string
}

var _ cache.Response = (*sotwResponse)(nil)

func (r *sotwResponse) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	if r.set.err != nil {
		return nil, r.set.err
	}
	return &discovery.DiscoveryResponse{VersionInfo: r.version, Resources: r.set.anys, TypeUrl: r.req.GetTypeUrl()}, nil
}

func (r *sotwResponse) GetRequest() *discovery.DiscoveryRequest { return r.req }
func (r *sotwResponse) GetVersion() (string, error)             { return r.version, nil }
func (r *sotwResponse) GetResponseVersion() string              { return r.version }
func (r *sotwResponse) GetReturnedResources() map[string]string { return r.returned }
func (r *sotwResponse) GetContext() context.Context             { return context.Background() }
