// SPDX-License-Identifier: Apache-2.0

package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/l4xds/l4xds/internal/makecmd"
)

const repoRoot = "../.."

// binaries are every binary `make build` builds, the image ships and
// users run.
var binaries = []string{"l4xds-agent", "l4xds-dbg", "l4xds-control-plane", "l4xds-traffic"}

// `make build VERSION=... COMMIT=...` stamps every binary, the control
// plane's module too, and each prints it with --version.
func TestMakeBuildStampsEveryBinary(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("needs make: %v", err)
	}
	bin := t.TempDir()
	cmd := makecmd.Command("-C", repoRoot, "--no-print-directory", "build",
		"BIN="+bin, "VERSION=v9.8.7-test", "COMMIT=c0ffee")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, b := range binaries {
		out, err := exec.Command(filepath.Join(bin, b), "--version").CombinedOutput()
		if err != nil {
			t.Errorf("%s --version: %v\n%s", b, err, out)
			continue
		}
		if want := b + " v9.8.7-test (commit c0ffee, " + runtime.Version() + ")\n"; string(out) != want {
			t.Errorf("%s --version = %q, want %q", b, out, want)
		}
	}
}

// Both Dockerfiles take VERSION and COMMIT as build arguments and stamp
// them into every go build; the image build cannot run here (no .git in
// its context, hence the arguments), so its commands are read.
func TestDockerfilesStampTheVersion(t *testing.T) {
	stamp := regexp.MustCompile(`-X github\.com/l4xds/l4xds/pkg/version\.Version=\$\{?VERSION\}? -X github\.com/l4xds/l4xds/pkg/version\.Commit=\$\{?COMMIT\}?`)
	for _, c := range []struct {
		file   string
		builds int // go build commands
	}{
		{"Dockerfile", 2},
		{"cilium/Dockerfile", 1},
	} {
		data, err := os.ReadFile(filepath.Join(repoRoot, c.file))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(data), "\\\n", " ")
		for _, arg := range []string{"VERSION", "COMMIT"} {
			if !regexp.MustCompile(`(?m)^ARG ` + arg + `\b`).MatchString(text) {
				t.Errorf("%s: no ARG %s", c.file, arg)
			}
		}
		builds := regexp.MustCompile(`go build [^\n&]*`).FindAllString(text, -1)
		if len(builds) != c.builds {
			t.Errorf("%s: %d go build commands, want %d: %q", c.file, len(builds), c.builds, builds)
		}
		for _, b := range builds {
			if !stamp.MatchString(b) {
				t.Errorf("%s: %q does not stamp VERSION and COMMIT into pkg/version", c.file, b)
			}
		}
	}
}
