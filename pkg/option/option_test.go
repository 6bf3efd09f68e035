// SPDX-License-Identifier: Apache-2.0

package option

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func testFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.Bool("enable-xds-control-plane", false, "")
	fs.String("xds-server-address", "", "")
	fs.String("xds-server-name", "", "")
	fs.String("xds-client-cert-path", "", "")
	fs.String("xds-client-key-path", "", "")
	fs.String("xds-ca-cert-path", "", "")
	fs.StringSlice("devices", nil, "")
	return fs
}

func write(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadConfigFileAcceptsTheCFPBlockVerbatim(t *testing.T) {
	file := write(t, filepath.Join(t.TempDir(), "l4xds.yaml"), `
xds-control-plane:
  # Enables the xDS client in the Cilium agent for L4 LB
  enabled: false
  # Address of the external xDS management server
  server-address: "xds.my-company.com:9000"
  # Optional: Path to a client certificate for mTLS authentication
  client-cert-path: "/var/lib/cilium/tls/xds-client.crt"
  # Optional: Path to a client key for mTLS authentication
  client-key-path: "/var/lib/cilium/tls/xds-client.key"
  # Optional: Path to the CA certificate for verifying the xDS server
  ca-cert-path: "/var/lib/cilium/tls/xds-ca.crt"
devices: [eth0, eth1]
`)
	got, err := Load(testFlags(), "", file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"enable-xds-control-plane": "false",
		"xds-server-address":       "xds.my-company.com:9000",
		"xds-client-cert-path":     "/var/lib/cilium/tls/xds-client.crt",
		"xds-client-key-path":      "/var/lib/cilium/tls/xds-client.key",
		"xds-ca-cert-path":         "/var/lib/cilium/tls/xds-ca.crt",
		"devices":                  "eth0,eth1",
	}
	if len(got) != len(want) {
		t.Errorf("got %d settings, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestLoadConfigDirAndFilePrecedence(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "xds-server-address"), "from-dir:9000\n")
	write(t, filepath.Join(dir, "enable-xds-control-plane"), "true")
	write(t, filepath.Join(dir, "..data", "ignored"), "x") // ConfigMap internals
	file := write(t, filepath.Join(t.TempDir(), "c.yaml"), "xds-control-plane:\n  server-address: from-file:9000\n")
	got, err := Load(testFlags(), dir, file)
	if err != nil {
		t.Fatal(err)
	}
	if got["xds-server-address"] != "from-file:9000" || got["enable-xds-control-plane"] != "true" {
		t.Errorf("got %v", got)
	}
}

func TestLoadRejectsUnknownKeysNamingThem(t *testing.T) {
	for name, c := range map[string]struct {
		file, dirKey, want string
	}{
		"typo in block":   {file: "xds-control-plane:\n  server-adress: x\n", want: `xds-control-plane.server-adress: "xds-server-adress" is not a setting`},
		"top-level typo":  {file: "devics: eth0\n", want: `"devics" is not a setting`},
		"block not a map": {file: "xds-control-plane: true\n", want: "xds-control-plane: want a mapping"},
		"dir typo":        {dirKey: "xds-sever-address", want: `xds-sever-address: "xds-sever-address" is not a setting`},
	} {
		t.Run(name, func(t *testing.T) {
			var dir, file string
			if c.file != "" {
				file = write(t, filepath.Join(t.TempDir(), "c.yaml"), c.file)
			}
			if c.dirKey != "" {
				dir = t.TempDir()
				write(t, filepath.Join(dir, c.dirKey), "x")
			}
			_, err := Load(testFlags(), dir, file)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// Several xDS servers (gRFC A71) are a YAML list or a comma-separated
// string, in order of priority, and so are their names.
func TestLoadConfigFileTakesAListOfServers(t *testing.T) {
	file := write(t, filepath.Join(t.TempDir(), "l4xds.yaml"), `
xds-control-plane:
  server-address: [xds-a.example:9000, xds-b.example:9000]
  server-name: [xds-a.example, xds-b.example]
`)
	got, err := Load(testFlags(), "", file)
	if err != nil {
		t.Fatal(err)
	}
	if got["xds-server-address"] != "xds-a.example:9000,xds-b.example:9000" || got["xds-server-name"] != "xds-a.example,xds-b.example" {
		t.Errorf("settings = %v, want the servers and names comma-separated, in order", got)
	}
}
