// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		{[]string{"serve", "--resources", bad, "--insecure", "--listen", "127.0.0.1:0"}, bad + `: document 1 (cluster "a"): unknown field "prot" (line 3)`},
		{[]string{"serve", "--resources", good, "--insecure", "--log-level", "loud"}, "--log-level"},
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
	out, err := run(ctx, "serve", "--resources", path, "--insecure", "--listen", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, out)
	}
	if !strings.Contains(out, "total=2") || !strings.Contains(out, "Stopped") {
		t.Fatalf("log:\n%s", out)
	}
}
