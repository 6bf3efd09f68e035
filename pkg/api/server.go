// SPDX-License-Identifier: Apache-2.0

// Package api serves the agent's local API on a unix socket: the StateDB
// tables (/statedb/, the handler that statedb.RemoteTable and l4xds-dbg
// read), the hive shell (/shell), health (/healthz), readiness (/readyz), the agent's settings
// (/config) and Go's profiles (/debug/pprof/, as net/http/pprof serves
// them: `go tool pprof` reads them through the socket).
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/l4xds/l4xds/pkg/health"
)

// DefaultSocket is where the agent listens and l4xds-dbg connects by default.
const DefaultSocket = "/var/run/l4xds/agent.sock"

// Config of the api server.
type Config struct {
	APISocket string
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("api-socket", def.APISocket, "Unix socket of the local API (statedb, shell, health); mode 0600")
}

// HealthReport is the body of /healthz and /readyz.
type HealthReport struct {
	// OK: no component is degraded.
	OK bool `json:"ok"`
	// Ready: the agent serves (health.Readiness); Waiting are the
	// conditions not met yet.
	Ready    bool            `json:"ready"`
	Waiting  []string        `json:"waiting,omitempty"`
	Statuses []health.Status `json:"statuses"`
}

// Settings are the agent's settings, flags and config files merged, by
// flag name: the body of /config.
type Settings map[string]any

// NewHandler returns the API's routes.
func NewHandler(db *statedb.DB, reg *health.Registry, ready *health.Readiness, cmds map[string]script.Cmd, settings Settings) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/statedb/", http.StripPrefix("/statedb", db.HTTPHandler()))
	// On the socket only (mode 0600): the profiles of a node's agent are
	// for whoever may already read its tables.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/config", func(w http.ResponseWriter, r *http.Request) {
		// l4xds-dbg reads where the datapath is (--datapath, --bpf-root)
		// and which server the agent was told to use.
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(settings)
	})
	report := func() HealthReport {
		rep := HealthReport{OK: len(reg.Degraded()) == 0, Statuses: reg.All()}
		rep.Waiting = ready.Waiting()
		rep.Ready = len(rep.Waiting) == 0
		return rep
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		rep := report()
		w.Header().Set("Content-Type", "application/json")
		if !rep.OK {
			// 503 while any component is degraded (e.g. the xDS server
			// unreachable). Neither for liveness nor for readiness: the
			// datapath keeps forwarding meanwhile (/readyz).
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		rep := report()
		w.Header().Set("Content-Type", "application/json")
		if !rep.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(rep)
	})
	cmds = maps.Clone(cmds)
	cmds["help"] = script.Help()
	engine := &script.Engine{Cmds: cmds}
	mux.HandleFunc("/shell", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST a command line", http.StatusMethodNotAllowed)
			return
		}
		line, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The command runs as long as the client listens (db/watch streams).
		s, err := script.NewState(r.Context(), os.TempDir(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Trailer", ShellErrorTrailer)
		out := &shellWriter{w: w}
		if err := engine.ExecuteLine(s, strings.TrimSpace(string(line)), out); err != nil {
			// One line, without the script engine's "<stdin>:0: " position.
			msg := strings.TrimPrefix(err.Error(), "<stdin>:0: ")
			w.Header().Set(ShellErrorTrailer, strings.ReplaceAll(msg, "\n", "; "))
		}
	})
	return mux
}

type params struct {
	cell.In

	Config    Config
	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	DB        *statedb.DB
	Health    *health.Registry
	Ready     *health.Readiness
	Cmds      hive.ScriptCmds
	Settings  cell.AllSettings
}

func register(p params) {
	if p.Config.APISocket == "" {
		p.Log.Info("API socket path empty: local API disabled")
		return
	}
	srv := &http.Server{
		Handler:           NewHandler(p.DB, p.Health, p.Ready, p.Cmds.Map(), Settings(p.Settings)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			lis, err := Listen(p.Config.APISocket)
			if err != nil {
				return err
			}
			p.Log.Info("API listening", "socket", p.Config.APISocket)
			go func() {
				if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
					p.Log.Error("API server stopped", "error", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx cell.HookContext) error {
			return srv.Shutdown(ctx)
		},
	})
}

// Listen creates the socket's directory, replaces a stale socket left by a
// previous run, and listens with mode 0600: the API is root's only.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	return lis, nil
}

// ShellErrorTrailer carries the error of a /shell command, after its output.
const ShellErrorTrailer = "X-L4xds-Shell-Error"

// shellWriter streams a command's log to the client, without the engine's
// "[stdout]" section markers, flushing as the command flushes.
type shellWriter struct{ w http.ResponseWriter }

func (sw *shellWriter) Write(p []byte) (int, error) {
	_, err := sw.w.Write(bytes.ReplaceAll(p, []byte("[stdout]\n"), nil))
	return len(p), err
}

func (sw *shellWriter) Flush() error {
	return http.NewResponseController(sw.w).Flush()
}
