// SPDX-License-Identifier: Apache-2.0

package version

import (
	"runtime/debug"
	"testing"
)

func buildInfo(mainVersion string, settings ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/l4xds/l4xds", Version: mainVersion}}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

// What -ldflags -X stamps wins; without it, what Go recorded of the module
// and the checkout; without that, dev and unknown.
func TestGet(t *testing.T) {
	for _, c := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{
			"stamped", "v0.2.0", "1a2b3c4",
			buildInfo("(devel)", "vcs.revision", "ffffff", "vcs.modified", "true"),
			Info{"v0.2.0", "1a2b3c4", "go1.26.0"},
		},
		{
			"go build in a checkout", "", "",
			buildInfo("(devel)", "vcs.revision", "1a2b3c4d", "vcs.modified", "false"),
			Info{"dev", "1a2b3c4d", "go1.26.0"},
		},
		{
			"go build in a modified checkout", "", "",
			buildInfo("(devel)", "vcs.revision", "1a2b3c4d", "vcs.modified", "true"),
			Info{"dev", "1a2b3c4d-dirty", "go1.26.0"},
		},
		{
			"go install module@version", "", "",
			buildInfo("v0.3.1"),
			Info{"v0.3.1", "unknown", "go1.26.0"},
		},
		{
			"stamped version, commit from the checkout", "v0.2.0", "",
			buildInfo("(devel)", "vcs.revision", "1a2b3c4d"),
			Info{"v0.2.0", "1a2b3c4d", "go1.26.0"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := get(c.version, c.commit, c.bi); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
	if got := get("", "", nil); got.Version != "dev" || got.Commit != "unknown" || got.GoVersion == "" {
		t.Errorf("without build info: got %+v, want dev, unknown and the running Go version", got)
	}
}

func TestString(t *testing.T) {
	got := Info{"v0.2.0", "1a2b3c4", "go1.26.0"}.String()
	if want := "v0.2.0 (commit 1a2b3c4, go1.26.0)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
