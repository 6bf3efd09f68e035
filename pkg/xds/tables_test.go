// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"slices"
	"testing"

	"github.com/cilium/statedb"
)

// The rows of xds-resources are found by type and name, a type's by prefix,
// whether the type's key is shortened or not, and by the strings an
// operator types.
func TestResourceIndex(t *testing.T) {
	const listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	db := statedb.New()
	tbl, err := NewResourcesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	rows := []*ResourceStatus{
		{TypeURL: ClusterType, Name: "a"}, {TypeURL: ClusterType, Name: "a b"},
		{TypeURL: EndpointType, Name: "a"}, {TypeURL: listenerType, Name: "a"},
	}
	txn := db.WriteTxn(tbl)
	for _, r := range rows {
		if _, _, err := tbl.Insert(txn, r); err != nil {
			t.Fatal(err)
		}
	}
	rtxn := txn.Commit()

	for _, r := range rows {
		if got, _, ok := tbl.Get(rtxn, ResourceByName(r.TypeURL, r.Name)); !ok || got != r {
			t.Errorf("%s %q: got %v", r.TypeURL, r.Name, got)
		}
		key, _ := ResourceIndex.FromString(r.TypeURL + " " + r.Name)
		if got, _, ok := tbl.Get(rtxn, ResourceIndex.QueryFromKey(key)); !ok || got != r {
			t.Errorf("%q: got %v", r.TypeURL+" "+r.Name, got)
		}
	}
	for _, typeURL := range []string{ClusterType, EndpointType, listenerType} {
		want := slices.DeleteFunc(slices.Clone(rows), func(r *ResourceStatus) bool { return r.TypeURL != typeURL })
		got := statedb.Collect(tbl.Prefix(rtxn, ResourcesByType(typeURL)))
		key, _ := ResourceIndex.FromString(typeURL)
		typed := statedb.Collect(tbl.Prefix(rtxn, ResourceIndex.QueryFromKey(key)))
		if !slices.Equal(got, want) || !slices.Equal(typed, want) {
			t.Errorf("%s: by type %v, by its URL typed %v, want %v", typeURL, got, typed, want)
		}
	}
}
