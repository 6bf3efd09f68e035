// SPDX-License-Identifier: Apache-2.0

// Package metrics provides the agent's Prometheus registry, which the other
// cells register their collectors into, and serves it as /metrics over HTTP
// on --prometheus-serve-addr. Off by default: a node agent opens no TCP port
// unless asked to.
package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"

	"github.com/l4xds/l4xds/pkg/version"
)

// Cell provides *prometheus.Registry and prometheus.Registerer (the same
// registry, with the Go and process collectors in it) and serves it when
// --prometheus-serve-addr is set. Cells that export metrics take the
// Registerer as optional, so that they also run in hives without this cell.
var Cell = cell.Module(
	"metrics",
	"Prometheus metrics on --prometheus-serve-addr",

	cell.Config(Config{}),
	cell.Provide(
		NewRegistry,
		func(r *prometheus.Registry) prometheus.Registerer { return r },
	),
	cell.Invoke(serve),
)

// Config of the metrics server.
type Config struct {
	// PrometheusServeAddr is the TCP address of /metrics; empty: not served.
	PrometheusServeAddr string
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("prometheus-serve-addr", def.PrometheusServeAddr,
		`Serve Prometheus metrics on this TCP address, e.g. ":9970" (empty: off)`)
}

// NewRegistry returns a registry with the Go runtime and process collectors
// and l4xds_build_info.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(version.Get()),
	)
	return r
}

// buildInfo is the usual constant 1 whose labels say which build runs, so
// that a query can join on it or count the versions of a rollout.
func buildInfo(v version.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "l4xds_build_info",
		Help: "Always 1; the labels are the version, git commit and Go version of the agent",
		ConstLabels: prometheus.Labels{
			"version":    v.Version,
			"commit":     v.Commit,
			"go_version": v.GoVersion,
		},
	})
	g.Set(1)
	return g
}

type serveParams struct {
	cell.In

	Config    Config
	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	Registry  *prometheus.Registry
}

func serve(p serveParams) {
	addr := p.Config.PrometheusServeAddr
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(p.Registry, promhttp.HandlerOpts{
		// A collector that fails (a map that cannot be read) costs its
		// own metrics, not the whole scrape.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slog.NewLogLogger(p.Log.Handler(), slog.LevelWarn),
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("metrics: --prometheus-serve-addr %s: %w", addr, err)
			}
			p.Log.Info("Serving Prometheus metrics", "address", lis.Addr().String())
			go func() {
				if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
					p.Log.Error("Metrics server stopped", "address", addr, "error", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx cell.HookContext) error {
			return srv.Shutdown(ctx)
		},
	})
}
