// SPDX-License-Identifier: Apache-2.0

// Package makecmd runs the repository's make from tests.
package makecmd

import (
	"os"
	"os/exec"
	"runtime/debug"
)

// Command is make with ARGS and the cgo setting the calling binary was
// built with, so that what make compiles is shared in Go's build cache
// with the go test that runs it (the Makefile's own default is
// CGO_ENABLED=0).
func Command(args ...string) *exec.Cmd {
	cmd := exec.Command("make", args...)
	cmd.Env = os.Environ()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "CGO_ENABLED" {
				cmd.Env = append(cmd.Env, "CGO_ENABLED="+s.Value)
			}
		}
	}
	return cmd
}
