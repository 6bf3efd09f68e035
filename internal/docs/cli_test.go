// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the generated parts of Documentation/ instead of checking them")

const docDir = "../../Documentation"

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// binDir builds the three binaries once per test run, or uses $L4XDS_BIN
// (set by `make test` and `make docs`, which have just built them).
func binDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("L4XDS_BIN"); dir != "" {
		return dir
	}
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "l4xds-docs-bin")
		if buildErr != nil {
			return
		}
		for _, args := range [][]string{
			{"build", "-o", builtDir + "/", "../../cmd/l4xds-agent", "../../cmd/l4xds-dbg"},
			{"build", "-C", "../../cmd/l4xds-control-plane", "-o", builtDir + "/", "."}, // a module of its own
		} {
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build: %v\n%s", err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// help runs `BIN ARGS... --help` and returns what it prints.
func help(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append(args, "--help")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s --help: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// checkBlock compares the part of Documentation/doc between the markers
// with want, or rewrites it with -update.
func checkBlock(t *testing.T, doc, begin, end, want string) {
	t.Helper()
	path := filepath.Join(docDir, doc)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	updated, got, err := replaceBetween(string(data), begin, end, want)
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: rewrote the part between %s and %s", doc, begin, end)
		return
	}
	t.Errorf("Documentation/%s between %s and %s is not what the binaries print; run `make docs`.\n%s",
		doc, begin, end, lineDiff(got, want))
}

// lineDiff lists the lines only in got (-) and only in want (+).
func lineDiff(got, want string) string {
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
	var b strings.Builder
	for _, l := range gotLines {
		if !slices.Contains(wantLines, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range wantLines {
		if !slices.Contains(gotLines, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}

// TestFlagReference: the flag table of configuration.md is `l4xds-agent
// --help`: every flag, with its type, default and usage.
func TestFlagReference(t *testing.T) {
	out := help(t, filepath.Join(binDir(t), "l4xds-agent"))
	flags, err := parseFlags(helpSection(out, "Flags:"))
	if err != nil {
		t.Fatal(err)
	}
	if len(flags) < 10 {
		t.Fatalf("parsed only %d flags from l4xds-agent --help:\n%s", len(flags), out)
	}
	for _, f := range flags {
		if f.Name == "" || f.Usage == "" {
			t.Fatalf("flag parsed without a name or usage: %+v", f)
		}
	}
	checkBlock(t, "configuration.md", "<!-- flags:begin -->", "<!-- flags:end -->", flagTable(flags))
}

// TestCommandReference: the command reference of cli.md is the --help of
// every command of l4xds-dbg and l4xds-control-plane, and of the agent's
// subcommands (its flags are in configuration.md).
func TestCommandReference(t *testing.T) {
	dir := binDir(t)
	for _, c := range []struct {
		bin  string
		root bool
	}{
		{"l4xds-dbg", true},
		{"l4xds-control-plane", true},
		{"l4xds-agent", false},
	} {
		t.Run(c.bin, func(t *testing.T) {
			var b strings.Builder
			commandHelp(t, &b, filepath.Join(dir, c.bin), nil, c.root)
			checkBlock(t, "cli.md", "<!-- help:"+c.bin+":begin -->", "<!-- help:"+c.bin+":end -->", b.String())
		})
	}
}

// commandHelp writes the help of the command at path and of every command
// under it, each under a heading.
func commandHelp(t *testing.T, b *strings.Builder, bin string, path []string, withSelf bool) {
	out := help(t, bin, path...)
	if withSelf {
		fmt.Fprintf(b, "### `%s`\n\n```text\n%s\n```\n\n",
			strings.Join(append([]string{filepath.Base(bin)}, path...), " "), strings.TrimRight(out, "\n"))
	}
	for _, sub := range subcommands(out) {
		commandHelp(t, b, bin, append(slices.Clone(path), sub), true)
	}
}

// TestStartupErrors: the agent refuses a bad configuration at start with
// the messages troubleshooting.md lists.
func TestStartupErrors(t *testing.T) {
	agent := filepath.Join(binDir(t), "l4xds-agent")
	doc, err := os.ReadFile(filepath.Join(docDir, "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	configDir := filepath.Join(tmp, "config")
	if err := os.Mkdir(configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(configDir, "xds-sever-address"), []byte("xds:9000"), 0o644); err != nil {
		t.Fatal(err)
	}
	configFile := filepath.Join(tmp, "agent.yaml")
	if err := os.WriteFile(configFile, []byte("xds-control-plane: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		args []string
		want []string
	}{
		{
			[]string{"--enable-xds-control-plane"},
			[]string{
				"--xds-server-address: must be set when --enable-xds-control-plane is true",
				"--xds-client-cert-path: must be set unless --xds-insecure is true",
				"--xds-client-key-path: must be set unless --xds-insecure is true",
				"--xds-ca-cert-path: must be set unless --xds-insecure is true",
			},
		},
		{
			[]string{"--enable-xds-control-plane", "--xds-insecure", "--xds-server-address", "xds.example.internal"},
			[]string{`--xds-server-address: "xds.example.internal" is not host:port: address xds.example.internal: missing port in address`},
		},
		{
			[]string{"--enable-xds-control-plane", "--xds-insecure", "--xds-server-address", "xds-a.example.internal:9000,xds-a.example.internal:9000"},
			[]string{`--xds-server-address: "xds-a.example.internal:9000" is listed twice (servers 1 and 2)`},
		},
		{
			[]string{"--enable-xds-control-plane", "--xds-insecure", "--xds-server-address", "xds-a.example.internal:9000,,xds-b.example.internal:9000"},
			[]string{`--xds-server-address: server 2 of "xds-a.example.internal:9000,,xds-b.example.internal:9000" is empty`},
		},
		{
			[]string{"--enable-xds-control-plane", "--xds-insecure", "--xds-server-address", "xds-a.example.internal:9000,xds-b.example.internal:9000,xds-c.example.internal:9000",
				"--xds-server-name", "xds-a.example.internal,xds-b.example.internal"},
			[]string{"--xds-server-name: 2 names for 3 servers in --xds-server-address: give one name for every server, or one per server in the same order"},
		},
		{[]string{"--xds-protocol", "grpc"}, []string{`--xds-protocol: "grpc" is not sotw or delta`}},
		{[]string{"--xds-max-recv-msg-size", "0"}, []string{"--xds-max-recv-msg-size: 0 is not a positive number of bytes"}},
		{[]string{"--xds-resource-does-not-exist-timeout", "0s"}, []string{"--xds-resource-does-not-exist-timeout: 0s is not positive"}},
		{[]string{"--datapath", "xdp"}, []string{`--datapath: "xdp" is not bpf or none`}},
		{[]string{"--datapath", "bpf", "--lb-maglev-table-size", "1000"}, []string{"--lb-maglev-table-size: 1000 is not a prime"}},
		{[]string{"--datapath", "bpf", "--lb-maglev-table-size", "262139"}, []string{"--lb-maglev-table-size: 262139 is larger than 131071"}},
		{[]string{"--config-dir", configDir}, []string{`"xds-sever-address" is not a setting of the agent (see l4xds-agent --help)`}},
		{[]string{"--config-file", configFile}, []string{"xds-control-plane: want a mapping of settings, got bool"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			args := append([]string{"--datapath=none", "--api-socket", filepath.Join(tmp, "agent.sock")}, c.args...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, agent, args...).CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("l4xds-agent %s: want an exit with an error, got %v\n%s", strings.Join(args, " "), err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("l4xds-agent %s does not print %q:\n%s", strings.Join(args, " "), w, out)
				}
				if !strings.Contains(string(doc), w) {
					t.Errorf("Documentation/troubleshooting.md does not list %q, which l4xds-agent %s prints", w, strings.Join(c.args, " "))
				}
			}
		})
	}
}
