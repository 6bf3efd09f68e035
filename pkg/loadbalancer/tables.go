// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// Table names, as shown by "db" and "db/show".
const (
	ServicesTableName  = "services"
	FrontendsTableName = "frontends"
	BackendsTableName  = "backends"
)

func serviceNameKey(n ServiceName) index.Key { return index.String(string(n)) }

func l3n4AddrKey(a L3n4Addr) index.Key { return a.Key() }

func l3n4AddrFromString(s string) (index.Key, error) {
	a, err := ParseL3n4Addr(s)
	if err != nil {
		return nil, err
	}
	return a.Key(), nil
}

//
// services
//

// ServiceByName is the primary index of the services table.
var ServiceByName = statedb.Index[*Service, ServiceName]{
	Name: "name",
	FromObject: func(s *Service) index.KeySet {
		return index.NewKeySet(serviceNameKey(s.Name))
	},
	FromKey:    serviceNameKey,
	FromString: index.FromString,
	Unique:     true,
}

// NewServicesTable creates the services table and registers it with db.
func NewServicesTable(db *statedb.DB) (statedb.RWTable[*Service], error) {
	return statedb.NewTable(db, ServicesTableName, ServiceByName)
}

func (s *Service) TableHeader() []string {
	return []string{"Name", "Source", "PortNames", "SourceRanges", "Labels", "SessionAffinity", "RejectWeight"}
}

// TableRow ends with a column that is never empty, so that printed tables
// have no trailing whitespace.
func (s *Service) TableRow() []string {
	ranges := make([]string, len(s.SourceRanges))
	for i, p := range s.SourceRanges {
		ranges[i] = p.String()
	}
	affinity := "-"
	if s.SessionAffinity {
		affinity = s.SessionAffinityTimeout.String()
	}
	portNames := make([]string, 0, len(s.PortNames))
	for _, name := range slices.Sorted(maps.Keys(s.PortNames)) {
		portNames = append(portNames, name+"="+strconv.Itoa(int(s.PortNames[name])))
	}
	labels := make([]string, 0, len(s.Labels))
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		labels = append(labels, k+"="+s.Labels[k])
	}
	return []string{
		string(s.Name),
		string(s.Source),
		strings.Join(portNames, ", "),
		strings.Join(ranges, ", "),
		strings.Join(labels, ", "),
		affinity,
		strconv.Itoa(int(s.RejectWeight)),
	}
}

// equal reports whether two services have the same contents, so that an
// unchanged service is not rewritten.
func (s *Service) equal(o *Service) bool {
	return s.Name == o.Name &&
		s.Source == o.Source &&
		s.Namespace == o.Namespace &&
		s.Cluster == o.Cluster &&
		s.SessionAffinity == o.SessionAffinity &&
		s.SessionAffinityTimeout == o.SessionAffinityTimeout &&
		s.RejectWeight == o.RejectWeight &&
		slices.Equal(s.SourceRanges, o.SourceRanges) &&
		maps.Equal(s.Labels, o.Labels) &&
		maps.Equal(s.PortNames, o.PortNames)
}

//
// frontends
//

// FrontendByAddress is the primary index of the frontends table. Its string
// form is the address as printed, e.g. "10.1.2.3:3306/TCP".
var FrontendByAddress = statedb.Index[*Frontend, L3n4Addr]{
	Name: "address",
	FromObject: func(fe *Frontend) index.KeySet {
		return index.NewKeySet(fe.Address.Key())
	},
	FromKey:    l3n4AddrKey,
	FromString: l3n4AddrFromString,
	Unique:     true,
}

// FrontendByServiceName indexes frontends by the service that owns them.
var FrontendByServiceName = statedb.Index[*Frontend, ServiceName]{
	Name: "service",
	FromObject: func(fe *Frontend) index.KeySet {
		return index.NewKeySet(serviceNameKey(fe.ServiceName))
	},
	FromKey:    serviceNameKey,
	FromString: index.FromString,
	Unique:     false,
}

// NewFrontendsTable creates the frontends table and registers it with db.
func NewFrontendsTable(db *statedb.DB) (statedb.RWTable[*Frontend], error) {
	return statedb.NewTable(db, FrontendsTableName, FrontendByAddress, FrontendByServiceName)
}

// GetStatus returns the reconciliation status of the frontend.
func (fe *Frontend) GetStatus() reconciler.Status { return fe.Status }

// SetStatus sets the status of fe, which must be a clone (rows are
// immutable), and returns it.
func (fe *Frontend) SetStatus(s reconciler.Status) *Frontend {
	fe.Status = s
	return fe
}

func (fe *Frontend) TableHeader() []string {
	return []string{"Address", "Type", "ServiceName", "PortName", "Backends", "Status"}
}

// TableRow prints the status without its age ("Pending", "Done",
// "Error: <error>") so that the output is stable.
func (fe *Frontend) TableRow() []string {
	status := fe.Status.Kind.String()
	if fe.Status.Kind == reconciler.StatusKindError {
		status += ": " + fe.Status.GetError()
	}
	return []string{
		fe.Address.String(),
		string(fe.Type),
		string(fe.ServiceName),
		fe.PortName,
		formatBackends(fe.Backends),
		status,
	}
}

// formatBackends prints backends in their (sorted) order as
// "192.168.1.10:3306, 192.168.1.11:3306/terminating": the state is shown only
// when the backend does not take new flows for a reason other than weight.
func formatBackends(bes []*Backend) string {
	var b strings.Builder
	for i, be := range bes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(be.Address.String())
		if be.State != BackendStateActive {
			b.WriteByte('/')
			b.WriteString(be.State.String())
		}
	}
	return b.String()
}

//
// backends
//

// BackendID is the primary key of a backend row: one address of one service
// from one source.
type BackendID struct {
	ServiceName ServiceName
	Address     L3n4Addr
	Source      Source
}

func (id BackendID) String() string {
	return fmt.Sprintf("%s %s %s", id.ServiceName, id.Address, id.Source)
}

// Key is the service name, a NUL separator (names never contain NUL), the
// address key and the source: rows sort by service, then address.
func (id BackendID) Key() index.Key {
	k := make([]byte, 0, len(id.ServiceName)+1+l3n4AddrKeyLen+len(id.Source))
	k = append(k, id.ServiceName...)
	k = append(k, 0)
	k = id.Address.appendKey(k)
	return append(k, id.Source...)
}

// ID returns the primary key of the row.
func (be *Backend) ID() BackendID {
	return BackendID{ServiceName: be.ServiceName, Address: be.Address, Source: be.Source}
}

// backendIDFromString parses "<service> [<address> [<source>]]". A partial
// key is a prefix: "db/prefix -i id backends mysql" lists a service's rows.
func backendIDFromString(s string) (index.Key, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 || len(fields) > 3 {
		return nil, fmt.Errorf("backend id %q: want \"<service> [<address> [<source>]]\"", s)
	}
	k := append([]byte(fields[0]), 0)
	if len(fields) > 1 {
		addr, err := ParseL3n4Addr(fields[1])
		if err != nil {
			return nil, fmt.Errorf("backend id %q: %w", s, err)
		}
		k = addr.appendKey(k)
	}
	if len(fields) > 2 {
		k = append(k, fields[2]...)
	}
	return k, nil
}

// BackendByID is the primary index of the backends table.
var BackendByID = statedb.Index[*Backend, BackendID]{
	Name: "id",
	FromObject: func(be *Backend) index.KeySet {
		return index.NewKeySet(be.ID().Key())
	},
	FromKey:    BackendID.Key,
	FromString: backendIDFromString,
	Unique:     true,
}

// backendsOfService queries the primary index for the rows of a service,
// sorted by address then source: their keys start with its name and a NUL
// (a name never holds one, so "db" does not match "db2"). A prefix of the
// primary key spares the backends table a second index, and every backend
// insert its upkeep. (Nothing looks backends up by address: the table has
// no index for it, which saves a tree and its keys per backend.)
var backendsOfService = statedb.Index[*Backend, ServiceName]{
	Name: BackendByID.Name,
	FromKey: func(n ServiceName) index.Key {
		return append([]byte(n), 0)
	},
	Unique: true,
}

// NewBackendsTable creates the backends table and registers it with db.
func NewBackendsTable(db *statedb.DB) (statedb.RWTable[*Backend], error) {
	return statedb.NewTable(db, BackendsTableName, BackendByID)
}

func (be *Backend) TableHeader() []string {
	return []string{"Address", "ServiceName", "Weight", "State", "Priority", "Zone", "Source"}
}

func (be *Backend) TableRow() []string {
	return []string{
		be.Address.String(),
		string(be.ServiceName),
		strconv.FormatUint(uint64(be.Weight), 10),
		be.State.String(),
		strconv.FormatUint(uint64(be.Priority), 10),
		be.Zone,
		string(be.Source),
	}
}
