// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/l4xds/l4xds/pkg/devcerts"
)

func run(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := newCommand(&out, &out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func TestCertsWritesTheFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, err := run(context.Background(), "certs", "--out", dir, "--server-name", "xds.example.internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{devcerts.CACert, devcerts.ServerCert, devcerts.ServerKey, devcerts.ClientCert, devcerts.ClientKey} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			t.Error(err)
		}
		if !strings.Contains(out, path) {
			t.Errorf("output does not mention %s:\n%s", path, out)
		}
	}
}

func TestServeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: a\n"), 0o644)
	os.WriteFile(bad, []byte("'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: a\nprot: TCP\n"), 0o644)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--insecure"}, "--resources, --kubeconfig or --in-cluster is required"},
		{[]string{"serve", "--insecure", "--kubeconfig", "k", "--in-cluster"}, "--kubeconfig and --in-cluster are exclusive"},
		{[]string{"serve", "--insecure", "--kubeconfig", "k", "--backend-mode", "pods"}, `--backend-mode "pods": want "pod" or "node-port"`},
		{[]string{"serve", "--insecure", "--kubeconfig", "k", "--address-pool", "lan"}, `--address-pool: pool "lan": want NAME=CIDR|FIRST-LAST[,...]`},
		{[]string{"serve", "--insecure", "--kubeconfig", "k", "--address-pool", "lan=10.0.0.9-10.0.0.1"}, `range "10.0.0.9-10.0.0.1": the first address must not be after the last`},
		{[]string{"serve", "--insecure", "--listen", "127.0.0.1:0", "--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig /nonexistent/kubeconfig"},
		{[]string{"serve", "--resources", good, "--cert", "c"}, "mutual TLS needs --cert, --key and --client-ca (missing --key, --client-ca), or --insecure"},
		{[]string{"serve", "--resources", good, "--insecure", "--cert", "c"}, "--insecure cannot be combined"},
		{[]string{"serve", "--resources", bad, "--insecure", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"}, bad + `: document 1 (cluster "a"): unknown field "prot" (line 3)`},
		{[]string{"serve", "--resources", good, "--insecure", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--resources", good, "--insecure", "--log-format", "yaml"}, `--log-format "yaml": want "text" or "json"`},
		{[]string{"certs"}, "--out is required"},
	}
	for _, tt := range tests {
		_, err := run(context.Background(), tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

// A cancelled context (SIGINT/SIGTERM in main) stops serve cleanly.
func TestServeStopsOnCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resources.yaml")
	data, err := os.ReadFile("../../examples/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, data, 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := run(ctx, "serve", "--resources", path, "--insecure", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, out)
	}
	if !strings.Contains(out, "total=2") || !strings.Contains(out, "Stopped") {
		t.Fatalf("log:\n%s", out)
	}
}

// --log-format=json logs one JSON object a line, with the same keys.
func TestServeLogsJSON(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := run(ctx, "serve", "--resources", "../../examples/cfp.yaml", "--insecure", "--listen", "127.0.0.1:0", "--log-format", "json")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, out)
	}
	var applied bool
	for line := range strings.Lines(out) {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("a line that is not JSON: %v\n%s", err, out)
		}
		applied = applied || (entry["msg"] == "Resources applied" && entry["total"] == float64(2))
	}
	if !applied {
		t.Fatalf("no \"Resources applied\" line with total 2:\n%s", out)
	}
}

// testListeners makes serve listen on loopback ports the test picked: the
// addresses "xds" and "health" of --listen and --health-listen.
func testListeners(t *testing.T) (xdsAddr, healthAddr string) {
	t.Helper()
	lis := map[string]net.Listener{}
	for _, name := range []string{"xds", "health"} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		lis[name] = l
	}
	listen = func(_, addr string) (net.Listener, error) {
		l, ok := lis[addr]
		if !ok {
			return nil, fmt.Errorf("the test has no listener %q", addr)
		}
		return l, nil
	}
	t.Cleanup(func() { listen = net.Listen })
	return lis["xds"].Addr().String(), lis["health"].Addr().String()
}

// hangingAPIServer accepts connections and never answers.
func hangingAPIServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + l.Addr().String()
}

// listsHangAPIServer answers that it serves no Gateway API, and never
// answers a list.
func listsHangAPIServer(t *testing.T) string {
	stop := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/apis/gateway.networking.k8s.io/v1" {
			http.NotFound(w, r)
			return
		}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); s.Close() })
	return s.URL
}

func writeKubeconfig(t *testing.T, server string) string {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A control plane whose API server does not answer (or lists nothing)
// answers no xDS request: an answer would be an empty state, and the
// agents would remove everything they serve. It says it is not ready, and
// why.
func TestServeKubernetesWaitsForTheAPIServer(t *testing.T) {
	for name, tt := range map[string]struct {
		api    func(*testing.T) string
		reason string
	}{
		"connection never answered": {hangingAPIServer, "kubernetes: waiting for the API server to answer"},
		"lists never answered":      {listsHangAPIServer, "kubernetes: waiting for the API server to list Services (not listed yet), EndpointSlices (not listed yet), Nodes (not listed yet)"},
	} {
		t.Run(name, func(t *testing.T) {
			xdsAddr, healthAddr := testListeners(t)
			kubeconfig := writeKubeconfig(t, tt.api(t))
			ctx, cancel := context.WithCancel(context.Background())
			var logs syncBuffer
			done := make(chan error, 1)
			go func() {
				cmd := newCommand(&logs, &logs)
				cmd.SetArgs([]string{"serve", "--kubeconfig", kubeconfig, "--insecure", "--log-level", "debug",
					"--listen", "xds", "--health-listen", "health"})
				done <- cmd.ExecuteContext(ctx)
			}()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("serve: %v", err)
				}
				if t.Failed() {
					t.Logf("log:\n%s", logs.String())
				}
			})

			conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			sctx, scancel := context.WithTimeout(context.Background(), testTimeout)
			defer scancel()
			stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&discovery.DiscoveryRequest{Node: &corev3.Node{Id: "node-1"}, TypeUrl: resource.ClusterType}); err != nil {
				t.Fatal(err)
			}
			answered := make(chan *discovery.DiscoveryResponse, 1)
			go func() {
				if resp, err := stream.Recv(); err == nil {
					answered <- resp
				}
			}()

			// Until the server holds the stream and says why it is not
			// ready, or answers (wrongly).
			hc := &http.Client{Timeout: time.Second}
			var readyz string
			for {
				if resp, err := hc.Get("http://" + healthAddr + "/readyz"); err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						t.Fatalf("/readyz: 200 %s", body)
					}
					readyz = string(body)
				}
				if strings.Contains(logs.String(), "xDS stream waits for the first state") && strings.Contains(readyz, tt.reason) {
					break
				}
				select {
				case resp := <-answered:
					t.Fatalf("answered %d resources at version %q before the cluster was read", len(resp.GetResources()), resp.GetVersionInfo())
				case <-sctx.Done():
					t.Fatalf("not held, or not reported (/readyz %q)", readyz)
				case <-time.After(50 * time.Millisecond):
				}
			}
			// A wrong answer would come right away; give it a moment.
			select {
			case resp := <-answered:
				t.Fatalf("answered %d resources at version %q before the cluster was read", len(resp.GetResources()), resp.GetVersionInfo())
			case <-time.After(time.Second):
			}
			t.Logf("/readyz: %s", readyz)
		})
	}
}

const testTimeout = 60 * time.Second

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Serving a file, the server is ready once the file is applied, and says
// so in its metrics.
func TestServeFileIsReady(t *testing.T) {
	_, healthAddr := testListeners(t)
	path := filepath.Join(t.TempDir(), "resources.yaml")
	data, err := os.ReadFile("../../examples/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, data, 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs syncBuffer
	go func() {
		cmd := newCommand(&logs, &logs)
		cmd.SetArgs([]string{"serve", "--resources", path, "--insecure", "--listen", "xds", "--health-listen", "health"})
		done <- cmd.ExecuteContext(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(testTimeout)
	for _, path := range []string{"/healthz", "/readyz"} {
		for {
			resp, err := hc.Get("http://" + healthAddr + path)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = fmt.Errorf("%d %s", resp.StatusCode, body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v\n%s", path, err, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	resp, err := hc.Get("http://" + healthAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"\nl4xds_control_plane_ready 1\n", "\nl4xds_control_plane_connected_clients 0\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %q:\n%s", want, body)
		}
	}
}
