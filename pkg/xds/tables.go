// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Table names.
const (
	ResourcesTableName = "xds-resources"
	StatusTableName    = "xds-status"
	ServersTableName   = "xds-servers"
)

// ResourceState is where one requested or received resource stands.
type ResourceState string

const (
	// StateRequested: subscribed to, nothing received yet.
	StateRequested ResourceState = "requested"
	// StateAcked: the last version received was accepted.
	StateAcked ResourceState = "acked"
	// StateNacked: the only version received was rejected.
	StateNacked ResourceState = "nacked"
	// StateNackedButCached: the last version received was rejected; the
	// previously accepted one is still in use.
	StateNackedButCached ResourceState = "nacked-but-cached"
	// StateDoesNotExist: requested, but the server said it does not exist
	// or did not answer within the does-not-exist timeout.
	StateDoesNotExist ResourceState = "does-not-exist"
	// StateDeletionIgnored: the server deleted the resource, and the
	// accepted version is kept in use (gRFC A53, --xds-server-features).
	StateDeletionIgnored ResourceState = "deletion-ignored"
)

// ResourceStatus is one row of xds-resources: one resource of one type, as
// the client holds it. Rows are immutable once inserted.
type ResourceStatus struct {
	TypeURL string
	Name    string
	// Version of the accepted resource in use; empty if there is none.
	Version string
	State   ResourceState
	// Error is why the last received version was rejected.
	Error string
	// Updated is when the row last changed.
	Updated time.Time
}

func (r *ResourceStatus) TableHeader() []string {
	return []string{"Type", "Name", "Version", "State", "Error", "Updated"}
}

func (r *ResourceStatus) TableRow() []string {
	return []string{ShortTypeName(r.TypeURL), r.Name, r.Version, string(r.State), r.Error, formatTime(r.Updated)}
}

// resourceKey shortens the type of the two types every agent watches to a
// letter: each row keeps its key, and their URLs are 52 and 68 bytes. Any
// other type keeps its URL, which holds a '/' and so is never a letter.
func resourceKey(typeURL, name string) index.Key {
	switch typeURL {
	case ClusterType:
		typeURL = "C"
	case EndpointType:
		typeURL = "E"
	}
	return index.String(typeURL + " " + name)
}

// ResourceIndex is the primary index of xds-resources: type URL and name.
// From a string it takes "<type URL> <name>", or a type URL alone.
var ResourceIndex = statedb.Index[*ResourceStatus, resourceID]{
	Name: "id",
	FromObject: func(r *ResourceStatus) index.KeySet {
		return index.NewKeySet(resourceKey(r.TypeURL, r.Name))
	},
	FromKey: func(id resourceID) index.Key { return resourceKey(id.TypeURL, id.Name) },
	FromString: func(s string) (index.Key, error) {
		typeURL, name, whole := strings.Cut(s, " ")
		key := resourceKey(typeURL, name)
		if !whole {
			key = key[:len(key)-1] // a prefix: the type's, without the space
		}
		return key, nil
	},
	Unique: true,
}

type resourceID struct{ TypeURL, Name string }

// ResourceByName queries xds-resources for one resource.
func ResourceByName(typeURL, name string) statedb.Query[*ResourceStatus] {
	return ResourceIndex.Query(resourceID{typeURL, name})
}

// ResourcesByType queries xds-resources, with Prefix, for all resources of a
// type: their keys start with the type URL and a space. (A prefix of the
// primary key, not an index of its own: that would cost every resource
// write an index insert and a key.)
func ResourcesByType(typeURL string) statedb.Query[*ResourceStatus] {
	return ResourceIndex.Query(resourceID{TypeURL: typeURL})
}

// ConnState is the state of the connection to the server.
type ConnState string

const (
	ConnConnecting ConnState = "connecting"
	ConnConnected  ConnState = "connected"
	// ConnBackoff: the last attempt failed; waiting before the next one.
	ConnBackoff ConnState = "backoff"
	// ConnStandby: a server of the list not in use, because one of
	// higher priority delivers or none was tried yet (xds-servers only).
	ConnStandby ConnState = "standby"
)

// TypeStatus is one row of xds-status: the stream as seen by one watched
// type. The connection columns are the same in every row.
type TypeStatus struct {
	TypeURL  string
	Wildcard bool
	Server   string
	Protocol string
	State    ConnState
	// Attempts counts connection attempts since the client started.
	Attempts uint64
	// Version is the last accepted version_info (SotW) of the type.
	Version string
	// Nonce is the nonce of the last response of the type on this stream.
	Nonce string
	// Synced is true once a response of the type arrived on this stream.
	Synced bool
	// Error is the last connection error, in one line.
	Error string
	// Since is when State last changed.
	Since time.Time
}

func (s *TypeStatus) TableHeader() []string {
	return []string{"Type", "Server", "Protocol", "State", "Attempts", "Version", "Nonce", "Synced", "Error", "Since"}
}

func (s *TypeStatus) TableRow() []string {
	return []string{
		ShortTypeName(s.TypeURL), s.Server, s.Protocol, string(s.State),
		strconv.FormatUint(s.Attempts, 10), s.Version, s.Nonce, strconv.FormatBool(s.Synced), s.Error,
		formatTime(s.Since),
	}
}

// ServerStatus is one row of xds-servers: one management server of
// --xds-server-address, in order of priority (gRFC A71).
type ServerStatus struct {
	// Priority is the server's place in the list, from 1.
	Priority int
	Address  string
	// Name is the name its certificate must carry; empty without TLS.
	Name string
	// InUse marks the server whose stream the client uses or is trying.
	InUse bool
	State ConnState
	// Attempts counts connection attempts to the server, including those
	// that check whether it delivers again while a lower one is in use.
	Attempts uint64
	// Failures counts the attempts that failed before a response (A57).
	Failures uint64
	// Error is the last error of the server, in one line.
	Error string
	// Since is when State last changed.
	Since time.Time
}

func (s *ServerStatus) TableHeader() []string {
	return []string{"Priority", "Address", "Name", "InUse", "State", "Attempts", "Failures", "Error", "Since"}
}

func (s *ServerStatus) TableRow() []string {
	return []string{
		strconv.Itoa(s.Priority), s.Address, s.Name, strconv.FormatBool(s.InUse), string(s.State),
		strconv.FormatUint(s.Attempts, 10), strconv.FormatUint(s.Failures, 10), s.Error, formatTime(s.Since),
	}
}

// ServerPriorityIndex is the primary index of xds-servers: the priority.
var ServerPriorityIndex = statedb.Index[*ServerStatus, int]{
	Name: "priority",
	FromObject: func(s *ServerStatus) index.KeySet {
		return index.NewKeySet(index.Int(s.Priority))
	},
	FromKey:    index.Int,
	FromString: index.IntString,
	Unique:     true,
}

// NewServersTable registers xds-servers in db.
func NewServersTable(db *statedb.DB) (statedb.RWTable[*ServerStatus], error) {
	return statedb.NewTable(db, ServersTableName, ServerPriorityIndex)
}

// TypeStatusIndex is the primary index of xds-status: the type URL.
var TypeStatusIndex = statedb.Index[*TypeStatus, string]{
	Name: "type",
	FromObject: func(s *TypeStatus) index.KeySet {
		return index.NewKeySet(index.String(s.TypeURL))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewResourcesTable registers xds-resources in db.
func NewResourcesTable(db *statedb.DB) (statedb.RWTable[*ResourceStatus], error) {
	return statedb.NewTable(db, ResourcesTableName, ResourceIndex)
}

// NewStatusTable registers xds-status in db.
func NewStatusTable(db *statedb.DB) (statedb.RWTable[*TypeStatus], error) {
	return statedb.NewTable(db, StatusTableName, TypeStatusIndex)
}

// ShortTypeName is the message name of a type URL: "Cluster" for
// "type.googleapis.com/envoy.config.cluster.v3.Cluster".
func ShortTypeName(typeURL string) string {
	if i := strings.LastIndexByte(typeURL, '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}

// KindName is a type's short name in snake case, as errors name a resource:
// "cluster", "cluster_load_assignment".
func KindName(typeURL string) string {
	var b strings.Builder
	for i, r := range ShortTypeName(typeURL) {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
