// SPDX-License-Identifier: Apache-2.0

package dbg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/api"
	"github.com/l4xds/l4xds/pkg/datapath"
	"github.com/l4xds/l4xds/pkg/health"
	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

func statusCommand(client func() *api.Client) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "One-screen summary of the agent: health, xDS, tables, datapath; exits 1 when degraded",
		Long: "Print the agent's health (and why it is degraded), its readiness, its xDS connection and " +
			"resources, its tables and its datapath on one screen. The exit status is 0 when the agent is " +
			"healthy and 1 when it is degraded or does not answer. With --readiness it is 0 when the agent " +
			"is ready: its first complete state is served (or none was needed), which it stays while " +
			"degraded, e.g. disconnected from every xDS server: the readiness probe of the Helm chart.",
		Args: cobra.NoArgs,
	}
	output := outputFlag(cmd)
	var readiness bool
	cmd.Flags().BoolVar(&readiness, "readiness", false, "exit 1 only when the agent is not ready (its first complete state not served yet), not when it is degraded")
	var bpfRoot string
	cmd.Flags().StringVar(&bpfRoot, "bpf-root", "", "BPF filesystem of the pinned maps (default: the agent's --bpf-root)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(*output); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
		defer cancel()
		v, err := readStatus(ctx, client(), bpfRoot)
		if err != nil {
			return err
		}
		if *output == "json" {
			err = writeJSON(cmd.OutOrStdout(), v)
		} else {
			err = printStatus(cmd.OutOrStdout(), v, time.Now())
		}
		if err != nil {
			return err
		}
		if readiness {
			return v.notReady()
		}
		return v.degraded()
	}
	return cmd
}

// statusView is what `status` shows.
type statusView struct {
	Health    api.HealthReport `json:"health"`
	XDS       xdsView          `json:"xds"`
	Services  []*lb.Service    `json:"services"`
	Frontends []*lb.Frontend   `json:"frontends"`
	Backends  []*lb.Backend    `json:"backends"`
	Datapath  datapathStatus   `json:"datapath"`
}

type datapathStatus struct {
	// Mode is --datapath: bpf or none.
	Mode    string   `json:"mode"`
	Devices []string `json:"devices,omitempty"`
	// PinDir is where the maps are pinned.
	PinDir string `json:"pinDir,omitempty"`
	// Services and Backends in the pinned maps, if they could be read.
	Services int `json:"services"`
	Backends int `json:"backends"`
	// Error is why the maps could not be read.
	Error string `json:"error,omitempty"`
}

func readStatus(ctx context.Context, c *api.Client, bpfRoot string) (statusView, error) {
	var v statusView
	var err error
	if v.Health, err = c.Health(ctx); err != nil {
		return v, err
	}
	settings, err := c.Config(ctx)
	if err != nil {
		return v, err
	}
	if v.XDS, err = readXDS(ctx, c, settings); err != nil {
		return v, err
	}
	for name, rows := range map[string]any{
		lb.ServicesTableName: &v.Services, lb.FrontendsTableName: &v.Frontends, lb.BackendsTableName: &v.Backends,
	} {
		if err := c.Table(ctx, name, rows); err != nil {
			return v, err
		}
	}
	v.Datapath = readDatapathStatus(settings, bpfRoot)
	return v, nil
}

// readDatapathStatus counts what the pinned maps hold; an agent on the same
// node shares its BPF filesystem with l4xds-dbg.
func readDatapathStatus(settings api.Settings, bpfRoot string) datapathStatus {
	d := datapathStatus{Mode: settingString(settings, "datapath"), Devices: settingStrings(settings, "devices")}
	if d.Mode != "bpf" {
		return d
	}
	if bpfRoot == "" {
		bpfRoot = settingString(settings, "bpf-root")
	}
	d.PinDir = filepath.Join(bpfRoot, datapath.PinDir)
	m, err := datapath.OpenPinnedMaps(bpfRoot)
	if err != nil {
		d.Error = err.Error()
		return d
	}
	defer m.Close()
	for _, err := range m.Services() {
		if err != nil {
			d.Error = err.Error()
			return d
		}
		d.Services++
	}
	for _, err := range m.Backends() {
		if err != nil {
			d.Error = err.Error()
			return d
		}
		d.Backends++
	}
	return d
}

// degraded is the error that makes the exit status 1, naming each
// degraded component and why.
func (v statusView) degraded() error {
	if v.Health.OK {
		return nil
	}
	var reasons []string
	for _, s := range v.Health.Statuses {
		if s.Level == cell.StatusDegraded {
			reasons = append(reasons, healthLine(s))
		}
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "the agent reports not OK")
	}
	return errors.New("degraded: " + strings.Join(reasons, "; "))
}

// notReady is the error of `status --readiness`: nil once the agent is ready.
func (v statusView) notReady() error {
	if v.Health.Ready {
		return nil
	}
	if len(v.Health.Waiting) == 0 {
		return errors.New("not ready")
	}
	return errors.New("not ready: waiting for " + strings.Join(v.Health.Waiting, "; "))
}

func printStatus(w io.Writer, v statusView, now time.Time) error {
	t := newTable(w)

	// Health: OK, or each degraded component with its reason.
	if v.Health.OK {
		t.row("Health:", fmt.Sprintf("OK (%s)", plural(len(v.Health.Statuses), "component", "components")))
	} else {
		t.row("Health:", "Degraded")
		for _, s := range v.Health.Statuses {
			if s.Level == cell.StatusDegraded {
				t.row("", fmt.Sprintf("%s (for %s): %s", s.Scope, age(now.Sub(s.Since)), healthReason(s)))
			}
		}
	}
	// Readiness, when it is not what a healthy agent has: not ready yet, or
	// ready although degraded.
	switch {
	case !v.Health.Ready && len(v.Health.Waiting) > 0:
		t.row("Readiness:", v.notReady().Error())
	case v.Health.Ready && !v.Health.OK:
		t.row("Readiness:", "ready: serving the last complete state")
	}

	// xDS: the connection, each type's version, the resources by state and
	// each NACKed one with its error.
	server, state, lastError := v.XDS.connection(now)
	if server != "" {
		t.row("xDS server:", server)
	}
	t.row("xDS state:", state)
	if lastError != "" {
		t.row("", "last error: "+lastError)
	}
	for _, s := range v.XDS.Types {
		synced := "synced"
		if !s.Synced {
			synced = "not synced"
		}
		t.row("", fmt.Sprintf("%s: version %s, %s", shortTypeName(s.TypeURL), orDash(s.Version), synced))
	}
	for i, l := range v.XDS.serverLines(now) {
		label := ""
		if i == 0 {
			label = "xDS servers:"
		}
		t.row(label, l)
	}
	if v.XDS.Enabled {
		t.row("Resources:", resourceCounts(v.XDS.Resources))
		for _, r := range v.XDS.Resources {
			if r.State == stateNacked || r.State == stateNackedButCached {
				t.row("", fmt.Sprintf("%s %s %s: %s", r.State, shortTypeName(r.TypeURL), r.Name, oneLine(r.Error)))
			}
		}
	}

	// Tables.
	t.row("Services:", fmt.Sprint(len(v.Services)))
	t.row("Frontends:", frontendCounts(v.Frontends, v.Datapath.Mode))
	for _, fe := range v.Frontends {
		if fe.Status.Kind == reconciler.StatusKindError {
			t.row("", fmt.Sprintf("Error %s (%s): %s", fe.Address, fe.ServiceName, oneLine(fe.Status.GetError())))
		}
	}
	t.row("Backends:", backendCounts(v.Backends))

	// Datapath.
	t.row("Datapath:", datapathLine(v.Datapath))
	return t.flush()
}

func healthLine(s health.Status) string { return s.Scope + ": " + healthReason(s) }

// healthReason is the message and its error, once when the message
// already ends with it.
func healthReason(s health.Status) string {
	if s.Error != "" && !strings.HasSuffix(s.Message, s.Error) {
		return s.Message + ": " + s.Error
	}
	return s.Message
}

// counts is "2 acked, 1 nacked" in the order of names, zeros left out, or
// "none".
func counts(names []string, n map[string]int) string {
	var parts []string
	for _, name := range names {
		if n[name] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[name], name))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

var resourceStates = []string{stateAcked, stateNacked, stateNackedButCached, stateDoesNotExist, stateRequested}

func resourceCounts(rs []xdsResource) string {
	n := map[string]int{}
	for _, r := range rs {
		n[r.State]++
	}
	return counts(resourceStates, n)
}

func frontendCounts(fes []*lb.Frontend, mode string) string {
	n := map[string]int{}
	for _, fe := range fes {
		n[fe.Status.Kind.String()]++
	}
	s := fmt.Sprintf("%d", len(fes))
	if len(fes) > 0 {
		s += " (" + counts([]string{"Done", "Pending", "Refreshing", "Error"}, n) + ")"
	}
	if mode == "none" && n["Pending"] > 0 {
		s += "; Pending stays: no datapath reconciles them (--datapath=none)"
	}
	return s
}

func backendCounts(bes []*lb.Backend) string {
	n := map[string]int{}
	for _, be := range bes {
		n[be.State.String()]++
	}
	s := fmt.Sprintf("%d", len(bes))
	if len(bes) > 0 {
		s += " (" + counts([]string{"active", "terminating", "quarantined", "maintenance"}, n) + ")"
	}
	return s
}

func datapathLine(d datapathStatus) string {
	if d.Mode != "bpf" {
		return fmt.Sprintf("%s: no forwarding, tables only", orDash(d.Mode))
	}
	devices := "no devices"
	if len(d.Devices) > 0 {
		devices = strings.Join(d.Devices, ", ")
	}
	s := fmt.Sprintf("bpf on %s; maps at %s: ", devices, d.PinDir)
	if d.Error != "" {
		return s + "not readable: " + d.Error
	}
	return s + fmt.Sprintf("%s, %s", plural(d.Services, "service", "services"), plural(d.Backends, "backend", "backends"))
}
