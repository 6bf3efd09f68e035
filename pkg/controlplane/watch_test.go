// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
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
	checkServed(t, c.recvTypes(2), cfpResources(t))

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
	replaceFile(t, path, withVIPText(cfp, "10.1.2.4"))
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
	if !sameResources(env.srv.Resources(), good, identical) {
		t.Fatal("a bad edit changed the served resources")
	}

	// The next good edit is applied again.
	replaceFile(t, path, withVIPText(cfp, "10.1.2.5"))
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

// sameResources says whether a and b name the same resources, and same
// says so of the messages of each name.
func sameResources(a, b Resources, same func(x, y proto.Message) bool) bool {
	if a.Len() != b.Len() {
		return false
	}
	for typeURL, byName := range a {
		for name, msg := range byName {
			if other, ok := b[typeURL][name]; !ok || !same(msg, other) {
				return false
			}
		}
	}
	return true
}

// identical is the same message, not an equal one.
func identical(x, y proto.Message) bool { return x == y }

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

	next := watch(t, path)

	wantVIP(t, "initial contents", next(), "10.1.2.3")

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
	swap("..v2", withVIPText(cfp, "10.1.2.9"))
	wantVIP(t, "after the swap", next(), "10.1.2.9")

	// A bad version is reported, naming the file and document.
	swap("..v3", cfp+"---\nresource: {'@type': type.googleapis.com/envoy.config.cluster.v3.Cluster}\n")
	if r := next(); r.err == nil || !strings.Contains(r.err.Error(), path+": document 3 (cluster): ") {
		t.Fatalf("after a bad swap: %v %v", r.res, r.err)
	}
}

type watchResult struct {
	res Resources
	err error
}

// watch runs WatchFile on path until the test ends; next returns its next
// callback.
func watch(t *testing.T, path string) (next func() watchResult) {
	t.Helper()
	results := make(chan watchResult, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchFile(ctx, path, func(res Resources, err error) { results <- watchResult{res, err} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchFile: %v", err)
		}
	})
	return func() watchResult {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(testTimeout):
			t.Fatal("no callback")
			return watchResult{}
		}
	}
}

// A symlink to a file elsewhere, whose target is edited in place: the
// events are in the target's directory.
func TestWatchFileFollowsASymlinkIntoAnotherDirectory(t *testing.T) {
	linkDir, targetDir := t.TempDir(), t.TempDir()
	target := filepath.Join(targetDir, "cfp.yaml")
	cfp := readTestdata(t, "cfp.yaml")
	writeFile(t, target, cfp)
	path := filepath.Join(linkDir, "resources.yaml")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	next := watch(t, path)
	wantVIP(t, "initial contents", next(), "10.1.2.3")

	writeFile(t, target, withVIPText(cfp, "10.1.2.7"))
	wantVIP(t, "after editing the target", next(), "10.1.2.7")
	replaceFile(t, target, withVIPText(cfp, "10.1.2.8"))
	wantVIP(t, "after replacing the target", next(), "10.1.2.8")
}

// Other programs writing beside the file without pause do not hold its
// edits back.
func TestWatchFileInABusyDirectory(t *testing.T) {
	path, next := watchCFP(t)
	dir := filepath.Dir(path)

	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		noise := filepath.Join(dir, "noise.log")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				os.WriteFile(noise, []byte(strconv.Itoa(i)), 0o644)
			}
		}
	}()
	defer func() {
		close(stop)
		<-stopped
	}()

	writeFile(t, path, withVIPText(readTestdata(t, "cfp.yaml"), "10.1.2.6"))
	wantVIP(t, "after the edit", next(), "10.1.2.6")
}

// A deleted file is reported once, however busy its directory, and its
// contents are reported again when it comes back, even unchanged.
func TestWatchFileDeletedAndCreatedAgain(t *testing.T) {
	path, next := watchCFP(t)
	dir := filepath.Dir(path)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if r := next(); !errors.Is(r.err, fs.ErrNotExist) || r.res != nil {
		t.Fatalf("after the removal: %v %v", r.res, r.err)
	}
	// Unrelated changes while the file is missing, each seen on its own.
	for i := range 3 {
		writeFile(t, filepath.Join(dir, "other.yaml"), strconv.Itoa(i))
		time.Sleep(2 * watchDebounce)
	}
	writeFile(t, path, readTestdata(t, "cfp.yaml"))
	wantVIP(t, "after creating the file again", next(), "10.1.2.3")
}

// watchCFP writes the CFP example to a new directory and watches it.
func watchCFP(t *testing.T) (path string, next func() watchResult) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, path, readTestdata(t, "cfp.yaml"))
	next = watch(t, path)
	wantVIP(t, "initial contents", next(), "10.1.2.3")
	return path, next
}

// withVIPText is the CFP example with another VIP.
func withVIPText(cfp, vip string) string {
	return strings.Replace(cfp, `vip: "10.1.2.3"`, `vip: "`+vip+`"`, 1)
}

// wantVIP checks that r is the CFP example with the given VIP.
func wantVIP(t *testing.T, what string, r watchResult, vip string) {
	t.Helper()
	if r.err != nil || r.res.Len() != 2 || vipOf(r.res[resource.ClusterType]["my-database-service"]) != vip {
		t.Fatalf("%s: %v %v, want the CFP example with VIP %s", what, r.res, r.err, vip)
	}
}
