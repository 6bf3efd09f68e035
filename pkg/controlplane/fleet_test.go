// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// countingStringer counts how often it is formatted.
type countingStringer struct{ n *int }

func (c countingStringer) String() string { *c.n++; return "names" }

// The caches log every watch with the resources it subscribes to; a
// message below the logger's level must cost no formatting.
func TestCacheLoggerFormatsOnlyEnabledLevels(t *testing.T) {
	var out bytes.Buffer
	l := &cacheLogger{slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	var n int
	l.Infof("open watch for %v", countingStringer{&n})
	l.Debugf("details %v", countingStringer{&n})
	if n != 0 || out.Len() != 0 {
		t.Errorf("debug messages formatted %d times, logged %q; want neither", n, out.String())
	}
	l.Warnf("warning %v", countingStringer{&n})
	if n != 1 || !strings.Contains(out.String(), "warning names") {
		t.Errorf("warning formatted %d times, logged %q; want once", n, out.String())
	}
}

// fleetResources is n clusters and their CLAs, the weight of every
// endpoint depending on round r.
func fleetResources(t *testing.T, n, r int) Resources {
	t.Helper()
	res := Resources{}
	for i := range n {
		name := "svc-" + strconv.Itoa(i)
		lbs := []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: "192.168.1." + strconv.Itoa(10+i), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 80}}}},
			}},
			LoadBalancingWeight: wrapperspb.UInt32(uint32(1 + (i+r)%10)),
		}}
		for _, m := range []proto.Message{
			&clusterv3.Cluster{Name: name},
			&endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}},
		} {
			if err := res.Add(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	return res
}

// sotwStep is what a SotW stream does next in the differential test.
type sotwStep struct {
	// request: the stream sends a request with names (nil: wildcard)
	// and the version it holds; versionOverride replaces that version.
	request         bool
	names           []string
	versionOverride *string
	// otherwise the caches get an update.
	update   map[string]types.Resource
	toDelete []string
}

// fakeStream plays the SotW server's part for one stream and one cache: it
// keeps the subscription and the open watch, as sotw's server does.
type fakeStream struct {
	typeURL string
	sub     stream.Subscription
	started bool
	version string
	ch      chan cache.Response
	cancel  func()
	// shared: the stream is sotwServer's, its state a sotwSub.
	shared bool
	ours   *sotwSub
}

// sotwWatcher is the SotW half of cache.ConfigWatcher.
type sotwWatcher interface {
	CreateWatch(*cache.Request, cache.Subscription, chan cache.Response) (func(), error)
}

func (f *fakeStream) request(t *testing.T, c sotwWatcher, names []string, version *string) {
	t.Helper()
	if f.cancel != nil {
		f.cancel()
	}
	v := f.version
	if version != nil {
		v = *version
	}
	if f.shared {
		c := c.(*sotwCache)
		if f.ours == nil {
			f.ours = newSotwSub(c, names)
		} else {
			f.ours.setNames(names)
		}
		w := &sotwWatch{sub: f.ours, deliver: func(r *sotwResponse) { f.ch <- r }}
		c.open(w, c.replyEvenIfEmpty(v))
		f.cancel = func() { c.cancel(w) }
		return
	}
	if !f.started {
		f.sub = stream.NewSotwSubscription(names, true)
		f.started = true
	} else {
		f.sub.SetResourceSubscription(names)
	}
	var err error
	f.cancel, err = c.CreateWatch(&cache.Request{TypeUrl: f.typeURL, ResourceNames: names, VersionInfo: v}, &f.sub, f.ch)
	if err != nil {
		t.Fatal(err)
	}
}

// take is the response the stream got, if any: its version, resource
// names and the versions the stream then knows.
func (f *fakeStream) take(t *testing.T) string {
	t.Helper()
	select {
	case resp := <-f.ch:
		out, err := resp.GetDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, msg := range decodeAll(t, out.GetResources()) {
			names = append(names, resourceName(msg))
		}
		slices.Sort(names)
		f.sub.SetReturnedResources(resp.GetReturnedResources())
		if f.shared {
			f.ours.known = resp.(*sotwResponse).known
		}
		f.version = out.GetVersionInfo()
		return fmt.Sprintf("version %s resources %v known %v", out.GetVersionInfo(), names, resp.GetReturnedResources())
	default:
		return "no response"
	}
}

// sotwCache answers exactly as cache.LinearCache does, for full-state
// (CDS) and other (EDS) types, wildcard and named subscriptions, and so
// for sotwServer's streams, whose state it shares.
func TestSotwCacheAnswersAsLinearCache(t *testing.T) {
	res := fleetResources(t, 4, 0)
	changed := fleetResources(t, 4, 1)
	other := "other-process-7"
	for _, typeURL := range []string{resource.ClusterType, resource.EndpointType} {
		all, next := map[string]types.Resource{}, map[string]types.Resource{}
		for name, m := range res[typeURL] {
			all[name] = m
		}
		for name, m := range changed[typeURL] {
			next[name] = m
		}
		steps := []sotwStep{
			{request: true, names: []string{"svc-0", "svc-1"}},
			{update: all},
			{request: true, names: []string{"svc-0", "svc-1"}}, // ACK
			{update: map[string]types.Resource{"svc-1": next["svc-1"]}},
			{request: true, names: []string{"svc-0", "svc-1"}},
			{update: map[string]types.Resource{"svc-3": next["svc-3"]}}, // not subscribed
			{request: true, names: []string{"svc-0", "svc-1", "svc-2"}}, // one more
			{request: true, names: []string{"svc-0", "svc-2"}},          // one less
			{update: nil, toDelete: []string{"svc-2"}},
			{request: true, names: []string{"svc-0", "svc-2"}},
			{request: true, names: []string{"svc-0"}, versionOverride: &other}, // a restarted client
			{request: true, names: []string{"svc-0"}},
			{update: next},
			{request: true, names: []string{"svc-0"}},
		}
		wildcard := []sotwStep{
			{request: true},
			{update: all},
			{request: true},
			{update: map[string]types.Resource{"svc-1": next["svc-1"]}},
			{request: true},
			{update: nil, toDelete: []string{"svc-2"}},
			{request: true},
			{update: map[string]types.Resource{"svc-1": next["svc-1"]}, toDelete: []string{"svc-3"}},
			{request: true, versionOverride: &other},
			{request: true},
		}
		for name, steps := range map[string][]sotwStep{"named": steps, "wildcard": wildcard} {
			t.Run(typeURL[strings.LastIndexByte(typeURL, '.')+1:]+"/"+name, func(t *testing.T) {
				ours := newSotwCache(typeURL, "p-")
				theirs := cache.NewLinearCache(typeURL, cache.WithVersionPrefix("p-"))
				a := &fakeStream{typeURL: typeURL, ch: make(chan cache.Response, 1)}
				b := &fakeStream{typeURL: typeURL, ch: make(chan cache.Response, 1)}
				// Two streams of sotwServer, in the same state.
				c := &fakeStream{typeURL: typeURL, ch: make(chan cache.Response, 1), shared: true}
				d := &fakeStream{typeURL: typeURL, ch: make(chan cache.Response, 1), shared: true}
				for i, s := range steps {
					if s.request {
						a.request(t, ours, s.names, s.versionOverride)
						b.request(t, theirs, s.names, s.versionOverride)
						c.request(t, ours, s.names, s.versionOverride)
						d.request(t, ours, s.names, s.versionOverride)
					} else {
						if err := ours.update(s.update, s.toDelete); err != nil {
							t.Fatal(err)
						}
						if err := theirs.UpdateResources(s.update, s.toDelete); err != nil {
							t.Fatal(err)
						}
					}
					want := b.take(t)
					for _, f := range []*fakeStream{a, c, d} {
						if got := f.take(t); got != want {
							t.Fatalf("step %d %+v: got %s (shared state %v), LinearCache: %s", i, s, got, f.shared, want)
						}
					}
				}
			})
		}
	}
}

// Streams that get the same resources at the same version share one
// []*anypb.Any, each in a DiscoveryResponse of its own: setting one's nonce
// leaves the others' alone.
func TestSotwCacheSharesResources(t *testing.T) {
	res := fleetResources(t, 3, 0)
	c := newSotwCache(resource.EndpointType, "p-")
	upd := map[string]types.Resource{}
	for name, m := range res[resource.EndpointType] {
		upd[name] = m
	}
	if err := c.update(upd, nil); err != nil {
		t.Fatal(err)
	}
	names := []string{"svc-0", "svc-1", "svc-2"}
	var outs []*discovery.DiscoveryResponse
	for i := range 3 {
		sub := stream.NewSotwSubscription(slices.Clone(names), true)
		if i == 2 {
			slices.Reverse(names) // the same set in another order
			sub = stream.NewSotwSubscription(names, true)
		}
		ch := make(chan cache.Response, 1)
		if _, err := c.CreateWatch(&cache.Request{TypeUrl: resource.EndpointType, ResourceNames: names}, &sub, ch); err != nil {
			t.Fatal(err)
		}
		out, err := (<-ch).GetDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		out.Nonce = strconv.Itoa(i + 1)
		outs = append(outs, out)
	}
	for i, out := range outs {
		if out.GetNonce() != strconv.Itoa(i+1) || out.GetVersionInfo() != "p-1" || len(out.GetResources()) != 3 {
			t.Errorf("response %d: nonce %q version %q, %d resources; want nonce %d, version p-1, 3 resources",
				i, out.GetNonce(), out.GetVersionInfo(), len(out.GetResources()), i+1)
		}
		if i > 0 && (out == outs[0] || &out.Resources[0] != &outs[0].Resources[0]) {
			t.Errorf("response %d does not share its resources with the first, or is the same response", i)
		}
	}

	// A subset is another set.
	sub := stream.NewSotwSubscription([]string{"svc-0"}, true)
	ch := make(chan cache.Response, 1)
	if _, err := c.CreateWatch(&cache.Request{TypeUrl: resource.EndpointType, ResourceNames: []string{"svc-0"}}, &sub, ch); err != nil {
		t.Fatal(err)
	}
	if out, _ := (<-ch).GetDiscoveryResponse(); len(out.GetResources()) != 1 {
		t.Errorf("subset: got %d resources, want 1", len(out.GetResources()))
	}
}

// Several streams at once over several changes: every stream gets every
// version, with all its resources as served, and nonces of its own in
// sequence. With -race, this also shows that sharing responses races
// nothing.
func TestServerFleetOfStreams(t *testing.T) {
	env := startServer(t)
	const streams, clusters, changes = 8, 5, 4
	if err := env.srv.Set(fleetResources(t, clusters, 0)); err != nil {
		t.Fatal(err)
	}
	names := make([]string, clusters)
	for i := range names {
		names[i] = "svc-" + strconv.Itoa(i)
	}
	cs := make([]*sotwClient, streams)
	for i := range cs {
		cs[i] = env.sotw(t, map[string][]string{resource.ClusterType: nil, resource.EndpointType: names})
	}
	nonces := make([]int, streams)
	// recv checks a response's nonce: the stream's next one.
	recv := func(i int) (*discovery.DiscoveryResponse, map[string]proto.Message) {
		resp, msgs := cs[i].recv()
		nonces[i]++
		if resp.GetNonce() != strconv.Itoa(nonces[i]) {
			t.Fatalf("stream %d: response nonce %q, want %d", i, resp.GetNonce(), nonces[i])
		}
		return resp, msgs
	}
	for i := range cs {
		got := Resources{}
		for len(got) < 2 {
			resp, msgs := recv(i)
			got[resp.GetTypeUrl()] = msgs
		}
		checkServed(t, got, fleetResources(t, clusters, 0))
	}
	for r := 1; r <= changes; r++ {
		want := fleetResources(t, clusters, r)
		if err := env.srv.Set(want); err != nil {
			t.Fatal(err)
		}
		versions := map[string]bool{}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range cs {
			wg.Go(func() {
				resp, msgs := recv(i)
				if resp.GetTypeUrl() != resource.EndpointType {
					t.Errorf("stream %d: got a %s response, want EDS only", i, resp.GetTypeUrl())
					return
				}
				checkServed(t, Resources{resource.EndpointType: msgs}, Resources{resource.EndpointType: want[resource.EndpointType]})
				mu.Lock()
				versions[resp.GetVersionInfo()] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(versions) != 1 {
			t.Fatalf("change %d: streams got versions %v, want one", r, versions)
		}
	}
}

// Streams in the same state share it: what they subscribe to and what
// they hold of each type, whatever order their requests name it in.
func TestSotwServerSharesStreamState(t *testing.T) {
	env := startServer(t)
	if err := env.srv.Set(fleetResources(t, 3, 0)); err != nil {
		t.Fatal(err)
	}
	names := []string{"svc-0", "svc-1", "svc-2"}
	const streams = 4
	for range streams {
		c := env.sotw(t, map[string][]string{resource.ClusterType: nil, resource.EndpointType: names})
		c.recvTypes(2) // and ACKed: each type's watch is open again
	}
	for _, typeURL := range []string{resource.ClusterType, resource.EndpointType} {
		tc, err := env.srv.caches.get(typeURL)
		if err != nil {
			t.Fatal(err)
		}
		c := tc.sotw
		eventually(t, "every stream's ACK to open a watch", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.watches) == streams
		})
		c.mu.Lock()
		states := map[answerKey]int{}
		for w := range c.watches {
			sub := w.sub.(*sotwSub)
			states[answerKey{sub.known, sub.names, sub.wildcard}]++
			if len(sub.known.get()) != 3 {
				t.Errorf("%s: a stream holds %v, want 3 resources", typeURL, sub.known.get())
			}
		}
		c.mu.Unlock()
		if len(states) != 1 {
			t.Errorf("%s: %d states among %d streams, want one shared", typeURL, len(states), streams)
		}
	}
}

// A response that cannot be marshalled is not sent: the stream keeps its
// watch and gets the next state that can be.
func TestSotwServerHoldsAResponseItCannotMarshal(t *testing.T) {
	env := startServer(t)
	cfp := cfpResources(t)
	if err := env.srv.Set(cfp); err != nil {
		t.Fatal(err)
	}
	c := env.sotw(t, map[string][]string{resource.ClusterType: nil})
	if _, msgs := c.recv(); len(msgs) != 1 {
		t.Fatalf("first response: %v", msgs)
	}
	bad := cloneResources(cfp)
	// Invalid UTF-8 in a string field: proto.Marshal refuses it.
	if err := bad.Add(&clusterv3.Cluster{Name: "bad", AltStatName: "\xff"}); err == nil {
		if err := env.srv.Set(bad); err == nil {
			t.Fatal("Set with an unmarshallable cluster succeeded")
		}
	} else {
		t.Fatal(err)
	}
	next := cloneResources(cfp)
	if err := next.Add(&clusterv3.Cluster{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := env.srv.Set(next); err != nil {
		t.Fatal(err)
	}
	if _, msgs := c.recv(); len(msgs) != 2 || msgs["web"] == nil {
		t.Fatalf("got %v, want the two clusters of the last Set", slices.Sorted(maps.Keys(msgs)))
	}
}

// Streams that come and go with names of their own between changes do not
// grow the answers kept without bound.
func TestSotwCacheBoundsItsAnswers(t *testing.T) {
	c := newSotwCache(resource.EndpointType, "p-")
	upd := map[string]types.Resource{}
	for name, m := range fleetResources(t, 3, 0)[resource.EndpointType] {
		upd[name] = m
	}
	if err := c.update(upd, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 * maxAnswers {
		sub := newSotwSub(c, []string{"svc-0", "node-" + strconv.Itoa(i)})
		w := &sotwWatch{sub: sub, deliver: func(*sotwResponse) {}}
		c.open(w, true)
		c.cancel(w)
		sub.close()
	}
	if n := len(c.answers); n > maxAnswers {
		t.Errorf("%d answers kept, want at most %d", n, maxAnswers)
	}
	if n := len(c.nameSets); n != 0 {
		t.Errorf("%d name sets kept after every stream went, want none", n)
	}
}
