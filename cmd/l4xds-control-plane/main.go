// SPDX-License-Identifier: Apache-2.0

// l4xds-control-plane is the reference xDS management server of l4xds: it
// serves the Envoy resources of a YAML or JSON file to l4xds agents (and to
// any other xDS client) and follows the file's edits.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
	"github.com/l4xds/l4xds/pkg/controlplane"
	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/logging"
	"github.com/l4xds/l4xds/pkg/memlimit"
	"github.com/l4xds/l4xds/pkg/tlsmetrics"
	"github.com/l4xds/l4xds/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "l4xds-control-plane:", err)
		os.Exit(1)
	}
}

func newCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "l4xds-control-plane",
		Short: "Reference xDS server for l4xds: serves Envoy resources from a file",
		Long: `l4xds-control-plane serves Envoy Cluster and ClusterLoadAssignment resources
(and any other Envoy resource) from a YAML or JSON file over xDS (ADS, SotW and
Delta) with mutual TLS. l4xds agents subscribe to it; so can Envoy.

It watches the file: every saved edit is applied within a second, and only the
resources that changed are sent to clients. An edit that does not parse is
logged and ignored; the last good resources stay served.

Start with "certs" to make development certificates, then "serve".`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	version.AddFlag(root)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(certsCommand(), serveCommand(stderr))
	return root
}

func certsCommand() *cobra.Command {
	var out, serverName string
	cmd := &cobra.Command{
		Use:   "certs --out DIR",
		Short: "Write a development CA and server and client certificates",
		Long: `Write a new certificate authority and a server and a client certificate signed
by it into DIR, for trying mutual TLS between l4xds-control-plane and the agents.
The keys are written unencrypted: these certificates are for development and
tests, not for production.

The server certificate is valid for localhost, 127.0.0.1, ::1 and --server-name
(a DNS name or an IP address).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out is required: the directory to write the certificates to")
			}
			if err := devcerts.Write(out, devcerts.Options{ServerName: serverName}); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, f := range []struct{ name, what string }{
				{devcerts.CACert, "CA certificate: give to the agents (--xds-ca-cert-path) and to serve --client-ca"},
				{devcerts.CAKey, "CA key: keep it to yourself"},
				{devcerts.ServerCert, "server certificate: serve --cert"},
				{devcerts.ServerKey, "server key: serve --key"},
				{devcerts.ClientCert, "client certificate: agents' --xds-client-cert-path"},
				{devcerts.ClientKey, "client key: agents' --xds-client-key-path"},
			} {
				fmt.Fprintf(w, "%-40s %s\n", filepath.Join(out, f.name), f.what)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the certificates to (created if missing)")
	cmd.Flags().StringVar(&serverName, "server-name", "", "extra DNS name or IP address of the server certificate: what agents dial (their --xds-server-address or --xds-server-name)")
	return cmd
}

type serveFlags struct {
	resources, listen   string
	healthListen        string
	kubeconfig          string
	inCluster           bool
	lbClass, controller string
	backendMode         string
	pools               []string
	poolsConfigMap      string
	leaderElect         bool
	maxConnectionAge    time.Duration
	leaderLease         string
	cert, key, clientCA string
	insecure            bool
	logLevel, logFormat string
	skipValidation      bool
	pprof               bool
}

func serveCommand(stderr io.Writer) *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve (--resources FILE | --kubeconfig FILE | --in-cluster)... (--cert F --key F --client-ca F | --insecure)",
		Short: "Serve the resources of FILE over xDS, following its edits",
		Long: `Serve the Envoy resources of FILE over xDS (ADS, SotW and Delta) and follow
its changes: edits in place, editors that save by renaming, a FILE deleted and
written again, and Kubernetes ConfigMap updates. Only the resources that
changed are sent to clients.

FILE holds YAML documents separated by "---", or JSON. Each document is one
resource under "resource:",

  resource:
    '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster
    name: my-database-service
    ...

or the same map without "resource:" around it, or Envoy's filesystem form
"resources: [...]". Field names may be snake_case or camelCase.

A FILE that is invalid at start is an error. Later, an invalid edit is logged
in one line that names the file, document, resource and field; like a missing
FILE, it leaves the last good resources served.

Clients must present a certificate signed by --client-ca. --cert, --key and
--client-ca are re-read when they change, so rotated certificates need no
restart. --insecure serves plaintext to anyone instead, for local experiments
only.

With --kubeconfig (or --in-cluster) it also serves a Kubernetes cluster: every
Service of type LoadBalancer whose spec.loadBalancerClass is
--load-balancer-class becomes one cluster, with an address from the
--address-pool pools, and every TCPRoute and UDPRoute attached to a Gateway of
a GatewayClass whose controllerName is --gateway-controller-name one per
listener. Their status is written back (KEP-1435 port status, conditions,
Events). With --resources too, both are served; a resource name both publish
is served from the file and the conflict is logged.

Clients get no response until the first complete state is read: the file,
and the cluster once its objects are listed. A client that connects earlier
waits; an empty answer would make it remove everything it serves. Plaintext
HTTP on --health-listen answers /healthz (the process runs), /readyz (200
once the first complete state is served; 503 with the reasons otherwise, such
as an API server that does not answer) and /metrics (Prometheus: connected
nodes, each node's ACKs, NACKs and ACKed version per type, the time from a
change to each node's ACK of it per type, readiness, when the TLS
certificates expire).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := prepare(f, stderr)
			if err != nil {
				return err
			}
			// Memory grows with the agents connected: near the container's
			// limit the collector works harder instead of the pod being killed.
			if cgroup, set, err := memlimit.FromCgroup(); err != nil {
				s.log.Warn("Go memory limit not taken from the container's", "error", err)
			} else if set > 0 {
				s.log.Info("Go memory limit taken from the container's", "container_bytes", cgroup, "go_bytes", set)
			}
			lis, err := listen("tcp", f.listen)
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			var hlis net.Listener
			if f.healthListen != "" {
				if hlis, err = listen("tcp", f.healthListen); err != nil {
					lis.Close()
					return fmt.Errorf("--health-listen: %w", err)
				}
			}
			return s.run(cmd.Context(), lis, hlis)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.resources, "resources", "", "YAML or JSON file of Envoy resources to serve and follow (required)")
	fl.StringVar(&f.listen, "listen", ":9000", "host:port to accept xDS clients on (the agents' --xds-server-address)")
	fl.StringVar(&f.healthListen, "health-listen", "", `host:port of the plaintext HTTP /healthz, /readyz and /metrics, e.g. :9001 (the chart's); none when empty`)
	fl.BoolVar(&f.pprof, "pprof", false, "also serve Go's profiles (net/http/pprof) under /debug/pprof/ on --health-listen, for profiling; they reveal the process's internals to anyone who can reach that port")
	fl.StringVar(&f.cert, "cert", "", "server certificate (PEM); re-read when it changes")
	fl.StringVar(&f.key, "key", "", "server private key (PEM); re-read when it changes")
	fl.StringVar(&f.clientCA, "client-ca", "", "CA certificates (PEM) that client certificates must chain to; re-read when it changes")
	fl.BoolVar(&f.insecure, "insecure", false, "serve plaintext without client authentication (never in production)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug (also every ACK), info, warn (NACKs) or error")
	fl.StringVar(&f.logFormat, "log-format", logging.Text, logging.FlagUsage)
	fl.BoolVar(&f.skipValidation, "skip-validation", false, "serve resources that break the Envoy API's validation rules (to test clients' NACKs)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "serve the LoadBalancer Services and Gateway API routes of this cluster (a kubeconfig file) and write their status")
	fl.BoolVar(&f.inCluster, "in-cluster", false, "like --kubeconfig, for the cluster this pod runs in (its service account)")
	fl.StringVar(&f.lbClass, "load-balancer-class", kubesource.DefaultLoadBalancerClass, "spec.loadBalancerClass of the Services to serve; others are not touched")
	fl.StringVar(&f.controller, "gateway-controller-name", kubesource.DefaultControllerName, "spec.controllerName of the GatewayClasses to serve")
	fl.StringVar(&f.backendMode, "backend-mode", string(kubesource.PodBackends), `where Services' traffic goes: "pod" (the EndpointSlices' pod addresses) or "node-port" (the nodes' InternalIP at the nodePort)`)
	fl.StringArrayVar(&f.pools, "address-pool", nil, "a pool of VIPs, NAME=CIDR|FIRST-LAST[,...]; repeat for more pools (the first with a free address serves)")
	fl.StringVar(&f.poolsConfigMap, "address-pools-configmap", "", "NAMESPACE/NAME of a ConfigMap of more pools: one key per pool, the ranges as value; followed live")
	fl.DurationVar(&f.maxConnectionAge, "max-connection-age", 30*time.Minute, "close a client's connection after about this long (±10 %), so that clients spread over the replicas again after a rollout; the client reconnects at once and keeps its state; 0 for never")
	fl.BoolVar(&f.leaderElect, "leader-elect", false, "run as one of several replicas: all serve xDS, the holder of a Lease writes status and Events")
	fl.StringVar(&f.leaderLease, "leader-elect-lease", "", `NAMESPACE/NAME of the Lease of --leader-elect (default: $POD_NAMESPACE/l4xds-control-plane)`)
	return cmd
}

// listen is net.Listen; tests replace it to hand in their listeners.
var listen = net.Listen

// server is a checked serve command line, ready to run.
type server struct {
	f    serveFlags
	log  *slog.Logger
	tls  *tls.Config
	kube *rest.Config // nil without --kubeconfig or --in-cluster
	kcfg kubesource.Config
	// election is --leader-elect's, zero without it.
	election kubesource.Election
}

// prepare checks the flags and loads what they name, before anything listens.
func prepare(f serveFlags, stderr io.Writer) (*server, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	log, err := logging.New(stderr, f.logFormat, level)
	if err != nil {
		return nil, err
	}
	s := &server{f: f, log: log}
	kube := f.kubeconfig != "" || f.inCluster
	if f.resources == "" && !kube {
		return nil, errors.New("--resources, --kubeconfig or --in-cluster is required: what to serve")
	}
	if f.kubeconfig != "" && f.inCluster {
		return nil, errors.New("--kubeconfig and --in-cluster are exclusive")
	}
	if kube {
		var err error
		if s.kcfg, err = kubeConfig(f); err != nil {
			return nil, err
		}
		if s.kube, err = kubesource.RESTConfig(f.kubeconfig); err != nil {
			return nil, err
		}
	}
	if f.pprof && f.healthListen == "" {
		return nil, errors.New("--pprof needs --health-listen: the profiles are served there")
	}
	if f.leaderElect && !kube {
		return nil, errors.New("--leader-elect needs --kubeconfig or --in-cluster: the Lease is in the cluster")
	}
	if s.election, err = election(f); err != nil {
		return nil, err
	}
	// gRPC's jitter needs an age of a few nanoseconds at least; less than
	// a second would only make agents reconnect all the time.
	if a := f.maxConnectionAge; a < 0 || (a > 0 && a < time.Second) {
		return nil, fmt.Errorf("--max-connection-age %s: want 0 (never) or 1s or more", a)
	}

	if f.insecure {
		if f.cert != "" || f.key != "" || f.clientCA != "" {
			return nil, errors.New("--insecure cannot be combined with --cert, --key or --client-ca")
		}
	} else {
		var missing []string
		for _, fl := range []struct{ name, value string }{{"--cert", f.cert}, {"--key", f.key}, {"--client-ca", f.clientCA}} {
			if fl.value == "" {
				missing = append(missing, fl.name)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("mutual TLS needs --cert, --key and --client-ca (missing %s), or --insecure for plaintext", strings.Join(missing, ", "))
		}
		var err error
		if s.tls, err = controlplane.ServerTLSConfig(f.cert, f.key, f.clientCA); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// run serves xDS on lis and health on hlis (nil for none) until ctx is
// done; it closes both.
func (s *server) run(ctx context.Context, lis, hlis net.Listener) error {
	f, log := s.f, s.log
	if f.insecure {
		log.Warn("Serving xDS in plaintext without client authentication (--insecure): anyone who can reach the port can read the configuration")
	}
	var opts []controlplane.ParseOption
	if f.skipValidation {
		opts = append(opts, controlplane.WithoutValidation())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if !f.insecure {
		// Read at scrape time, as the handshakes re-read them.
		reg.MustRegister(tlsmetrics.New(
			tlsmetrics.File{Role: "server", Path: f.cert},
			tlsmetrics.File{Role: "client-ca", Path: f.clientCA, Bundle: true},
		))
	}
	srv := controlplane.NewServer(controlplane.Options{TLS: s.tls, Logger: log, Registerer: reg, MaxConnectionAge: f.maxConnectionAge})
	health := controlplane.NewHealth(srv)
	health.Register(reg)
	if hlis != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/", health)
		if f.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			log.Info("Serving health and metrics", "address", hlis.Addr().String(), "paths", "/healthz /readyz /metrics")
			if err := hs.Serve(hlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("Health endpoint stopped", "error", err)
			}
		}()
		defer hs.Close()
	}
	if s.kube == nil {
		return srv.Run(ctx, lis, f.resources, opts...)
	}
	defer srv.Stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The file's resources take precedence: a name both publish is served
	// from the file and reported. Clients are served once both have
	// published.
	order := []string{kubesource.SourceName}
	if f.resources != "" {
		order = []string{"file", kubesource.SourceName}
	}
	sources := controlplane.NewSources(srv, order...)
	errs := make(chan error, 2)
	// Streams wait for the first complete state: accepting them now lets
	// agents connect and be answered the moment it is read.
	go func() { errs <- srv.Serve(lis) }()
	if f.resources != "" {
		set := func(res controlplane.Resources) error { _, err := sources.Set("file", res); return err }
		if err := controlplane.ApplyFile(ctx, f.resources, log, set, opts...); err != nil {
			return err
		}
	}
	src, err := kubesource.New(s.kube, kubesource.Options{
		Config:         s.kcfg,
		PoolsConfigMap: f.poolsConfigMap,
		Publish: func(res controlplane.Resources) ([]controlplane.Conflict, error) {
			return sources.Set(kubesource.SourceName, res)
		},
		Problem:    func(err error) { health.Report(kubesource.SourceName, err) },
		Election:   s.election,
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	// The source is waited for: it hands its Lease over as it stops.
	srcDone := make(chan error, 1)
	go func() { srcDone <- src.Run(ctx) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		<-srcDone
		log.Info("Stopped")
		return nil
	case err := <-errs:
		// The source too hands its Lease over before the process ends.
		cancel()
		<-srcDone
		return err
	case err := <-srcDone:
		return err
	}
}

// election is the leader election of --leader-elect.
func election(f serveFlags) (kubesource.Election, error) {
	if !f.leaderElect {
		if f.leaderLease != "" {
			return kubesource.Election{}, errors.New("--leader-elect-lease needs --leader-elect")
		}
		return kubesource.Election{}, nil
	}
	lease := f.leaderLease
	if lease == "" {
		ns := os.Getenv("POD_NAMESPACE")
		if ns == "" {
			return kubesource.Election{}, errors.New("--leader-elect: give --leader-elect-lease NAMESPACE/NAME, or set $POD_NAMESPACE")
		}
		lease = ns + "/l4xds-control-plane"
	}
	ns, name, ok := strings.Cut(lease, "/")
	if !ok || ns == "" || name == "" {
		return kubesource.Election{}, fmt.Errorf("--leader-elect-lease %q: want NAMESPACE/NAME", lease)
	}
	id := os.Getenv("POD_NAME")
	if id == "" {
		var err error
		if id, err = os.Hostname(); err != nil {
			return kubesource.Election{}, fmt.Errorf("--leader-elect: no $POD_NAME and no hostname: %w", err)
		}
	}
	return kubesource.Election{Namespace: ns, Name: name, Identity: id}, nil
}

func kubeConfig(f serveFlags) (kubesource.Config, error) {
	cfg := kubesource.Config{LoadBalancerClass: f.lbClass, ControllerName: f.controller}
	switch m := kubesource.BackendMode(f.backendMode); m {
	case kubesource.PodBackends, kubesource.NodePortBackends:
		cfg.BackendMode = m
	default:
		return cfg, fmt.Errorf("--backend-mode %q: want %q or %q", f.backendMode, kubesource.PodBackends, kubesource.NodePortBackends)
	}
	for _, p := range f.pools {
		pool, err := kubesource.ParsePool(p)
		if err != nil {
			return cfg, fmt.Errorf("--address-pool: %w", err)
		}
		cfg.Pools = append(cfg.Pools, pool)
	}
	return cfg, nil
}
