// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
)

// Conflict is a resource that two sources both publish.
type Conflict struct {
	TypeURL, Name string
	// Kept is the source whose resource is served, Dropped the other.
	Kept, Dropped string
}

func (c Conflict) String() string {
	return fmt.Sprintf("%s %q is published by both %s and %s: serving %s's", kindOfURL(c.TypeURL), c.Name, c.Kept, c.Dropped, c.Kept)
}

func kindOfURL(typeURL string) string {
	return typeURL[strings.LastIndex(typeURL, ".")+1:]
}

// Merge combines the resources of sources, given in order of precedence:
// a resource that several sources publish under one type and name is served
// from the first of them, and reported as a Conflict. Nothing is merged
// field by field.
func Merge(order []string, sets map[string]Resources) (Resources, []Conflict) {
	out := Resources{}
	from := map[string]map[string]string{}
	var conflicts []Conflict
	for _, src := range order {
		for _, typeURL := range slices.Sorted(maps.Keys(sets[src])) {
			for _, name := range slices.Sorted(maps.Keys(sets[src][typeURL])) {
				if kept, ok := from[typeURL][name]; ok {
					conflicts = append(conflicts, Conflict{TypeURL: typeURL, Name: name, Kept: kept, Dropped: src})
					continue
				}
				if out[typeURL] == nil {
					out[typeURL] = map[string]proto.Message{}
					from[typeURL] = map[string]string{}
				}
				out[typeURL][name] = sets[src][typeURL][name]
				from[typeURL][name] = src
			}
		}
	}
	return out, conflicts
}

// Sources feeds a Server from several sources (a resource file, a
// Kubernetes cluster): each Set replaces one source's resources and serves
// the merge of all. The server gets its first state once every source has
// published (a source alone is a partial state, and clients take the first
// state as complete). Conflicts are logged when they appear and returned on
// every Set.
type Sources struct {
	srv   *Server
	log   *slog.Logger
	order []string

	mu       sync.Mutex
	sets     map[string]Resources
	reported map[Conflict]bool
}

// NewSources serves the sources named, in order of precedence, on srv.
func NewSources(srv *Server, order ...string) *Sources {
	return &Sources{srv: srv, log: srv.log, order: order, sets: map[string]Resources{}, reported: map[Conflict]bool{}}
}

// Set replaces the resources of source and applies the merge.
func (s *Sources) Set(source string, res Resources) ([]Conflict, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.order, source) {
		return nil, fmt.Errorf("unknown resource source %q", source)
	}
	s.sets[source] = res
	merged, conflicts := Merge(s.order, s.sets)
	now := map[Conflict]bool{}
	for _, c := range conflicts {
		now[c] = true
		if !s.reported[c] {
			s.log.Error("Resource name conflict", "conflict", c.String())
		}
	}
	s.reported = now
	for _, src := range s.order {
		if _, ok := s.sets[src]; !ok {
			s.log.Info("Resources not served until every source has published", "source", source, "waiting-for", src)
			return conflicts, nil
		}
	}
	return conflicts, s.srv.Set(merged)
}
