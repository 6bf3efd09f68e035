// SPDX-License-Identifier: Apache-2.0

// Package version is the version of the l4xds binaries: what the Makefile
// and the Dockerfiles stamp into them with
//
//	-ldflags "-X github.com/l4xds/l4xds/pkg/version.Version=v0.1.0 -X github.com/l4xds/l4xds/pkg/version.Commit=<sha>"
//
// and, for a binary built without them (go build, go install), what Go
// recorded of the module and of the git checkout it was built from.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/spf13/cobra"
)

// Set with -ldflags -X; empty when not stamped.
var (
	// Version is the release, as `git describe --tags --always --dirty`
	// prints it.
	Version string
	// Commit is the git commit the binary was built from.
	Commit string
)

// Info is the version of a binary.
type Info struct {
	// Version is the stamped version, else the module's version when built
	// by `go install module@version`, else "dev".
	Version string
	// Commit is the stamped commit, else the vcs.revision Go recorded
	// (with "-dirty" when the checkout had changes), else "unknown".
	Commit string
	// GoVersion is the Go release the binary was built with.
	GoVersion string
}

// Get returns the version of the running binary.
var Get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(Version, Commit, bi)
})

func get(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var revision, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if revision != "" && modified == "true" {
				revision += "-dirty"
			}
			info.Commit = revision
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the line --version prints, after the binary's name.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}

// AddFlag gives the root command cmd a --version flag that prints the
// binary's name and Info, as `l4xds-agent v0.1.0 (commit 1a2b3c4, go1.26.0)`.
func AddFlag(cmd *cobra.Command) {
	cmd.Version = Get().String()
	// Defined here rather than by cobra, which would also take -v.
	cmd.Flags().Bool("version", false, "Print the version, git commit and Go version, and exit")
	cmd.SetVersionTemplate("{{.Name}} {{.Version}}\n")
}
