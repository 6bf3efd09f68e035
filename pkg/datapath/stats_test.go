// SPDX-License-Identifier: Apache-2.0

package datapath

import "testing"

func TestDropReasonNames(t *testing.T) {
	for r, want := range map[DropReason]string{
		DropNoBackend: "no backend", DropSourceRange: "source range", DropBackendFamily: "backend family", DropRemovedVIP: "removed vip", DropRejectLimit: "reject limit", NumDropReasons: "reason 11",
	} {
		if got := r.String(); got != want {
			t.Errorf("DropReason(%d) = %q, want %q", int(r), got, want)
		}
	}
}
