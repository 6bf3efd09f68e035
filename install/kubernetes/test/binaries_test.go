// SPDX-License-Identifier: Apache-2.0

package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/pflag"

	"github.com/l4xds/l4xds/pkg/option"
)

// repoRoot is the checkout the chart and the binaries come from.
const repoRoot = "../../.."

var binaries = []string{"l4xds-agent", "l4xds-dbg", "l4xds-control-plane"}

var (
	buildDir string
	build    = sync.OnceValue(func() error {
		out, err := exec.Command("go", "build", "-C", repoRoot, "-o", buildDir+"/",
			"./cmd/l4xds-agent", "./cmd/l4xds-dbg").CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
		// The control plane is a module of its own.
		out, err = exec.Command("go", "build", "-C", repoRoot+"/cmd/l4xds-control-plane", "-o", buildDir+"/", ".").CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
		return nil
	})
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "l4xds-chart-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary is the path of one of the project's binaries: from $L4XDS_BIN
// (make test builds them there first), else built from this checkout.
func binary(t *testing.T, name string) string {
	t.Helper()
	if dir := os.Getenv("L4XDS_BIN"); dir != "" {
		p, err := filepath.Abs(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("L4XDS_BIN: %v (run make build)", err)
		}
		return p
	}
	if err := build(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(buildDir, name)
}

// flagLine is one flag of cobra's --help: "  -o, --output string   text".
// Boolean flags have no type word.
var flagLine = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)(?: ([a-zA-Z0-9]+))?\s`)

// helpFlags runs `BINARY ARGS... --help` and returns its flags with the
// type cobra prints for them ("" for booleans). The help text is the
// binary's own contract with operators, so it is what the chart must match.
func helpFlags(t *testing.T, name string, args ...string) map[string]string {
	t.Helper()
	out, err := exec.Command(binary(t, name), append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s --help: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	flags := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flags[m[1]] = m[2]
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s %s --help lists no flags:\n%s", name, strings.Join(args, " "), out)
	}
	return flags
}

// commandFlags are flags of the agent's command line, not settings: they
// are read before the config dir, so a ConfigMap key of that name would be
// accepted and silently do nothing.
var commandFlags = map[string]bool{"config-dir": true, "config-file": true, "debug": true, "log-format": true, "help": true}

// agentSettings is the agent's settings as a flag set of the right types,
// built from l4xds-agent --help.
func agentSettings(t *testing.T) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("l4xds-agent", pflag.ContinueOnError)
	for name, typ := range helpFlags(t, "l4xds-agent") {
		if commandFlags[name] {
			continue
		}
		switch typ {
		case "":
			fs.Bool(name, false, "")
		case "string":
			fs.String(name, "", "")
		case "strings":
			fs.StringSlice(name, nil, "")
		case "int":
			fs.Int(name, 0, "")
		case "uint":
			fs.Uint(name, 0, "")
		case "duration":
			fs.Duration(name, 0, "")
		default:
			t.Fatalf("l4xds-agent --%s has type %q, which this test does not know how to check", name, typ)
		}
	}
	return fs
}

// checkAgentConfig mounts the ConfigMap's data as a directory and reads it
// with the agent's own --config-dir loader: every key must be a setting of
// the agent, and every value must parse as that setting's type.
func checkAgentConfig(t *testing.T, data map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for key, value := range data {
		if commandFlags[key] {
			t.Errorf("ConfigMap key %q is a command-line flag of the agent, not a setting: it would be ignored", key)
		}
		if err := os.WriteFile(filepath.Join(dir, key), []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := agentSettings(t)
	settings, err := option.Load(fs, dir, "")
	if err != nil {
		t.Fatalf("the agent would reject its ConfigMap: %v", err)
	}
	for key, value := range settings {
		if err := fs.Set(key, value.(string)); err != nil {
			t.Errorf("ConfigMap %s=%q: %v", key, value, err)
		}
	}
}

// checkCommand checks that `NAME ARGS...` names a subcommand and flags that
// exist: cobra's --help fails on an unknown subcommand or flag.
func checkCommand(t *testing.T, argv []string) {
	t.Helper()
	name := argv[0]
	var args []string
	for _, a := range argv[1:] {
		if a == "--" {
			break // what follows is the subcommand's own input
		}
		args = append(args, a)
	}
	if out, err := exec.Command(binary(t, name), append(args, "--help")...).CombinedOutput(); err != nil {
		t.Errorf("%q is not a command of %s: %v\n%s", argv, name, err, out)
	}
}
