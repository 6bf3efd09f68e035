// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/api"
)

func xdsCommand(client func() *api.Client) *cobra.Command {
	cmd := &cobra.Command{Use: "xds", Short: "Inspect the agent's xDS client"}
	status := &cobra.Command{
		Use:   "status",
		Short: "Servers, connection state, per-type versions, and every resource's version, state and last NACK error",
		Args:  cobra.NoArgs,
	}
	showOutput(status, func(cmd *cobra.Command) (xdsView, error) {
		ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
		defer cancel()
		c := client()
		settings, err := c.Config(ctx)
		if err != nil {
			return xdsView{}, err
		}
		return readXDS(ctx, c, settings)
	}, func(w io.Writer, v xdsView) error { return printXDS(w, v, time.Now()) })
	cmd.AddCommand(status)
	return cmd
}

// requestTimeout bounds a one-shot read of the agent's API.
const requestTimeout = 30 * time.Second

// The rows of the xDS client's tables (xds.TypeStatus, xds.ResourceStatus,
// xds.ServerStatus)
// as the agent encodes them. Mirrored rather than imported: pkg/xds brings
// gRPC and the Envoy API, which would triple the size of l4xds-dbg; a test
// keeps the mirrors in step with pkg/xds.
const (
	xdsStatusTable    = "xds-status"
	xdsResourcesTable = "xds-resources"
	xdsServersTable   = "xds-servers"

	stateAcked           = "acked"
	stateNacked          = "nacked"
	stateNackedButCached = "nacked-but-cached"
	stateDoesNotExist    = "does-not-exist"
	stateRequested       = "requested"
)

type xdsTypeStatus struct {
	TypeURL  string
	Wildcard bool
	Server   string
	Protocol string
	State    string
	Attempts uint64
	Version  string
	Nonce    string
	Synced   bool
	Error    string
	Since    time.Time
}

type xdsServer struct {
	Priority int
	Address  string
	Name     string
	InUse    bool
	State    string
	Attempts uint64
	Failures uint64
	Error    string
	Since    time.Time
}

type xdsResource struct {
	TypeURL string
	Name    string
	Version string
	State   string
	Error   string
	Updated time.Time
}

// shortTypeName is the message name of a type URL: "Cluster" for
// "type.googleapis.com/envoy.config.cluster.v3.Cluster".
func shortTypeName(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '.')+1:]
}

// xdsView is the xDS client as the agent's tables show it.
type xdsView struct {
	Enabled bool `json:"enabled"`
	// Types is xds-status: the connection and each watched type.
	Types []xdsTypeStatus `json:"types"`
	// Resources is xds-resources, by type then name.
	Resources []xdsResource `json:"resources"`
	// Servers is xds-servers, in order of priority.
	Servers []xdsServer `json:"servers"`
}

func readXDS(ctx context.Context, c *api.Client, settings api.Settings) (xdsView, error) {
	v := xdsView{Enabled: settingBool(settings, "enable-xds-control-plane")}
	if err := c.Table(ctx, xdsStatusTable, &v.Types); err != nil {
		return v, err
	}
	if err := c.Table(ctx, xdsResourcesTable, &v.Resources); err != nil {
		return v, err
	}
	if err := c.Table(ctx, xdsServersTable, &v.Servers); err != nil {
		return v, err
	}
	return v, nil
}

// serverLines are the servers of the list, one line each, when there are
// several (gRFC A71).
func (v xdsView) serverLines(now time.Time) []string {
	if len(v.Servers) < 2 {
		return nil
	}
	var lines []string
	for _, s := range v.Servers {
		l := fmt.Sprintf("%d. %s: %s for %s, %s, %s", s.Priority, s.Address, s.State, age(now.Sub(s.Since)),
			plural(int(s.Attempts), "attempt", "attempts"), plural(int(s.Failures), "failure", "failures"))
		if s.InUse {
			l += ", in use"
		}
		if s.Error != "" {
			l += ": " + oneLine(s.Error)
		}
		lines = append(lines, l)
	}
	return lines
}

// connection is the stream's state, as every row of xds-status repeats it.
func (v xdsView) connection(now time.Time) (server, state, lastError string) {
	if !v.Enabled {
		return "", "xDS control plane disabled (--enable-xds-control-plane)", ""
	}
	if len(v.Types) == 0 {
		return "", "starting: no stream yet", ""
	}
	s := v.Types[0]
	server = fmt.Sprintf("%s (%s)", s.Server, s.Protocol)
	if len(v.Servers) > 1 {
		for _, srv := range v.Servers {
			if srv.Address == s.Server {
				server += fmt.Sprintf(", server %d of %d", srv.Priority, len(v.Servers))
			}
		}
	}
	state = fmt.Sprintf("%s for %s, %s", s.State, age(now.Sub(s.Since)), plural(int(s.Attempts), "connection attempt", "connection attempts"))
	return server, state, s.Error
}

func printXDS(w io.Writer, v xdsView, now time.Time) error {
	server, state, lastError := v.connection(now)
	if !v.Enabled {
		_, err := fmt.Fprintln(w, state)
		return err
	}
	t := newTable(w)
	if server != "" {
		t.row("Server:", server)
	}
	t.row("State:", state)
	if lastError != "" {
		t.row("Last error:", lastError)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(v.Servers) > 1 {
		fmt.Fprintln(w)
		t.row("Priority", "Server", "Name", "In use", "State", "Attempts", "Failures", "Last error")
		for _, s := range v.Servers {
			t.row(fmt.Sprint(s.Priority), s.Address, orDash(s.Name), yesNo(s.InUse),
				fmt.Sprintf("%s for %s", s.State, age(now.Sub(s.Since))),
				fmt.Sprint(s.Attempts), fmt.Sprint(s.Failures), orDash(oneLine(s.Error)))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(v.Types) > 0 {
		fmt.Fprintln(w)
		t.row("Type", "Version", "Synced")
		for _, s := range v.Types {
			t.row(shortTypeName(s.TypeURL), orDash(s.Version), yesNo(s.Synced))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(v.Resources) == 0 {
		_, err := fmt.Fprintln(w, "No resources requested or received yet")
		return err
	}
	t.row("Type", "Name", "Version", "State", "Updated", "Error")
	for _, r := range v.Resources {
		t.row(shortTypeName(r.TypeURL), r.Name, orDash(r.Version), r.State,
			r.Updated.UTC().Format(time.RFC3339), orDash(oneLine(r.Error)))
	}
	return t.flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// oneLine keeps a multi-line error on its table row.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

// settingBool reads a boolean setting: flags hold bools, the config dir
// strings.
func settingBool(s api.Settings, key string) bool {
	b, _ := strconv.ParseBool(fmt.Sprint(s[key]))
	return b
}

func settingString(s api.Settings, key string) string {
	if v, ok := s[key]; ok && v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

// settingStrings reads a list setting: a JSON list, or a comma-separated
// string from the config dir.
func settingStrings(s api.Settings, key string) []string {
	switch v := s[key].(type) {
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			out = append(out, fmt.Sprint(e))
		}
		return out
	case string:
		if v == "" || v == "[]" {
			return nil
		}
		return strings.Split(strings.Trim(v, "[]"), ",")
	}
	return nil
}
