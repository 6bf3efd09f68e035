// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestL3n4AddrCompareMatchesKey(t *testing.T) {
	addrs := []L3n4Addr{
		addr("[2001:db8::1]:53/UDP"),
		addr("10.0.0.2:80"),
		addr("10.0.0.1:443/TCP"),
		addr("10.0.0.1:80/UDP"),
		addr("10.0.0.1:80/TCP"),
		addr("[::1]:80/TCP"),
	}
	byCompare := slices.SortedFunc(slices.Values(addrs), L3n4Addr.Compare)
	byKey := slices.SortedFunc(slices.Values(addrs), func(a, b L3n4Addr) int { return bytes.Compare(a.Key(), b.Key()) })
	if !slices.Equal(byCompare, byKey) {
		t.Fatalf("Compare order %v differs from key order %v", byCompare, byKey)
	}
	if byCompare[0] != addr("10.0.0.1:80/TCP") || byCompare[len(byCompare)-1] != addr("[2001:db8::1]:53/UDP") {
		t.Fatalf("unexpected order %v", byCompare)
	}
}

func TestTextEncoding(t *testing.T) {
	in := Backend{
		BackendParams: BackendParams{Address: addr("[2001:db8::2]:8080"), Weight: 3, State: BackendStateQuarantined},
		ServiceName:   "db",
		Source:        SourceXDS,
	}
	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ym, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Address":"[2001:db8::2]:8080"`, `"State":"quarantined"`} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("JSON %s lacks %s", js, want)
		}
	}
	for _, want := range []string{"address: '[2001:db8::2]:8080'", "state: quarantined"} {
		if !bytes.Contains(ym, []byte(want)) {
			t.Errorf("YAML %s lacks %s", ym, want)
		}
	}
	var fromJSON, fromYAML Backend
	if err := json.Unmarshal(js, &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ym, &fromYAML); err != nil {
		t.Fatal(err)
	}
	if fromJSON != in || fromYAML != in {
		t.Errorf("round trip: JSON %+v, YAML %+v, want %+v", fromJSON, fromYAML, in)
	}
	var bad Backend
	if err := yaml.Unmarshal([]byte("state: sleeping\n"), &bad); err == nil {
		t.Error("unknown backend state accepted")
	}
}
