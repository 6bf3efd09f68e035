// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func TestMergeReportsConflicts(t *testing.T) {
	file := cfpResources(t)
	kube := withVIP(t, file, "10.9.9.9")
	other := withVIP(t, file, "10.1.1.1")
	delete(other, resource.EndpointType)
	other[resource.ClusterType]["service/default/dns"] = other[resource.ClusterType]["my-database-service"]
	delete(other[resource.ClusterType], "my-database-service")

	merged, conflicts := Merge([]string{"file", "kubernetes"}, map[string]Resources{"file": file, "kubernetes": kube})
	want := []Conflict{
		{TypeURL: resource.ClusterType, Name: "my-database-service", Kept: "file", Dropped: "kubernetes"},
		{TypeURL: resource.EndpointType, Name: "my-database-service", Kept: "file", Dropped: "kubernetes"},
	}
	if !slices.Equal(conflicts, want) {
		t.Errorf("conflicts %v, want %v", conflicts, want)
	}
	if got := vipOf(merged[resource.ClusterType]["my-database-service"]); got != "10.1.2.3" {
		t.Errorf("served VIP %s, want the file's 10.1.2.3", got)
	}
	if got := conflicts[0].String(); got != `Cluster "my-database-service" is published by both file and kubernetes: serving file's` {
		t.Errorf("conflict reads %q", got)
	}

	merged, conflicts = Merge([]string{"file", "kubernetes"}, map[string]Resources{"file": file, "kubernetes": other})
	if len(conflicts) != 0 || merged.Len() != 3 {
		t.Errorf("disjoint sources: %d conflicts, %d resources, want 0 and 3", len(conflicts), merged.Len())
	}
}

func TestSourcesLogConflictsOnce(t *testing.T) {
	var log bytes.Buffer
	srv := NewServer(Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	defer srv.Stop()
	src := NewSources(srv, "file", "kubernetes")
	if _, err := src.Set("file", cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c, err := src.Set("kubernetes", withVIP(t, cfpResources(t), "10.9.9.9"))
		if err != nil || len(c) != 2 {
			t.Fatalf("Set: %v conflicts, %v", c, err)
		}
	}
	if n := strings.Count(log.String(), "Resource name conflict"); n != 2 {
		t.Errorf("%d conflict lines, want 2 (one per resource, not per Set):\n%s", n, log.String())
	}
	if got := vipOf(srv.Resources()[resource.ClusterType]["my-database-service"]); got != "10.1.2.3" {
		t.Errorf("served VIP %s, want the file's", got)
	}
	if _, err := src.Set("elsewhere", nil); err == nil {
		t.Error("an unknown source was accepted")
	}
}

// The server gets its first state only once every source has published:
// the file alone is not the complete state of a server that also serves a
// cluster.
func TestSourcesServeOnceAllPublished(t *testing.T) {
	srv := NewServer(Options{Logger: slog.New(slog.DiscardHandler)})
	defer srv.Stop()
	src := NewSources(srv, "file", "kubernetes")
	if _, err := src.Set("file", cfpResources(t)); err != nil {
		t.Fatal(err)
	}
	if n := srv.Resources().Len(); n != 0 {
		t.Fatalf("the file alone is served (%d resources) before the cluster was read", n)
	}
	other := Resources{}
	if err := other.Add(&clusterv3.Cluster{Name: "service/default/web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Set("kubernetes", other); err != nil {
		t.Fatal(err)
	}
	if n := srv.Resources().Len(); n != 3 {
		t.Fatalf("%d resources served, want both sources' 3", n)
	}
}
