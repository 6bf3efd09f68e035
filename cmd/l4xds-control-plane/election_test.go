// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/l4xds/l4xds/cmd/l4xds-control-plane/kubesource"
)

func TestElectionFlags(t *testing.T) {
	for _, tt := range []struct {
		name      string
		f         serveFlags
		namespace string // $POD_NAMESPACE
		want      kubesource.Election
		err       string
	}{
		{name: "off", want: kubesource.Election{}},
		{name: "a Lease without election", f: serveFlags{leaderLease: "ns/l"}, err: "--leader-elect-lease needs --leader-elect"},
		{name: "the pod's namespace", f: serveFlags{leaderElect: true}, namespace: "lb",
			want: kubesource.Election{Namespace: "lb", Name: "l4xds-control-plane", Identity: "cp-0"}},
		{name: "a Lease given", f: serveFlags{leaderElect: true, leaderLease: "kube-system/lb"},
			want: kubesource.Election{Namespace: "kube-system", Name: "lb", Identity: "cp-0"}},
		{name: "no namespace", f: serveFlags{leaderElect: true},
			err: "--leader-elect: give --leader-elect-lease NAMESPACE/NAME, or set $POD_NAMESPACE"},
		{name: "not NAMESPACE/NAME", f: serveFlags{leaderElect: true, leaderLease: "lb"},
			err: `--leader-elect-lease "lb": want NAMESPACE/NAME`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tt.namespace)
			t.Setenv("POD_NAME", "cp-0")
			got, err := election(tt.f)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %s", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("election = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
