// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// --leader-elect without a cluster says that it needs one, whatever the
// environment: not first to set $POD_NAMESPACE, then (once set) that the
// Lease is in a cluster.
func TestLeaderElectNeedsCluster(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	f := serveFlags{resources: filepath.Join(t.TempDir(), "r.yaml"), insecure: true, leaderElect: true, logLevel: "info"}
	_, err := prepare(f, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--leader-elect needs --kubeconfig or --in-cluster") {
		t.Fatalf("error %v, want that --leader-elect needs --kubeconfig or --in-cluster", err)
	}
}
