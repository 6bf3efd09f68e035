// SPDX-License-Identifier: Apache-2.0

package dbg

import "testing"

func TestShellJoinQuotesWhatTheShellWouldSplit(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"db/show", "frontends"}, "db/show frontends"},
		{[]string{"health", "xds: OK"}, "health 'xds: OK'"},
		{[]string{"echo", "it's"}, "echo 'it''s'"},
		{[]string{"db/get", ""}, "db/get ''"},
	} {
		if got := shellJoin(c.args); got != c.want {
			t.Errorf("shellJoin(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}
