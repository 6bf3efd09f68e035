// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes text to a temporary file and renames it over path, as
// editors and configuration management tools do.
func replaceFile(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, text)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServeFileFollowsEdits(t *testing.T) {
	env := startServer(t)
	path := filepath.Join(t.TempDir(), "resources.yaml")
	cfp := readTestdata(t, "cfp.yaml")
	writeFile(t, path, cfp)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.srv.ServeFile(ctx, path); err != nil {
		t.Fatal(err)
	}

	c := env.sotw(t, map[string][]string{resource.ClusterType: nil, resource.EndpointType: {"my-database-service"}})
	got := Resources{}
	for len(got) < 2 {
		resp, msgs := c.recv()
		got[resp.GetTypeUrl()] = msgs
	}
	checkServed(t, got, cfpResources(t))

	// In-place write: a third backend.
	writeFile(t, path, cfp+`    - endpoint:
        address:
          socket_address: { address: 192.168.1.12, port_value: 3306 }
`)
	resp, msgs := c.recv()
	if resp.GetTypeUrl() != resource.EndpointType || endpointCount(msgs["my-database-service"]) != 3 {
		t.Fatalf("after an in-place edit got %s %v, want the CLA with 3 endpoints", resp.GetTypeUrl(), msgs)
	}

	// Rename over the file: another VIP.
	replaceFile(t, path, strings.Replace(cfp, `vip: "10.1.2.3"`, `vip: "10.1.2.4"`, 1))
	for {
		// The CLA goes back to 2 endpoints too; wait for the cluster.
		resp, msgs = c.recv()
		if resp.GetTypeUrl() == resource.ClusterType {
			break
		}
	}
	if vip := vipOf(msgs["my-database-service"]); vip != "10.1.2.4" {
		t.Fatalf("after rename-replace the VIP is %s, want 10.1.2.4", vip)
	}

	// A bad edit is logged with the file, document and field, and the last
	// good state stays served.
	good := env.srv.Resources()
	replaceFile(t, path, strings.Replace(cfp, "  type: EDS", "  typ: EDS", 1))
	eventually(t, "the bad edit to be logged", func() bool {
		return strings.Contains(env.logs.String(), `document 1 (cluster \"my-database-service\"): unknown field \"typ\"`) &&
			strings.Contains(env.logs.String(), path)
	})
	if !resourcesEqual(env.srv.Resources(), good) {
		t.Fatal("a bad edit changed the served resources")
	}

	// The next good edit is applied again.
	replaceFile(t, path, strings.Replace(cfp, `vip: "10.1.2.3"`, `vip: "10.1.2.5"`, 1))
	for {
		resp, msgs = c.recv()
		if resp.GetTypeUrl() == resource.ClusterType {
			break
		}
	}
	if vip := vipOf(msgs["my-database-service"]); vip != "10.1.2.5" {
		t.Fatalf("after fixing the file the VIP is %s, want 10.1.2.5", vip)
	}
}

func resourcesEqual(a, b Resources) bool {
	if a.Len() != b.Len() {
		return false
	}
	for typeURL, byName := range a {
		for name, msg := range byName {
			if other, ok := b[typeURL][name]; !ok || other != msg {
				return false
			}
		}
	}
	return true
}

func TestServeFileRejectsAnInvalidFileAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, path, strings.Replace(readTestdata(t, "cfp.yaml"), "port_value: 3306", "port_valu: 3306", 1))
	srv := NewServer(Options{})
	defer srv.Stop()
	err := srv.ServeFile(context.Background(), path)
	want := path + `: document 2 (cluster_load_assignment "my-database-service"): unknown field "port_valu" in endpoints[0].lb_endpoints[0].endpoint.address.socket_address (line 30)`
	if err == nil || err.Error() != want {
		t.Fatalf("ServeFile error:\n got %v\nwant %s", err, want)
	}
	if srv.Resources().Len() != 0 {
		t.Fatalf("serving %v", srv.Resources())
	}
}

// Kubernetes mounts a ConfigMap as FILE -> ..data/FILE, ..data -> ..<ts>/,
// and updates it by pointing ..data at a new directory.
func TestWatchFileSeesConfigMapUpdates(t *testing.T) {
	dir := t.TempDir()
	mkVersion := func(name, text string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "resources.yaml"), text)
	}
	cfp := readTestdata(t, "cfp.yaml")
	mkVersion("..v1", cfp)
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "resources.yaml")
	if err := os.Symlink("..data/resources.yaml", path); err != nil {
		t.Fatal(err)
	}

	type result struct {
		res Resources
		err error
	}
	results := make(chan result, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchFile(ctx, path, func(res Resources, err error) { results <- result{res, err} })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchFile: %v", err)
		}
	}()
	next := func() result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(testTimeout):
			t.Fatal("no callback")
			return result{}
		}
	}

	if r := next(); r.err != nil || r.res.Len() != 2 {
		t.Fatalf("initial contents: %v %v", r.res, r.err)
	}

	swap := func(version, text string) {
		mkVersion(version, text)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap("..v2", strings.Replace(cfp, `vip: "10.1.2.3"`, `vip: "10.1.2.9"`, 1))
	r := next()
	if r.err != nil || vipOf(r.res[resource.ClusterType]["my-database-service"]) != "10.1.2.9" {
		t.Fatalf("after the swap: %v %v", r.res, r.err)
	}

	// A bad version is reported, naming the file and document.
	swap("..v3", cfp+"---\nresource: {'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster}\n")
	r = next()
	if r.err == nil || !strings.Contains(r.err.Error(), path+": document 3 (cluster): ") {
		t.Fatalf("after a bad swap: %v %v", r.res, r.err)
	}
}
