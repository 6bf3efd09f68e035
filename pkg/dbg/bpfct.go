// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"cmp"
	"fmt"
	"io"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/datapath"
)

func ctListCommand(bpfRoot *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Conntrack entries: client, frontend, backend, flags and the lifetime left",
		Long: "List the entries of the pinned conntrack maps. Every flow has a forward entry (client -> VIP: " +
			"which backend) and a reply entry (backend -> client: which VIP to restore). A flow not established " +
			"yet (TCP before the client acknowledged the backend's SYN-ACK, UDP before the backend's first " +
			"answer) has them in the map of new flows (flag new). The lifetime left counts from the entry's " +
			"last refresh (at most once a second): 6h for TCP, 10s once a FIN or RST was seen (closing), 60s " +
			"for UDP and for new flows; expired entries are ignored by the datapath until the LRU map " +
			"reclaims them. Reads the maps directly: works while the agent is down.",
		Example: "  l4xds-dbg bpf ct list\n  l4xds-dbg bpf ct list -o json",
		Args:    cobra.NoArgs,
	}
	showOutput(cmd, func(*cobra.Command) (ctList, error) {
		entries, info, now, err := readFlows(*bpfRoot, (*datapath.Flows).Conntrack)
		if err != nil {
			return ctList{}, err
		}
		return newCTList(entries, info, now), nil
	}, printCTList)
	return cmd
}

// pinnedInfo is what the flow lists look up in the service and backend
// maps.
type pinnedInfo struct {
	backends map[uint32]datapath.BackendEntry
	services map[uint32]datapath.ServiceEntry
}

func openFlows(bpfRoot string) (*datapath.Flows, pinnedInfo, error) {
	info := pinnedInfo{backends: map[uint32]datapath.BackendEntry{}, services: map[uint32]datapath.ServiceEntry{}}
	m, err := openMaps(bpfRoot)
	if err != nil {
		return nil, info, err
	}
	defer m.Close()
	for b, err := range m.Backends() {
		if err != nil {
			return nil, info, err
		}
		info.backends[b.ID] = b
	}
	for s, err := range m.Services() {
		if err != nil {
			return nil, info, err
		}
		info.services[s.ID] = s
	}
	flows, err := datapath.OpenPinnedFlows(bpfRoot)
	return flows, info, err
}

// readFlows reads the entries of one of the pinned flow maps, the services
// and backends they name, and the kernel's clock their lifetimes count on.
func readFlows[E any](bpfRoot string, entriesOf func(*datapath.Flows) iter.Seq2[E, error]) ([]E, pinnedInfo, time.Duration, error) {
	flows, info, err := openFlows(bpfRoot)
	if err != nil {
		return nil, info, 0, err
	}
	defer flows.Close()
	var entries []E
	for e, err := range entriesOf(flows) {
		if err != nil {
			return nil, info, 0, err
		}
		entries = append(entries, e)
	}
	now, err := datapath.Ktime()
	return entries, info, now, err
}

// ctList is what `bpf ct list` prints.
type ctList struct {
	Entries []ctFlow `json:"entries"`
	Forward int      `json:"forward"`
	Reply   int      `json:"reply"`
	Expired int      `json:"expired"`
}

type ctFlow struct {
	// Direction is forward (client -> VIP) or reply (backend -> client).
	Direction string `json:"direction"`
	Protocol  string `json:"protocol"`
	Client    string `json:"client"`
	Frontend  string `json:"frontend"`
	// Backend is empty when a forward entry's backend ID is not in the
	// backends map any more (the flow is balanced again).
	Backend   string   `json:"backend,omitempty"`
	BackendID uint32   `json:"backendID"`
	ServiceID uint32   `json:"serviceID"`
	Flags     []string `json:"flags"`
	// RemainingSeconds of lifetime; zero or less: expired.
	RemainingSeconds int64 `json:"remainingSeconds"`
	Expired          bool  `json:"expired"`

	client, frontend netip.AddrPort
	remaining        time.Duration
}

func newCTList(entries []datapath.CTEntry, info pinnedInfo, now time.Duration) ctList {
	list := ctList{Entries: []ctFlow{}}
	for _, e := range entries {
		f := ctFlow{
			Direction: "forward",
			Protocol:  string(e.Protocol),
			Client:    e.Client.String(),
			Frontend:  e.Frontend.String(),
			BackendID: e.BackendID,
			ServiceID: e.ServiceID,
			Flags:     []string{},
			client:    e.Client,
			frontend:  e.Frontend,
			remaining: e.Remaining(now),
		}
		if e.Reply {
			f.Direction = "reply"
			f.Backend = e.Backend.String()
			list.Reply++
		} else {
			if b, ok := info.backends[e.BackendID]; ok && b.ServiceID == e.ServiceID {
				f.Backend = b.Address.String()
			}
			list.Forward++
		}
		if e.New {
			f.Flags = append(f.Flags, "new")
		}
		if e.Closing {
			f.Flags = append(f.Flags, "closing")
		}
		f.RemainingSeconds = int64(f.remaining / time.Second)
		if f.remaining <= 0 {
			f.Expired = true
			list.Expired++
		}
		list.Entries = append(list.Entries, f)
	}
	slices.SortFunc(list.Entries, func(a, b ctFlow) int {
		return cmp.Or(a.frontend.Compare(b.frontend), strings.Compare(a.Protocol, b.Protocol),
			a.client.Compare(b.client), strings.Compare(a.Direction, b.Direction), strings.Compare(a.Backend, b.Backend))
	})
	return list
}

func printCTList(w io.Writer, list ctList) error {
	t := newTable(w)
	t.row("Proto", "Client", "Frontend", "Backend", "Service", "Dir", "Flags", "Expires")
	for _, f := range list.Entries {
		flags := strings.Join(f.Flags, ",")
		if flags == "" {
			flags = "-"
		}
		t.row(f.Protocol, f.Client, f.Frontend, backendCell(f.Backend, f.BackendID), fmt.Sprint(f.ServiceID), f.Direction, flags, expires(f.remaining))
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s: %d forward, %d reply, %d expired\n",
		plural(len(list.Entries), "entry", "entries"), list.Forward, list.Reply, list.Expired)
	return err
}

// backendCell is "10.0.0.1:80 (id 3)", or says the backend ID is not in the
// backends map any more.
func backendCell(address string, id uint32) string {
	if address == "" {
		return fmt.Sprintf("id %d, not in the map", id)
	}
	return fmt.Sprintf("%s (id %d)", address, id)
}

// expires is "in 5h59m" or "expired 3s ago".
func expires(remaining time.Duration) string {
	if remaining <= 0 {
		return "expired " + age(-remaining) + " ago"
	}
	return "in " + age(remaining)
}

func affinityListCommand(bpfRoot *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Session affinity entries: client, service, backend and the time left",
		Long: "List the entries of the pinned session affinity map: the backend each client of a service " +
			"with session affinity is sent to, while the service's affinity timeout has not passed since " +
			"its last new flow. Reads the map directly: works while the agent is down.",
		Args: cobra.NoArgs,
	}
	showOutput(cmd, func(*cobra.Command) ([]affinityEntry, error) {
		entries, info, now, err := readFlows(*bpfRoot, (*datapath.Flows).Affinity)
		if err != nil {
			return nil, err
		}
		return newAffinityList(entries, info, now), nil
	}, printAffinityList)
	return cmd
}

type affinityEntry struct {
	Client    string `json:"client"`
	ServiceID uint32 `json:"serviceID"`
	// Frontend of the service; empty when the service is gone.
	Frontend  string `json:"frontend,omitempty"`
	Backend   string `json:"backend,omitempty"`
	BackendID uint32 `json:"backendID"`
	// RemainingSeconds of the service's affinity timeout; zero or less:
	// expired (also when the service has no affinity any more).
	RemainingSeconds int64 `json:"remainingSeconds"`
	Expired          bool  `json:"expired"`

	client    netip.Addr
	remaining time.Duration
}

func newAffinityList(entries []datapath.AffinityEntry, info pinnedInfo, now time.Duration) []affinityEntry {
	out := []affinityEntry{}
	for _, e := range entries {
		a := affinityEntry{Client: e.Client.String(), ServiceID: e.ServiceID, BackendID: e.BackendID, client: e.Client}
		var timeout time.Duration
		if s, ok := info.services[e.ServiceID]; ok {
			a.Frontend = s.Frontend.String()
			if s.Affinity {
				timeout = s.AffinityTimeout
			}
		}
		if b, ok := info.backends[e.BackendID]; ok && b.ServiceID == e.ServiceID {
			a.Backend = b.Address.String()
		}
		a.remaining = timeout - (now - e.LastUsed)
		a.RemainingSeconds = int64(a.remaining / time.Second)
		a.Expired = a.remaining <= 0
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b affinityEntry) int {
		return cmp.Or(cmp.Compare(a.ServiceID, b.ServiceID), a.client.Compare(b.client))
	})
	return out
}

func printAffinityList(w io.Writer, list []affinityEntry) error {
	t := newTable(w)
	t.row("Client", "Service", "Backend", "Expires")
	for _, a := range list {
		svc := fmt.Sprintf("%d (gone)", a.ServiceID)
		if a.Frontend != "" {
			svc = fmt.Sprintf("%d (%s)", a.ServiceID, a.Frontend)
		}
		t.row(a.Client, svc, backendCell(a.Backend, a.BackendID), expires(a.remaining))
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, plural(len(list), "entry", "entries"))
	return err
}
