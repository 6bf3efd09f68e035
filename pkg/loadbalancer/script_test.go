// SPDX-License-Identifier: Apache-2.0

package loadbalancer_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	lb "github.com/l4xds/l4xds/pkg/loadbalancer"
)

// TestScript runs the scenarios in testdata/*.txtar, each against its own
// hive with the statedb and loadbalancer cells and the lb/* commands below.
func TestScript(t *testing.T) {
	scripttest.Test(t, context.Background(),
		func(t testing.TB, args []string) *script.Engine {
			log := hivetest.Logger(t)
			h := hive.New(
				statedb.Cell,
				lb.Cell,
				cell.Provide(writerCommands),
			)
			t.Cleanup(func() { _ = h.Stop(log, context.Background()) })
			cmds, err := h.ScriptCommands(log)
			if err != nil {
				t.Fatalf("ScriptCommands: %v", err)
			}
			maps.Insert(cmds, maps.All(script.DefaultCmds()))
			return &script.Engine{Cmds: cmds}
		}, nil, "testdata/*.txtar")
}

// writerCommands drive the Writer from scripts. Each command is one write
// transaction; a failing command commits nothing and prints its error to
// stderr.
func writerCommands(w *lb.Writer) hive.ScriptCmdsOut {
	sourceFlag := func(fs *pflag.FlagSet) { fs.String("source", string(lb.SourceXDS), "Source of the rows") }
	source := func(s *script.State) lb.Source {
		src, _ := s.Flags.GetString("source")
		return lb.Source(src)
	}
	write := func(f func(txn lb.WriteTxn) error) (script.WaitFunc, error) {
		txn := w.WriteTxn()
		defer txn.Abort()
		if err := f(txn); err != nil {
			return func(*script.State) (string, string, error) { return "", err.Error() + "\n", err }, nil
		}
		txn.Commit()
		return nil, nil
	}
	initializers := map[string]func(lb.WriteTxn){}

	return hive.NewScriptCmds(map[string]script.Cmd{
		"lb/upsert-service": script.Command(
			script.CmdUsage{
				Summary: "Upsert a service and set its frontends",
				Args:    "name frontend...",
				Detail: []string{
					"A frontend is 'address[,port=N][,name=S]', e.g. '10.0.0.1:53/UDP,port=5353,name=dns':",
					"port is the service port that replaces the backends' port.",
				},
				Flags: func(fs *pflag.FlagSet) {
					sourceFlag(fs)
					fs.Duration("affinity", 0, "Session affinity timeout (0 = off)")
					fs.StringSlice("source-ranges", nil, "Allowed client prefixes")
					fs.StringToString("labels", nil, "Labels")
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) < 1 {
					return nil, script.ErrUsage
				}
				svc := &lb.Service{Name: lb.ServiceName(args[0]), Source: source(s)}
				svc.SessionAffinityTimeout, _ = s.Flags.GetDuration("affinity")
				svc.SessionAffinity = svc.SessionAffinityTimeout > 0
				svc.Labels, _ = s.Flags.GetStringToString("labels")
				ranges, _ := s.Flags.GetStringSlice("source-ranges")
				for _, r := range ranges {
					p, err := netip.ParsePrefix(r)
					if err != nil {
						return nil, err
					}
					svc.SourceRanges = append(svc.SourceRanges, p)
				}
				var fes []lb.FrontendParams
				for _, arg := range args[1:] {
					fe, err := parseFrontend(arg)
					if err != nil {
						return nil, err
					}
					fes = append(fes, fe)
				}
				return write(func(txn lb.WriteTxn) error { return w.UpsertServiceAndFrontends(txn, svc, fes...) })
			},
		),
		"lb/delete-service": script.Command(
			script.CmdUsage{Summary: "Delete a service and its frontends", Args: "name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return write(func(txn lb.WriteTxn) error {
					_, err := w.DeleteServiceAndFrontends(txn, lb.ServiceName(args[0]))
					return err
				})
			},
		),
		"lb/set-backends": script.Command(
			script.CmdUsage{
				Summary: "Replace the backends of a service from a source",
				Args:    "service backend...",
				Detail: []string{
					"A backend is 'address[,weight=N][,state=S][,priority=N][,zone=Z]'; weight defaults to 1.",
				},
				Flags: sourceFlag,
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) < 1 {
					return nil, script.ErrUsage
				}
				var bes []lb.BackendParams
				for _, arg := range args[1:] {
					be, err := parseBackend(arg)
					if err != nil {
						return nil, err
					}
					bes = append(bes, be)
				}
				return write(func(txn lb.WriteTxn) error {
					return w.SetBackends(txn, lb.ServiceName(args[0]), source(s), bes...)
				})
			},
		),
		"lb/delete-services-by-source": script.Command(
			script.CmdUsage{Summary: "Delete the services of a source", Args: "source"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return write(func(txn lb.WriteTxn) error { return w.DeleteServicesBySource(txn, lb.Source(args[0])) })
			},
		),
		"lb/delete-backends-by-source": script.Command(
			script.CmdUsage{Summary: "Delete the backends of a source", Args: "source"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 1 {
					return nil, script.ErrUsage
				}
				return write(func(txn lb.WriteTxn) error { return w.DeleteBackendsBySource(txn, lb.Source(args[0])) })
			},
		),
		"lb/initializer": script.Command(
			script.CmdUsage{Summary: "Register an initializer, or mark it done", Args: "register|done name"},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 2 {
					return nil, script.ErrUsage
				}
				switch name := args[1]; args[0] {
				case "register":
					initializers[name] = w.RegisterInitializer(name)
					return nil, nil
				case "done":
					done, ok := initializers[name]
					if !ok {
						return nil, fmt.Errorf("initializer %q is not registered", name)
					}
					return write(func(txn lb.WriteTxn) error { done(txn); return nil })
				}
				return nil, script.ErrUsage
			},
		),
	})
}

// options splits "head,k=v,k=v".
func options(s string) (head string, opts map[string]string, err error) {
	head, rest, _ := strings.Cut(s, ",")
	opts = map[string]string{}
	if rest == "" {
		return head, opts, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return "", nil, fmt.Errorf("%q: option %q is not key=value", s, kv)
		}
		opts[k] = v
	}
	return head, opts, nil
}

func parseFrontend(s string) (fe lb.FrontendParams, err error) {
	head, opts, err := options(s)
	if err != nil {
		return fe, err
	}
	if fe.Address, err = lb.ParseL3n4Addr(head); err != nil {
		return fe, err
	}
	for k, v := range opts {
		switch k {
		case "port":
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return fe, fmt.Errorf("frontend %q: port: %w", s, err)
			}
			fe.ServicePort = uint16(p)
		case "name":
			fe.PortName = v
		default:
			return fe, fmt.Errorf("frontend %q: unknown option %q", s, k)
		}
	}
	return fe, nil
}

func parseBackend(s string) (be lb.BackendParams, err error) {
	head, opts, err := options(s)
	if err != nil {
		return be, err
	}
	if be.Address, err = lb.ParseL3n4Addr(head); err != nil {
		return be, err
	}
	be.Weight = 1
	for k, v := range opts {
		switch k {
		case "weight":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return be, fmt.Errorf("backend %q: weight: %w", s, err)
			}
			be.Weight = uint16(n)
		case "priority":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return be, fmt.Errorf("backend %q: priority: %w", s, err)
			}
			be.Priority = uint32(n)
		case "state":
			if be.State, err = lb.ParseBackendState(v); err != nil {
				return be, fmt.Errorf("backend %q: %w", s, err)
			}
		case "zone":
			be.Zone = v
		default:
			return be, fmt.Errorf("backend %q: unknown option %q", s, k)
		}
	}
	return be, nil
}
