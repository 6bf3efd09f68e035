// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"os"
	"path/filepath"
	"testing"
)

// A kubeconfig's client writes status faster than client-go's default of 5
// requests a second; a rate the kubeconfig's user set would be kept.
func TestRESTConfigRate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != 50 || cfg.Burst != 100 {
		t.Errorf("QPS %v burst %d, want 50 and 100", cfg.QPS, cfg.Burst)
	}
	cfg.QPS, cfg.Burst = 7, 9
	if withRate(cfg); cfg.QPS != 7 || cfg.Burst != 9 {
		t.Errorf("a rate given was changed to QPS %v burst %d", cfg.QPS, cfg.Burst)
	}
}
